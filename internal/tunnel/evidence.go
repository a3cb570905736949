package tunnel

import (
	"github.com/aggd/aggd/internal/clock"
)

// The resequencer skips a gap without waiting for its timer once every link it knows
// of has shown a sequence number beyond it (FIFO evidence, package reseq). A link
// found down shows none again, and while it counted every gap waited for the hold
// timer: in the lab's standby scenario, with both primaries dead and the backup alone
// carrying the flow, each packet LTE lost held the flow for 200 ms (the hold with
// one active link), and TCP reached 1.4 of the backup's 2.1 Mbit/s. So a link found
// down leaves the set, and comes back into it with the first packet heard on it
// (the peer's probe, which precedes any data the peer sends there once it finds the
// link up again), before that packet reaches the resequencer. What a dead link still
// had on its way when it died is lost, or arrives late and is dropped as such; its
// copies (rescue.go) are delivered even then.

// evidenceLinks lists the links whose evidence the resequencer waits for.
func evidenceLinks(links map[uint8]*link) []uint8 {
	ids := make([]uint8, 0, len(links))
	for id, l := range links {
		if !l.noEvidence.Load() {
			ids = append(ids, id)
		}
	}
	return ids
}

// linkDown does what a link that just went down needs, whatever found it down (its
// silence, the peer's reports, its uplink going offline): the resequencer stops waiting
// for its evidence, what it had in flight and was not copied yet is copied to another
// link (rescue.go), and its share moves and its lost packets are named to the peer
// (lossnotice.go). It returns how many sequence numbers the loss notices name.
//
// The notice goes in two parts on the best refuge. The numbers no copy speaks for go
// first, ahead of the copies: nothing else fills their holes, and behind the copies
// they were often lost (the burst overflows a slow refuge's queue: in the e2e test of
// a carrier lost under a 90-Mbit/s flow, 153 copies to a 10-Mbit/s link with 50 kB of
// queue, and the notice after them was lost in 4 runs of 5). The numbers being copied
// are named after their copies, so that a copy that arrives fills its hole in order.
func (s *Session) linkDown(l *link) int {
	// Out of the schedule first. The daemon's scheduler takes the change at its next
	// packet; the kernel stripes by itself, so its schedule is rewritten now, before
	// what it sent on l is read (planRescue, lostOn). Left to the tick's refresh, it
	// went on for up to a probe interval (44 packets of a 10-Mbit/s flow after a
	// carrier loss in the e2e test), lost with no notice, and owed when the link came
	// back.
	if s.fp != nil {
		s.refreshSchedule()
	} else {
		s.schedDue.Store(true)
	}
	l.noEvidence.Store(true)
	s.resetEvidence()
	rescue := s.planRescue(l)
	lost := s.lostOn(l)
	copying := make(map[uint32]bool, len(rescue.seqs))
	for _, seq := range rescue.seqs {
		copying[seq] = true
	}
	copied, uncopied := splitSeqs(lost, func(seq uint32) bool { return copying[seq] })
	s.noticeLost(uncopied)
	s.sendRescue(rescue)
	s.noticeLost(copied)
	return len(lost)
}

// splitSeqs splits seqs, in their order, into those in and those not in a set.
func splitSeqs(seqs []uint32, in func(uint32) bool) (yes, no []uint32) {
	for _, seq := range seqs {
		if in(seq) {
			yes = append(yes, seq)
		} else {
			no = append(no, seq)
		}
	}
	return yes, no
}

// evidenceBack puts link l back into the set if it was out: called for every packet
// heard on it, so the common case is one atomic load.
func (s *Session) evidenceBack(l *link) {
	if l.noEvidence.Load() && l.noEvidence.CompareAndSwap(true, false) {
		s.resetEvidence()
	}
}

func (s *Session) resetEvidence() {
	s.linksMu.RLock()
	ids := evidenceLinks(s.links)
	s.linksMu.RUnlock()
	nanos := clock.Nanos()
	s.rxMu.Lock()
	defer s.rxMu.Unlock()
	s.reseq.SetLinks(ids)
	if !s.kernelMayOwn() { // as for a probe's watermark: the kernel may own the ordering
		s.reseq.Expire(nanos, s.deliver)
	}
	s.armHoldTimer(nanos)
}
