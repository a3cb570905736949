package tunnel

import (
	"testing"
	"time"

	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/wire"
)

// quietRig drives one link with explicit times: packets sent on it, probe replies, the
// peer's reports every 100 ms and the session's ticks halfway between them.
type quietRig struct {
	t     *testing.T
	l     *link
	t0    time.Time
	rx    uint32 // packets the peer has reported
	now   time.Duration
	cause healthCause // why the link last changed state
	// othersIdle: the reports show no data arriving on any other link either.
	othersIdle bool
}

// The thresholds the probes alone would use (the defaults: three 100-ms probe
// intervals, down_after 600 ms).
const rigSuspectAfter, rigDownAfter = 300 * time.Millisecond, 600 * time.Millisecond

func newQuietRig(t *testing.T, rtt time.Duration) *quietRig {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	r := &quietRig{t: t, l: s.addLink(LinkSpec{ID: 0, Name: "cable"}, func(*link, []byte) error { return nil }), t0: time.Unix(1000, 0)}
	r.l.onReply(r.t0, rtt)
	return r
}

// step advances 50 ms: sent packets go out, and then either a tick (probe reply if
// alive) or a report with delivered new packets, alternately. It returns the link's state.
func (r *quietRig) step(sent, delivered uint32, alive bool) linkState {
	r.now += 50 * time.Millisecond
	at := r.t0.Add(r.now)
	r.l.txPkts.Add(uint64(sent))
	r.l.txLinkSeq.Add(sent) // link numbers count the packets: the nth has number n
	if r.now%(100*time.Millisecond) == 0 {
		r.rx += delivered
		highest := min(r.rx, r.l.txLinkSeq.Load()) // delivered in order, lost ones not
		r.l.onFeedback(at, uint32(r.now/time.Microsecond), wire.LinkReport{RxPackets: r.rx, RxBytes: uint64(r.rx) * 1500, HighestLinkSeq: highest}, !r.othersIdle)
	} else if alive {
		r.l.onReply(at, 20*time.Millisecond)
	}
	st, changed, cause := r.l.checkHealth(at, rigSuspectAfter, rigDownAfter)
	if changed {
		r.cause = cause
	}
	return st
}

// A busy link that dies is suspect at the first report that owes its packets and down at
// the next: within a few report periods, long before its probes' silence would say so.
func TestBusyLinkThatStopsDeliveringGoesDownAtTheSecondQuietReport(t *testing.T) {
	r := newQuietRig(t, 20*time.Millisecond)
	for range 40 { // 2 s of 120 packets/s, all arriving
		if st := r.step(6, 12, true); st != stateUp {
			t.Fatalf("at %v, delivering: %v, want up", r.now, st)
		}
	}
	died := r.now
	var suspectAt, downAt time.Duration
	for range 20 {
		switch st := r.step(6, 0, false); {
		case st == stateSuspect && suspectAt == 0:
			suspectAt = r.now - died
		case st == stateDown:
			downAt = r.now - died
		}
		if downAt != 0 {
			break
		}
	}
	if suspectAt == 0 || downAt == 0 {
		t.Fatalf("dead busy link: suspect after %v, down after %v; want both", suspectAt, downAt)
	}
	// The probes alone: suspect after 300 ms of silence, down after 600 ms. The reports
	// must beat both, by at least a report period.
	if suspectAt >= rigSuspectAfter || downAt >= rigDownAfter-100*time.Millisecond {
		t.Errorf("dead busy link: suspect after %v, down after %v; the probes alone would take %v and %v",
			suspectAt, downAt, rigSuspectAfter, rigDownAfter)
	}
	if downAt-suspectAt < 100*time.Millisecond {
		t.Errorf("down %v after suspect: want a second report in between", downAt-suspectAt)
	}
}

