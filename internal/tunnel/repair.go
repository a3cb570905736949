package tunnel

// Loss repair (docs/architecture.md §3, NACK). A packet a link loses at random (LTE's
// radio, a noisy DSL line) is a loss for the flow it belonged to: the resequencer gives
// its number up as soon as the link's next packet shows the gap (FIFO evidence), and
// TCP cuts its window. On three links with 1 % random loss (the lab's lossy scenario)
// one CUBIC flow got 0.59–0.77 of the links' sum.
//
// So the receiver asks for the packet again. The link sequence numbers show which
// packets a link lost the moment its next packet (or probe) arrives; the receiver sends
// the sender a REPAIR_REQUEST naming them, on its best link. The sender finds the
// packets in its sent log and its kept packets (rescue.go) and sends each again under
// its own global sequence number, flagged as a copy, on its best link. Packets the
// kernel fast path sent come from its log and its ring of kept packets (rescue.go).
// What the sender can no longer send (no longer kept, or too long for the kernel to
// keep) it names in a LOSS_NOTICE.
//
// The receiver does not wait for the repair: it gives the number up as before, so what
// follows the hole is delivered at once, and the repair, about an RTT later, is
// delivered out of order as a late copy (reseq.PushCopy). The flow sees reordering, not
// a loss: its TCP receiver acknowledges what follows the hole with SACKs, so the
// sender's ACK clock keeps running, and when the repair fills the hole the sender finds
// its retransmission spurious (the ACK echoes the original's timestamp, or a D-SACK
// comes for the retransmission) and undoes its window reduction (Linux:
// tcp_try_undo_recovery). Until 2026-12-07 the receiver held the link's evidence back
// for the repair time instead, so that the repair filled the hole in order; that held
// the flow's ACKs for an RTT per loss, which a flow whose window was below the link's
// bandwidth-delay product could not make up (the standby scenario's upload on LTE
// alone), and added 25–30 ms of latency under load on lossy lines (BENCHMARKS.md,
// "Loss repair without the wait").
//
// Only losses that look random are repaired, not a full queue's drops. A link whose
// queue overflows was given more than it carries (a burst, or a rate estimate ahead of
// the link); the loss is the flow's signal to slow down, and a repair, more load on
// the link, would hide it (the lab's standby scenario, without this rule: the scaled
// cable's small downstream queue overflowed 756 times in a run instead of 54–88, and
// 661 of them were sent again). A packet that follows a tail drop waited in a queue as
// long as the queue holds (it joined it right behind the drop); a random loss happens at
// any queue length. This is the idea of the loss differentiation schemes that read the
// one-way delay (Spike, for one): tailDrop, with a budget for what it misses.
//
// Only a daemon without the kernel fast path asks: with it, the daemon sees only the
// packets the kernel hands up, and their link sequence gaps are no losses.

import (
	"time"

	"github.com/aggd/aggd/internal/clock"
	"github.com/aggd/aggd/internal/wire"
)

// maxRepairGap is the longest run of packets a link may lose at once for the receiver
// to ask for them: random loss takes one or two; a longer run is a link dying or a
// burst, which rescue and the loss notice deal with, and repairs for it would only
// come late, load the link, and hide what may be congestion.
const maxRepairGap = 8

// repairMargin is added to the best link's RTT to make the repair time: the request's
// and the repair's jitter, and the sender's work. A variable only so that tests can
// widen it.
var repairMargin = 10 * time.Millisecond

// queuePeak keeps the longest queueing delay (µs, one-way delay above its floor) a
// link's packets showed in the last 5 to 10 seconds, in two windows of peakWindow.
type queuePeak struct {
	cur, prev int32
	since     time.Time // start of the current window
}

const (
	peakWindow = 5 * time.Second
	// minTailQueue: a loss behind less queueing than this is not a tail drop, whatever
	// the peak (a link that never queued has a peak near zero).
	minTailQueue = int32(5000)
)

// note records one packet's queueing delay at now.
func (p *queuePeak) note(queued int32, now time.Time) {
	if age := now.Sub(p.since); age >= peakWindow {
		p.prev, p.cur, p.since = p.cur, 0, now
		if age >= 2*peakWindow { // the window before was empty
			p.prev = 0
		}
	}
	p.cur = max(p.cur, queued)
}

// at returns the recent peak at now.
func (p *queuePeak) at(now time.Time) int32 {
	if now.Sub(p.since) < 2*peakWindow {
		return max(p.cur, p.prev)
	}
	return p.cur
}

// rxGap is what a packet shows of the packets its link lost just before it: how many,
// how long it queued (µs) and the link's recent queueing peak before it.
type rxGap struct {
	lost         uint32
	queued, peak int32
}

