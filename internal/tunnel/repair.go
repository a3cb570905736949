package tunnel

// Loss repair (docs/architecture.md §3, NACK). A packet a link loses at random (LTE's
// radio, a noisy DSL line) is a loss for the flow it belonged to: the resequencer gives
// its number up as soon as the link's next packet shows the gap (FIFO evidence), and
// TCP halves its window. On a lossy link left alone with a flow (the lab's standby
// scenario: the primaries dead, LTE with 0.3 % loss carrying the upload) that kept the
// flow at 0.81–0.96 of what the link gave it alone.
//
// So the receiver asks for the packet again. The link sequence numbers show which
// packets a link lost the moment its next packet arrives; the receiver sends the
// sender a REPAIR_REQUEST naming them, on its best link, and holds the link's evidence
// back for the repair time (AwaitRepair), about one RTT of the best link. The sender
// finds the packets in its sent log and its kept packets (rescue.go) and sends each
// again under its own global sequence number, flagged as a copy, on its best link: it
// fills the hole, and TCP sees a delay of about one RTT instead of a loss. What the
// sender can no longer send (the kernel fast path sent it and kept no copy, or the
// session no longer keeps it) it names in a LOSS_NOTICE, so that the receiver gives it
// up at once instead of at the end of its wait.
//
// Only losses that look random are repaired, not a full queue's drops. A link whose
// queue overflows was given more than it carries (a burst, or a rate estimate ahead of
// the link); the loss is the flow's signal to slow down, and a repair, more load on
// the link, would hide it (the lab's standby scenario, before this rule: the scaled
// cable's 8-packet downstream queue overflowed 756 times in a run, and 661 of them were
// sent again). A packet that follows a tail drop waited in a queue as long as the link's
// longest recent one (it joined the queue right behind the drop); a random loss happens
// at any queue length. This is the idea of the loss differentiation schemes that read
// the one-way delay (Spike, for one), with the threshold near the recent peak.
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
// burst, which rescue and the loss notice deal with, and a request for it would only
// hold everything behind it for the repair time.
const maxRepairGap = 8

// repairMargin is added to the best link's RTT to make the repair time: the request's
// and the repair's jitter, and the sender's work.
const repairMargin = 10 * time.Millisecond

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

// tailDrop reports whether a loss just before a packet that queued for queued µs looks
// like a full queue's: that packet queued at least 4/5 of the recent peak (and at
// least minTailQueue).
func (p *queuePeak) tailDrop(queued int32, now time.Time) bool {
	peak := p.cur
	if now.Sub(p.since) < 2*peakWindow {
		peak = max(peak, p.prev)
	}
	return queued >= minTailQueue && int64(queued)*5 >= int64(peak)*4
}

// repairTime is how long the receiver waits for a repair: the smoothed RTT of the link
// with the lowest one (the request and the repair go on the best links) plus a quarter
// of it and repairMargin, at most the hold cap. Zero when no link has an RTT yet (no
// request is sent then).
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

// awaitRepair is called for a data packet that showed lost packets on its link (lost of
// them just before linkSeq): it holds the link's evidence back for the repair time and
// reports whether the caller should send a request (requestRepair) once it has pushed
// the packet. Caller holds rxMu.
func (s *Session) awaitRepair(l *link, lost uint32, nanos int64) bool {
	wait := s.repairWait.Load()
	if !s.cfg.LossRepair || s.fp != nil || wait == 0 || lost > maxRepairGap {
		return false
	}
	s.reseq.AwaitRepair(l.spec.ID, nanos+wait)
	return true
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
	s.m.RepairRequested.WithLabelValues(s.cfg.Peer).Add(float64(count))
}

// awaitingRepair reports whether a repair the receiver asked for may still come at
// nanos. Repairs are flagged as copies, but unlike other copies they do not mean that
// the peer doubts one of its links (peerCopied).
func (s *Session) awaitingRepair(nanos int64) bool {
	at := s.repairAsked.Load()
	return at != 0 && nanos-at <= s.repairWait.Load()
}

// onRepairRequest sends again what the peer asks for, on the best link, and names in a
// loss notice what it cannot send again.
func (s *Session) onRepairRequest(body wire.RepairRequestBody) {
	k := s.keys.sending()
	via := s.refuge(nil)
	var gone []uint32
	resent := 0
	now := clock.Nanos()
	s.txMu.Lock()
	for _, g := range body.Gaps {
		l := s.link(g.LinkID)
		if l == nil {
			continue
		}
		for i := range uint32(min(g.Count, maxRepairGap)) {
			e, ok := l.sent.find(g.Start + i)
			if !ok {
				continue // sent with a copy (not logged), or forgotten: the peer's wait ends it
			}
			pkt := s.kept.get(e.Seq)
			if pkt == nil || k == nil || via == nil {
				if !e.Copy { // a copy's original may still arrive
					gone = append(gone, e.Seq)
				}
				continue
			}
			s.sched.Charge(via.spec.ID, now, len(pkt)+28)
			if linkSeq, ok := s.sendDataOn(via.spec.ID, k, e.Seq, wire.FlagDuplicate, true, now, pkt); ok {
				via.sent.record(linkSeq, e.Seq, true) // as rescue logs its copies
				resent++
			}
		}
	}
	s.txMu.Unlock()
	gone = append(gone, s.kernelSent(body.Gaps)...)
	if len(gone) > 0 {
		s.noticeLost(gone)
	}
	s.m.RepairResent.WithLabelValues(s.cfg.Peer).Add(float64(resent))
	s.m.RepairUnavailable.WithLabelValues(s.cfg.Peer).Add(float64(len(gone)))
}

// kernelSent returns the global sequence numbers of the packets in gaps that the kernel
// fast path sent (none without it): it keeps no copies, so they cannot be sent again.
func (s *Session) kernelSent(gaps []wire.LinkSeqRange) []uint32 {
	if s.fp == nil {
		return nil
	}
	var seqs []uint32
	for _, g := range gaps {
		n := uint32(min(g.Count, maxRepairGap))
		sent, _ := s.fp.SentOn(g.LinkID, g.Start-1, g.Start+n-1)
		seqs = append(seqs, seqsOf(sent)...)
	}
	return seqs
}
