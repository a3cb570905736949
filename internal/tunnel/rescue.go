package tunnel

// Rescue (docs/architecture.md §5, reassignment). A suspect link's packets get a copy
// on another link from the moment it is suspect; rescue gives the same to the data
// packets it still had in flight then, those the peer has not reported: each is sent
// again, under its own sequence number and marked as a copy, on the two best other
// links. A link found down without having been suspect gets the same just before its
// loss notice names those numbers.
//
// Why: when a link dies under a TCP flow, the packets it had in flight are its
// flow's holes. The receiver's resequencer holds what comes behind a hole until the
// links' evidence, a loss notice or its hold timer gives it up, and then TCP has to
// find the loss itself: by its retransmission timer (200 ms plus the RTT at the
// least) when the flow stalled, or by fast recovery; either way CUBIC then needs about
// a second to grow its window back (the lab's standby scenario: both primaries dead
// under one upstream flow, recovery above the 1-s target in six runs of eight). A link
// is suspect 0.1–0.2 s after it dies. A copy sent then on a live link reaches the
// receiver while the hole is still held (the dead link is still in its evidence set,
// and nothing is held behind a stalled flow's hole for the hold timer to give up): the
// hole is filled, everything is delivered in order, and TCP sees a delay, not a loss.
//
// Why the same sequence numbers: a copy of a packet that arrived after all (the link
// was alive) is dropped as a duplicate, so the end host never sees a packet twice
// because of a rescue. A copy that comes after the receiver gave its number up is
// delivered late, out of order (reseq.PushCopy, or the kernel's receive program when
// the daemon has handed the ordering back to it since: late_copy, bpf/include/
// aggd_order.h): better for TCP than never. (New
// numbers, tried first, put every rescued packet behind all that followed its hole.)
//
// With the kernel fast path, the kernel keeps the latest packets it sent in a ring of
// its own (tx_kept in bpf/tc_tx.c) and logs those it sent without a copy per link
// (tx_sent_log); a rescue reads the link's log and takes the packets from the ring into
// the daemon's (kernelInFlight), and copies them as it copies the daemon's. Before,
// the loss notice alone spoke for them, and a flow whose link died under it waited for
// its retransmission timer (the lab's standby scenario with --fast-path: 2.3 s).

import (
	"slices"
	"time"

	"github.com/aggd/aggd/internal/clock"
	"github.com/aggd/aggd/internal/wire"
)

// rescueSlots is how many of the latest data packets the session keeps for a rescue
// (one slot per global sequence number, copied or not): more than a home bond has in
// flight on one link (a 50-Mbit/s link with 60 ms of RTT carries 250 full-size
// packets), and at most about 400 kB per session. Older ones are not rescued: TCP recovers them as it would without.
const rescueSlots = 256

// rescueRefuges is how many other links each packet in flight is copied to (rescue).
const rescueRefuges = 2

// keptPacket is one packet kept for a rescue, header included (nil pkt: none yet),
// and the links it went out on, copies included.
type keptPacket struct {
	seq uint32
	pkt []byte
	on  linkSet
}

// linkSet is a set of link ids.
type linkSet [4]uint64

func (ls *linkSet) add(id uint8)      { ls[id/64] |= 1 << (id % 64) }
func (ls *linkSet) has(id uint8) bool { return ls[id/64]&(1<<(id%64)) != 0 }

// keptPackets is the session's ring of packets kept for a rescue, indexed by global
// sequence number. Guarded by the session's txMu.
type keptPackets struct {
	ring []keptPacket // allocated on first use
}

// keep copies the packet sent with global sequence number seq.
func (k *keptPackets) keep(seq uint32, pkt []byte) {
	e := k.slot(seq)
	e.seq, e.pkt, e.on = seq, append(e.pkt[:0], pkt...), linkSet{}
}

// slot returns the slot the packet sent with seq goes in, whatever it holds now.
func (k *keptPackets) slot(seq uint32) *keptPacket {
	if k.ring == nil {
		k.ring = make([]keptPacket, rescueSlots)
	}
	return &k.ring[seq%rescueSlots]
}

// sentOn notes that the packet sent with seq went out on link id, if it is kept.
func (k *keptPackets) sentOn(seq uint32, id uint8) {
	if e := k.entry(seq); e != nil {
		e.on.add(id)
	}
}