// Probe replies do not lift a suspicion the reports raised (small probes can pass where
// data does not), a report with data arriving does, and a link that went down on the
// reports comes back on a probe reply with nothing held against it.
func TestQuietSuspicionEndsOnlyWithData(t *testing.T) {
	r := newQuietRig(t, 20*time.Millisecond)
	for range 20 {
		r.step(6, 12, true)
	}
	var st linkState
	for st != stateSuspect {
		st = r.step(6, 0, true) // probes answered, data lost
		if r.now > 5*time.Second {
			t.Fatal("a link losing all data was never suspected")
		}
	}
	if st = r.step(0, 0, true); st != stateSuspect {
		t.Fatalf("after a probe reply: %v, want still suspect", st)
	}
	if st = r.step(0, 3, true); st != stateUp {
		t.Fatalf("after a report of data arriving: %v, want up", st)
	}
	for st != stateDown {
		st = r.step(6, 0, true)
		if r.now > 10*time.Second {
			t.Fatal("a link losing all data never went down")
		}
	}
	if st = r.step(0, 0, true); st != stateUp {
		t.Fatalf("down link after a probe reply: %v, want up", st)
	}
	for range 10 { // idle now: nothing owed, nothing judged
		if st = r.step(0, 0, true); st != stateUp {
			t.Fatalf("idle link after coming back: %v at %v, want up", st, r.now)
		}
	}
}

// A slow link (two packets per report period, with two periods in a row delivering none
// in every four: a stalling radio) and an idle one are never judged by the reports: a stray empty period owes
// fewer than busyQuietPackets.
func TestSlowAndIdleLinksAreLeftToTheProbes(t *testing.T) {
	r := newQuietRig(t, 60*time.Millisecond)
	for i := range 200 {
		delivered := uint32(4)
		if i%8 == 1 || i%8 == 3 { // two reports in a row of each four are empty (reports are odd steps)
			delivered = 0
		}
		if st := r.step(1, delivered, true); st != stateUp {
			t.Fatalf("slow link at %v: %v, want up", r.now, st)
		}
	}
	for range 40 {
		if st := r.step(0, 0, true); st != stateUp {
			t.Fatalf("idle link at %v: %v, want up", r.now, st)
		}
	}
}

// The copies of one FEEDBACK (sendFeedback sends it on two links, with one timestamp)
// count once: the late one is stale, not a report showing that nothing new arrived
// although more was sent.
func TestFeedbackCopiesAreNotQuietReports(t *testing.T) {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	l := s.addLink(LinkSpec{ID: 0, Name: "cable"}, func(*link, []byte) error { return nil })
	t0 := time.Unix(1000, 0)
	l.onReply(t0, 10*time.Millisecond)
	var rx uint32
	var prev wire.FeedbackBody
	var prevStamp uint32
	for i := range 20 {
		at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		l.txPkts.Add(12)
		l.checkHealth(at.Add(-50*time.Millisecond), rigSuspectAfter, rigDownAfter) // the tick's mark
		if i > 0 {
			s.onFeedback(at.Add(-20*time.Millisecond), prevStamp, prev) // the last report's copy, 80 ms behind it
			if n := l.quietReports(); n != 0 {
				t.Fatalf("the copy of report %d: %d quiet reports, want 0", i-1, n)
			}
		}
		rx += 12
		prev = wire.FeedbackBody{Links: []wire.LinkReport{{LinkID: 0, RxPackets: rx, RxBytes: uint64(rx) * 1500}}}
		prevStamp = uint32(at.Sub(t0)/time.Microsecond) + 1
		s.onFeedback(at, prevStamp, prev)
	}
}

// FEEDBACK goes on the two best links in the schedule: not suspect first, then lowest RTT.
func TestFeedbackRoutes(t *testing.T) {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	t0 := time.Unix(1000, 0)
	mk := func(id uint8, rtt time.Duration) *link {
		l := s.addLink(LinkSpec{ID: id, Name: string(rune('a' + id))}, func(*link, []byte) error { return nil })
		l.onReply(t0, rtt)
		return l
	}
	a, b, c, d := mk(0, 30*time.Millisecond), mk(1, 10*time.Millisecond), mk(2, 20*time.Millisecond), mk(3, 5*time.Millisecond)
	d.mu.Lock()
	d.setState(stateDown)
	d.mu.Unlock()
	names := func() []string {
		var n []string
		for _, l := range feedbackRoutes(s.allLinks(), false) {
			n = append(n, l.spec.Name)
		}
		return n
	}
	if got := names(); len(got) != 2 || got[0] != b.spec.Name || got[1] != c.spec.Name {
		t.Fatalf("routes %v, want [b c] (lowest RTTs, the down link left out)", got)
	}
	b.mu.Lock()
	b.setState(stateSuspect)
	b.mu.Unlock()
	if got := names(); len(got) != 2 || got[0] != c.spec.Name || got[1] != a.spec.Name {
		t.Fatalf("routes %v with b suspect, want [c a]", got)
	}
}

