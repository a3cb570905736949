package tunnel

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/sched"
	"github.com/aggd/aggd/internal/wire"
)

// The health state machine, driven with explicit times: probing → up → suspect → down →
// up, and what the scheduler is told in each state.
func TestLinkHealthStateMachine(t *testing.T) {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	l := s.addLink(LinkSpec{ID: 0, Name: "up0"}, func(*link, []byte) error { return nil })
	const suspectAfter, downAfter = 300 * time.Millisecond, time.Second
	t0 := time.Unix(1000, 0)
	rtt := 10 * time.Millisecond

	check := func(now time.Time, want linkState, usable, suspect bool) {
		t.Helper()
		got, _, _ := l.checkHealth(now, suspectAfter, downAfter)
		if got != want {
			t.Fatalf("at %v: state %v, want %v", now.Sub(t0), got, want)
		}
		p := l.params()
		if p.Usable != usable || p.Suspect != suspect {
			t.Fatalf("at %v (%v): scheduler told usable=%v suspect=%v, want %v %v", now.Sub(t0), want, p.Usable, p.Suspect, usable, suspect)
		}
	}
	check(t0.Add(5*time.Second), stateProbing, false, false) // never answered: stays probing

	if was := l.onReply(t0, rtt); was != stateProbing {
		t.Fatalf("first reply: was %v, want probing", was)
	}
	check(t0.Add(suspectAfter), stateUp, true, false)
	check(t0.Add(suspectAfter+time.Millisecond), stateSuspect, true, true)
	check(t0.Add(downAfter), stateSuspect, true, true)
	check(t0.Add(downAfter+time.Millisecond), stateDown, false, false)

	if was := l.onReply(t0.Add(2*time.Second), rtt); was != stateDown {
		t.Fatalf("reply after down: was %v, want down", was)
	}
	check(t0.Add(2*time.Second), stateUp, true, false)
	// A reply while suspect ends the doubt.
	check(t0.Add(2*time.Second+suspectAfter+time.Millisecond), stateSuspect, true, true)
	if was := l.onReply(t0.Add(3*time.Second), rtt); was != stateSuspect {
		t.Fatalf("reply while suspect: was %v, want suspect", was)
	}
	check(t0.Add(3*time.Second), stateUp, true, false)
	if why := liftCause(l, t0.Add(3*time.Second)); why != "it answers probes again" {
		t.Errorf("up again after a reply: logged cause %q", why)
	}

	// In doubt for data it owes, then owing nothing, with no sign of life meanwhile:
	// the log does not claim one.
	l.mu.Lock()
	l.quiet.owing = true
	l.mu.Unlock()
	check(t0.Add(3*time.Second+200*time.Millisecond), stateSuspect, true, true)
	l.mu.Lock()
	l.quiet.owing = false
	l.mu.Unlock()
	check(t0.Add(3*time.Second+250*time.Millisecond), stateUp, true, false)
	if why := liftCause(l, t0.Add(3*time.Second+250*time.Millisecond)); !strings.HasPrefix(why, "the doubt around it lifted") {
		t.Errorf("up again with no sign of life: logged cause %q", why)
	}
}

// liftCause is the cause l.liftedBy gives the log.
func liftCause(l *link, now time.Time) string {
	kv := l.liftedBy(now)
	return kv[slices.Index(kv, any("cause"))+1].(string)
}

// What a link's state change tells the metrics, the next packet sent finds in the
// schedule, whoever changed it and whether or not the one who did asked for a new
// schedule: a packet sent by someone who read the link up in the metrics must not
// meet a schedule that still lacks it (nor one that still has a link read down).
func TestTheNextPacketFindsTheLinksStateInTheSchedule(t *testing.T) {
	r := newRescueRig(t)
	s := r.s
	if !s.SendData(make([]byte, wire.HeaderLen+100)) {
		t.Fatal("setup: SendData found no usable link")
	}
	setState := func(l *link, st linkState) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.setState(st)
	}
	for _, l := range r.links {
		setState(l, stateDown)
	}
	if s.SendData(make([]byte, wire.HeaderLen+100)) {
		t.Fatal("every link was down, yet a packet was sent")
	}
	r.clear()
	setState(r.links[2], stateUp)
	if gauge(r.links[2].m.up) != 1 {
		t.Fatal("the metrics do not show up2 up")
	}
	if !s.SendData(make([]byte, wire.HeaderLen+100)) {
		t.Fatal("up2 is up in the metrics, yet the packet found no usable link")
	}
	if got, _ := r.seqsOn(2); len(got) != 1 {
		t.Errorf("up2 carried %v, want the one packet", got)
	}
}

