// Package handover is the daemon's side of the receive ordering handover
// between the kernel fast path and the daemon's resequencer
// (docs/architecture.md §4; the protocol is written down at struct
// aggd_fp_rx_order in bpf/include/aggd_fastpath.h, and the kernel's side is
// bpf/include/aggd_order.h).
//
// One session's ordering has one owner at a time. While the kernel (BPF)
// owns it, in-order packets go straight into agg0 and the daemon's
// resequencer is empty and idle. On a gap the kernel hands the ordering over
// at its next expected sequence number and passes every later packet up
// (counting them); the daemon resequences from there. When the daemon's
// resequencer is empty it posts a handback stamped with the number of
// packets it has consumed; the kernel accepts it only if that equals its own
// count of packets passed up, that is, if no packet is still on its way to
// the daemon. The daemon learns the outcome from the next DATA packet that
// reaches it: if the kernel's handover epoch moved, the handback was
// accepted and the kernel has since handed over again (the resequencer must
// restart at the new handover point); if not, the request died and the
// daemon still owns.
//
// A packet the kernel passed up that the host lost leaves the two counts apart;
// Resync (after a quiet period) and the tally (while traffic flows, tally.go)
// bring them together again.
//
// This package has no dependencies: internal/bpf implements OrderMap on the
// kernel's map (and re-exports Order), tests implement it in memory.
package handover

import (
	"errors"
	"fmt"
	"time"
)

// Owner says who orders a session's received DATA packets.
type Owner uint32

const (
	// OwnerBPF: the kernel delivers in-order packets itself
	// (AGGD_FP_OWNER_BPF).
	OwnerBPF Owner = 0
	// OwnerDaemon: the kernel passes every DATA packet up to the daemon
	// (AGGD_FP_OWNER_DAEMON).
	OwnerDaemon Owner = 1
)

func (o Owner) String() string {
	switch o {
	case OwnerBPF:
		return "bpf"
	case OwnerDaemon:
		return "daemon"
	}
	return fmt.Sprintf("owner(%d)", uint32(o))
}

// Order is a session's ordering state as the kernel keeps it (struct
// aggd_fp_rx_order without its lock).
type Order struct {
	Owner Owner
	// Next is the next expected sequence number while the kernel owns,
	// and where it handed over while the daemon owns.
	Next uint32
	// Epoch counts the kernel's handovers to the daemon.
	Epoch uint32
	// ReqValid, ReqStamp and ReqNext are the daemon's posted handback:
	// the low 32 bits of its consumed count and where the kernel
	// continues if it accepts.
	ReqValid bool
	ReqStamp uint32
	ReqNext  uint32
	// LastDiverted is the latest DATA packet the kernel passed up, and
	// DivertedBefore the low 32 bits of its count before that packet (the
	// tally's reference, tally.go). The kernel writes them; the daemon
	// writes back what it read.
	LastDiverted   PacketID
	DivertedBefore uint32
	// ReqSkipped goes with the handback: bit i set means the daemon gave up
	// ReqNext-1-i and has not delivered it. On acceptance the kernel takes it
	// as Skipped, below SkippedEnd = ReqNext, and while it owns it delivers a
	// redundant copy of such a number when one comes, once, clearing its bit
	// (late copies, aggd_fastpath.h).
	ReqSkipped uint64
	Skipped    uint64
	SkippedEnd uint32
}

// PacketID names a DATA packet as the kernel and the daemon both see it: the link it
// came on and its link sequence number.
type PacketID struct {
	Link    uint8
	LinkSeq uint32
}

// OrderMap reads and writes a session's Order atomically with respect to
// the kernel (under the value's spin lock: BPF_F_LOCK), and reads how many
// DATA packets the kernel passed up for the session (rx_divert).
type OrderMap interface {
	ReadOrder(index uint32) (Order, error)
	WriteOrder(index uint32, o Order) error
	Diverted(index uint32) (uint64, error)
}

