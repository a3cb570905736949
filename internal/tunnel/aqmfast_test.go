package tunnel

import (
	"slices"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/aqm"
	"github.com/aggd/aggd/internal/clock"
	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/sched"
)

// With the kernel fast path the session has one AQM schedule (a spacing, fpGap).
// The daemon carries it out on its own packets, one signal per spacing, only while the
// kernel sends nothing; while the kernel is seen sending, the kernel carries it out and
// the daemon signals on none of its packets, so that the two paths do not signal twice.
func TestDaemonLeavesTheAQMScheduleToTheKernelWhileItSends(t *testing.T) {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	s.aqm = aqm.New(int64(time.Millisecond), int64(100*time.Millisecond))
	s.fp = &fakeSessionPath{}
	const ms = int64(time.Millisecond)
	start := int64(time.Hour)
	// signals sends a packet every ms over [from, from+d) and returns when (ms after
	// start) the AQM signalled.
	signals := func(from, d int64) (at []int64) {
		s.txMu.Lock()
		defer s.txMu.Unlock()
		for now := from; now < from+d; now += ms {
			if s.aqmSignal(now) {
				at = append(at, (now-start)/ms)
			}
		}
		return at
	}
	s.fpGap = 50 * ms
	if got, want := signals(start, 200*ms), []int64{0, 50, 100, 150}; !slices.Equal(got, want) {
		t.Errorf("kernel silent, spacing 50 ms: signals at %v ms, want %v", got, want)
	}
	s.kernelSentAt.Store(start + 200*ms)
	if got := signals(start+200*ms, 50*ms); len(got) != 0 {
		t.Errorf("kernel sending: the daemon signalled at %v ms, want never", got)
	}
	// Three probe intervals (60 ms here) after the kernel was last seen sending, the
	// daemon takes the schedule up again, from its first packet.
	if got, want := signals(start+300*ms, 60*ms), []int64{300, 350}; !slices.Equal(got, want) {
		t.Errorf("kernel silent again: signals at %v ms, want %v", got, want)
	}
	s.fpGap = 0
	if got := signals(start+400*ms, 100*ms); len(got) != 0 {
		t.Errorf("no spacing: signals at %v ms, want none", got)
	}
}

// What the kernel's share of the AQM schedule dropped and marked counts in the peer's
// aggd_aqm_* counters, as the daemon's own drops do: with the fast path on, the kernel
// makes nearly all of them, and the counters read 0 otherwise.
func TestKernelAQMDropsCountAsThePeers(t *testing.T) {
	m := metrics.New()
	s := newSession(testSession(), m, discard, 1, func([]byte) {})
	fp := &fakeSessionPath{}
	s.fp = fp
	fp.aqmSince = AQMDelta{Drops: 5, ECTDrops: 2, Marks: 3}
	s.mergeFastTx(s.allLinks())
	fp.aqmSince = AQMDelta{Drops: 1}
	s.mergeFastTx(s.allLinks())
	peer := s.pm
	if d, e, k := gauge(peer.aqmDrops), gauge(peer.aqmECTDrops), gauge(peer.aqmMarks); d != 6 || e != 2 || k != 3 {
		t.Errorf("after the kernel dropped 5 (2 ECN-capable) and marked 3, then dropped 1: drops %v, ECN-capable drops %v, marks %v; want 6, 2, 3", d, e, k)
	}
}

// In userspace the daemon offers every packet to the AQM. One that comes after an
// interval without any is never dropped, whatever queue the last measure showed: the
// sender was not feeding it (a TCP flow's tail-loss probe, or its retransmission after
// a timeout, when the links it was using died).
func TestNoDropAfterTheSenderIdled(t *testing.T) {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	s.aqm = aqm.New(int64(time.Millisecond), int64(100*time.Millisecond))
	const ms = int64(time.Millisecond)
	start := int64(time.Hour)
	s.bondQueue.Store(50 * ms)
	s.bondQueueGen.Add(1)
	s.txMu.Lock()
	defer s.txMu.Unlock()
	dropped := 0
	for now := start; now < start+300*ms; now += ms {
		if s.aqmSignal(now) {
			dropped++
		}
	}
	if dropped == 0 {
		t.Fatal("setup: no drop in 300 ms of packets every ms on a 50-ms queue")
	}
	s.bondQueueGen.Add(1) // a newer measure, showing the same queue
	if s.aqmSignal(start + 440*ms) {
		t.Error("the first packet after 140 ms without any was dropped")
	}
}

