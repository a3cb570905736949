package tunnel

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aggd/aggd/internal/estimate"
	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/sched"
	"github.com/aggd/aggd/internal/wire"
)

// The delay estimates the scheduler and the estimators work with are exported per
// link, as the peer's reports make them: the base one-way delay added to each link's
// expected arrival (half the RTT until the peer reports one-way delays on every link,
// then relative to the lowest link's floor, so that the clocks' offset cancels), and
// the jitter a queue must stand above to count.
func TestLinkDelayEstimatesAreExported(t *testing.T) {
	m := metrics.New()
	cfg := testSession()
	cfg.Peer = "hub"
	s := newSession(cfg, m, discard, 1, func([]byte) {})
	t.Cleanup(s.close)
	drop := func(*link, []byte) error { return nil }
	dsl := s.addLink(LinkSpec{ID: 0, Name: "dsl"}, drop)
	lte := s.addLink(LinkSpec{ID: 1, Name: "lte"}, drop)
	seconds := func(vec *prometheus.GaugeVec, name string) time.Duration {
		return time.Duration(math.Round(gauge(vec.WithLabelValues("hub", name)) * 1e9))
	}
	check := func(step string, vec *prometheus.GaugeVec, what string, want map[string]time.Duration) {
		t.Helper()
		for name, w := range want {
			if got := seconds(vec, name); got != w {
				t.Errorf("%s: %s of %s = %v, want %v", step, what, name, got, w)
			}
		}
	}

	now := time.Now()
	dsl.onReply(now, 24*time.Millisecond)
	lte.onReply(now, 60*time.Millisecond)
	s.refreshSchedule()
	check("probe replies only", m.LinkBaseDelay, "base delay", map[string]time.Duration{"dsl": 12 * time.Millisecond, "lte": 30 * time.Millisecond})

	// The peer's clock runs 5 s ahead: only the difference between the links' floors
	// is a delay. Each report's last packet came 8 ms (dsl) and 24 ms (lte) above the
	// period's smallest delay.
	const offset = 5_000_000 // µs
	report := func(peerTime uint32, pkts uint32) {
		s.onFeedback(now, peerTime, wire.FeedbackBody{Counter: uint64(peerTime), Links: []wire.LinkReport{
			{LinkID: 0, RxPackets: pkts, RxBytes: uint64(pkts) * 1000, HighestLinkSeq: pkts,
				OWDMinMicros: offset + 11_000, OWDLastMicros: offset + 19_000},
			{LinkID: 1, RxPackets: pkts, RxBytes: uint64(pkts) * 1000, HighestLinkSeq: pkts,
				OWDMinMicros: offset + 29_000, OWDLastMicros: offset + 53_000},
		}})
	}
	report(1, 10)
	s.refreshSchedule()
	check("one report", m.LinkBaseDelay, "base delay", map[string]time.Duration{"dsl": 0, "lte": 18 * time.Millisecond})
	check("one report", m.LinkJitter, "jitter", map[string]time.Duration{"dsl": time.Millisecond, "lte": 3 * time.Millisecond})
	report(2, 20)
	check("two reports", m.LinkJitter, "jitter", map[string]time.Duration{"dsl": 1875 * time.Microsecond, "lte": 5625 * time.Microsecond})
}