// A link with a long RTT (a deep but working queue) is not suspected before three RTTs.
func TestSuspicionWaitsForSlowLinks(t *testing.T) {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	l := s.addLink(LinkSpec{ID: 0, Name: "sat"}, func(*link, []byte) error { return nil })
	t0 := time.Unix(1000, 0)
	l.onReply(t0, 600*time.Millisecond)
	if st, _, _ := l.checkHealth(t0.Add(time.Second), 300*time.Millisecond, 5*time.Second); st != stateUp {
		t.Fatalf("silent for 1 s with a 600 ms RTT: %v, want up", st)
	}
	if st, _, _ := l.checkHealth(t0.Add(1900*time.Millisecond), 300*time.Millisecond, 5*time.Second); st != stateSuspect {
		t.Fatalf("silent for 1.9 s with a 600 ms RTT: %v, want suspect", st)
	}
}

// A link with a long RTT is not declared down before it has been suspect for as long
// as it took to suspect it, whatever down_after says.
func TestDownWaitsForSlowLinks(t *testing.T) {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	l := s.addLink(LinkSpec{ID: 0, Name: "sat"}, func(*link, []byte) error { return nil })
	t0 := time.Unix(1000, 0)
	l.onReply(t0, 600*time.Millisecond)
	const suspectAfter, downAfter = 300 * time.Millisecond, 600 * time.Millisecond
	for _, c := range []struct {
		at   time.Duration
		want linkState
	}{
		{500 * time.Millisecond, stateUp},       // past down_after, not yet three RTTs
		{1900 * time.Millisecond, stateSuspect}, // three RTTs
		{3500 * time.Millisecond, stateSuspect}, // not yet six
		{3700 * time.Millisecond, stateDown},    // six RTTs
	} {
		if st, _, _ := l.checkHealth(t0.Add(c.at), suspectAfter, downAfter); st != c.want {
			t.Fatalf("silent for %v with a 600 ms RTT: %v, want %v", c.at, st, c.want)
		}
	}
}

// The peer's reports of new data received on a link keep it alive when its probe
// replies are late (a deep queue: the probes wait behind the data), end a suspicion,
// and, once they stop too, let it go suspect and down as before.
func TestDeliveredDataKeepsALinkAlive(t *testing.T) {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	l := s.addLink(LinkSpec{ID: 0, Name: "adsl"}, func(*link, []byte) error { return nil })
	const suspectAfter, downAfter = 300 * time.Millisecond, 600 * time.Millisecond
	t0 := time.Unix(1000, 0)
	l.onReply(t0, 20*time.Millisecond)
	var rx uint32
	report := func(at time.Duration, more uint32) {
		rx += more
		l.txLinkSeq.Store(rx + 1) // a deep queue: more in flight behind what arrived
		l.onFeedback(t0.Add(at), uint32(at/time.Microsecond), wire.LinkReport{RxPackets: rx, RxBytes: uint64(rx) * 1500, HighestLinkSeq: rx}, true)
	}
	check := func(at time.Duration, want linkState) {
		t.Helper()
		if st, _, _ := l.checkHealth(t0.Add(at), suspectAfter, downAfter); st != want {
			t.Fatalf("at %v: %v, want %v", at, st, want)
		}
	}
	report(0, 1)
	// No probe reply after t0, but the peer keeps reporting data arriving.
	for at := 100 * time.Millisecond; at <= time.Second; at += 100 * time.Millisecond {
		report(at, 2)
		check(at, stateUp)
	}
	// The reports stop showing progress: suspect, then down.
	report(1100*time.Millisecond, 0)
	check(1301*time.Millisecond, stateSuspect)
	report(1400*time.Millisecond, 1) // data again: the doubt ends
	check(1400*time.Millisecond, stateUp)
	if why := liftCause(l, t0.Add(1400*time.Millisecond)); why != "the peer reports our data arriving on it" {
		t.Errorf("up again on data: logged cause %q", why)
	}
	check(1701*time.Millisecond, stateSuspect)
	check(2001*time.Millisecond, stateDown)
	report(2100*time.Millisecond, 1) // late data does not bring a down link back: a probe reply does
	check(2100*time.Millisecond, stateDown)
}