// A report that shows nothing new on any link is no verdict on one of them: the peer's
// receiving stalled as a whole. The same silence next to a link that still delivers is.
func TestAStalledPeerIsNoVerdict(t *testing.T) {
	for _, otherDelivers := range []bool{false, true} {
		s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
		a := s.addLink(LinkSpec{ID: 0, Name: "a"}, func(*link, []byte) error { return nil })
		b := s.addLink(LinkSpec{ID: 1, Name: "b"}, func(*link, []byte) error { return nil })
		t0 := time.Unix(1000, 0)
		var rxA, rxB uint32
		wentDown := false
		for i := range 10 {
			at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
			a.onReply(at, 10*time.Millisecond)
			b.onReply(at, 10*time.Millisecond)
			for _, l := range []*link{a, b} {
				l.txPkts.Add(12)
				l.txLinkSeq.Add(12) // link numbers count the packets
				l.checkHealth(at.Add(-50*time.Millisecond), rigSuspectAfter, rigDownAfter)
			}
			if i < 5 {
				rxA += 12
			}
			if i < 5 || otherDelivers {
				rxB += 12
			}
			s.onFeedback(at, uint32(i+1)*100_000, wire.FeedbackBody{Links: []wire.LinkReport{
				{LinkID: 0, RxPackets: rxA, RxBytes: uint64(rxA) * 1500, HighestLinkSeq: rxA},
				{LinkID: 1, RxPackets: rxB, RxBytes: uint64(rxB) * 1500, HighestLinkSeq: rxB},
			}})
			wentDown = wentDown || !a.isUp()
		}
		// Probe replies keep coming on both: only the reports can take a out (and the
		// next reply brings it back).
		if wentDown != otherDelivers {
			t.Errorf("link a silent for 500 ms, link b delivering=%v: a went down=%v", otherDelivers, wentDown)
		}
	}
}

// A busy link whose last burst a full queue dropped, just before the flow ended, owes
// those packets for good. The report that misses them may raise a suspicion (it cannot
// tell them from a death), but the idle link's next report ends it, and when traffic
// resumes on another link seconds later the old loss is no verdict on this one.
func TestATailLossIsNoVerdict(t *testing.T) {
	r := newQuietRig(t, 20*time.Millisecond)
	for range 20 {
		r.step(6, 12, true)
	}
	r.step(8, 0, true) // the last 8 packets are dropped at the bottleneck, and the flow ends
	var st linkState
	for range 100 { // 5 s idle; the peer's reports show another link delivering
		if st = r.step(0, 0, true); st == stateDown {
			t.Fatalf("at %v, idle after a tail loss: down", r.now)
		}
	}
	if st != stateUp {
		t.Fatalf("5 s after a tail loss: %v, want up", st)
	}
}

// A dying link's TCP flow slows down or waits for its retransmission timer, so a report
// may find the link hardly used: no verdict, but the suspicion stands, and the report
// after the sender resumes, into the silence, is the second verdict.
func TestASenderStallKeepsTheSuspicion(t *testing.T) {
	var q quietWatch
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var sent uint64
	for ms := 0; ms <= 1200; ms += 50 {
		if ms <= 600 || ms >= 900 { // 12 packets per 100 ms, none in 650..850 ms
			sent += 6
		}
		q.mark(at(ms), sent, uint32(sent))
	}
	const span = 100 * time.Millisecond
	q.onReport(at(420), at(480), span, true, true, 0) // data arriving up to about 480 ms; the link dies at 500
	steps := []struct {
		report, cutoff int
		want           int
	}{
		{700, 620, 1},   // owes what was sent in 500..600 ms: suspect
		{800, 720, 1},   // the sender stalled: no verdict, the suspicion stands
		{900, 820, 1},   // still stalled
		{1100, 1020, 2}, // sending again into the silence: down
	}
	for _, c := range steps {
		q.onReport(at(c.cutoff), at(c.report-20), span, false, true, 0)
		if q.reports != c.want {
			t.Fatalf("report at %d ms: %d quiet reports, want %d", c.report, q.reports, c.want)
		}
	}
}

