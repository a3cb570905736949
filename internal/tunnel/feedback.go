package tunnel

// FEEDBACK: each side reports every probe interval what arrived on each link, and the
// other side turns the reports into its links' samples, health verdicts and the bond's
// standing queue (docs/architecture.md §5).

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/aggd/aggd/internal/clock"
	"github.com/aggd/aggd/internal/estimate"
	"github.com/aggd/aggd/internal/wire"
)

// sendFeedback reports what arrived on each link to the peer, on the two best links
// (feedbackRoutes): the copy on the second keeps the reports coming when the best one
// dies, and the peer needs them most then, to see which of its links went quiet
// (quiet.go). Both copies carry one timestamp, so the peer takes the first and ignores
// the other as stale.
//
// A session that mostly sends puts each report on one of the two in turn instead, while
// both are healthy and the session is not in doubt (no link owes data, the peer sends
// no copies; takeTurns): its reports ride in the loaded
// direction, where the second copy took 0.3 % of the lab's 4.5 Mbit/s bond (FEEDBACK was
// two thirds of the 0.9 % the control messages took there; BENCHMARKS.md, "What the
// control messages cost"). Taking turns rather than one link for all (tried before and
// reverted: "One FEEDBACK copy from the sending side") keeps every other report coming
// if either link dies before we know it, and the peer still gets one every interval.
func (s *Session) sendFeedback(now time.Time, links []*link, doubt bool) {
	var reports []wire.LinkReport
	for _, l := range links {
		reports = append(reports, l.rx.report(l.spec.ID))
	}
	routes := feedbackRoutes(links, doubt || s.flowArriving(now, reports))
	if s.mostlySending(links, reports) && !doubt {
		routes = s.takeTurns(routes, now)
	}
	stamp := clock.Micros32(clock.Nanos())
	for _, via := range routes {
		fb := wire.FeedbackBody{Counter: s.txCtrl.Add(1), Links: reports}
		s.sendControlStamped(via, wire.TypeFeedback, 0, 0, fb.Append(nil), stamp)
	}
}

// mostlySending says whether the session sent more bytes on its links than the peer's
// data brought in since its last FEEDBACK (the reports being sent now). Called once
// per FEEDBACK, from the tick.
func (s *Session) mostlySending(links []*link, reports []wire.LinkReport) bool {
	var rx, tx uint64 // cumulative: only differences count
	for _, r := range reports {
		rx += r.RxBytes
	}
	for _, l := range links {
		tx += l.txData.Load()
	}
	// A link removed since makes a sum shrink: no growth then.
	received, sent := grownBy(rx, s.fbRxBytes), grownBy(tx, s.fbTxBytes)
	s.fbRxBytes, s.fbTxBytes = rx, tx
	return sent > received
}

func grownBy(now, before uint64) uint64 {
	if now < before {
		return 0
	}
	return now - before
}

// takeTurns keeps one of the two primary routes feedbackRoutes chose, the other one
// each time, when both are healthy (up, owing nothing, no probe answer overdue); any
// standby copy behind them stays. Otherwise it leaves the routes as they are.
func (s *Session) takeTurns(routes []*link, now time.Time) []*link {
	if len(routes) < 2 || routes[0].isStandby() || routes[1].isStandby() ||
		!routes[0].healthy(now) || !routes[1].healthy(now) {
		return routes
	}
	pick := routes[0]
	if pick.spec.ID == s.fbLast {
		pick = routes[1]
	}
	s.fbLast = pick.spec.ID
	return append([]*link{pick}, routes[2:]...)
}

// flowArriving says whether a flow the peer's quiet reports can judge is arriving
// (busyQuietPackets data packets since the last report, on all links together), or
// was until down_after ago: the peer needs these reports most if its links die, so
// they get a copy on a standby link (feedbackRoutes); the reports that show nothing
// arriving any more are the verdicts. Called once per FEEDBACK, from the tick.
func (s *Session) flowArriving(now time.Time, reports []wire.LinkReport) bool {
	var rx uint32 // cumulative per link, wrapping: only differences count
	for _, r := range reports {
		rx += r.RxPackets
	}
	if rx-s.fbRxPackets >= busyQuietPackets {
		s.fbFlowUntil = now.Add(max(s.cfg.DownAfter, 3*s.cfg.Probe))
	}
	s.fbRxPackets = rx
	return now.Before(s.fbFlowUntil)
}