// A FEEDBACK older than one already taken (they travel on whichever link is best, so
// they can overtake each other) is ignored: its counters would run backwards. It is
// logged; the newest report's second copy, which most reports have, is not.
func TestStaleFeedbackIsIgnored(t *testing.T) {
	var log bytes.Buffer
	s := newSession(testSession(), metrics.New(), debugLog(&log), 1, func([]byte) {})
	l := s.addLink(LinkSpec{ID: 0, Name: "cable"}, func(*link, []byte) error { return nil })
	now := time.Unix(1000, 0)
	report := func(peerTime, pkts uint32) {
		s.onFeedback(now, peerTime, wire.FeedbackBody{Links: []wire.LinkReport{{LinkID: 0, RxPackets: pkts, RxBytes: uint64(pkts) * 1500}}})
	}
	report(100_000, 10)
	report(200_000, 30)
	report(200_000, 30) // its copy on a second link: no news, and no line
	if strings.Contains(log.String(), "stale FEEDBACK") {
		t.Errorf("the second copy of the newest report was logged as stale:\n%s", log.String())
	}
	report(150_000, 20) // overtaken on the way
	if got := l.prevReport.RxPackets; got != 30 {
		t.Fatalf("after a stale report the link's last report counts %d packets, want 30 (the newest)", got)
	}
	if !strings.Contains(log.String(), `msg="stale FEEDBACK ignored" peer="" session=1 peer_time_us=150000 newest_us=200000`) {
		t.Errorf("the overtaken report was not logged as stale:\n%s", log.String())
	}
	report(300_000, 50)
	if c := l.est.Capacity(); c > 10e6 {
		t.Errorf("capacity estimate %.3g bit/s after a stale report: the counters ran backwards", c)
	}
}

// A link the peer's reports show our data arriving on is probed every busyProbeEvery
// intervals; an idle one, or one in doubt, every interval (an idle backup link: below).
func TestBusyLinksAreProbedLessOften(t *testing.T) {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	l := s.addLink(LinkSpec{ID: 0, Name: "cable"}, func(*link, []byte) error { return nil })
	const interval = 100 * time.Millisecond
	t0 := time.Unix(1000, 0)
	l.onReply(t0, 10*time.Millisecond)
	var rx uint32
	probes := func(ticks int, busy, doubt bool) (n int) {
		for range ticks {
			t0 = t0.Add(interval)
			if busy {
				rx += 10
				l.txLinkSeq.Store(rx + 10) // still sending
				l.onFeedback(t0.Add(-interval/2), uint32(t0.UnixMicro()), wire.LinkReport{RxPackets: rx, RxBytes: uint64(rx) * 1500, HighestLinkSeq: rx}, true)
			}
			if l.probeDue(t0, interval, doubt) {
				n++
			}
		}
		return n
	}
	if n := probes(20, false, false); n != 20 {
		t.Errorf("idle link: %d probes in 20 intervals, want 20", n)
	}
	if n := probes(20, true, false); n != 20/busyProbeEvery {
		t.Errorf("busy link: %d probes in 20 intervals, want %d", n, 20/busyProbeEvery)
	}
	if n := probes(8, true, true); n != 8 {
		t.Errorf("busy link while another owes data: %d probes in 8 intervals, want 8", n)
	}
	l.mu.Lock()
	l.setState(stateSuspect)
	l.mu.Unlock()
	if n := probes(8, true, false); n != 8 {
		t.Errorf("busy suspect link: %d probes in 8 intervals, want 8", n)
	}
}

