package tunnel

import (
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/auth"
	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/reseq"
	"github.com/aggd/aggd/internal/wire"
)

// pipePair is two sessions wired back to back in memory, over two links, with a
// virtual clock: datagrams queue up until the test pumps them, and a link can be cut.
// Nothing depends on real time, so the tests can say exactly what the receiver knew.
type pipePair struct {
	t         *testing.T
	tx, rx    *Session
	txM, rxM  *metrics.Set
	clk       time.Time
	mu        sync.Mutex
	queue     []queued
	dead      [2]bool // per link id: drop everything sent on it, both ways
	droppedTx [2]int  // data packets of tx dropped on a dead link
	// replays counts datagrams the receiving session dropped as replayed (a second
	// copy of a packet); any other rejection fails the test.
	replays    int
	delivered  []uint32
	deliveredM sync.Mutex
}

type queued struct {
	to  *Session
	pkt []byte
}

// newPipePair makes the pair; txFP, if given, is the sending session's fast path.
func newPipePair(t *testing.T, txFP ...FastPath) *pipePair {
	p := &pipePair{t: t, txM: metrics.New(), rxM: metrics.New(), clk: time.Unix(1000, 0)}
	cfg := SessionConfig{
		Peer: "peer", MaxHold: time.Hour, MaxBuffer: 4 << 20,
		Probe: 20 * time.Millisecond, DownAfter: 500 * time.Millisecond,
	}
	txCfg := cfg
	if len(txFP) > 0 {
		txCfg.FastPath = txFP[0]
	}
	p.tx = newSession(txCfg, p.txM, discard, 1, func([]byte) {})
	p.rx = newSession(cfg, p.rxM, discard, 2, func(b []byte) {
		p.deliveredM.Lock()
		p.delivered = append(p.delivered, packetID(b))
		p.deliveredM.Unlock()
	})
	t.Cleanup(p.tx.close)
	t.Cleanup(p.rx.close)
	p.tx.peerIndex.Store(2)
	p.rx.peerIndex.Store(1)
	var a, b auth.Key
	a[0], b[0] = 1, 2
	p.tx.installKeys(&keyGen{id: 1, send: a, recv: b, created: time.Now()}, true)
	p.rx.installKeys(&keyGen{id: 1, send: b, recv: a, created: time.Now()}, true)
	for id := range uint8(2) {
		spec := LinkSpec{ID: id, Name: []string{"up0", "up1"}[id], TxRate: linkRate, RxRate: linkRate}
		p.tx.addLink(spec, p.sender(id, p.rx, true))
		p.rx.addLink(spec, p.sender(id, p.tx, false))
	}
	return p
}

// sender is a link's send function: it queues the datagram for the other session.
func (p *pipePair) sender(id uint8, to *Session, fromTx bool) func(*link, []byte) error {
	return func(_ *link, pkt []byte) error {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.dead[id] {
			if fromTx && isData(pkt) {
				p.droppedTx[id]++
			}
			return nil
		}
		p.queue = append(p.queue, queued{to, append([]byte(nil), pkt...)})
		return nil
	}
}

// pump delivers everything queued, and whatever that makes the sessions send, in order.
func (p *pipePair) pump() {
	p.t.Helper()
	for {
		p.mu.Lock()
		if len(p.queue) == 0 {
			p.mu.Unlock()
			return
		}
		q := p.queue[0]
		p.queue = p.queue[1:]
		p.mu.Unlock()
		h, err := parseDatagram(q.pkt)
		if err != nil {
			p.t.Fatalf("a session sent a malformed datagram: %v", err)
		}
		if reason, ok := q.to.receive(&h, q.pkt, netip.AddrPort{}, p.clk, arrival{}); !ok {
			if reason == wire.ReasonReplay {
				p.replays++
				continue
			}
			p.t.Fatalf("%s datagram rejected: %v", h.Type, reason)
		}
	}
}

// step advances the virtual clock by d and runs the sender's periodic work.
func (p *pipePair) step(d time.Duration) {
	p.clk = p.clk.Add(d)
	p.tx.tick(p.clk)
	p.pump()
}

// send stripes n fresh packets from tx and returns their ids in sending order.
func (p *pipePair) send(n int) []uint32 {
	p.t.Helper()
	var ids []uint32
	for _, pkt := range packets(netip.MustParseAddr("100.64.0.2"), internet, n) {
		buf := make([]byte, wire.HeaderLen+len(pkt))
		copy(buf[wire.HeaderLen:], pkt)
		if !p.tx.SendData(buf) {
			p.t.Fatal("SendData found no usable link")
		}
		ids = append(ids, packetID(pkt))
	}
	return ids
}

