package handover

import "time"

// The tally finds passed-up packets lost on the host while the session's traffic flows.
//
// A packet the kernel counted and passed up but the host lost (the socket's receive
// buffer was full, a first fragment never reassembled) leaves the kernel's count above
// the daemon's for good, and every handback dies (docs/fastpath-ordering.md, finding
// 4.4). Resync repairs that after a quiet period, which a continuous flow never gives.
//
// The tally needs no pause. With every packet it counts, the kernel notes in rx_order
// which packet that was and how many it had counted before it (Order.LastDiverted,
// Order.DivertedBefore). When a handback dies, the daemon watches for the packet named
// there; when that packet reaches it, the kernel's count before it less the daemon's is
// one sample: the packets counted before it that the daemon has not consumed. Those are
// lost, or still on their way (another CPU, another socket's queue), and a packet
// counted after it but consumed first counts the other way. So one sample says
// little; but a packet still on its way arrives within milliseconds, and one lost
// never does. If every sample over tallyWindow (and at least tallySamples of them)
// shows packets missing, the fewest it showed are lost, and the daemon adds them to
// its consumed count, as Resync does with the kernel's whole count.
//
// If that is wrong (a packet took longer than the window to reach the socket), the
// packet arrives later all the same. While the kernel owns, or while a handback the
// daemon posted may still be accepted, it is dropped (ErrKernelOwns,
// ErrCountedBefore): lost, never delivered twice. While the daemon owns it is counted
// a second time, and the next handback brings the daemon's count down to the kernel's
// (Idle). The SPIN model checks this with the window's assumption broken
// (docs/fastpath-ordering.md, tally-early).

const (
	// tallyWindow is how long every sample must show the same packets missing. A
	// passed-up packet reaches the socket within microseconds and a busy daemon reads
	// it within milliseconds.
	tallyWindow = 200 * time.Millisecond
	// tallySamples is the fewest samples that can show it.
	tallySamples = 8
)

// tally is one session's, kept by its Daemon (and guarded like it).
type tally struct {
	watching bool
	watch    PacketID
	before   uint32    // the kernel's count before the watched packet
	since    time.Time // when the watch began

	samples int
	start   time.Time // the window's first sample
	low     int32     // the fewest missing in the window
}

// watchFor starts watching for the latest packet the kernel counted, unless a watch is
// on.
func (t *tally) watchFor(o Order, now time.Time) {
	if t.watching {
		return
	}
	t.watching, t.watch, t.before, t.since = true, o.LastDiverted, o.DivertedBefore, now
}

// observe is told of every DATA packet the daemon receives, with its consumed count
// before that packet. It returns how many packets to add to that count, or 0.
func (t *tally) observe(id PacketID, consumed uint64, now time.Time) uint64 {
	if !t.watching {
		return 0
	}
	if id != t.watch {
		if now.Sub(t.since) > tallyWindow {
			t.watching = false // the watched packet was lost too, or consumed before the watch began
		}
		return 0
	}
	t.watching = false
	missing := int32(t.before - uint32(consumed)) // serial arithmetic: the counts are compared mod 2^32
	if t.samples == 0 {
		t.start, t.low = now, missing
	}
	t.samples++
	t.low = min(t.low, missing)
	if t.samples < tallySamples || now.Sub(t.start) < tallyWindow {
		return 0
	}
	t.samples = 0
	if t.low <= 0 {
		return 0
	}
	return uint64(t.low)
}

// reset forgets the samples: they were taken against a consumed count that has since
// been corrected.
func (t *tally) reset() { *t = tally{} }