// An idle standby link (here a backup) is probed every standby interval while a
// primary is up, and its silence is judged in that unit; carrying traffic, or while a
// link owes data, it is probed as the others are. When the primary goes away its unit
// shrinks: it is probed at once and its silence counts afresh, so its last answer,
// seconds old, does not make it suspect just when the bond needs it. It carries no
// FEEDBACK while a primary is up, unless that primary is in doubt.
func TestIdleStandbyLinkIsProbedSeldom(t *testing.T) {
	s, cfg, links := standbyTest(sched.ClassPrimary, sched.ClassBackup)
	primary, backup := links[0], links[1]
	t0 := time.Unix(1000, 0)
	primary.onReply(t0, 10*time.Millisecond)
	backup.onReply(t0, 5*time.Millisecond) // the lower RTT: FEEDBACK's first choice, were it not a backup
	var rx uint32
	probes := func(ticks int, busy, doubt bool) (n int) {
		for range ticks {
			t0 = t0.Add(cfg.Probe)
			if busy {
				rx += 10
				backup.txLinkSeq.Store(rx + 10) // still sending
				backup.onFeedback(t0.Add(-cfg.Probe/2), uint32(t0.UnixMicro()), wire.LinkReport{LinkID: 1, RxPackets: rx, RxBytes: uint64(rx) * 1500, HighestLinkSeq: rx}, true)
			}
			backup.setUnit(s.probeUnit(backup, t0, primary.isUp()), t0)
			if backup.probeDue(t0, cfg.Probe, doubt) {
				n++
				backup.onReply(t0, 5*time.Millisecond) // a working link answers
			}
		}
		return n
	}
	if n := probes(30, false, false); n != 3 {
		t.Errorf("idle backup link: %d probes in 3 s, want 3", n)
	}
	if n := probes(8, false, true); n != 8 {
		t.Errorf("idle backup link while another link owes data: %d probes in 8 intervals, want 8", n)
	}
	if n := probes(20, true, false); n != 20/busyProbeEvery {
		t.Errorf("busy backup link: %d probes in 20 intervals, want %d", n, 20/busyProbeEvery)
	}
	if got := s.probeUnit(primary, t0, true); got != cfg.Probe {
		t.Errorf("a primary link's unit is %v, want %v", got, cfg.Probe)
	}

	// FEEDBACK: on the primary alone; beside it on the backup while it is in doubt.
	if routes := feedbackRoutes([]*link{primary, backup}, false); len(routes) != 1 || routes[0] != primary {
		t.Errorf("FEEDBACK goes on %v, want the primary alone", linkNames(routes))
	}
	if routes := feedbackRoutes([]*link{primary, backup}, true); len(routes) != 2 || routes[0] != primary || routes[1] != backup {
		t.Errorf("while a link owes data FEEDBACK goes on %v, want the primary and the backup", linkNames(routes))
	}

	// Silence, idle: 2 s without a sign is nothing for an idle backup link (three of
	// its intervals make it suspect), while a primary is suspect after 300 ms.
	probes(20, false, false) // idle again: back to the standby unit
	quietFrom := t0
	backup.mu.Lock()
	backup.lastReply, backup.lastDelivered = quietFrom, time.Time{}
	backup.mu.Unlock()
	s.checkLinkHealth(backup, quietFrom.Add(2*time.Second))
	if backup.isSuspect() || !backup.isUp() {
		t.Errorf("idle backup link silent for 2 s: suspect %v up %v, want up", backup.isSuspect(), backup.isUp())
	}

	// The primary goes down 0.9 s into a silence of the backup's, its next answer not
	// yet due: the backup's unit shrinks, it is probed at once, and its silence counts
	// from now. (One whose answer was overdue would be in doubt at once:
	// TestIdleStandbyLinkThatMissesAnAnswerIsVerified.)
	quietFrom = quietFrom.Add(2 * time.Second)
	backup.mu.Lock()
	backup.lastReply = quietFrom
	backup.mu.Unlock()
	primary.mu.Lock()
	primary.setState(stateDown)
	primary.mu.Unlock()
	now := quietFrom.Add(900 * time.Millisecond)
	backup.setUnit(s.probeUnit(backup, now, false), now)
	if u := backup.probeUnit(cfg.Probe); u != cfg.Probe {
		t.Fatalf("with no primary up the backup's unit is %v, want %v", u, cfg.Probe)
	}
	if !backup.probeDue(now, cfg.Probe, false) {
		t.Error("the backup is not probed at once when it becomes the bond's only link")
	}
	s.checkLinkHealth(backup, now.Add(cfg.Probe))
	if backup.isSuspect() || !backup.isUp() {
		t.Errorf("the backup, 1.0 s since its last answer but 0.1 s since it became the only link: suspect %v up %v, want up",
			backup.isSuspect(), backup.isUp())
	}
	s.checkLinkHealth(backup, now.Add(4*cfg.Probe))
	if !backup.isSuspect() {
		t.Error("the backup, the only link, silent for four probe intervals since: not suspect")
	}
	if routes := feedbackRoutes([]*link{primary, backup}, false); len(routes) != 1 || routes[0] != backup {
		t.Errorf("with the primary down FEEDBACK goes on %v, want the backup", linkNames(routes))
	}
}

func linkNames(ls []*link) []string {
	var names []string
	for _, l := range ls {
		names = append(names, l.spec.Name)
	}
	return names
}