// ErrKernelOwns is returned by OnData for a DATA packet that reached the
// daemon while the kernel owns the ordering without having handed it over:
// one that arrived on an interface without the receive program, or a stray
// copy. The kernel did not count it and may deliver the same sequence
// number itself, so the caller must drop the packet instead of
// resequencing it.
var ErrKernelOwns = errors.New("a DATA packet reached the daemon while the kernel owns the ordering; " +
	"dropped (attach the receive program to every interface tunnel packets arrive on)")

// ErrCountedBefore is returned by OnData for a DATA packet that reached the daemon
// while its handback was pending and no packet had judged it yet: the kernel counted
// this one before the handback was posted, so the daemon's count already held it when
// it took the stamp, which it can only have done by taking the packet for lost (a
// tally or a resync whose assumption failed: the packet took longer than allowed to
// reach the daemon). The kernel may take the ordering at the stamp and deliver from
// there, so the caller must drop the packet, as it would a stray: it is lost, never
// delivered twice.
var ErrCountedBefore = errors.New("a DATA packet reached the daemon after it had been counted as lost on the host; dropped")

// Stats count the daemon's handbacks.
type Stats struct {
	Posted   uint64 // handback requests written
	Accepted uint64 // of those, accepted by the kernel (learnt when it handed over again)
	Died     uint64 // of those, never acceptable: a packet passed up after the stamp was taken
	Strays   uint64 // DATA packets that arrived while the kernel owned (ErrKernelOwns)
	Late     uint64 // DATA packets that arrived after they were counted as lost (ErrCountedBefore)
	// Overcounts: handbacks before which the daemon's count was above the kernel's
	// (a packet counted as lost arrived after all, while the daemon owned), and came
	// down to it.
	Overcounts uint64
	Resyncs    uint64 // the consumed count set to the kernel's after a quiet period (Resync)
	Tallies    uint64 // the consumed count corrected while traffic flowed (tally.go)
	// TallyLost is what the tallies added: passed-up packets lost on the host.
	TallyLost uint64
}

// Daemon is one session's handover state on the daemon's side. It is not
// safe for concurrent use: the caller serialises it with the lock that
// guards the session's resequencer (both must change together).
type Daemon struct {
	m     OrderMap
	index uint32

	consumed uint64 // DATA packets received that the kernel passed up
	posted   bool   // a handback is posted and its outcome not yet known
	postedAt uint64 // consumed when the last handback was posted
	ever     bool   // a handback was ever posted
	epoch    uint32 // the kernel's epoch when the pending handback was posted
	tally    tally
	// The kernel's divert count as Resync last read it while it was not the daemon's,
	// and since when it has stood there (zero: none read yet).
	resyncCount uint64
	resyncSince time.Time

	stats Stats
}

// New returns the handover state of the session with receive index index,
// whose ordering the daemon owns (the kernel's entry was just created with
// owner daemon and epoch 0, or the daemon is adopting a session it owns).
func New(m OrderMap, index uint32) *Daemon {
	return &Daemon{m: m, index: index}
}

