// Package reseq puts one session's received data packets (one direction) back into
// sequence order: the resequencer of docs/architecture.md §4.
//
// Packets that arrive in order are delivered at once. Packets that arrive ahead of a
// gap are copied into the resequencer's own buffers and held until the gap is
// resolved, in one of four ways:
//
//   - the missing packet arrives;
//   - FIFO evidence: every link is FIFO, so once every link of the session has shown
//     a sequence number beyond the gap (in a data packet or a probe's watermark), the
//     missing packet either arrived or is lost, wherever it was sent: skip it now,
//     without waiting for a timer;
//   - a loss notice (Skip) from the sender says it will never come;
//   - the hold timer: when the oldest held packet has waited the hold time (adaptive,
//     set by the caller from the links' delay spread, capped by Config.MaxHold), the
//     gap in front of it is skipped. This covers a link that went silent. A packet
//     that arrives after the timer gave its number up proves the hold too short, and
//     the resequencer lengthens it by itself (stretch.go).
//
// Memory is bounded: when holding one more packet would exceed Config.MaxBytes or
// Config.MaxPackets, the oldest gaps are skipped and what we have is delivered rather
// than dropped. Duplicates (redundant copies), late packets (whose sequence number
// was already given up) and bogus ones (absurdly far ahead) are dropped and counted;
// a late redundant copy is delivered out of order instead (PushCopy).
//
// Sequence numbers are uint32 compared in serial arithmetic (RFC 1982), so
// everything works across the wrap from 0xffffffff to 0.
//
// This is per-packet code: after warm-up (the ring and the buffer pool reach their
// working size) nothing allocates. A Resequencer is not safe for concurrent use; the
// caller serialises every method with its own lock. deliver callbacks run inside the
// methods, must not call back into the Resequencer, and must not keep the slice they
// are given: for held packets it is a buffer the resequencer reuses as soon as
// deliver returns. Times are int64 nanoseconds of the caller's monotonic clock; the
// resequencer never lets its notion of now go backwards, so callers racing for the
// lock with slightly stale timestamps do no harm.
package reseq

import "math"

// Defaults for the zero values of Config.
const (
	DefaultMaxHold    = int64(200e6) // 200 ms: beyond that, TCP would rather see the loss
	DefaultMaxBytes   = 4 << 20
	DefaultMaxPackets = 8192
)

// Window is how far ahead of the next expected sequence number a packet may be.
// Anything further is bogus (a peer out of step with us) and is dropped; it is also
// the largest MaxPackets.
const Window = 1 << 16

// Config bounds a Resequencer. The zero value uses the defaults.
type Config struct {
	MaxHold int64 // cap on the hold time, ns
	// MaxBytes caps the payload bytes held. Buffers are at least 2 KiB and the pool
	// keeps up to MaxBytes of idle ones, so the memory used can reach about twice
	// this (more with many tiny packets).
	MaxBytes int
	// MaxPackets caps the packets held. It also bounds the span of sequence numbers
	// the buffer covers (rounded up to a power of two, at most Window): a packet more
	// than that far ahead of the first gap forces the oldest gaps to be skipped.
	MaxPackets int
}

// Stats are cumulative counters, except HeldPackets and HeldBytes which are the
// current buffer occupancy. Every data packet pushed ends up counted exactly once in
// Delivered, LateCopies, Duplicates, Late, Stale or Bogus (once nothing is held any
// more).
type Stats struct {
	Delivered     uint64 // packets handed to deliver, in order or (Ahead) just ahead of a gap
	Ahead         uint64 // of those, sparse packets delivered ahead of a gap (PushSparse)
	LateCopies    uint64 // copies and sparse packets handed to deliver after their number was skipped (PushCopy, PushSparse)
	Held          uint64 // of those, how many had to wait in the buffer
	HoldTimeNsSum uint64 // total time held packets waited, ns
	Duplicates    uint64 // already delivered or already held: dropped
	Late          uint64 // arrived after their sequence number was skipped: dropped
	Stale         uint64 // too far behind to tell duplicate from late: dropped
	Bogus         uint64 // too far ahead (Window or more): dropped

	Lost uint64 // sequence numbers skipped, for any of the reasons below
	// Lost by reason.
	EvidenceSkips uint64 // every link showed it had passed them
	TimeoutSkips  uint64 // the hold timer expired
	NoticeSkips   uint64 // the sender said they will never come
	OverflowSkips uint64 // the buffer was full

	Stretches uint64 // late packets after a timeout that lengthened the hold (stretch.go)

	HeldPackets int
	HeldBytes   int
}