// feedback makes the receiver report to the sender, as its tick would (the tick itself
// would also adapt the hold time, which this test keeps at its cap, and probe: the
// receiver's links are up here, as its own probes would have shown, so that it has
// routes for the report).
func (p *pipePair) feedback() {
	links := p.rx.allLinks()
	for _, l := range links {
		l.onReply(p.clk, time.Millisecond)
	}
	p.rx.sendFeedback(time.Now(), links, false)
	p.pump()
}

func (p *pipePair) stats() reseq.Stats {
	p.rx.rxMu.Lock()
	defer p.rx.rxMu.Unlock()
	return p.rx.reseq.Stats()
}

func (p *pipePair) deliveredIDs() []uint32 {
	p.deliveredM.Lock()
	defer p.deliveredM.Unlock()
	return append([]uint32(nil), p.delivered...)
}

// A link dies while carrying traffic. The receiver holds what arrives on the other link
// behind the dead link's gaps, with a hold time of an hour; when the sender declares the
// link down, its loss notice names exactly the packets lost on it, and the receiver
// releases everything it held. The notice's repeat, and a third copy, change nothing.
func TestLossNoticeReleasesHeldPackets(t *testing.T) {
	p := newPipePair(t)
	p.step(0) // probes, replies: both links up
	for _, l := range p.tx.allLinks() {
		if !l.isUp() {
			t.Fatalf("link %s not up after a probe round", l.spec.Name)
		}
	}

	// Both links carry traffic; the receiver reports what it got.
	first := p.send(40)
	p.pump()
	p.feedback()
	if got := p.deliveredIDs(); len(got) != len(first) {
		t.Fatalf("before the failure: %d of %d packets delivered", len(got), len(first))
	}

	// Link 1 dies with packets on it: what link 0 carries after the first loss waits.
	p.mu.Lock()
	p.dead[1] = true
	p.mu.Unlock()
	second := p.send(40)
	p.pump()
	// The daemon keeps no copy of them (as of packets too long for the kernel fast
	// path to keep): the loss notice alone speaks for them (copies of kept packets:
	// rescue_test.go).
	p.tx.txMu.Lock()
	p.tx.kept = keptPackets{}
	p.tx.txMu.Unlock()
	lost := p.droppedTx[1]
	st := p.stats()
	if lost == 0 || st.HeldPackets == 0 {
		t.Fatalf("setup: link 1 lost %d packets and the receiver holds %d; the test needs both", lost, st.HeldPackets)
	}

	t.Logf("link 1 lost %d packets; the receiver holds %d behind them", lost, st.HeldPackets)

	// Probe replies stop on link 1: suspect, then down after DownAfter; the notice goes
	// on link 0 and is repeated one tick later.
	for range 8 {
		p.step(100 * time.Millisecond)
	}
	if p.tx.link(1).isUp() {
		t.Fatal("link 1 still up after 800 ms without a probe reply")
	}
	st = p.stats()
	if st.HeldPackets != 0 || st.NoticeSkips != uint64(lost) || st.TimeoutSkips != 0 || st.EvidenceSkips != 0 {
		t.Fatalf("after the notice: held %d, notice skips %d (want %d lost on link 1), timeout skips %d, evidence skips %d",
			st.HeldPackets, st.NoticeSkips, lost, st.TimeoutSkips, st.EvidenceSkips)
	}
	if sent, got := gauge(p.txM.LossNoticeSent.WithLabelValues("peer")), gauge(p.rxM.LossNoticeReceived.WithLabelValues("peer")); sent != float64(2*lost) || got != sent {
		t.Fatalf("loss notice metrics: sent %v, received %v; want %d each (the notice and its repeat)", sent, got, 2*lost)
	}
	checkOrder(t, p.deliveredIDs(), append(first, second...), lost)

	// A third copy of the notice (a late duplicate) resolves nothing new.
	p.tx.txMu.Lock()
	ranges := seqRanges(p.tx.link(1).sent.ringSeqs())
	p.tx.txMu.Unlock()
	p.rx.onLossNotice(wire.LossNoticeBody{Counter: 1 << 40, Ranges: ranges})
	if again := p.stats(); again.Lost != st.Lost || again.Delivered != st.Delivered || again.HeldPackets != 0 {
		t.Fatalf("a repeated notice changed the resequencer: before %+v, after %+v", st, again)
	}

	// Traffic goes on over link 0 alone, in order, nothing held.
	third := p.send(20)
	p.pump()
	got := p.deliveredIDs()
	if len(got) < len(third) || !equalIDs(got[len(got)-len(third):], third) {
		t.Fatalf("after the failover the last %d packets delivered are not the %d sent", len(third), len(third))
	}
}