// The daemon's half of the fast path's schedule spares the packet after an AQM
// interval without any, as the kernel's does (aggd_aqm_drop), and restarts from it.
func TestDaemonScheduleSparesThePacketAfterAnIdleSpell(t *testing.T) {
	const ms = int64(time.Millisecond)
	var next, last int64
	start := int64(time.Hour)
	if !dueEvery(&next, &last, 20*ms, start) {
		t.Fatal("setup: the first packet once a gap is set was not signalled")
	}
	if dueEvery(&next, &last, 20*ms, start+150*ms) {
		t.Error("the first packet after 150 ms without any was signalled")
	}
	if dueEvery(&next, &last, 20*ms, start+160*ms) {
		t.Error("a packet 10 ms after the spared one was signalled; the schedule restarts from it")
	}
	if !dueEvery(&next, &last, 20*ms, start+170*ms) {
		t.Error("no signal a spacing after the spared packet")
	}
}

// The AQM holds while a link that carries traffic is in doubt: its measure is then the
// dying links' last report, and what the senders send is a failover's retransmissions.
// A standby link in doubt while the primaries carry the traffic does not hold it.
func TestAFailoverIsUnderWayWhileALinkThatCarriesTrafficIsSuspect(t *testing.T) {
	link := func(usable, suspect bool, class sched.Class) sched.LinkParams {
		return sched.LinkParams{Usable: usable, Suspect: suspect, Class: class, RateBps: 1e6}
	}
	primary, backup := sched.ClassPrimary, sched.ClassBackup
	cases := []struct {
		name  string
		links []sched.LinkParams
		want  bool
	}{
		{"all up", []sched.LinkParams{link(true, false, primary), link(true, false, primary), link(true, false, backup)}, false},
		{"a primary suspect", []sched.LinkParams{link(true, true, primary), link(true, false, primary), link(true, false, backup)}, true},
		{"the idle backup suspect", []sched.LinkParams{link(true, false, primary), link(true, true, backup)}, false},
		{"the backup suspect, carrying alone", []sched.LinkParams{link(false, false, primary), link(true, true, backup)}, true},
		{"a suspect link out of the schedule", []sched.LinkParams{link(false, true, primary), link(true, false, primary)}, false},
	}
	for _, c := range cases {
		if got := failoverUnderWay(c.links); got != c.want {
			t.Errorf("%s: failover under way = %v, want %v", c.name, got, c.want)
		}
	}
}

// kernelAQMDropping returns a fast-path session with one link up whose AQM has the
// kernel dropping on a 50-ms queue above a 1-ms target, and measure, which makes a new
// measure of the same queue, 12 ms after the last, and returns the kernel's spacing:
// measures 12 ms apart outlast the interval and, two at a time, the reaction time (a
// 20-ms probe interval, no RTT yet).
func kernelAQMDropping(t *testing.T) (*Session, *link, *fakeSessionPath, func() time.Duration) {
	t.Helper()
	s, l, sp := fastSessionWithLink()
	s.installKeys(&keyGen{id: 1, created: time.Now()}, true)
	l.setState(stateUp)
	s.aqm = aqm.New(int64(time.Millisecond), int64(time.Millisecond))
	s.bondQueue.Store(int64(50 * time.Millisecond))
	measure := func() time.Duration {
		time.Sleep(12 * time.Millisecond)
		s.bondQueueGen.Add(1)
		s.refreshSchedule()
		return sp.programmed.AQMGap
	}
	measure()
	if gap := measure(); gap == 0 {
		t.Fatal("setup: no drop schedule on a 50-ms queue above a 1-ms target")
	}
	return s, l, sp, measure
}

