package auth

// Replay protection: a sliding window of WindowSize sequence numbers behind the
// highest one accepted. A number ahead of the highest is accepted and moves the
// window; one inside the window is accepted once; one behind the window is rejected
// as too old. Attackers cannot forge tags, so only genuine packets move the window.
//
// Neither window is safe for concurrent use: the caller holds the session's lock.

// WindowSize is how far behind the highest accepted number a packet may arrive and
// still be accepted. It must cover the reordering between the slowest and fastest
// link: 2048 packets is 24 ms at 1 Gbit/s with 1500-byte packets.
const WindowSize = 2048

const windowWords = WindowSize / 64

// window is the bitmap both windows share, over positions on a 64-bit line; the
// wrappers map their counters onto it. The window only ever uses distances from top
// (computed by the wrappers in serial arithmetic) and slots p % WindowSize, and 2^64
// is a multiple of WindowSize, so even a wrap of the 64-bit line itself is harmless.
type window struct {
	top     uint64 // highest accepted position
	started bool   // anything accepted since the last reset
	// bits has one bit per position in (top-WindowSize, top], position p at bit
	// p % WindowSize: a ring, so moving forward clears instead of shifting.
	bits [windowWords]uint64
}

// fresh reports whether position pos, delta ahead of top (negative: behind), may be
// accepted.
func (w *window) fresh(pos uint64, delta int64) bool {
	switch {
	case !w.started || delta > 0:
		return true
	case delta <= -WindowSize:
		return false
	default:
		return !w.has(pos)
	}
}

// accept marks pos if it is fresh.
func (w *window) accept(pos uint64, delta int64) bool {
	if !w.fresh(pos, delta) {
		return false
	}
	switch {
	case !w.started:
		w.bits = [windowWords]uint64{}
		w.top, w.started = pos, true
	case delta > 0:
		w.advance(pos, delta)
	}
	w.set(pos)
	return true
}

// advance moves top forward by delta to pos, forgetting the positions that the ring
// reuses.
func (w *window) advance(pos uint64, delta int64) {
	if delta >= WindowSize {
		w.bits = [windowWords]uint64{}
	} else {
		for p := w.top + 1; p != pos+1; p++ {
			w.clear(p)
		}
	}
	w.top = pos
}

func (w *window) has(p uint64) bool {
	i := p % WindowSize
	return w.bits[i/64]&(1<<(i%64)) != 0
}

func (w *window) set(p uint64) {
	i := p % WindowSize
	w.bits[i/64] |= 1 << (i % 64)
}

func (w *window) clear(p uint64) {
	i := p % WindowSize
	w.bits[i/64] &^= 1 << (i % 64)
}

func (w *window) reset() { *w = window{} }

// ReplayWindow guards the 32-bit global data sequence. Sequence numbers wrap, so each
// is mapped to a 64-bit position by its serial distance from the highest accepted one
// (RFC 1982: at most 2^31 either way); the window then never sees a 32-bit wrap. The
// zero value is ready and accepts any first sequence number.
type ReplayWindow struct {
	w window
}

// position maps seq onto the 64-bit line relative to the highest accepted one.
func (r *ReplayWindow) position(seq uint32) (pos uint64, delta int64) {
	if !r.w.started {
		return uint64(seq), 0
	}
	delta = int64(int32(seq - uint32(r.w.top)))
	return r.w.top + uint64(delta), delta
}

// Check reports whether seq would be accepted, without changing the window (for a
// cheap look before verifying the tag).
func (r *ReplayWindow) Check(seq uint32) bool {
	return r.w.fresh(r.position(seq))
}

// Accept marks seq as seen if it is fresh and reports whether it was. Call it only for
// packets whose tag verified.
func (r *ReplayWindow) Accept(seq uint32) bool {
	return r.w.accept(r.position(seq))
}

// Reset forgets everything, e.g. for a new key generation.
func (r *ReplayWindow) Reset() { r.w.reset() }

// Window64 guards a 64-bit control counter, with the same semantics as ReplayWindow.
// Differences are taken in 64-bit serial arithmetic, so even a counter that started
// near 2^64 wraps safely. The zero value is ready.
type Window64 struct {
	w window
}

func (c *Window64) delta(counter uint64) int64 {
	if !c.w.started {
		return 0
	}
	return int64(counter - c.w.top)
}

// Check reports whether counter would be accepted, without changing the window.
func (c *Window64) Check(counter uint64) bool {
	return c.w.fresh(counter, c.delta(counter))
}

// Accept marks counter as seen if it is fresh and reports whether it was.
func (c *Window64) Accept(counter uint64) bool {
	return c.w.accept(counter, c.delta(counter))
}

// Reset forgets everything.
func (c *Window64) Reset() { c.w.reset() }