// A link's floor comes from its probes too (rxAccount.probeSample): a report period
// without data carries the least delay of the probes that arrived in it, and the
// sender takes that for the link's floor, nothing more. In the lab's homogeneous
// upload a link's first data met a queue, its floor stood 3.3 ms above the others',
// the headend's scheduler never tied it with them and sent it no ACK, so no data came
// to lower its floor: every ACK went on one link for the whole transfer.
func TestProbesLowerAnIdleLinksFloor(t *testing.T) {
	var a rxAccount
	a.probeSample(5000)
	a.probeSample(4000)
	if got := a.report(0).OWDMinMicros; got != 4000 {
		t.Errorf("a period with two probes, no data: least delay %d µs, want the lower probe's 4000", got)
	}
	a.account(&wire.Header{LinkSeq: 1}, 100, 7000, time.Unix(0, 0), true)
	a.probeSample(3000)
	if got := a.report(0).OWDMinMicros; got != 7000 {
		t.Errorf("a period with data and a probe: least delay %d µs, want the data's 7000 (its queue)", got)
	}
	if got := a.report(0).OWDMinMicros; got != 0 {
		t.Errorf("an empty period: least delay %d µs, want 0 (none)", got)
	}

	m := metrics.New()
	cfg := testSession()
	cfg.Peer = "cpe1"
	s := newSession(cfg, m, discard, 1, func([]byte) {})
	t.Cleanup(s.close)
	drop := func(*link, []byte) error { return nil }
	first := s.addLink(LinkSpec{ID: 0, Name: "eth1"}, drop)
	s.addLink(LinkSpec{ID: 1, Name: "eth2"}, drop)
	now := time.Now()
	var rx [2]uint32
	// eth1's last data packet came 2 ms above its period's least: the last delay a
	// report without data repeats (rxAccount.report).
	report := func(i int, firstOWD int32, firstData bool) {
		rx[1] += 20
		r := wire.LinkReport{LinkID: 0, RxPackets: rx[0], RxBytes: uint64(rx[0]) * 100, HighestLinkSeq: rx[0],
			OWDMinMicros: firstOWD, OWDLastMicros: 15_300}
		if firstData {
			rx[0] += 20
			r.RxPackets, r.RxBytes, r.HighestLinkSeq = rx[0], uint64(rx[0])*100, rx[0]
		}
		s.onFeedback(now.Add(time.Duration(i)*100*time.Millisecond), uint32(i)*100_000, wire.FeedbackBody{Counter: uint64(i), Links: []wire.LinkReport{
			r,
			{LinkID: 1, RxPackets: rx[1], RxBytes: uint64(rx[1]) * 100, HighestLinkSeq: rx[1], OWDMinMicros: 10_000, OWDLastMicros: 10_000},
		}})
	}
	base := func() time.Duration {
		s.refreshSchedule()
		return time.Duration(math.Round(gauge(m.LinkBaseDelay.WithLabelValues("cpe1", "eth1")) * 1e9))
	}
	report(1, 13_300, true) // eth1's first data queued 3.3 ms
	report(2, 13_300, true)
	if got := base(); got != 3300*time.Microsecond {
		t.Fatalf("setup: eth1's base delay after its queued data is %v, want 3.3ms", got)
	}
	jitter := gauge(m.LinkJitter.WithLabelValues("cpe1", "eth1"))
	report(3, 10_000, false) // then no data on it, a probe at the floor
	if got := base(); got != 0 {
		t.Errorf("eth1's base delay after a probe at eth2's floor is %v, want 0", got)
	}
	if got := gauge(m.LinkJitter.WithLabelValues("cpe1", "eth1")); got != jitter {
		t.Errorf("a probe-only report moved eth1's jitter from %v to %v s", jitter, got)
	}
	if smp, ok := first.onFeedback(now.Add(400*time.Millisecond), 400_000, wire.LinkReport{LinkID: 0, RxPackets: rx[0], RxBytes: uint64(rx[0]) * 100,
		HighestLinkSeq: rx[0], OWDMinMicros: 10_000, OWDLastMicros: 15_300}, true); smp.HaveQueue && smp.Packets == 0 {
		t.Errorf("a sample with no data has a queue from a probe: %+v (ok %v)", smp, ok)
	}
}

// With no data sent at all, every link of an idle bond has its floor, on both sides,
// from the probes alone.
func TestAnIdleBondMeasuresEveryLinksFloor(t *testing.T) {
	p := newPeer(t, "cpe1", "10.0.0.2")
	b := newBed(t, p)
	n := b.startCPE(p, 2, 0)
	b.waitReady(n)
	floors := func(s *Session) bool {
		for _, l := range s.allLinks() {
			if _, ok := l.peerOWDFloor(); !ok {
				return false
			}
		}
		return true
	}
	waitFor(t, "every link's floor on both sides, from probes", func() bool {
		return floors(n.c.session.Load()) && floors(b.session(p.name))
	})
	for _, s := range []*Session{n.c.session.Load(), b.session(p.name)} {
		for _, l := range s.allLinks() {
			if sent := l.txData.Load(); sent != 0 {
				t.Errorf("setup: %s sent %d bytes of data on %s; the floors were to come from probes alone", s.cfg.Peer, sent, l.spec.Name)
			}
		}
	}
}