// adopt keeps a packet the kernel fast path sent with seq on link id (pkt with room for
// the header in front, as keep copies it), unless its slot holds a newer packet, and
// tells whether it is kept now.
func (k *keptPackets) adopt(seq uint32, pkt []byte, id uint8) bool {
	if e := k.entry(seq); e != nil {
		e.on.add(id)
		return true
	}
	e := k.slot(seq)
	if e.pkt != nil && !wire.SeqAfter(seq, e.seq) {
		return false // a newer packet took the slot
	}
	e.seq, e.pkt, e.on = seq, pkt, linkSet{}
	e.on.add(id)
	return true
}

// wentOn tells whether the packet sent with seq is kept and went out on link id.
func (k *keptPackets) wentOn(seq uint32, id uint8) bool {
	e := k.entry(seq)
	return e != nil && e.on.has(id)
}

// get returns the kept packet sent with seq, or nil if it is no longer kept. Sending it
// rewrites its header in place, as every send does.
func (k *keptPackets) get(seq uint32) []byte {
	if e := k.entry(seq); e != nil {
		return e.pkt
	}
	return nil
}

// entry returns the slot that keeps the packet sent with seq, or nil if none does.
func (k *keptPackets) entry(seq uint32) *keptPacket {
	if k.ring == nil {
		return nil
	}
	if e := &k.ring[seq%rescueSlots]; e.pkt != nil && e.seq == seq {
		return e
	}
	return nil
}

// rescue copies the data packets link l had in flight (the logged ones sent after
// the peer's last report, and after l's last rescue, copies from other links
// included) to the best two refuge links (refuges), under their own sequence numbers.
// It returns how many packets it copied.
//
// Two, because links die together (one power cut, one street cabinet, the lab's
// standby scenario), though rarely at the same instant: the healthiest other link may
// be the next to go, and a copy lost with it leaves the flow to its retransmission
// timer. The second goes even to a link that is not healthy (no answer to its last
// probe yet, or owing), though not to a suspect one: when the primaries die together,
// the healthiest other link may be the other dying primary, and the backup behind it
// is then the one whose copy arrives (the lab's standby scenario once copied a dying
// cable's packets only to the dying DSL, and 100 ms later on to LTE, where a 1-s stall
// followed). The copies are also logged on the links they went on, so the rescue of
// such a link copies them again. They are a few packets, and only when a link goes
// into doubt. None goes where the packet went already: when the primaries die
// together each one's rescue holds the other's copies, and the backup, which already
// carries them, has a few hundred milliseconds of packets to pass then (a standby lab
// run copied 52 packets to its 2-Mbit/s LTE link in 0.2 s, most of them twice; the
// queue they made, 67 ms, drew an AQM drop).
//
// Nor does a packet that already went on a healthy refuge get any copy: a suspect
// link's packets each have their duplicate on another link, and when the link is then
// found down its rescue copied all it carried while suspect to the refuge each had not
// been on. In the lab's failover scenario (three 1.5-Mbit/s links, one dies) that was
// 22-30 packets at once onto the two live links: 3.85 Mbit/s on one of them for 0.1 s,
// and 10-13 consecutive packets really lost (BENCHMARKS.md, "What the failover's
// resends are"). A copy on a link that is itself in doubt, or dying unseen (not
// healthy: owing, or a probe overdue), still gets its copies.
func (s *Session) rescue(l *link) int {
	return s.sendRescue(s.planRescue(l))
}

// rescuePlan is what a rescue of a link will copy: the global sequence numbers of its
// packets in flight that get copies, oldest first, and the refuges they go to.
type rescuePlan struct {
	from            *link
	seqs            []uint32
	to              []*link
	logged, covered int // packets in flight in the link's log; of those, copied already
	kernel          int // of the logged ones, how many the kernel fast path sent
}