// A link suspect on the reports goes down as soon as its probes have been silent for the
// suspicion time as well, without waiting for a second report (its TCP flow stalled and
// sent nothing more) or for down_after.
func TestReportsAndProbeSilenceTogetherTakeALinkDown(t *testing.T) {
	r := newQuietRig(t, 20*time.Millisecond)
	for range 20 {
		r.step(6, 12, true)
	}
	died := r.now
	r.step(12, 0, false) // the last burst, lost; then the sender waits
	var st linkState
	for st != stateDown {
		if st = r.step(0, 0, false); r.now-died > rigDownAfter {
			t.Fatalf("%v after the death, silent and suspect on the reports: %v, want down before down_after", r.now-died, st)
		}
	}
}

// A TCP flow whose packets a dead link swallowed stalls within an RTT: the resequencer
// holds everything behind the gap, so no ACKs come back and the sender has nothing more
// to send on any link. The reports then show nothing arriving anywhere, which is no
// verdict (it could be the peer stalling), and the probes alone would take the link
// down only at down_after (the CI run of 6ffbf1c: recovery 1.12 s). The packets the
// link owes are a verdict together with the probes' silence: suspect (copies) at half
// the suspicion time, down at all of it.
func TestOwedPacketsAndProbeSilenceTakeAStalledLinkDown(t *testing.T) {
	r := newQuietRig(t, 20*time.Millisecond)
	for range 20 {
		r.step(6, 12, true)
	}
	died := r.now
	r.step(6, 0, false) // the last packets, sent into the death
	r.othersIdle = true // then the flow stalls: nothing more is sent or arrives
	var st linkState
	var suspectAt time.Duration
	for st != stateDown {
		if st = r.step(0, 0, false); st == stateSuspect && suspectAt == 0 {
			suspectAt = r.now - died
			if r.cause != causeOwedAndSilence {
				t.Errorf("suspect because %q", r.cause)
			}
		}
		if r.now-died > rigDownAfter {
			t.Fatalf("%v after the death, owing its last packets and no probe reply: %v, want down at the suspicion time", r.now-died, st)
		}
	}
	if took := r.now - died; took > rigSuspectAfter+100*time.Millisecond {
		t.Errorf("down %v after the death; want within the suspicion time (%v) and a tick", took, rigSuspectAfter)
	}
	// Suspect, with copies for a retransmission, at half the suspicion time.
	if suspectAt == 0 || suspectAt > rigSuspectAfter/2+100*time.Millisecond {
		t.Errorf("suspect %v after the death; want within half the suspicion time (%v) and a tick", suspectAt, rigSuspectAfter/2)
	}
	if r.cause != causeOwedAndSilence {
		t.Errorf("down because %q; the test means a stall no report can judge", r.cause)
	}
}

// An idle link owes nothing, so its probes alone decide: suspect at the suspicion time,
// down only at down_after.
func TestAnIdleSilentLinkWaitsForDownAfter(t *testing.T) {
	r := newQuietRig(t, 20*time.Millisecond)
	for range 20 {
		r.step(6, 12, true)
	}
	r.step(0, 6, true) // the flow ends: its last packets arrive, in the next report
	r.step(0, 6, true)
	for range 10 {
		r.step(0, 0, true)
	}
	died := r.now
	var st linkState
	for st != stateDown {
		st = r.step(0, 0, false)
		if st == stateDown && r.now-died < rigDownAfter-50*time.Millisecond { // the last reply came up to a step before
			t.Fatalf("idle link down %v after it went silent (%q); want after down_after %v", r.now-died, r.cause, rigDownAfter)
		}
		if r.now-died > 2*rigDownAfter {
			t.Fatalf("idle silent link still %v after %v", st, r.now-died)
		}
	}
}