// ringSeqs is every global sequence number the log holds, oldest first (for tests).
func (g *sentLog) ringSeqs() []uint32 {
	held := min(g.n, sentLogSize)
	out := make([]uint32, 0, held)
	for i := held; i > 0; i-- {
		out = append(out, g.ring[(g.n-i)%sentLogSize].Seq)
	}
	return out
}

// reassign names what link l, just gone down, had in flight in a loss notice, as
// linkDown does without the rescue around it, and returns how many numbers it named.
func (s *Session) reassign(l *link) int {
	seqs := s.lostOn(l)
	s.noticeLost(seqs)
	return len(seqs)
}

// toRepeat returns the ranges of the notices waiting to be sent once more.
func (n *lossNotices) toRepeat() []wire.SeqRange {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []wire.SeqRange
	for _, p := range n.repeat {
		out = append(out, p.ranges...)
	}
	return out
}

// checkOrder checks that got is sent in order with exactly lost packets missing.
func checkOrder(t *testing.T, got, sent []uint32, lost int) {
	t.Helper()
	if len(got) != len(sent)-lost {
		t.Fatalf("delivered %d packets, want %d sent minus %d lost", len(got), len(sent), lost)
	}
	j := 0
	for _, id := range got {
		for j < len(sent) && sent[j] != id {
			j++
		}
		if j == len(sent) {
			t.Fatalf("packet %d delivered out of order or never sent", id)
		}
		j++
	}
}