// An idle standby link that misses an answer is verified at the probe interval: one
// that died is found down a suspicion time after the missed answer (its doubt began
// there) rather than after three standby intervals or a fresh down_after, one whose
// reply was only late goes back to standing by, and one found down is probed on the
// standby scale again.
func TestIdleStandbyLinkThatMissesAnAnswerIsVerified(t *testing.T) {
	s, cfg, _, backup, t0 := answeringPrimaryAndBackup()
	now := t0
	var probes int
	tick := func(answer bool) {
		now = now.Add(cfg.Probe)
		backup.setUnit(s.probeUnit(backup, now, true), now)
		if backup.probeDue(now, cfg.Probe, false) {
			probes++
			if answer {
				backup.onReply(now, 10*time.Millisecond)
			}
		}
		s.checkLinkHealth(backup, now)
	}
	for range 10 {
		tick(true)
	}
	if u := backup.probeUnit(cfg.Probe); u != cfg.StandbyProbe {
		t.Fatalf("idle backup answering its probes: unit %v, want %v", u, cfg.StandbyProbe)
	}

	// A reply goes missing (a lost packet), then the link answers again.
	answered := backup.lastSign()
	for backup.probeUnit(cfg.Probe) != cfg.Probe && now.Sub(answered) < 3*cfg.StandbyProbe {
		tick(false)
	}
	if silent, most := now.Sub(answered), cfg.StandbyProbe+4*cfg.Probe+20*time.Millisecond; silent > most {
		t.Fatalf("idle backup verified %v after its last answer, want within %v", silent, most)
	}
	if !backup.isUp() || backup.isSuspect() {
		t.Fatalf("idle backup whose reply is just overdue: up %v suspect %v, want up", backup.isUp(), backup.isSuspect())
	}
	probes = 0
	tick(true)
	tick(true)
	if u := backup.probeUnit(cfg.Probe); u != cfg.StandbyProbe || !backup.isUp() || backup.isSuspect() {
		t.Errorf("the backup answered again: unit %v up %v suspect %v, want the standby interval and up", u, backup.isUp(), backup.isSuspect())
	}
	if probes != 1 {
		t.Errorf("verifying a late link cost %d probes before it answered, want 1", probes)
	}

	// Now it dies: found down within the missed answer plus the suspicion time.
	answered = backup.lastSign()
	var suspectAt time.Time
	for backup.isUp() && now.Sub(answered) < 3*cfg.StandbyProbe {
		tick(false)
		if suspectAt.IsZero() && backup.isSuspect() {
			suspectAt = now
		}
	}
	if backup.isUp() {
		t.Fatalf("idle backup silent for %v: still up, want down", now.Sub(answered))
	}
	// In doubt from the tick after the missed answer: that tick's probe went unanswered.
	if took, most := suspectAt.Sub(answered), cfg.StandbyProbe+5*cfg.Probe+20*time.Millisecond; suspectAt.IsZero() || took > most {
		t.Errorf("idle backup suspect %v after its last answer, want within %v", took, most)
	}
	// The missed answer and a tick, then the suspicion time (three probe intervals) and
	// a tick: not a fresh down_after (six).
	if took, most := now.Sub(answered), cfg.StandbyProbe+4*cfg.Probe+20*time.Millisecond+4*cfg.Probe; took > most {
		t.Errorf("idle backup found down %v after its last answer, want at most %v", took, most)
	}
	// Down, it is probed on the standby scale.
	probes = 0
	for range 30 {
		tick(false)
	}
	if probes != 3 {
		t.Errorf("a down backup got %d probes in 3 s, want 3", probes)
	}
}

// A standby link that carried data keeps the probe interval as its unit for three
// standby intervals after its last packet, so that dying under load it is found dead
// on the primaries' scale although its reports of delivery stopped at once.
func TestStandbyLinkThatCarriedDataIsJudgedQuickly(t *testing.T) {
	s, cfg, links := standbyTest(sched.ClassPrimary, sched.ClassOverflow)
	primary, lte := links[0], links[1]
	t0 := time.Unix(1000, 0)
	primary.onReply(t0, 10*time.Millisecond)
	lte.onReply(t0, 10*time.Millisecond)
	tick := func(now time.Time) {
		lte.noteSent(now)
		lte.setUnit(s.probeUnit(lte, now, true), now)
	}
	tick(t0)
	if u := lte.probeUnit(cfg.Probe); u != time.Second {
		t.Fatalf("idle overflow link: unit %v, want the standby interval", u)
	}
	// The primaries fill up: data goes out on the overflow link, which then dies.
	lte.txPkts.Add(50)
	tick(t0.Add(100 * time.Millisecond))
	if u := lte.probeUnit(cfg.Probe); u != cfg.Probe {
		t.Fatalf("overflow link carrying data: unit %v, want %v", u, cfg.Probe)
	}
	for now := t0.Add(200 * time.Millisecond); now.Before(t0.Add(900 * time.Millisecond)); now = now.Add(100 * time.Millisecond) {
		tick(now)
		s.checkLinkHealth(lte, now)
	}
	if lte.isUp() {
		t.Errorf("overflow link silent for 900 ms right after carrying data: still up (suspect %v); want it down", lte.isSuspect())
	}
	// Three standby intervals after its last packet it stands by again.
	tick(t0.Add(3200 * time.Millisecond))
	if u := lte.probeUnit(cfg.Probe); u != time.Second {
		t.Errorf("3.1 s after its last packet the overflow link's unit is %v, want the standby interval", u)
	}
}