// OnData is called for every DATA packet of the session the daemon receives
// (once its header and body passed the wire checks), before it goes into the
// resequencer, with the packet's link and link sequence number and the time.
// If a handback is pending, it asks the kernel what became of it: reset
// reports that the kernel accepted it and has handed over again at next; the
// caller must then Restart its resequencer (empty since the handback) at
// next, and resequence this packet from there.
//
// err == ErrKernelOwns: the kernel owns the ordering and did not pass this
// packet up; err == ErrCountedBefore: the daemon had counted it as lost and
// its handback is not yet judged. The caller must drop it. Other errors (the
// kernel's state could not be read) leave the handback pending; the caller
// resequences the packet as usual, and the next packet asks again.
func (d *Daemon) OnData(id PacketID, now time.Time) (reset bool, next uint32, err error) {
	if !d.posted {
		d.consume(id, now)
		return false, 0, nil
	}
	// The count before the ordering state (as Resync does): if the state
	// shows the request neither accepted nor handed over, the count tells
	// whether a packet has judged it.
	count, err := d.m.Diverted(d.index)
	if err != nil {
		d.consume(id, now)
		return false, 0, fmt.Errorf("session %#x: reading the kernel's divert count: %w", d.index, err)
	}
	o, err := d.m.ReadOrder(d.index)
	if err != nil {
		d.consume(id, now)
		return false, 0, fmt.Errorf("session %#x: reading the kernel's ordering state: %w", d.index, err)
	}
	switch {
	case o.Epoch != d.epoch && o.Owner == OwnerDaemon:
		// Accepted, and handed over again: this packet was passed up by
		// that handover or after it.
		d.consume(id, now)
		d.posted = false
		d.stats.Accepted++
		return true, o.Next, nil
	case o.Epoch != d.epoch:
		// Impossible: a second acceptance needs a second handback.
		d.consume(id, now)
		return false, 0, fmt.Errorf("session %#x: the kernel owns the ordering in epoch %d, "+
			"but the daemon posted in epoch %d: the ordering state was changed by someone else (restart aggd)",
			d.index, o.Epoch, d.epoch)
	case o.Owner == OwnerDaemon && uint32(count) == uint32(d.postedAt):
		// Nothing was counted since the stamp was taken (up to the count's
		// read; nothing was accepted up to the state's): no packet has
		// judged the request, and it may still be accepted. This packet
		// was counted before the stamp, and the stamp already holds it.
		d.stats.Late++
		return false, 0, ErrCountedBefore
	case o.Owner == OwnerDaemon:
		// The request died: this packet, or an earlier one, was passed up
		// after the stamp was taken, so the kernel's count is beyond it
		// for good. The daemon owns; it posts again when it is empty.
		// The tally watches for the packet the kernel counted last (it
		// may be this one) to tell whether one counted was lost.
		d.tally.watchFor(o, now)
		d.consume(id, now)
		d.posted = false
		d.stats.Died++
		return false, 0, nil
	default:
		// The kernel accepted and still owns: it did not pass this packet
		// up (it hands over before it passes anything up).
		d.stats.Strays++
		return false, 0, ErrKernelOwns
	}
}

// consume counts a DATA packet the kernel passed up, after the tally had its look at
// the count before it.
func (d *Daemon) consume(id PacketID, now time.Time) {
	if lost := d.tally.observe(id, d.consumed, now); lost > 0 {
		d.consumed += lost
		d.tally.reset()
		d.stats.Tallies++
		d.stats.TallyLost += lost
	}
	d.consumed++
}

// Idle is called whenever the daemon has processed packets or timers, with
// its resequencer's next expected sequence number, the numbers below it that it
// gave up without delivering them (bit i: next-1-i; Order.ReqSkipped) and whether
// it holds nothing. If it holds nothing, no handback is pending and a packet was
// consumed since the last one (or none was ever posted), it posts a
// handback: the kernel may take over at next once it has passed up no more
// than the daemon consumed.
func (d *Daemon) Idle(next uint32, skipped uint64, empty bool) error {
	if !empty || d.posted || (d.ever && d.consumed == d.postedAt) {
		return nil
	}
	// The count first, as Resync does. A stamp above it could match later, once the
	// kernel's count has grown to it, after the daemon has given the request up (on
	// a packet, or in Resync): the kernel would take the ordering the daemon still
	// holds. A count of the daemon's own above the kernel's (a tally took a packet
	// for lost, and it came after all while the daemon owned) comes down to it.
	count, err := d.m.Diverted(d.index)
	if err != nil {
		return fmt.Errorf("session %#x: reading the kernel's divert count: %w", d.index, err)
	}
	if d.consumed > count {
		d.consumed = count
		d.stats.Overcounts++
	}
	o, err := d.m.ReadOrder(d.index)
	if err != nil {
		return fmt.Errorf("session %#x: reading the kernel's ordering state: %w", d.index, err)
	}
	if o.Owner != OwnerDaemon {
		return fmt.Errorf("session %#x: the kernel owns the ordering, but no handback is pending: "+
			"the ordering state was changed by someone else (restart aggd)", d.index)
	}
	// While the daemon owns, the kernel changes the value only to accept a
	// handback, and no live one is posted: writing back what was read
	// loses nothing.
	o.ReqValid, o.ReqStamp, o.ReqNext, o.ReqSkipped = true, uint32(d.consumed), next, skipped
	if err := d.m.WriteOrder(d.index, o); err != nil {
		return fmt.Errorf("session %#x: posting a handback: %w", d.index, err)
	}
	d.posted, d.ever, d.postedAt, d.epoch = true, true, d.consumed, o.Epoch
	d.stats.Posted++
	return nil
}