func equalIDs(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A suspect link's packets have a copy on another link: the log marks them as copies,
// and a link that goes down after them names none of them.
func TestLossNoticeLeavesOutCopiedPackets(t *testing.T) {
	p := newPipePair(t)
	p.step(0)
	p.mu.Lock()
	p.dead[1] = true
	p.mu.Unlock()
	for range 2 { // link 1 suspect, not down
		p.step(50 * time.Millisecond)
	}
	l := p.tx.link(1)
	l.mu.Lock()
	state := l.state
	l.mu.Unlock()
	if state != stateSuspect {
		t.Fatalf("setup: link 1 is %v, want suspect", state)
	}
	p.send(40)
	p.pump()
	logged := p.tx.link(1).sent.unackedSince(0)
	if len(logged) == 0 {
		t.Fatal("setup: no packet was sent on suspect link 1")
	}
	for _, e := range logged {
		if !e.Copy {
			t.Fatalf("packet %d sent on suspect link 1 was logged as an original, for loss notices; its copy may arrive", e.Seq)
		}
	}
	for range 8 {
		p.step(100 * time.Millisecond)
	}
	if got := gauge(p.txM.LossNoticeSent.WithLabelValues("peer")); got != 0 {
		t.Fatalf("the notice named %v sequence numbers; every packet on the link had a copy", got)
	}
	if st := p.stats(); st.HeldPackets != 0 || st.Lost != 0 {
		t.Fatalf("receiver: %+v; the copies should have made every packet arrive", st)
	}
}

// The log of sent packets: what follows the peer's report, oldest first, merged into
// ranges; incomplete when more were sent since the report than it holds.
func TestSentLog(t *testing.T) {
	var g sentLog
	for i := uint32(1); i <= 10; i++ {
		g.record(i, 100+2*i, false) // link seq i carried global seq 100+2i
	}
	g.record(11, 99, true) // a copy of global seq 99, sent on another link first
	g.ack(7)
	g.ack(3) // an older report changes nothing
	if got := g.unackedSince(8); len(got) != 3 || got[0].LinkSeq != 9 || !got[2].Copy {
		t.Fatalf("unackedSince(8) = %v, want link seqs 9, 10 and the copy 11 (logged after the first 8)", got)
	}
	if got := g.unackedSince(2); len(got) != 4 || got[0].LinkSeq != 8 {
		t.Fatalf("unackedSince(2) = %v, want link seqs 8 to 11 (after the report of 7)", got)
	}
	sent, incomplete := g.takeUnacked(11)
	if want := []uint32{116, 118, 120}; !equalIDs(seqsOf(sent), want) || incomplete {
		t.Fatalf("after ack 7: %v (incomplete %v), want %v: the copy's number is not named", sent, incomplete, want)
	}
	if again, _ := g.takeUnacked(11); len(again) != 0 {
		t.Fatalf("the same packets named twice: %v", again)
	}

	var big sentLog
	for i := uint32(1); i <= sentLogSize+10; i++ {
		big.record(i, 5000+i, false)
	}
	sent, incomplete = big.takeUnacked(sentLogSize + 10)
	if len(sent) != sentLogSize || !incomplete {
		t.Fatalf("overflowed log: %d numbers, incomplete %v; want %d and true", len(sent), incomplete, sentLogSize)
	}

	r := seqRanges([]uint32{1, 2, 3, 7, 8, 0xffffffff, 0, 1})
	want := []wire.SeqRange{{Start: 1, Count: 3}, {Start: 7, Count: 2}, {Start: 0xffffffff, Count: 3}}
	if len(r) != len(want) {
		t.Fatalf("ranges %v, want %v", r, want)
	}
	for i := range r {
		if r[i] != want[i] {
			t.Fatalf("ranges %v, want %v", r, want)
		}
	}
}

// A suspect link's packets that lose the race to their copies are rejected as replays,
// but the receiver still counts them on their link: otherwise the link would look as if
// nothing arrived on it, and stay suspect (quiet.go).
func TestLateTwinsCountOnTheirLink(t *testing.T) {
	p := newPipePair(t)
	p.step(0) // both links up
	l1 := p.tx.link(1)
	l1.mu.Lock()
	l1.setState(stateSuspect)
	l1.mu.Unlock()
	p.tx.refreshSchedule()
	p.send(20)
	// The copies (on link 0) overtake the originals (on link 1).
	p.mu.Lock()
	var first, later []queued
	for _, q := range p.queue {
		if h, err := parseDatagram(q.pkt); err == nil && h.Type == wire.TypeData && h.LinkID == 1 {
			later = append(later, q)
		} else {
			first = append(first, q)
		}
	}
	p.queue = nil
	p.mu.Unlock()
	sent := l1.txPkts.Load()
	replays := 0
	for _, q := range append(first, later...) {
		h, _ := parseDatagram(q.pkt)
		if reason, ok := q.to.receive(&h, q.pkt, netip.AddrPort{}, p.clk, arrival{}); !ok {
			if reason != wire.ReasonReplay {
				t.Fatalf("%s datagram rejected: %v", h.Type, reason)
			}
			replays++
		}
	}
	p.mu.Lock()
	p.queue = nil
	p.mu.Unlock()
	if sent == 0 || replays != len(later) {
		t.Fatalf("setup: %d packets sent on the suspect link, %d of them rejected as replays, want all", sent, replays)
	}
	rx := p.rx.link(1).rx.report(1)
	if uint64(rx.RxPackets) != sent || rx.Lost != 0 {
		t.Fatalf("the suspect link carried %d packets; its receiver counts %d arrived, %d lost", sent, rx.RxPackets, rx.Lost)
	}
}

// With the fast path, the kernel and the daemon take numbers from one series and each
// logs what it sent; a link going down gets one notice naming the packets of both logs
// after the peer's last report, in link order (across the wrap of the link numbers),
// and a kernel log too short for the span is reported.
func TestLossNoticeNamesTheKernelsPackets(t *testing.T) {
	s, l, sp := fastSessionWithLink()
	// Link numbers 0xfffffffe .. 3: the kernel sent 0xfffffffe, 0xffffffff, 1 and 3;
	// the daemon 0 and 2. The peer has reported up to 0xfffffffe.
	sp.kernel = []SentEntry{{LinkSeq: 0xfffffffe, Seq: 40}, {LinkSeq: 0xffffffff, Seq: 41}, {LinkSeq: 1, Seq: 43}, {LinkSeq: 3, Seq: 45}}
	l.sent.record(0, 42, false)
	l.sent.record(2, 44, false)
	l.sent.ack(0x7fffffff) // reports move forward in steps of less than half the space
	l.sent.ack(0xfffffffe)
	sp.linkNext = 4
	if n := s.reassign(l); n != 5 {
		t.Fatalf("the notice named %d numbers (%v), want 5 (41..45)", n, s.notices.toRepeat())
	}
	if want := []wire.SeqRange{{Start: 41, Count: 5}}; !slices.Equal(s.notices.toRepeat(), want) {
		t.Errorf("notice %v, want %v", s.notices.toRepeat(), want)
	}
	if sp.asked != [2]uint32{0xfffffffe, 3} {
		t.Errorf("asked the kernel for the link numbers after %d through %d, want after 0xfffffffe through 3", sp.asked[0], sp.asked[1])
	}
	if n := s.reassign(l); n != 0 {
		t.Errorf("a second notice named %d numbers again", n)
	}
}

// fastSessionWithLink is a session on a fake fast path with one link, id 3, whose
// sends go nowhere.
func fastSessionWithLink() (*Session, *link, *fakeSessionPath) {
	return fastSessionSendingTo(func(*link, []byte) error { return nil })
}

// fastSessionSendingTo is fastSessionWithLink with the link's sends going to send.
func fastSessionSendingTo(send func(*link, []byte) error) (*Session, *link, *fakeSessionPath) {
	fp := &fakeFastPath{}
	cfg := testSession()
	cfg.FastPath = fp
	s := newSession(cfg, metrics.New(), discard, 1, func([]byte) {})
	l := s.addLink(LinkSpec{ID: 3, Name: "lte"}, send)
	return s, l, fp.session
}

// fakeFastPath stands in for the kernel's share of a session where a test needs only
// its numbers and its sent log.
type fakeFastPath struct{ session *fakeSessionPath }

func (f *fakeFastPath) OpenSession(uint32, []netip.Prefix) SessionPath {
	f.session = &fakeSessionPath{}
	return f.session
}

type fakeSessionPath struct {
	next, linkNext uint32
	kernel         []SentEntry
	asked          [2]uint32
	// pending: a handback is posted; handover: what the next OnData reports (the
	// kernel handed the ordering over at handoverAt), after which nothing is pending.
	pending    bool
	handover   bool
	handoverAt uint32
	// offered: the last Idle call offered the kernel the ordering (empty true);
	// programmed: the last Program call's state; programs: every one's, in order.
	offered    bool
	programmed *TxState
	programs   []TxState
	// noReceive: the interface index the kernel's receive program is not on (0: none).
	noReceive int
	// sentSince: what the kernel sent on each link since the last TxDelta.
	sentSince map[uint8]TxDelta
	aqmSince  AQMDelta
	// kept: the inner packets the kernel keeps, by global sequence number.
	kept map[uint32][]byte
}

// send has the kernel send n packets on link id: they take link sequence numbers and
// show in the next TxDelta.
func (f *fakeSessionPath) send(id uint8, n int) {
	if f.sentSince == nil {
		f.sentSince = map[uint8]TxDelta{}
	}
	d := f.sentSince[id]
	d.Packets += uint64(n)
	d.Bytes += uint64(n) * 1400
	f.sentSince[id] = d
	f.linkNext += uint32(n)
}

func (f *fakeSessionPath) TakeSeq() uint32          { f.next++; return f.next - 1 }
func (f *fakeSessionPath) TakeLinkSeq(uint8) uint32 { f.linkNext++; return f.linkNext - 1 }
func (f *fakeSessionPath) PeekSeq() uint32          { return f.next }
func (f *fakeSessionPath) PeekLinkSeq(uint8) uint32 { return f.linkNext }
func (f *fakeSessionPath) Program(st TxState) {
	f.programmed = &st
	f.programs = append(f.programs, st)
}
func (f *fakeSessionPath) OnData(uint8, uint32, time.Time) (bool, uint32, bool) {
	restart := f.handover
	f.pending, f.handover = false, false
	return restart, f.handoverAt, false
}
func (f *fakeSessionPath) HandbackPending() bool                          { return f.pending }
func (f *fakeSessionPath) ReceivesOn(ifindex int) bool                    { return ifindex != f.noReceive }
func (f *fakeSessionPath) Idle(_ uint32, _ uint64, empty bool)            { f.offered = empty }
func (f *fakeSessionPath) Resync(time.Time, time.Duration) (bool, uint32) { return false, 0 }
func (f *fakeSessionPath) RxDelta() map[uint8]RxDelta                     { return nil }
func (f *fakeSessionPath) TxDelta() map[uint8]TxDelta {
	d := f.sentSince
	f.sentSince = nil
	return d
}
func (f *fakeSessionPath) AQMDelta() AQMDelta {
	d := f.aqmSince
	f.aqmSince = AQMDelta{}
	return d
}
func (f *fakeSessionPath) Close() {}
func (f *fakeSessionPath) Kept(seqs []uint32) [][]byte {
	out := make([][]byte, len(seqs))
	for i, seq := range seqs {
		out[i] = f.kept[seq]
	}
	return out
}
func (f *fakeSessionPath) SentOn(_ uint8, after, through uint32) ([]SentEntry, bool) {
	f.asked = [2]uint32{after, through}
	var out []SentEntry
	for _, e := range f.kernel {
		if wire.SeqAfter(e.LinkSeq, after) && !wire.SeqAfter(e.LinkSeq, through) {
			out = append(out, e)
		}
	}
	return out, true
}