// A standby link silent beyond its own scale gets no fresh silence count when the
// primaries go: it is not made up again by the grace meant for a healthy one.
func TestDeadStandbyLinkGetsNoGrace(t *testing.T) {
	s, _, links := standbyTest(sched.ClassBackup)
	backup := links[0]
	t0 := time.Unix(1000, 0)
	backup.onReply(t0, 10*time.Millisecond)
	backup.setUnit(s.probeUnit(backup, t0, true), t0)
	// 3.5 s of silence: beyond three standby intervals. The primaries go.
	now := t0.Add(3500 * time.Millisecond)
	backup.setUnit(s.probeUnit(backup, now, false), now)
	s.checkLinkHealth(backup, now)
	if backup.isUp() && !backup.isSuspect() {
		t.Error("a backup silent for 3.5 s (1-s standby interval) is up when the primaries go; want it in doubt at once")
	}
}

// A probe from the peer on a link that is down on this side is answered with a probe
// of our own at once, so that the link comes up here too without waiting for this
// side's turn (a standby interval, for a backup); at most one per probe interval, and
// none on a link that is up.
func TestAPeersProbeOnADownLinkIsProbedBack(t *testing.T) {
	s, cfg, _, backup, t0 := answeringPrimaryAndBackup()
	backup.setUnit(s.probeUnit(backup, t0, true), t0)
	if !backup.probeDue(t0, cfg.Probe, false) {
		t.Fatal("the backup's first probe is not due")
	}
	if backup.probeBack(t0.Add(cfg.Probe), cfg.Probe) {
		t.Error("a peer's probe on a link that is up is probed back")
	}
	backup.mu.Lock()
	backup.setState(stateDown)
	backup.mu.Unlock()

	now := t0.Add(cfg.StandbyProbe / 2)
	if backup.probeDue(now, cfg.Probe, false) {
		t.Fatal("a down backup is probed before a standby interval is up; the test wants it waiting")
	}
	if !backup.probeBack(now, cfg.Probe) {
		t.Fatal("a peer's probe on a down backup, half a standby interval after its last probe, is not probed back")
	}
	if backup.probeBack(now.Add(cfg.Probe/2), cfg.Probe) {
		t.Error("a second peer's probe half a probe interval later is probed back too")
	}
	if due := t0.Add(cfg.StandbyProbe); backup.probeDue(due, cfg.Probe, false) {
		t.Error("the tick probes the backup a standby interval after its turn before the probe back; want it counting from the probe back")
	}
	if !backup.probeBack(now.Add(cfg.Probe), cfg.Probe) {
		t.Error("a peer's probe a probe interval after the last probe back is not probed back")
	}
}

// A flow arriving puts the FEEDBACK copy on a standby link, and keeps it there for
// down_after after the flow stops: those reports are the verdicts on dead links.
func TestFeedbackFollowsAFlowToTheStandbyLink(t *testing.T) {
	cfg := testSession()
	cfg.Probe, cfg.DownAfter = 100*time.Millisecond, 600*time.Millisecond
	s := newSession(cfg, metrics.New(), discard, 1, func([]byte) {})
	t0 := time.Unix(1000, 0)
	report := func(pkts uint32) []wire.LinkReport { return []wire.LinkReport{{LinkID: 0, RxPackets: pkts}} }
	if s.flowArriving(t0, report(3)) {
		t.Error("3 packets in a report period: counted as a flow")
	}
	if !s.flowArriving(t0.Add(100*time.Millisecond), report(3+busyQuietPackets)) {
		t.Error("8 packets in a report period: not a flow")
	}
	if !s.flowArriving(t0.Add(600*time.Millisecond), report(3+busyQuietPackets)) {
		t.Error("500 ms after the flow's last packets: no longer counted; want down_after (600 ms)")
	}
	if s.flowArriving(t0.Add(800*time.Millisecond), report(3+busyQuietPackets)) {
		t.Error("700 ms after the flow's last packets: still counted")
	}
	// Wrapping counters: only the difference counts.
	s.flowArriving(t0.Add(time.Second), report(^uint32(0)-2))
	if !s.flowArriving(t0.Add(1100*time.Millisecond), report(20)) {
		t.Error("a counter that wrapped with 23 new packets: not a flow")
	}
}