// When every link of the session falls silent at once, the peer or the path stalled,
// not a link: a link owing data is then held to the probes' times like any other.
func TestOwedPacketsSayNothingWhenAllLinksAreSilent(t *testing.T) {
	r := newQuietRig(t, 20*time.Millisecond)
	for range 20 {
		r.step(6, 12, true)
	}
	died := r.now
	r.step(6, 0, false)
	r.othersIdle = true
	r.l.quiet.othersSilent = true // as the session marks it when no link shows life
	for r.now-died < rigSuspectAfter {
		if st := r.step(0, 0, false); st != stateUp {
			t.Fatalf("%v into a silence of every link: %v (%q), want up until the suspicion time", r.now-died, st, r.cause)
		}
	}
	for r.now-died < rigDownAfter {
		if st := r.step(0, 0, false); st == stateDown {
			t.Fatalf("%v into a silence of every link: down (%q), want not before down_after", r.now-died, r.cause)
		}
	}
}

// The session marks a link's peers silent when no other link showed life within half
// the suspicion time.
func TestMarkSilentPeers(t *testing.T) {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	send := func(*link, []byte) error { return nil }
	a := s.addLink(LinkSpec{ID: 0, Name: "a"}, send)
	b := s.addLink(LinkSpec{ID: 1, Name: "b"}, send)
	t0 := time.Unix(1000, 0)
	half := 3 * s.cfg.Probe / 2
	a.onReply(t0, 20*time.Millisecond)
	b.onReply(t0.Add(-2*half), 20*time.Millisecond)
	s.markSilentPeers([]*link{a, b}, t0.Add(half/2))
	if !a.quiet.othersSilent || b.quiet.othersSilent {
		t.Errorf("a alive, b silent: a's peers silent %v (want true), b's %v (want false)", a.quiet.othersSilent, b.quiet.othersSilent)
	}
	s.markSilentPeers([]*link{a, b}, t0.Add(2*half))
	if !a.quiet.othersSilent || !b.quiet.othersSilent {
		t.Errorf("both silent: peers silent %v, %v; want true for both", a.quiet.othersSilent, b.quiet.othersSilent)
	}
}

// A link that lost its last packets and has carried nothing since owes them only for
// staleOwed: after that they are an old loss. Owed for good, they kept the session in
// doubt and its idle metered backup probed every interval.
func TestAnOldLossIsNotOwedForGood(t *testing.T) {
	r := newQuietRig(t, 20*time.Millisecond)
	for range 20 {
		r.step(1, 2, true)
	}
	r.step(4, 0, true) // the flow's last packets, lost; the link lives on, idle
	owedAt, freeAt := time.Duration(-1), time.Duration(-1)
	lost := r.now
	for range 60 {
		r.step(0, 0, true)
		switch owes := r.l.owes(); {
		case owes && owedAt < 0:
			owedAt = r.now
		case !owes && owedAt >= 0 && freeAt < 0:
			freeAt = r.now
		}
	}
	if owedAt < 0 {
		t.Fatal("the lost packets were never owed")
	}
	if freeAt < 0 {
		t.Fatalf("the lost packets are still owed %v after they were sent, with nothing sent since", r.now-lost)
	}
	if took := freeAt - lost; took > staleOwed+300*time.Millisecond {
		t.Errorf("the lost packets were owed until %v after they were sent; want about staleOwed (%v)", took, staleOwed)
	}
}