// tailDrop reports whether the loss looks like a full queue's: the packet behind it
// queued at least minTailQueue, and either at least 4/5 of the recent peak or longer
// than ceiling (µs; 0: none), the most the bond's AQM lets a link queue. Beyond that
// the link queues what the bond did not mean it to (a burst filling the modem), which
// is where its drops are congestion. The ceiling catches what the peak misses: in the
// lab the packets behind the scaled cable's overflows queued 30–57 ms (its queue holds
// 50), while the recent peak, 65–82 ms, also held transients.
func (g rxGap) tailDrop(ceiling int32) bool {
	if g.queued < minTailQueue {
		return false
	}
	return int64(g.queued)*5 >= int64(g.peak)*4 || (ceiling > 0 && g.queued > ceiling)
}

// Repair budget: a receiver asks for at most repairSharePct % of the packets a link
// delivers (a bucket of repairBurst). Random loss on a bad line is a few per cent;
// where losses run beyond that, a repair would more likely hide a queue overflowing
// again and again (tailDrop's misses) than save a flow from the line's noise, and the
// flows must see them.
const (
	repairSharePct = 3
	repairBurst    = 8
)

// askRepairs sets whether the receiver asks for the link's losses. A link it asks for
// starts with a full budget: a standby link that has carried nothing when the primaries
// die would otherwise have none for the random losses of its first seconds alone, when
// the flow's window grows (in a standby lab run LTE lost a packet 0.4 s after the
// outage, with the budget still empty, and the upload's recovery took 1.44 s).
func (a *rxAccount) askRepairs(on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.repairs = on
	if on {
		a.repairBudget = repairBurst * 100
	}
}

// earnRepair adds one delivered packet's share to the link's repair budget (kept in
// hundredths of a packet, so that it adds up exactly). Caller holds a.mu.
func (a *rxAccount) earnRepair() {
	a.repairBudget = min(a.repairBudget+repairSharePct, repairBurst*100)
}

// spendRepair takes n packets' worth from the link's repair budget if it holds them.
func (a *rxAccount) spendRepair(n uint32) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.repairBudget < n*100 {
		return false
	}
	a.repairBudget -= n * 100
	return true
}

// repairTime is how long after a request the receiver expects its repair: the smoothed
// RTT of the link with the lowest one (the request and the repair go on the best links)
// plus a quarter of it and repairMargin, at most the hold cap. Copies that come within
// it are taken for repairs, not for the peer doubting a link (awaitingRepair). Zero
// when no link has an RTT yet (no request is sent then).
func repairTime(links []*link, maxHold time.Duration) time.Duration {
	best := time.Duration(0)
	for _, l := range links {
		if rtt := l.rtt(); l.isUp() && rtt > 0 && (best == 0 || rtt < best) {
			best = rtt
		}
	}
	if best == 0 {
		return 0
	}
	return min(best+best/4+repairMargin, maxHold)
}

// asksRepairs reports whether this end asks its peer for lost packets: loss repair is
// on, and no kernel fast path hides the link sequence gaps.
func (s *Session) asksRepairs() bool { return s.cfg.LossRepair && s.fp == nil }

// wantsRepair is called for a data packet or probe that showed lost packets on its
// link (gap), and reports whether the caller should ask for them (requestRepair): a
// run short enough, not a full queue's drop, and within the link's repair budget, on a
// link that is up. The resequencer is not told: it gives the numbers up as it would
// without repair, and the repairs come as late copies.
//
// A link that is not up shows no random loss: the first packet of a link coming back
// shows what it had in flight when it went down, which its sender copied or named
// lost long ago (in a standby lab run the CPE asked for the DSL line's four such
// packets 10 s after the outage).
//
// Nor is a loss repaired on a link that has not queued lately (its recent peak under
// minTailQueue): a flow starting up, whose slow start the bond's AQM, with no standing
// queue measured yet, cannot end in time. A random loss is then the flow's first
// signal, and a repair, which TCP undoes its reaction to, kept it doubling: in a SOHO
// lab run an upload's LTE loss 0.16 s into the flow (no queue yet, a peak of 4 ms) was
// repaired, and 0.37 s later the cable's and LTE's buffers overflowed, 112 packets
// lost. A flow that has run for a while has queued on its links (LTE's first losses
// after the standby scenario's failover came at recent peaks of 27–62 ms).
func (s *Session) wantsRepair(l *link, gap rxGap) bool {
	if !l.rx.repairs || s.repairWait.Load() == 0 || !l.isUp() {
		return false
	}
	repair := gap.lost <= maxRepairGap && gap.peak >= minTailQueue && !gap.tailDrop(s.queueCeiling()) &&
		l.rx.spendRepair(gap.lost)
	l.logger().Debug("packets lost", "count", gap.lost, "queued_ms", float64(gap.queued)/1e3,
		"queue_peak_ms", float64(gap.peak)/1e3, "repair", repair)
	return repair
}