// standbyTest is a session probing every 100 ms, and idle standby links every second,
// with one link of each class given (ids from 0, named by their class).
func standbyTest(classes ...sched.Class) (*Session, SessionConfig, []*link) {
	cfg := testSession()
	cfg.Probe, cfg.StandbyProbe = 100*time.Millisecond, time.Second
	s := newSession(cfg, metrics.New(), discard, 1, func([]byte) {})
	var links []*link
	for i, c := range classes {
		links = append(links, s.addLink(LinkSpec{ID: uint8(i), Name: c.String(), Class: c}, func(*link, []byte) error { return nil }))
	}
	return s, cfg, links
}

// answeringPrimaryAndBackup is standbyTest with a primary and a backup, both up on a
// probe reply at t0.
func answeringPrimaryAndBackup() (s *Session, cfg SessionConfig, primary, backup *link, t0 time.Time) {
	s, cfg, links := standbyTest(sched.ClassPrimary, sched.ClassBackup)
	primary, backup, t0 = links[0], links[1], time.Unix(1000, 0)
	primary.onReply(t0, 10*time.Millisecond)
	backup.onReply(t0, 10*time.Millisecond)
	return s, cfg, primary, backup, t0
}

// When nothing at all is heard from the peer, the silence is the peer's, the path's or
// this host's, not a link's: no link is suspected for it (their traffic would be
// copied to links as silent), and all go down at down_after. The lab's loaded VM
// suspected all of a session's links at once on both sides when it stalled for half
// a second. A link silent while another answers is suspected as before.
func TestSilenceOfTheWholeBondSuspectsNoLink(t *testing.T) {
	cfg := testSession()
	cfg.Probe, cfg.DownAfter = 100*time.Millisecond, 600*time.Millisecond
	s := newSession(cfg, metrics.New(), discard, 1, func([]byte) {})
	send := func(*link, []byte) error { return nil }
	a := s.addLink(LinkSpec{ID: 0, Name: "a"}, send)
	b := s.addLink(LinkSpec{ID: 1, Name: "b"}, send)
	t0 := time.Unix(1000, 0)
	for _, l := range []*link{a, b} {
		l.onReply(t0, 10*time.Millisecond)
	}
	tick := func(at time.Duration) {
		now := t0.Add(at)
		links := s.allLinks()
		s.markSilentPeers(links, now)
		for _, l := range links {
			s.checkLinkHealth(l, now)
		}
	}
	for at := 50 * time.Millisecond; at <= 550*time.Millisecond; at += 100 * time.Millisecond {
		tick(at)
		for _, l := range []*link{a, b} {
			if !l.isUp() || l.isSuspect() {
				t.Fatalf("%s suspected (or down) %v into a silence of the whole bond", l.spec.Name, at)
			}
		}
	}
	tick(650 * time.Millisecond)
	for _, l := range []*link{a, b} {
		if l.isUp() {
			t.Errorf("%s still up after down_after of the whole bond's silence", l.spec.Name)
		}
	}

	// Both back; then b alone falls silent while a answers: b is suspect after the
	// suspicion time, not down.
	t1 := 2 * time.Second
	for _, l := range []*link{a, b} {
		l.onReply(t0.Add(t1), 10*time.Millisecond)
	}
	for at := t1 + 50*time.Millisecond; at <= t1+350*time.Millisecond; at += 100 * time.Millisecond {
		a.onReply(t0.Add(at-time.Millisecond), 10*time.Millisecond)
		tick(at)
	}
	if !b.isSuspect() || !a.isUp() || a.isSuspect() {
		t.Errorf("b silent for 350 ms while a answers: b suspect %v (want true), a up %v suspect %v (want up)",
			b.isSuspect(), a.isUp(), a.isSuspect())
	}
}

