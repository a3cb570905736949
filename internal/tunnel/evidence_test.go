package tunnel

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/reseq"
)

// A link found down no longer holds up the resequencer: a packet lost on the link still
// working is given up as soon as that link shows a later one (FIFO evidence), not after
// the hold timer (a second here: with one link active the hold is the maximum). When the
// dead link answers again it counts again.
func TestDownLinkLeavesTheEvidence(t *testing.T) {
	p := newPeer(t, "cpe1", "100.64.0.2")
	b := newBed(t, p)
	n := b.startCPE(p, 2, time.Hour)
	b.waitReady(n)
	ms := b.mappings(n)
	s := b.session(p.name)
	heUp := b.cutLink(n, ms, 1)
	if !s.link(1).noEvidence.Load() {
		t.Fatal("the headend found link 1 down but still waits for its evidence")
	}
	b.up(n, 20) // whatever was in flight settles

	stats := func() reseq.Stats {
		s.rxMu.Lock()
		defer s.rxMu.Unlock()
		return s.reseq.Stats()
	}
	before := stats()
	var dropped atomic.Bool
	b.relay.setHook(func(m *mapping, up bool, pkt []byte) []byte {
		if up && isData(pkt) && dropped.CompareAndSwap(false, true) {
			return nil // one packet lost on link 0
		}
		return pkt
	})
	pkts := packets(n.peer.addr, internet, 20)
	for _, pk := range pkts {
		n.tun.inject(t, pk)
	}
	var got int
	waitFor(t, "19 of 20 packets through", func() bool { got += len(b.heTun.pending()); return got >= 19 })
	b.relay.setHook(nil)
	after := stats()
	if ev, to := after.EvidenceSkips-before.EvidenceSkips, after.TimeoutSkips-before.TimeoutSkips; ev != 1 || to != 0 {
		t.Errorf("the lost packet was given up by evidence %d times, by the hold timer %d times; want 1 and 0", ev, to)
	}

	ms[1].setBlackhole(false)
	waitFor(t, "link 1 up again on both sides", func() bool { return linkUp(n, 1) == 1 && heUp() == 1 })
	if s.link(1).noEvidence.Load() {
		t.Error("link 1 answers again but the headend does not wait for its evidence")
	}
	late := stats().Late
	b.both(n, 200)
	if d := stats().Late - late; d != 0 {
		t.Errorf("%d packets dropped as late after link 1 came back", d)
	}
}
