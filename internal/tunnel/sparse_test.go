package tunnel

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/sched"
	"github.com/aggd/aggd/internal/wire"
)

// A ping sent behind a gap in the bulk flow's numbers (a packet lost on one link) is
// delivered as it comes, not held for the gap: its flow is new, so the sender marks it
// sparse. A second ping right behind it is of a flow that just sent, so it is not
// marked (reseq's tests show what the receiver does with either).
func TestAPingPassesTheBulksGap(t *testing.T) {
	p := newPipePair(t)
	p.tx.cfg.SparseFlows = true
	for _, l := range p.tx.allLinks() {
		l.onReply(p.clk, 5*time.Millisecond)
	}
	p.step(0)
	p.tx.txMu.Lock()
	margin := p.tx.sparseMargin
	p.tx.txMu.Unlock()
	if margin <= 0 {
		t.Fatalf("setup: no sparse margin with both links' RTTs known (%v)", time.Duration(margin))
	}
	bulk := p.send(4)
	p.pump()

	// Link 1 drops the bulk's next packet; the gap it leaves is not resolved by anything
	// link 1 carries later, for it carries nothing more.
	p.mu.Lock()
	p.dead[1] = true
	p.mu.Unlock()
	for p.droppedTx[1] == 0 {
		bulk = append(bulk, p.send(1)...)
	}
	lost := bulk[len(bulk)-1]
	p.mu.Lock()
	p.dead[1] = false
	p.mu.Unlock()
	p.pump()

	src := netip.MustParseAddr("100.64.0.3")
	sendPing := func(id uint32) {
		pkt := ipv4Packet(src, internet, id, 84)
		buf := make([]byte, wire.HeaderLen+len(pkt))
		copy(buf[wire.HeaderLen:], pkt)
		if !p.tx.SendData(buf) {
			t.Fatal("SendData found no usable link")
		}
		p.pump()
	}
	sendPing(1 << 30)
	if got := p.deliveredIDs(); !slices.Contains(got, 1<<30) {
		t.Fatalf("the ping was not delivered behind the gap of %d: delivered %v", lost, got)
	}
	if st := p.stats(); st.Ahead != 1 || st.Lost != 0 {
		t.Fatalf("receiver %+v: want one packet ahead of a gap not yet given up", st)
	}
	if sent := gauge(p.txM.SparseSent.WithLabelValues("peer")); sent != 2 {
		t.Fatalf("%v packets sent marked sparse, want 2: the bulk flow's first and the ping", sent)
	}
	sendPing(1<<30 + 1)
	if sent := gauge(p.txM.SparseSent.WithLabelValues("peer")); sent != 2 {
		t.Fatalf("the ping right behind the first was marked sparse too (%v marked)", sent)
	}
}

func TestSparseMarks(t *testing.T) {
	var f sparseFlows
	a := ipv4Packet(netip.MustParseAddr("10.0.0.1"), internet, 1, 100)
	b := ipv4Packet(netip.MustParseAddr("10.0.0.2"), internet, 2, 100)
	const ms = int64(time.Millisecond)
	steps := []struct {
		pkt         []byte
		now, out    int64
		want        bool
		description string
	}{
		{a, 1000 * ms, 1010 * ms, true, "a flow's first packet"},
		{a, 1001 * ms, 1020 * ms, false, "right behind it"},
		{b, 1001 * ms, 1001 * ms, true, "another flow's first"},
		{a, 1049 * ms, 1050 * ms, false, "29 ms after the last left its queue: less than the margin"},
		{a, 1080 * ms, 1080 * ms, true, "30 ms after"},
	}
	for _, s := range steps {
		if got := f.mark(s.pkt, s.now, s.out, 30*ms); got != s.want {
			t.Errorf("%s: sparse %v, want %v", s.description, got, s.want)
		}
	}
	frag := ipv4Packet(netip.MustParseAddr("10.0.0.3"), internet, 3, 100)
	frag[6] = 0x20
	if f.mark(frag, 5000*ms, 5000*ms, 30*ms) {
		t.Error("a fragment was marked sparse")
	}
	if f.mark(ipv4Packet(netip.MustParseAddr("10.0.0.4"), internet, 4, 100), 5000*ms, 5000*ms, 0) {
		t.Error("marked sparse with no margin")
	}
}

func TestSparseMarginIsTheLargestRTTInTheSchedule(t *testing.T) {
	params := []sched.LinkParams{{ID: 0, Usable: true}, {ID: 1, Usable: true}, {ID: 2}}
	if got := sparseMargin(params, []time.Duration{10 * time.Millisecond, 45 * time.Millisecond, time.Second}); got != int64(45*time.Millisecond) {
		t.Errorf("margin %v, want the usable links' largest RTT, 45ms", time.Duration(got))
	}
	if got := sparseMargin(params, []time.Duration{10 * time.Millisecond, 0, time.Second}); got != 0 {
		t.Errorf("margin %v with a usable link's RTT unknown, want 0", time.Duration(got))
	}
}