// Primaries die together: once one is found down, each other primary that has shown no
// sign of life since the doubt about it began is in doubt at once (its traffic copied
// to the standby link), until it shows one. A companion that answered meanwhile is
// left alone, and so is every companion without a standby link to take the copies.
func TestAPrimaryFoundDownPutsTheSilentOthersInDoubt(t *testing.T) {
	const ms = time.Millisecond
	// The cable falls silent at t0: suspect at 400 ms, down at 700 (ticks every 100 ms,
	// suspicion after 300 ms, down after twice that). The ADSL line, its RTT 250 ms
	// (suspect itself only after 750 ms of silence), last answers at dslLast; with
	// answersAfter it answers again before the tick after the cable's down.
	run := func(withBackup bool, dslLast time.Duration, answersAfter bool) (atDown, nextTick bool, companion float64) {
		classes := []sched.Class{sched.ClassPrimary, sched.ClassPrimary}
		if withBackup {
			classes = append(classes, sched.ClassBackup)
		}
		s, _, links := standbyTest(classes...)
		dsl, cable := links[0], links[1]
		t0 := time.Unix(1000, 0)
		cable.onReply(t0, 10*ms)
		dsl.onReply(t0, 250*ms)
		tick := func(at time.Duration) {
			now := t0.Add(at)
			if withBackup {
				links[2].onReply(now.Add(-ms), 10*ms)
			}
			if at-ms <= dslLast || (answersAfter && at > 700*ms) {
				dsl.onReply(now.Add(-ms), 250*ms)
			}
			all := s.allLinks()
			s.markSilentPeers(all, now)
			for _, l := range all {
				s.checkLinkHealth(l, now)
			}
		}
		for at := 100 * ms; at <= 700*ms; at += 100 * ms {
			tick(at)
			if down := !cable.isUp(); down != (at == 700*ms) {
				t.Fatalf("setup: the cable silent for %v: down %v", at, down)
			}
		}
		atDown = dsl.isSuspect()
		tick(800 * ms)
		return atDown, dsl.isSuspect(), gauge(dsl.m.suspicions[causeCompanionDown])
	}
	if doubt, still, n := run(true, 200*ms, false); !doubt || !still || n != 1 {
		t.Errorf("ADSL silent since before the cable's doubt: suspect at the cable's down %v, a tick later %v (want both), companion_down suspicions %v (want 1)",
			doubt, still, n)
	}
	if doubt, still, _ := run(true, 200*ms, true); !doubt || still {
		t.Errorf("ADSL silent since before the cable's doubt, answering after its down: suspect at the down %v (want true), after its answer %v (want false)",
			doubt, still)
	}
	if doubt, _, n := run(true, 500*ms, false); doubt || n != 0 {
		t.Errorf("ADSL answered after the cable's doubt began: suspect %v with %v companion_down suspicions, want left alone", doubt, n)
	}
	if doubt, _, n := run(false, 200*ms, false); doubt || n != 0 {
		t.Errorf("no standby link: the ADSL line suspect %v with %v companion_down suspicions, want left alone", doubt, n)
	}
}

// With the kernel fast path, the schedule that takes the dead primary out is the one
// that puts its silent companion in doubt: no schedule in between has the kernel send
// the companion's packets uncopied.
func TestTheKernelLearnsOfACompanionsDoubtWithTheDown(t *testing.T) {
	const ms = time.Millisecond
	fp := &fakeFastPath{}
	cfg := testSession()
	cfg.Probe, cfg.StandbyProbe, cfg.FastPath = 100*ms, time.Second, fp
	s := newSession(cfg, metrics.New(), discard, 1, func([]byte) {})
	send := func(*link, []byte) error { return nil }
	dsl := s.addLink(LinkSpec{ID: 0, Name: "dsl"}, send)
	cable := s.addLink(LinkSpec{ID: 1, Name: "cable"}, send)
	lte := s.addLink(LinkSpec{ID: 2, Name: "lte", Class: sched.ClassBackup}, send)
	s.installKeys(&keyGen{id: 1, created: time.Now()}, true)
	t0 := time.Unix(1000, 0)
	cable.onReply(t0, 10*ms)
	dsl.onReply(t0, 250*ms)
	for at := 100 * ms; at <= 700*ms; at += 100 * ms {
		now := t0.Add(at)
		lte.onReply(now.Add(-ms), 10*ms)
		if at <= 200*ms {
			dsl.onReply(now.Add(-ms), 250*ms)
		}
		all := s.allLinks()
		s.markSilentPeers(all, now)
		for _, l := range all {
			s.checkLinkHealth(l, now)
		}
	}
	if cable.isUp() || !dsl.isSuspect() {
		t.Fatalf("setup: cable up %v (want down), dsl suspect %v (want true)", cable.isUp(), dsl.isSuspect())
	}
	var without int
	for i, st := range fp.session.programs {
		// By id: the links come in the session's map order.
		byID := map[uint8]TxLink{}
		for _, tl := range st.Links {
			byID[tl.ID] = tl
		}
		if byID[1].Usable {
			continue
		}
		without++
		if !byID[0].Suspect {
			t.Errorf("schedule %d takes the cable out with the silent ADSL line not in doubt: its packets go uncopied", i)
		}
	}
	if without == 0 {
		t.Fatal("setup: no schedule took the cable out")
	}
}