// A sample's losses are the gaps the peer found in the link's sequence, not what we
// sent less what arrived: what we sent after the peer's cut is in flight, and counted
// as lost it made a flow's first window look like drops (estimate.Sample.Lost).
func TestSampleLossesAreThePeersGaps(t *testing.T) {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	t.Cleanup(s.close)
	l := s.addLink(LinkSpec{ID: 0, Name: "lte"}, func(*link, []byte) error { return nil })
	t0 := time.Unix(1000, 0)
	report := func(at time.Duration, rx, lost uint32) (sent uint64, lostInSample uint32, ok bool) {
		l.txData.Add(20 * 1500) // we sent 20 packets since the last report
		smp, ok := l.onFeedback(t0.Add(at), uint32(at/time.Microsecond),
			wire.LinkReport{RxPackets: rx, RxBytes: uint64(rx) * 1500, HighestLinkSeq: rx + lost, Lost: lost}, true)
		return smp.Sent, smp.Lost, ok
	}
	report(0, 0, 0) // starts the first sample
	report(100*time.Millisecond, 10, 0)
	sent, lost, ok := report(200*time.Millisecond, 15, 0)
	if !ok || sent != 20*1500 || lost != 0 {
		t.Fatalf("5 packets arrived of 20 sent, none missing: sample ok=%v, sent %d bytes, lost %d; want a sample of 30000 bytes sent and no loss", ok, sent, lost)
	}
	if _, lost, _ = report(300*time.Millisecond, 25, 3); lost != 3 {
		t.Errorf("the peer found 3 packets missing: the sample lost %d", lost)
	}
}

// The peer's FEEDBACK timestamps are 32-bit microseconds, which tell newer from older
// only within 35.8 minutes. After 40 minutes without a report (every link dead, the
// session kept) the next report's timestamp looks older than the last one's: it is
// taken all the same, where it used to be ignored as stale, with every report after it
// for another half hour. A report that really is older, arriving just after a newer
// one, is still ignored.
func TestFeedbackAfterALongSilenceIsTaken(t *testing.T) {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	t.Cleanup(s.close)
	s.addLink(LinkSpec{ID: 0, Name: "lte"}, func(*link, []byte) error { return nil })
	t0 := time.Unix(1000, 0)
	report := func(at time.Duration, rx uint32) uint32 {
		peerTime := uint32(at / time.Microsecond)
		s.onFeedback(t0.Add(at), peerTime, wire.FeedbackBody{Counter: uint64(at), Links: []wire.LinkReport{
			{LinkID: 0, RxPackets: rx, RxBytes: uint64(rx) * 1500, HighestLinkSeq: rx}}})
		return peerTime
	}
	taken := func() uint32 {
		s.feedbackMu.Lock()
		defer s.feedbackMu.Unlock()
		return s.lastFeedback
	}
	report(0, 10)
	before := report(100*time.Millisecond, 20)
	after := report(40*time.Minute, 30)
	if int32(after-before) > 0 {
		t.Fatal("setup: 40 minutes should put the peer's timestamp half its range or more ahead")
	}
	if taken() != after {
		t.Fatalf("the report 40 minutes after the last one was ignored as stale (peer time %d, newest taken %d)", after, taken())
	}
	report(40*time.Minute-50*time.Millisecond, 29) // sent before the last one, arriving after it
	if taken() != after {
		t.Fatalf("a report older than the newest one taken was taken (newest now %d, want %d)", taken(), after)
	}
}

// A link's estimator sample is not stretched over a long silence of the peer's reports:
// the first report after it starts a new sample. One across the silence measured the
// silence (a rate near nothing), and its span, in the peer's 32-bit microseconds, would
// be wrong by 71.6 minutes for each time they wrapped meanwhile.
func TestNoSampleAcrossALongSilence(t *testing.T) {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	t.Cleanup(s.close)
	l := s.addLink(LinkSpec{ID: 0, Name: "lte"}, func(*link, []byte) error { return nil })
	t0 := time.Unix(1000, 0)
	report := func(at time.Duration, rx uint32) (estimate.Sample, bool) {
		l.txData.Add(10 * 1500)
		return l.onFeedback(t0.Add(at), uint32(at/time.Microsecond), wire.LinkReport{RxPackets: rx, RxBytes: uint64(rx) * 1500, HighestLinkSeq: rx}, true)
	}
	report(0, 0)
	if _, ok := report(100*time.Millisecond, 10); !ok {
		t.Fatal("setup: 10 packets in 100 ms made no sample")
	}
	if smp, ok := report(80*time.Minute, 20); ok {
		t.Fatalf("a sample across 80 minutes of silence: %+v", smp)
	}
	smp, ok := report(80*time.Minute+100*time.Millisecond, 30)
	if !ok || smp.Interval != 100*time.Millisecond || smp.Packets != 10 {
		t.Fatalf("the first sample after the silence: %+v (ok %v), want 10 packets in 100 ms", smp, ok)
	}
}