// feedbackRoutes picks up to two links in the schedule for a FEEDBACK: links that are
// not suspect first, then the lowest RTT. Standby links (overflow, backup) carry it
// when no primary is up, and one copy more when the reports matter (need: a flow is
// arriving, or some link owes data) or a chosen primary is suspect: if the primaries
// die, the reports that reach the peer over the standby link are what tells it so
// within two report periods (quiet.go), where silence alone takes down_after and then
// TCP's backed-off retransmission timer (both primaries dying silently mid-transfer:
// a second without data, against none with the copy; BENCHMARKS.md, "Idle links").
// Ten reports a second on an idle standby link would otherwise be most of what its
// metered line bills (TestIdleStandbyLinksCostLittle).
func feedbackRoutes(links []*link, need bool) []*link {
	routes := bestTwo(links, upPrimary)
	if len(routes) == 0 {
		return bestTwo(links, (*link).isUp)
	}
	if need || slices.ContainsFunc(routes, (*link).isSuspect) {
		if spare := bestTwo(links, func(l *link) bool { return l.isUp() && l.isStandby() }); len(spare) > 0 {
			routes = append(routes, spare[0])
		}
	}
	return routes
}

// bestTwo picks up to two of the links that pass ok: links that are not suspect
// first, then the lowest RTT.
func bestTwo(links []*link, ok func(*link) bool) []*link {
	var routes []*link
	better := func(a, b *link) bool {
		if sa, sb := a.isSuspect(), b.isSuspect(); sa != sb {
			return sb
		}
		return a.rtt() < b.rtt()
	}
	for _, l := range links {
		if !ok(l) {
			continue
		}
		switch {
		case len(routes) < 2:
			routes = append(routes, l)
		case better(l, routes[1]):
			routes[1] = l
		}
		if len(routes) == 2 && better(routes[1], routes[0]) {
			routes[0], routes[1] = routes[1], routes[0]
		}
	}
	return routes
}

// feedbackOrderSpan is how long after the last FEEDBACK taken a report's timestamp
// still decides whether it is stale (onFeedback), and how long a gap between a link's
// reports may be for them to make one estimator sample (link.onFeedback).
const feedbackOrderSpan = 10 * time.Second

// period is one link's sample that a FEEDBACK completed.
type period struct {
	l   *link
	smp estimate.Sample
}

// onFeedback hands each link its report, then the estimators their samples: together,
// because each needs the least queue among all the links that carried traffic.
func (s *Session) onFeedback(now time.Time, peerTime uint32, body wire.FeedbackBody) {
	var periods, unsampled []period
	s.feedbackMu.Lock()
	defer s.feedbackMu.Unlock()
	// FEEDBACK goes out on whichever link is best at the moment, so an older one can
	// arrive after a newer one. Its cumulative counters would then run backwards, and a
	// difference of them wrap: a stale report once made a 3 Mbit/s link look like
	// 34 Pbit/s. Only reports newer than the last one count. The peer's timestamps are
	// 32-bit microseconds, which tell newer from older only within 35 minutes: after a
	// longer silence (every link dead, the session kept) a new report would look older
	// than the last one before it, and every report would be ignored for up to 35
	// minutes more. Reports cross each other only within an RTT or two, so after
	// feedbackOrderSpan without one the next is taken whatever its timestamp.
	if s.haveFeedback && now.Sub(s.lastFeedbackAt) < feedbackOrderSpan && int32(peerTime-s.lastFeedback) <= 0 {
		// The peer sends most reports on two links: the copy that comes second is the
		// report already taken, no news (in the lab's debug logs, seven lines a second
		// that hid the rest). Only one older than that is worth a line.
		if peerTime != s.lastFeedback {
			s.log.Debug("stale FEEDBACK ignored", "peer_time_us", peerTime, "newest_us", s.lastFeedback)
		}
		return
	}
	s.lastFeedback, s.haveFeedback, s.lastFeedbackAt = peerTime, true, now
	if s.fp != nil {
		s.mergeFastTx(s.allLinks())
	}
	// Which links the report shows data arriving on, each judged once: a link's quiet
	// counts only next to another that delivers (quiet.go).
	links := make([]*link, len(body.Links))
	progress := make([]bool, len(body.Links))
	delivering := 0
	for i, r := range body.Links {
		if links[i] = s.link(r.LinkID); links[i] != nil && links[i].delivering(r) {
			progress[i] = true
			delivering++
		}
	}
	for i, r := range body.Links {
		fl := links[i]
		if fl == nil {
			continue
		}
		others := delivering
		if progress[i] {
			others--
		}
		smp, ok := fl.onFeedback(now, peerTime, r, others > 0)
		if !ok {
			if smp.Interval > 0 {
				unsampled = append(unsampled, period{fl, smp})
			}
			continue
		}
		periods = append(periods, period{fl, smp})
	}
	if delivering == 0 {
		oweTogether(links)
		s.logOwed(links)
	}
	smps := make([]estimate.Sample, len(periods))
	for i, p := range periods {
		smps[i] = p.smp
	}
	least := estimate.SetBondQueues(smps)
	bondLoaded := bondLoaded(periods)
	for i, p := range periods {
		smps[i].BondLoaded = bondLoaded
		p.l.estimate(smps[i])
	}
	// The links whose samples go on see the bond's state too (Estimator.Unsampled), if
	// some link completed a sample to tell it (SetBondQueues set the same on each).
	if len(smps) > 0 {
		for _, p := range unsampled {
			p.smp.LeastQueue, p.smp.MostQueue, p.smp.BondLoaded = smps[0].LeastQueue, smps[0].MostQueue, bondLoaded
			p.l.unsampled(p.smp)
		}
	}
	// A report that shows a busy link's data stopped arriving, or owed on it, acts now,
	// not at the next tick (quiet.go).
	for _, fl := range links {
		if fl != nil && (fl.quietReports() > 0 || fl.owes()) {
			s.checkLinkHealth(fl, now)
		}
	}
	s.publishBondQueue(least, links)
	s.schedDue.Store(true)
}