// skipReason says why a sequence number was given up; it selects a Stats counter.
type skipReason uint8

const (
	byEvidence skipReason = iota
	byTimeout
	byNotice
	byOverflow
)

// Resequencer is the receive-side ordering state of one session and direction.
type Resequencer struct {
	maxHold    int64
	hold       int64
	maxBytes   int
	maxPackets int
	maxSpan    uint32 // power of two: the ring never grows beyond it

	next uint32 // the first sequence number not yet delivered or skipped
	now  int64  // the latest time seen

	ring      ring // held packets and loss markers for [next, next+len(ring.slots))
	heldBytes int
	pool      pool
	ev        evidence
	hist      history
	stretch   stretch
	flows     heldFlows

	stats Stats
}

// New returns a resequencer expecting start as its first sequence number. The start
// is explicit rather than learnt from the first packet: the first packet may well be
// a reordered one, and both ends of a session know where its numbering begins (0).
func New(cfg Config, start uint32) *Resequencer {
	if cfg.MaxHold <= 0 {
		cfg.MaxHold = DefaultMaxHold
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.MaxPackets <= 0 {
		cfg.MaxPackets = DefaultMaxPackets
	}
	cfg.MaxPackets = min(cfg.MaxPackets, Window)
	r := &Resequencer{
		maxHold:    cfg.MaxHold,
		hold:       cfg.MaxHold,
		maxBytes:   cfg.MaxBytes,
		maxPackets: cfg.MaxPackets,
		maxSpan:    nextPow2(uint32(cfg.MaxPackets)),
		next:       start,
		now:        math.MinInt64,
		ring:       ring{head: none, tail: none},
		pool:       pool{limit: cfg.MaxBytes},
	}
	r.ev.set = make([]uint8, 0, 256)
	return r
}

// SetLinks sets the links currently in the session, whose FIFO evidence the
// loss rule waits for. With no links the rule never fires (only the timer does). A
// change takes effect at the next Push, Watermark or Expire.
func (r *Resequencer) SetLinks(ids []uint8) { r.ev.set = append(r.ev.set[:0], ids...) }

// SetHold sets the hold time, ns, clamped to [0, Config.MaxHold]. It applies to
// packets already held too. What late packets taught the resequencer comes on top
// (Hold).
func (r *Resequencer) SetHold(ns int64) { r.hold = min(max(ns, 0), r.maxHold) }

// Hold returns the hold time in force, ns: the one set, lengthened by what late
// packets showed it lacked (stretch.go), at most Config.MaxHold.
func (r *Resequencer) Hold() int64 { return r.stretch.apply(r.hold, r.maxHold, r.now) }

// NextDeadline returns when Expire next has work to do, if anything is held: the hold
// timer's deadline.
func (r *Resequencer) NextDeadline() (int64, bool) {
	if r.ring.head == none {
		return 0, false
	}
	return r.ring.slots[r.ring.head].arrival + r.Hold(), true
}

// Skipped returns which of the 64 numbers below the next expected one were given up
// and not delivered since (bit i: Next()-1-i): the ones whose late copy PushCopy would
// still deliver.
func (r *Resequencer) Skipped() uint64 { return r.hist.skippedBelow(r.next) }

// Stats returns the counters.
func (r *Resequencer) Stats() Stats {
	st := r.stats
	st.HeldPackets, st.HeldBytes = r.ring.held, r.heldBytes
	return st
}

// Push takes one data packet with global sequence number seq that arrived on link.
// pkt is only read during the call: if the packet has to wait, it is copied.
func (r *Resequencer) Push(now int64, seq uint32, link uint8, pkt []byte, deliver func([]byte)) {
	r.observe(now)
	d := int32(seq - r.next)
	switch {
	case d < 0:
		r.countBehind(seq)
		return
	case d >= Window:
		r.stats.Bogus++
		return
	case d == 0 && r.ring.held == 0 && r.ring.marked == 0:
		// The common case: in order with nothing waiting. Evidence needs no update:
		// a bound of seq+1 says nothing beyond the new next.
		r.deliverDirect(pkt, deliver)
		return
	}
	switch {
	case d == 0:
		r.deliverDirect(pkt, deliver)
	case r.resolvedAhead(seq):
		r.stats.Duplicates++ // still evidence about its link, below
	default:
		r.store(seq, pkt, deliver)
	}
	r.ev.note(link, seq+1, r.next)
	r.release(deliver)
}

// PushCopy is Push for a redundant copy, which its sender sent because it doubted the
// link the original went on. A copy whose number was already given up, and not
// delivered, is delivered at once, out of order, instead of dropped as late: its
// original was lost, or is late itself and then dropped as a duplicate, so the content
// is delivered once, and late is better for TCP than never (a flow that gets it has
// nothing to retransmit). Its sender may send copies of what a doubted link had in
// flight some time after the original, under the same number, behind later numbers on
// another link; such a copy fills the hole if it comes in time, and comes late
// otherwise.
func (r *Resequencer) PushCopy(now int64, seq uint32, link uint8, pkt []byte, deliver func([]byte)) {
	if r.deliveredLate(now, seq, pkt, deliver) {
		return
	}
	r.Push(now, seq, link, pkt, deliver)
}

// PushSparse is Push for a packet of a sparse flow (wire.FlagSparse): its sender sent
// the flow's previous packet long enough before it that that one has arrived or is
// lost. Unless a packet of its flow is held here, it is delivered at once, ahead of
// any gap before it, and its number is marked so that it is passed over, not delivered
// again, when the gap is resolved. Late, after its number was given up, it is
// delivered too, as a late copy is. Otherwise it is an ordinary packet.
func (r *Resequencer) PushSparse(now int64, seq uint32, link uint8, pkt []byte, deliver func([]byte)) {
	if r.deliveredLate(now, seq, pkt, deliver) {
		return
	}
	d := int32(seq - r.next)
	if d <= 0 || d >= Window || r.resolvedAhead(seq) || r.flows.mayHold(bucketOf(pkt)) {
		r.Push(now, seq, link, pkt, deliver)
		return
	}
	r.observe(now)
	r.reach(seq, deliver)
	if r.next == seq {
		r.deliverDirect(pkt, deliver)
	} else {
		r.ring.ensure(r.next, seq-r.next, r.maxSpan)
		deliver(pkt)
		r.stats.Delivered++
		r.stats.Ahead++
		r.ring.pass(seq, r.now)
	}
	r.ev.note(link, seq+1, r.next)
	r.release(deliver)
}

// deliveredLate delivers pkt if its number seq was given up and not delivered since,
// out of order, and reports whether it did.
func (r *Resequencer) deliveredLate(now int64, seq uint32, pkt []byte, deliver func([]byte)) bool {
	if d := int32(seq - r.next); d >= 0 || r.hist.lookup(r.next, seq) != wasSkipped {
		return false
	}
	r.observe(now)
	deliver(pkt)
	r.hist.markDelivered(seq)
	r.stats.LateCopies++
	return true
}

// resolvedAhead reports whether seq, ahead of next, is already here: held, or passed.
func (r *Resequencer) resolvedAhead(seq uint32) bool {
	st := r.ring.stateAt(r.next, seq)
	return st == held || st == passed
}

// Watermark takes a probe's watermark: every data packet below next that was sent on
// link has arrived or is lost.
func (r *Resequencer) Watermark(now int64, link uint8, next uint32, deliver func([]byte)) {
	r.observe(now)
	if int32(next-r.next) > Window {
		// Still true of everything below next+Window, and keeps bounds comparable.
		next = r.next + Window
	}
	r.ev.note(link, next, r.next)
	r.release(deliver)
}

// Skip takes a loss notice: the count sequence numbers from start will never come.
// Numbers already resolved are ignored, and so are numbers the buffer cannot cover
// (more than its span ahead), which the other rules will resolve.
func (r *Resequencer) Skip(start uint32, count uint16, deliver func([]byte)) {
	n := uint32(count)
	if behind := r.next - start; int32(behind) > 0 {
		if behind >= n {
			return
		}
		start, n = r.next, n-behind
	}
	for seq := start; seq != start+n; seq++ {
		d := seq - r.next
		if d >= r.maxSpan {
			break
		}
		r.ring.ensure(r.next, d, r.maxSpan)
		if s := r.ring.at(seq); s.state == empty {
			s.state = lostMarked
			r.ring.marked++
		}
	}
	r.release(deliver)
}

// Expire runs the hold timer: while the oldest held packet has waited the hold time,
// the gap in front of the buffer is skipped and what follows it delivered.
func (r *Resequencer) Expire(now int64, deliver func([]byte)) {
	r.observe(now)
	hold := r.Hold()
	for r.ring.head != none && r.ring.slots[r.ring.head].arrival+hold <= r.now {
		r.skipGap(byTimeout, r.next, false)
		r.stretch.timedOut(r.now)
		r.drain(deliver)
	}
	r.release(deliver) // also catches evidence that SetLinks made sufficient
}

// store holds a packet ahead of a gap, first making room under the caps by skipping
// the oldest gaps. If that brings the packet's turn, it is delivered instead.
func (r *Resequencer) store(seq uint32, pkt []byte, deliver func([]byte)) {
	r.reach(seq, deliver)
	for r.ring.held > 0 && r.next != seq && (r.ring.held >= r.maxPackets || r.heldBytes+len(pkt) > r.maxBytes) {
		r.skipGap(byOverflow, seq, true)
		r.drain(deliver)
	}
	if r.next != seq && len(pkt) > r.maxBytes {
		r.forceTo(seq, deliver) // it can never be held: deliver it rather than drop it
	}
	if r.next == seq {
		r.deliverDirect(pkt, deliver)
		return
	}
	r.ring.ensure(r.next, seq-r.next, r.maxSpan)
	buf := r.pool.get(len(pkt))
	copy(buf, pkt)
	b := bucketOf(pkt)
	r.ring.put(seq, buf, r.now, b)
	r.flows.add(b)
	r.heldBytes += len(buf)
	r.stats.Held++
}

// reach readies the slot of seq, ahead of next, for a packet that came: a loss marker
// on it is lifted (the sender gave it up, yet here it is: keep the data), and if seq lies
// beyond the span the buffer covers, the oldest numbers are resolved until it does not.
// That may bring next to seq.
func (r *Resequencer) reach(seq uint32, deliver func([]byte)) {
	if r.ring.stateAt(r.next, seq) == lostMarked {
		r.ring.at(seq).state = empty
		r.ring.marked--
	}
	if seq-r.next >= r.maxSpan {
		r.forceTo(seq-r.maxSpan+1, deliver)
		r.drain(deliver)
	}
}

// release resolves everything it can at the front of the buffer: held packets and
// loss markers in order, and gaps the links' FIFO evidence has passed.
func (r *Resequencer) release(deliver func([]byte)) {
	r.drain(deliver)
	floor := r.ev.floor(r.next)
	for int32(floor-r.next) > 0 {
		r.skipOne(byEvidence) // the slot at next is empty after drain
		r.drain(deliver)
	}
}

// drain delivers held packets and resolves loss markers from next onwards, up to the
// first gap.
func (r *Resequencer) drain(deliver func([]byte)) {
	for {
		switch r.ring.stateAt(r.next, r.next) {
		case held:
			r.deliverHeld(deliver)
		case lostMarked:
			r.skipOne(byNotice)
		case passed:
			r.passOver()
		default:
			return
		}
	}
}

// skipGap gives up the empty slots from next up to the first occupied one, or up to
// limit if bounded. The caller makes sure an occupied slot or the limit exists.
func (r *Resequencer) skipGap(why skipReason, limit uint32, bounded bool) {
	for !(bounded && r.next == limit) && r.ring.stateAt(r.next, r.next) == empty {
		if r.ring.held == 0 && r.ring.marked == 0 && r.ring.passed == 0 && !bounded {
			return // nothing ahead to reach: do not skip forever
		}
		r.skipOne(why)
	}
}

// forceTo moves next to target, delivering what is held on the way and giving up the
// rest: the buffer cannot reach further.
func (r *Resequencer) forceTo(target uint32, deliver func([]byte)) {
	for r.next != target {
		switch r.ring.stateAt(r.next, r.next) {
		case held:
			r.deliverHeld(deliver)
		case lostMarked:
			r.skipOne(byNotice)
		case passed:
			r.passOver()
		default:
			r.skipOne(byOverflow)
		}
	}
}

// deliverDirect delivers the caller's packet, which is next in order.
func (r *Resequencer) deliverDirect(pkt []byte, deliver func([]byte)) {
	deliver(pkt)
	r.stats.Delivered++
	r.advance(true)
}

// deliverHeld delivers the held packet at next and recycles its buffer.
func (r *Resequencer) deliverHeld(deliver func([]byte)) {
	buf, arrival, b := r.ring.take(r.next)
	r.flows.remove(b)
	r.heldBytes -= len(buf)
	r.stats.HoldTimeNsSum += uint64(max(r.now-arrival, 0))
	deliver(buf)
	r.pool.put(buf)
	r.stats.Delivered++
	r.advance(true)
}

// passOver moves past next, a sparse packet delivered ahead (counted then).
func (r *Resequencer) passOver() {
	r.ring.unpass(r.next)
	r.advance(true)
}

// skipOne gives up sequence number next (an empty or loss-marked slot).
func (r *Resequencer) skipOne(why skipReason) {
	if r.ring.stateAt(r.next, r.next) == lostMarked {
		r.ring.at(r.next).state = empty
		r.ring.marked--
	}
	r.stats.Lost++
	switch why {
	case byEvidence:
		r.stats.EvidenceSkips++
	case byTimeout:
		r.stats.TimeoutSkips++
	case byNotice:
		r.stats.NoticeSkips++
	case byOverflow:
		r.stats.OverflowSkips++
	}
	r.advance(false)
}

// advance records the outcome for next and moves on.
func (r *Resequencer) advance(delivered bool) {
	r.hist.record(r.next, delivered)
	r.next++
	if r.next%Window == 0 {
		// Evidence bounds are compared in serial arithmetic; drop the ones next has
		// passed before they could alias (2^31 numbers later).
		r.ev.forgetBehind(r.next)
	}
}

// countBehind classifies a packet whose sequence number is already resolved.
func (r *Resequencer) countBehind(seq uint32) {
	switch r.hist.lookup(r.next, seq) {
	case wasDelivered:
		r.stats.Duplicates++
	case wasSkipped:
		r.stats.Late++
		if r.stretch.late(r.now, r.maxHold) {
			r.stats.Stretches++
		}
	default:
		r.stats.Stale++
	}
}

// observe advances the resequencer's clock; it never goes backwards.
func (r *Resequencer) observe(now int64) { r.now = max(r.now, now) }

// nextPow2 returns the smallest power of two ≥ n (n ≥ 1).
func nextPow2(n uint32) uint32 {
	p := uint32(1)
	for p < n {
		p <<= 1
	}
	return p
}