// One-way delays are measured as our clock less the sender's stamp, both 32-bit
// microseconds on clocks with an arbitrary offset. With an offset just below 2^31, a
// link whose delays vary by 4 ms has raw values on both sides of the int32 boundary:
// read raw, the larger delays looked like the smallest, and the link's floor and the
// queue above it were wrong by about 2^32 µs. In the session's frame (owdFrame) they
// are what they are.
func TestOneWayDelaysAcrossTheClockBoundary(t *testing.T) {
	var f owdFrame
	var a rxAccount
	h := &wire.Header{}
	const offset = 1<<31 - 2000 // µs: the raw delays cross 2^31 at 2 ms
	now := uint32(123_456_789)
	for i, delay := range []uint32{1000, 4000, 0, 3000, 2500} { // µs; 0 is the floor
		h.LinkSeq = uint32(i + 1)
		h.Timestamp = now - offset - delay
		a.account(h, 100, f.rel(now-h.Timestamp), time.Unix(0, 0), true)
		now += 10_000
	}
	r := a.report(0)
	floor, last, _ := a.owd(time.Unix(0, 0), time.Second)
	if got := r.OWDMinMicros - floor; got != 0 {
		t.Errorf("the period's least delay is %d µs above the floor; want 0 (both are the 0-µs packet)", got)
	}
	if got := last - floor; got != 2500 {
		t.Errorf("the last packet queued %d µs above the floor; want 2500", got)
	}
	if got := r.OWDLastMicros - r.OWDMinMicros; got != 2500 {
		t.Errorf("the report's last delay is %d µs above its least; want 2500", got)
	}
}

// A link whose probe train measured nothing starts at estimate.StartRate; next to a
// link a train did measure, which takes a whole TCP flow with only a few milliseconds of
// queue, the scheduler gives it nothing, so it completes no sample for a second at a
// time. Every report in which the bond is loaded still doubles its assumed rate, so the
// scheduler tries it within a few hundred milliseconds, not seconds. A standby link
// (it waits for the primaries to fail) does not grow so.
func TestUnusedUnmeasuredLinkGrowsPerReport(t *testing.T) {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	t.Cleanup(s.close)
	drop := func(*link, []byte) error { return nil }
	busy := s.addLink(LinkSpec{ID: 0, Name: "cable", TxRate: 30e6}, drop)
	unused := s.addLink(LinkSpec{ID: 1, Name: "fibre"}, drop)
	standby := s.addLink(LinkSpec{ID: 2, Name: "lte", Class: sched.ClassBackup}, drop)
	now := time.Now()
	for _, l := range []*link{busy, unused, standby} {
		l.onReply(now, 2*time.Millisecond)
	}
	var busyRx uint32
	report := func(i int) {
		busy.txData.Add(30e6 / 8 / 10) // the busy link was given its whole rate
		busyRx += 250
		s.onFeedback(now.Add(time.Duration(i)*100*time.Millisecond), uint32(i)*100_000, wire.FeedbackBody{Counter: uint64(i), Links: []wire.LinkReport{
			{LinkID: 0, RxPackets: busyRx, RxBytes: uint64(busyRx) * 1500, HighestLinkSeq: busyRx, OWDMinMicros: 3000, OWDLastMicros: 5000},
			{LinkID: 1, RxPackets: 1, RxBytes: 80, HighestLinkSeq: 1, OWDMinMicros: 1000, OWDLastMicros: 1000}, // one probe, long ago
			{LinkID: 2, RxPackets: 1, RxBytes: 80, HighestLinkSeq: 1, OWDMinMicros: 1000, OWDLastMicros: 1000},
		}})
	}
	report(1) // starts the samples
	for i := 2; i <= 6; i++ {
		report(i) // each completes a sample of the busy link, loaded
	}
	if got, want := unused.assumedRate(), estimate.StartRate*32; got != want {
		t.Errorf("after five loaded reports the unused link's assumed rate is %.2f Mbit/s, want %.2f (doubled in each)", got/1e6, want/1e6)
	}
	if got := standby.assumedRate(); got != estimate.StartRate {
		t.Errorf("the standby link grew to %.2f Mbit/s while the primaries carried the flow", got/1e6)
	}
}