// What the kernel sent on a link counts at the tick after it, not at the tick after
// that: a report that confirms the packets must find them in the tick's mark. With the
// mark taken before the tick merged the kernel's counts, a report that showed all of a
// burst arriving confirmed none of it, and the next report, with nothing new on the
// now idle link, owed the whole burst: the link went suspect and its traffic was
// copied (the e2e split test's fast path, at the start of each transfer).
func TestKernelSendsCountAtTheTickAfterThem(t *testing.T) {
	s, l, fp := fastSessionWithLink()
	other := s.addLink(LinkSpec{ID: 4, Name: "cable"}, func(*link, []byte) error { return nil })
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, k := range []*link{l, other} {
		k.onReply(t0, time.Millisecond)
		k.setState(stateUp)
		k.est.Train(30e6)
	}
	report := func(ms int, rx, otherRx uint32) {
		s.onFeedback(at(ms), uint32(ms*1000), wire.FeedbackBody{Links: []wire.LinkReport{
			{LinkID: 3, RxPackets: rx, RxBytes: uint64(rx) * 1456, HighestLinkSeq: rx},
			{LinkID: 4, RxPackets: otherRx, RxBytes: uint64(otherRx) * 1456},
		}})
	}
	for ms := 0; ms <= 100; ms += 100 {
		l.onReply(at(ms), time.Millisecond)
		other.onReply(at(ms), time.Millisecond)
		s.tick(at(ms))
		report(ms+1, 0, 0)
	}
	fp.send(3, 26) // a burst at 150 ms, all of it delivered by the report at 201
	l.onReply(at(200), time.Millisecond)
	s.tick(at(200))
	if sent, _ := l.quiet.sentBy(at(200)); sent != 26 {
		t.Errorf("the tick at 200 ms marked %d packets sent, want the 26 the kernel sent before it", sent)
	}
	report(201, 26, 30)
	l.onReply(at(300), time.Millisecond)
	s.tick(at(300))
	report(301, 26, 60) // nothing new on the link: nothing was sent since the burst
	s.tick(at(302))
	if l.isSuspect() || l.quietReports() > 0 {
		t.Errorf("a link whose burst was all delivered is suspect after a report with nothing new (quiet reports %d)", l.quietReports())
	}
}

// A report that shows a link's packets all arrived confirms them, even those sent
// after the last mark before the report's reach (marks come once per tick and
// report): the next report, with nothing new on the link because the sender moved
// its traffic elsewhere, owes nothing. It did, by the sent-packet count alone, and a
// 10 Mbit/s link carrying a trickle of ACKs went suspect as two faster links took them
// over (the e2e split test, fast path).
func TestPacketsThePeerReportedAreNotOwed(t *testing.T) {
	r := newQuietRig(t, 20*time.Millisecond)
	r.l.mu.Lock()
	r.l.est.Train(10e6)
	r.l.mu.Unlock()
	for range 20 {
		r.step(10, 20, true)
	}
	for range 20 { // the traffic moved to other links; those deliver
		if st := r.step(0, 0, true); st != stateUp {
			t.Fatalf("at %v, after its traffic moved elsewhere with all of it delivered: %v (%s)", r.now, st, r.cause)
		}
	}
}

// A link taken down with packets in flight (its carrier lost) owes none of them when it
// returns: they were written off (the peer got a loss notice for them). Before, the
// reports went on owing them until the link's new packets arrived, and a returning link
// that the kernel's schedule took back a tick later was made suspect for that silence.
func TestAReturningLinkOwesNothingFromBeforeItWentDown(t *testing.T) {
	r := newQuietRig(t, 20*time.Millisecond)
	for range 40 { // 2 s of 120 packets/s, all arriving
		r.step(6, 12, true)
	}
	r.step(12, 0, false) // in flight when the carrier goes: never arrives
	r.l.mu.Lock()
	r.l.setState(stateDown)
	r.l.mu.Unlock()

	r.l.onReply(r.t0.Add(r.now), 20*time.Millisecond) // carrier back: the first probe's reply
	for range 4 {                                     // 200 ms of reports before the link's new packets arrive, no probe due
		if st := r.step(0, 0, false); st != stateUp {
			t.Fatalf("%v after its return, with nothing sent since: %v (%v), want up", r.now, st, r.cause)
		}
	}
	for range 10 {
		if st := r.step(6, 12, true); st != stateUp {
			t.Fatalf("%v after its return, delivering: %v (%v), want up", r.now, st, r.cause)
		}
	}
}