// planRescue chooses what a rescue of l copies, and where to, without sending
// anything: a link found down names the rest in its loss notice first (linkDown).
func (s *Session) planRescue(l *link) rescuePlan {
	p := rescuePlan{from: l}
	to := s.refuges(l)
	if s.keys.sending() == nil || len(to) == 0 {
		return p
	}
	if len(to) > 1 && to[1].isSuspect() { // refuges are up or suspect: no copy into doubt
		to = to[:1]
	}
	p.to = to[:min(len(to), rescueRefuges)]
	at := time.Now()
	live := slices.DeleteFunc(slices.Clone(p.to), func(r *link) bool { return !r.healthy(at) }) // refuges that can cover
	kernel, kernelPkts := s.kernelInFlight(l)
	s.txMu.Lock()
	defer s.txMu.Unlock()
	inFlight := l.sent.unackedSince(l.rescuedThrough)
	l.rescuedThrough = l.sent.n
	if len(kernel) > 0 {
		kept := kernel[:0:0]
		for i, e := range kernel {
			if kernelPkts[i] != nil && s.kept.adopt(e.Seq, kernelPkts[i], l.spec.ID) {
				kept = append(kept, e)
			}
		}
		inFlight = mergeSent(inFlight, kept, l.sent.acked.Load())
		p.kernel = len(kept)
	}
	p.logged = len(inFlight)
	for _, e := range inFlight {
		switch {
		case s.kept.get(e.Seq) == nil: // no longer kept: nothing to copy
		case slices.ContainsFunc(live, func(r *link) bool { return s.kept.wentOn(e.Seq, r.spec.ID) }):
			p.covered++ // its copy is on a healthy link already
		case slices.ContainsFunc(p.to, func(r *link) bool { return !s.kept.wentOn(e.Seq, r.spec.ID) }):
			p.seqs = append(p.seqs, e.Seq)
		}
	}
	return p
}

// kernelInFlight returns what the kernel fast path sent on link l without a copy after
// the peer's last report and after l's last rescue, in link order, and each packet
// with room for the header in front (nil where the kernel no longer keeps it). Nothing
// without the fast path. The kernel's maps are read without txMu.
func (s *Session) kernelInFlight(l *link) ([]SentEntry, [][]byte) {
	if s.fp == nil {
		return nil, nil
	}
	acked := l.sent.acked.Load()
	s.txMu.Lock()
	_, last := s.watermark(l)
	from := acked
	if t := l.kernelRescuedThrough; wire.SeqAfter(t, acked) && !wire.SeqAfter(t, last) {
		from = t
	}
	l.kernelRescuedThrough = last
	s.txMu.Unlock()
	sent, _ := s.fp.SentOn(l.spec.ID, from, last)
	if len(sent) > rescueSlots {
		sent = sent[len(sent)-rescueSlots:] // the older ones are no longer kept
	}
	return sent, s.kernelKept(sent)
}

// kernelKept returns the packets the kernel sent as the entries of its log name them,
// with room for the header in front, nil where it no longer keeps one.
func (s *Session) kernelKept(sent []SentEntry) [][]byte {
	if len(sent) == 0 {
		return nil
	}
	seqs := make([]uint32, len(sent))
	for i, e := range sent {
		seqs[i] = e.Seq
	}
	inner := s.fp.Kept(seqs)
	pkts := make([][]byte, len(sent))
	for i, p := range inner {
		if i < len(pkts) && p != nil {
			pkts[i] = append(make([]byte, wire.HeaderLen, wire.HeaderLen+len(p)), p...)
		}
	}
	return pkts
}

// sendRescue sends the copies p planned, none where its packet went already, and
// returns how many packets it copied. A packet whose slot was taken by a newer one
// since the plan is not copied: TCP recovers it as it would without.
func (s *Session) sendRescue(p rescuePlan) (copied int) {
	k := s.keys.sending()
	if k == nil || len(p.seqs) == 0 {
		return 0
	}
	now := clock.Nanos()
	s.txMu.Lock()
	for _, seq := range p.seqs {
		pkt := s.kept.get(seq)
		if pkt == nil {
			continue
		}
		sent := false
		for _, r := range p.to {
			if s.kept.wentOn(seq, r.spec.ID) {
				continue // a copy is on its way there already
			}
			s.sched.Charge(r.spec.ID, now, len(pkt)+28)
			// Logged as a copy: if this link goes into doubt too, its rescue copies
			// the packet again, and its loss notice leaves the number out.
			s.sendDataOn(r.spec.ID, k, seq, wire.FlagDuplicate, true, now, pkt)
			sent = true
		}
		if sent {
			copied++
		}
	}
	s.txMu.Unlock()
	if copied > 0 {
		s.pm.rescued.Add(float64(copied))
		p.from.logger().Debug("copied packets in flight", "to", p.to[0].spec.Name, "links", len(p.to), "copied", copied,
			"logged", p.logged, "covered", p.covered, "from_kernel", p.kernel)
	}
	return copied
}