// Reports that show nothing arriving on a link count as its sample's idle time: a burst
// that queued at the end of a second the link was unused (a suspect link's packets in
// flight, copied to it at once) does not measure its capacity at what it delivered
// over that second, nor end its startup.
func TestBurstAfterAnIdleSecondIsNoMeasure(t *testing.T) {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	t.Cleanup(s.close)
	drop := func(*link, []byte) error { return nil }
	busy := s.addLink(LinkSpec{ID: 0, Name: "cable", TxRate: 30e6}, drop)
	unused := s.addLink(LinkSpec{ID: 1, Name: "fibre"}, drop)
	now := time.Now()
	for _, l := range []*link{busy, unused} {
		l.onReply(now, 2*time.Millisecond)
	}
	var busyRx, rx uint32
	report := func(i int, sent uint64, arrived uint32, owd int32) {
		busy.txData.Add(30e6 / 8 / 10)
		unused.txData.Add(sent)
		busyRx += 250
		rx += arrived
		r := wire.LinkReport{LinkID: 1, RxPackets: rx, RxBytes: uint64(rx) * 1500, HighestLinkSeq: rx}
		if arrived > 0 {
			r.OWDMinMicros, r.OWDLastMicros = owd, owd+5000
		}
		s.onFeedback(now.Add(time.Duration(i)*100*time.Millisecond), uint32(i)*100_000, wire.FeedbackBody{Counter: uint64(i), Links: []wire.LinkReport{
			{LinkID: 0, RxPackets: busyRx, RxBytes: uint64(busyRx) * 1500, HighestLinkSeq: busyRx, OWDMinMicros: 3000, OWDLastMicros: 5000},
			r,
		}})
	}
	report(1, 1500, 1, 1000) // one packet: the link's floor, 1 ms; its sample starts here
	for i := 2; i <= 10; i++ {
		report(i, 0, 0, 0) // idle
	}
	report(11, 254*1500, 80, 41_000) // 80 of 254 copies passed the 10 Mbit/s link, 40 ms of queue
	if !unused.est.InStartup() {
		t.Errorf("a burst that queued after 0.9 s of idle time ended the link's startup at %.2f Mbit/s",
			unused.est.Capacity()/1e6)
	}
}

// A rate prior (configured, reloaded, or announced by the peer) shows in the capacity
// metric at once, not when the link's next sample completes (never on a link that stays
// idle, up to a second later on one that does not).
func TestNewPriorIsPublishedAtOnce(t *testing.T) {
	m := metrics.New()
	cfg := testSession()
	cfg.Peer = "hub"
	s := newSession(cfg, m, discard, 1, func([]byte) {})
	t.Cleanup(s.close)
	l := s.addLink(LinkSpec{ID: 0, Name: "cable", TxRate: 10e6}, func(*link, []byte) error { return nil })
	if got := gauge(m.LinkCapacity.WithLabelValues("hub", "cable")); got != 10e6 {
		t.Errorf("a new link configured at 10 Mbit/s: the capacity metric shows %.2f Mbit/s", got/1e6)
	}
	l.retune(LinkSpec{ID: 0, Name: "cable", TxRate: 20e6})
	if got := gauge(m.LinkCapacity.WithLabelValues("hub", "cable")); got != 20e6 {
		t.Errorf("after a retune to 20 Mbit/s the capacity metric shows %.2f Mbit/s", got/1e6)
	}
	lte := s.addLink(LinkSpec{ID: 1, Name: "lte"}, func(*link, []byte) error { return nil })
	lte.setPeerPrior(8e6, sched.ClassPrimary)
	if got := gauge(m.LinkCapacity.WithLabelValues("hub", "lte")); got != 8e6 {
		t.Errorf("after the peer's first prior of 8 Mbit/s the capacity metric shows %.2f Mbit/s", got/1e6)
	}
	l.setPeerPrior(8e6, sched.ClassPrimary)
	l.setPeerPrior(5e6, sched.ClassPrimary) // the peer's config changed
	if got := gauge(m.LinkCapacity.WithLabelValues("hub", "cable")); got != 5e6 {
		t.Errorf("after the peer's new prior of 5 Mbit/s the capacity metric shows %.2f Mbit/s", got/1e6)
	}
}