// Resync recovers from a packet the kernel passed up that never reached the
// daemon (its socket's receive buffer was full, a fragment never
// reassembled). Such a packet leaves the kernel's count above the daemon's
// for good, so every handback would be stale and the session would stay in
// userspace (docs/fastpath-ordering.md, finding 4.4). The caller must call
// it only while its resequencer is empty and once no DATA packet of the
// session has reached it for much longer than a passed-up packet takes to
// reach the socket: then nothing the kernel counted is still on its way,
// and what is missing was lost on the host. Resync adopts the kernel's
// count as consumed, so the next Idle posts a handback that can match.
//
// The daemon's quiet says nothing of what the kernel passed up moments ago: while it
// delivered a flow itself, the daemon heard nothing for seconds, and a packet it
// passes up at the next gap is quiet's end, not a loss, until it has had its time to
// arrive. So Resync also waits until the kernel's count has stood still for quiet
// (read at each call, now the time of the call): the first call that sees a new count
// only notes it. (An end-to-end test caught the tick in the millisecond between such a
// packet and the next: it resynchronised at once, and would have dropped that packet
// as late had the host not lost it.)
//
// reset reports, as OnData does, that the pending handback was accepted and
// the kernel has since handed over again at next (the passed-up packets of
// that handover were the ones lost): the caller must Restart its
// resequencer at next. If the quiet-period assumption was wrong (a counted
// packet was still queued), that packet later reaches a daemon that has
// already counted it: OnData drops it while the kernel owns or a handback
// is unjudged, and Idle takes back a second count. At worst it is lost,
// never delivered twice (the SPIN model's resync-early run). Traffic that
// never pauses gives no quiet period; the tally (tally.go) covers that.
func (d *Daemon) Resync(now time.Time, quiet time.Duration) (reset bool, next uint32, err error) {
	if !d.posted {
		return false, 0, nil // Idle posts first; a posted request is what a resync replaces
	}
	// The count before the ordering state: a packet passed up between the two reads is
	// then counted by the daemon when it arrives, exactly as by the kernel.
	count, err := d.m.Diverted(d.index)
	if err != nil {
		return false, 0, fmt.Errorf("session %#x: reading the kernel's divert count: %w", d.index, err)
	}
	if count == d.consumed {
		return false, 0, nil // the request can match: the next packet hands the ordering back
	}
	if d.resyncSince.IsZero() || count != d.resyncCount {
		d.resyncCount, d.resyncSince = count, now
		return false, 0, nil // just passed up: it may still be on its way
	}
	if now.Sub(d.resyncSince) < quiet {
		return false, 0, nil
	}
	o, err := d.m.ReadOrder(d.index)
	if err != nil {
		return false, 0, fmt.Errorf("session %#x: reading the kernel's ordering state: %w", d.index, err)
	}
	if o.Owner != OwnerDaemon {
		// Accepted means stamp == count, and the kernel counts nothing while it owns.
		return false, 0, fmt.Errorf("session %#x: the kernel owns the ordering although its count (%d) "+
			"is not the daemon's (%d): the ordering state was changed by someone else (restart aggd)",
			d.index, count, d.consumed)
	}
	if o.Epoch != d.epoch {
		reset, next = true, o.Next
		d.stats.Accepted++
	}
	d.consumed, d.posted = count, false
	d.tally.reset()
	d.stats.Resyncs++
	return reset, next, nil
}

// Pending reports whether a handback is posted and its outcome not yet
// known (the kernel may own the ordering).
func (d *Daemon) Pending() bool { return d.posted }

// Consumed returns the number of DATA packets the daemon consumed.
func (d *Daemon) Consumed() uint64 { return d.consumed }

// Stats returns the handback counters.
func (d *Daemon) Stats() Stats { return d.stats }