// With the kernel fast path: a link going into doubt clears the kernel's drop schedule
// at once (announceSuspect refreshes it), and once the doubt is resolved the queue must
// stand above the target for an interval again before the kernel drops anything.
func TestTheKernelsAQMScheduleHoldsWhileALinkIsInDoubt(t *testing.T) {
	s, l, sp, measure := kernelAQMDropping(t)
	l.setState(stateSuspect) // as checkLinkHealth finds it, and then announces it
	s.announceSuspect(l, causeSilence)
	if gap := sp.programmed.AQMGap; gap != 0 {
		t.Errorf("a link in doubt: the kernel drops every %s, want no drop", gap)
	}
	if gap := measure(); gap != 0 {
		t.Errorf("a new measure while the link is in doubt: the kernel drops every %s, want no drop", gap)
	}
	l.setState(stateUp)
	resolved := clock.Nanos()
	s.refreshSchedule() // the doubt resolved, on the measure of before
	if gap := sp.programmed.AQMGap; gap != 0 {
		t.Errorf("the doubt resolved: the kernel drops every %s, want none before an interval above target", gap)
	}
	// No drop schedule on a measure taken within the reaction time (the 20-ms probe
	// interval) after the doubt was resolved (aqm.Codel.Settle); then the control law
	// resumes.
	for range 5 {
		gap := measure()
		at := clock.Nanos()
		if gap == 0 {
			continue
		}
		if since := time.Duration(at - resolved); since < 20*time.Millisecond {
			t.Errorf("a drop schedule (%s) on a measure %s after the doubt was resolved: within the 20-ms reaction time", gap, since)
		}
		return
	}
	t.Error("the queue stayed above target for intervals after the doubt, and the kernel was given no drop schedule")
}

// In userspace the daemon drops nothing while a link that carries traffic is in doubt.
func TestTheDaemonsAQMHoldsWhileALinkIsInDoubt(t *testing.T) {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	l := s.addLink(LinkSpec{ID: 1, Name: "cable"}, func(*link, []byte) error { return nil })
	l.setState(stateUp)
	s.aqm = aqm.New(int64(time.Millisecond), int64(time.Millisecond))
	s.bondQueue.Store(int64(50 * time.Millisecond))
	const ms = int64(time.Millisecond)
	// The session's clock, which refreshSchedule reads: the first two spells of 100 ms
	// are over before the test begins, the third begins now.
	start := clock.Nanos() - 300*ms
	// drops sends a packet every ms over [from, from+100 ms), with a new measure every
	// 10 ms, and counts the drops; first is when the first was made.
	drops := func(from int64) (n int, first int64) {
		s.refreshSchedule()
		s.txMu.Lock()
		defer s.txMu.Unlock()
		for now := from; now < from+100*ms; now += ms {
			if (now-from)%(10*ms) == 0 {
				s.bondQueueGen.Add(1)
			}
			if s.aqmSignal(now) {
				if n == 0 {
					first = now
				}
				n++
			}
		}
		return n, first
	}
	if n, _ := drops(start); n == 0 {
		t.Fatal("setup: no drop in 100 ms on a 50-ms queue above a 1-ms target")
	}
	l.setState(stateSuspect)
	if n, _ := drops(start + 100*ms); n != 0 {
		t.Errorf("a link in doubt: %d drops, want none", n)
	}
	l.setState(stateUp)
	// The doubt is resolved at the next refresh, no sooner than now: the first drop
	// after it acts on a measure of the links left, one that came at least the reaction
	// time (the 20-ms probe interval) later (aqm.Codel.Settle).
	resolved := clock.Nanos()
	n, first := drops(resolved)
	if n == 0 {
		t.Fatal("the doubt resolved: no drop in 100 ms on a 50-ms queue")
	}
	if since := time.Duration(first - resolved); since < 20*time.Millisecond {
		t.Errorf("the first drop after the doubt came %s after it was resolved: within the 20-ms reaction time", since)
	}
}