// queueCeiling is the most (µs) the bond's AQM lets a link queue, 0 without AQM.
func (s *Session) queueCeiling() int32 {
	if s.cfg.AQMTarget <= 0 {
		return 0
	}
	return int32(max(s.cfg.AQMTarget, s.cfg.AQMMaxTarget) / time.Microsecond)
}

// requestRepair asks the peer to send again the count packets link l lost before link
// sequence number next.
func (s *Session) requestRepair(l *link, next, count uint32) {
	via := s.refuge(nil)
	if via == nil {
		return
	}
	body := wire.RepairRequestBody{Counter: s.txCtrl.Add(1), Gaps: []wire.LinkSeqRange{
		{LinkID: l.spec.ID, Count: uint16(count), Start: next - count},
	}}
	s.repairAsked.Store(clock.Nanos())
	s.sendControl(via, wire.TypeRepairRequest, 0, 0, body.Append(nil))
	s.pm.repairRequested.Add(float64(count))
}

// awaitingRepair reports whether a repair the receiver asked for may still come at
// nanos. Repairs are flagged as copies, but unlike other copies they do not mean that
// the peer doubts one of its links (peerCopied).
func (s *Session) awaitingRepair(nanos int64) bool {
	at := s.repairAsked.Load()
	return at != 0 && nanos-at <= s.repairWait.Load()
}

// maxRepairsPerRequest bounds what one REPAIR_REQUEST makes the sender send again
// (its ranges may name 255 × 8 packets): a receiver asks for one gap at a time.
const maxRepairsPerRequest = 64

// trimGaps caps each range at maxRepairGap packets and all of them together at
// maxRepairsPerRequest.
func trimGaps(gaps []wire.LinkSeqRange) []wire.LinkSeqRange {
	out := make([]wire.LinkSeqRange, 0, len(gaps))
	left := uint16(maxRepairsPerRequest)
	for _, g := range gaps {
		if left == 0 {
			break
		}
		g.Count = min(g.Count, maxRepairGap, left)
		left -= g.Count
		out = append(out, g)
	}
	return out
}

// onRepairRequest sends again what the peer asks for, on the best link, and names in a
// loss notice what it cannot send again.
func (s *Session) onRepairRequest(body wire.RepairRequestBody) {
	gaps := trimGaps(body.Gaps)
	k := s.keys.sending()
	via := s.refuge(nil)
	var gone []uint32
	resent := 0
	now := clock.Nanos()
	kernel, kernelPkts := s.kernelSent(gaps)
	// resend sends the logged packet e again if it is kept, or else names it lost.
	resend := func(e SentEntry) {
		pkt := s.kept.get(e.Seq)
		if pkt == nil || k == nil || via == nil {
			if !e.Copy { // a copy's original may still arrive
				gone = append(gone, e.Seq)
			}
			return
		}
		s.sched.Charge(via.spec.ID, now, len(pkt)+28)
		if _, ok := s.sendDataOn(via.spec.ID, k, e.Seq, wire.FlagDuplicate, true, now, pkt); ok {
			resent++
		}
	}
	s.txMu.Lock()
	for _, g := range gaps {
		l := s.link(g.LinkID)
		if l == nil {
			continue
		}
		for i := range uint32(g.Count) {
			if e, ok := l.sent.find(g.Start + i); ok { // else forgotten: the peer's wait ends it
				resend(e)
			}
		}
	}
	for i, e := range kernel {
		if kernelPkts[i] != nil {
			s.kept.adopt(e.Seq, kernelPkts[i], e.link) // kept with the daemon's own, unless a newer one took its slot
		}
		resend(e.SentEntry)
	}
	s.txMu.Unlock()
	if len(gone) > 0 {
		s.noticeLost(gone)
	}
	s.pm.repairResent.Add(float64(resent))
	s.pm.repairUnavailable.Add(float64(len(gone)))
}

// kernelSent returns what the kernel fast path sent (nothing without it) of the
// packets in gaps (trimmed), with each packet it still keeps (kernelKept).
func (s *Session) kernelSent(gaps []wire.LinkSeqRange) ([]kernelEntry, [][]byte) {
	if s.fp == nil {
		return nil, nil
	}
	var out []kernelEntry
	var sent []SentEntry
	for _, g := range gaps {
		got, _ := s.fp.SentOn(g.LinkID, g.Start-1, g.Start+uint32(g.Count)-1)
		for _, e := range got {
			out = append(out, kernelEntry{e, g.LinkID})
		}
		sent = append(sent, got...)
	}
	return out, s.kernelKept(sent)
}

// kernelEntry is a packet the kernel logged, and the link it logged it on.
type kernelEntry struct {
	SentEntry
	link uint8
}