// publishBondQueue makes least the bond's standing queue, the measure the AQM acts on
// (once per measure: bondQueueGen), unless one of the report's links fell silent: it
// was delivering steadily and the reports since show nothing new on it
// (link.fellSilent). Then the report is no measure: the least queue was taken over
// the links that did deliver, and the silent one, which may have been the least
// queued, was left out. When a busy link dies, the reports after the death show its
// companions alone, and a slow companion's queue is long by nature (a 0.2 Mbit/s ADSL
// upstream takes 60 ms to pass one full-size packet). In the lab's standby scenario
// the CPE's AQM dropped a packet of the upload on the ADSL line's 37-ms queue 220 ms
// after the cable died, 10 ms before the cable went suspect (from when on the AQM
// holds: failoverUnderWay), and the flow went onto the LTE backup with its window cut
// (BENCHMARKS.md, "A busy link's silence is no measure of the bond's queue"). Until
// the silent link delivers again, is found down, or owes nothing, the AQM signals
// nothing (bondUnmeasured), in either datapath, and keeps its state.
func (s *Session) publishBondQueue(least time.Duration, links []*link) {
	for _, l := range links {
		if l != nil && l.fellSilent() {
			if !s.bondUnmeasured.Swap(true) {
				s.log.Debug("bond queue not measured: a busy link shows nothing new", "link", l.spec.Name,
					"least_of_the_others", least)
			}
			return
		}
	}
	s.bondUnmeasured.Store(false)
	s.bondQueue.Store(int64(least))
	s.bondQueueGen.Add(1)
}

// oweTogether handles a report that showed nothing new on any link: if the links
// together owed togetherPackets or more, each that owed anything owes
// (quietWatch.oweTogether).
func oweTogether(links []*link) {
	var total uint32
	for _, l := range links {
		if l != nil {
			total += l.behind()
		}
	}
	if total < togetherPackets {
		return
	}
	for _, l := range links {
		if l != nil {
			l.oweTogether()
		}
	}
}

// logOwed logs, at debug level, what a report that showed nothing new on any link
// owed on each: how the links' silence is judged when all the busy ones die at once.
// Not when no link lagged behind (a link that owes does): an idle bond's every report
// (ten lines a second in the lab's debug logs between transfers, which said nothing).
func (s *Session) logOwed(links []*link) {
	if !s.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	var attrs []any
	owed := false
	for _, l := range links {
		if l != nil {
			behind := l.behind()
			owed = owed || behind > 0
			attrs = append(attrs, l.spec.Name, fmt.Sprintf("behind=%d owing=%v", behind, l.owes()))
		}
	}
	if owed {
		s.log.Debug("FEEDBACK shows nothing new on any link", attrs...)
	}
}

// bondLoaded tells whether every link that carried data in these samples (at least
// MinSamplePackets, more than probes) was given about all its assumed rate: the sender
// offers the bond all the links it uses take (estimate.Sample.BondLoaded).
func bondLoaded(periods []period) bool {
	carried := 0
	for _, p := range periods {
		if p.smp.Packets < estimate.MinSamplePackets || p.smp.Sent*8 < uint64(estimate.StartRate*p.smp.Interval.Seconds()) {
			continue // idle, or probes only
		}
		if !p.smp.Loaded(p.l.assumedRate()) {
			return false
		}
		carried++
	}
	return carried > 0
}
