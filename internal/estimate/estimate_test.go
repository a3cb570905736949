package estimate

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// soho returns ADSL-, cable- and LTE-like upstreams (1, 10 and 15 Mbit/s).
func soho() []*simLink {
	return []*simLink{
		{rate: 1e6, delay: 12 * time.Millisecond, buffer: 300 * time.Millisecond},
		{rate: 10e6, delay: 6 * time.Millisecond, buffer: 100 * time.Millisecond},
		{rate: 15e6, delay: 22 * time.Millisecond, buffer: 120 * time.Millisecond},
	}
}

func capacityShares(links []*simLink) []float64 {
	var total float64
	for _, l := range links {
		total += l.rate
	}
	out := make([]float64, len(links))
	for i, l := range links {
		out[i] = l.rate / total
	}
	return out
}

// settleTolerance is how close every link's share of the assumed rates must stay to its
// share of the capacity, from then on, for the split to count as converged (the lab
// uses the same tolerance on measured shares).
const settleTolerance = 0.10

// baselineSum is the sum of what the simulated sender gets over each link alone.
func baselineSum(links []*simLink) float64 {
	var sum float64
	for _, l := range links {
		sum += baseline(*l, 5*time.Second, 20*time.Second)
	}
	return sum
}

// checkBond runs the bond for 30 s and checks the split converges to the capacities
// within settle (if settle > 0), stays within 3 points of them over the long run, and the
// aggregate reaches ratio of the links' own baselines.
func checkBond(t *testing.T, links []*simLink, cfg []Config, settle time.Duration, ratio float64) *sim {
	t.Helper()
	base := baselineSum(links)
	s := newSim(links, cfg)
	s.run(30 * time.Second)
	want := capacityShares(links)
	at := s.splitSettledAt(0, want, settleTolerance)
	split, _ := s.split(10*time.Second, 30*time.Second)
	_, rate := s.delivered(10*time.Second, 30*time.Second)
	t.Logf("split %.3f (capacities %.3f) settled at %v; aggregate %.2f Mbit/s = %.2f of the baselines' sum %.2f",
		split, want, at, rate/1e6, rate/base, base/1e6)
	if settle > 0 && (at < 0 || at > settle) {
		t.Errorf("split did not settle within %v of start (settled at %v)", settle, at)
	}
	for i := range want {
		if math.Abs(split[i]-want[i]) > 0.03 {
			t.Errorf("link %d carried %.3f of the traffic over 10-30 s, its capacity share is %.3f", i, split[i], want[i])
		}
	}
	if rate < ratio*base {
		t.Errorf("aggregate %.2f Mbit/s is %.2f of the baselines' sum, want at least %.2f", rate/1e6, rate/base, ratio)
	}
	return s
}

// With no configured rates, the split follows the links' capacities and the bond
// carries nearly the sum of what each link carries alone.
func TestSplitFollowsCapacityWithoutPriors(t *testing.T) {
	links := soho()
	s := checkBond(t, links, nil, 5*time.Second, 0.9)
	for i, l := range links {
		if c := s.est[i].Capacity(); math.Abs(c-l.rate)/l.rate > 0.2 {
			t.Errorf("link %d capacity estimate %.2f Mbit/s, real %.2f", i, c/1e6, l.rate/1e6)
		}
	}
}

// Wrong priors (the cable's set ten times too high, the LTE's ten times too low) are
// corrected by measurement.
func TestWrongPriorsAreCorrected(t *testing.T) {
	checkBond(t, soho(), []Config{{Prior: 1e6}, {Prior: 100e6}, {Prior: 1.5e6}}, 5*time.Second, 0.9)
}

// When a link's capacity doubles (LTE), probing finds the new capacity and the split
// follows within 3 s.
func TestSplitFollowsCapacityIncrease(t *testing.T) {
	checkStep(t, 2, 3*time.Second)
}

// Equal links share equally. (The simulated sender loses a little more to the bond
// than to a single link: its buffer overflows on whichever link fills first; versions
// of the estimator gave 0.92-1.00 here, the lab measures the real thing. How soon the
// split settles is not asserted here: one link's first measurement can come from a
// period it was only partly busy in, and equal links correct it only when the sender
// next fills the bond (6 s in, in one version); the SOHO cases assert convergence.)
func TestHomogeneousLinksShareEqually(t *testing.T) {
	var links []*simLink
	for range 3 {
		links = append(links, &simLink{rate: 5e6, delay: 5 * time.Millisecond, buffer: 50 * time.Millisecond})
	}
	checkBond(t, links, nil, 0, 0.9)
}

// When a link's capacity halves mid-transfer, the split follows within 2 s.
func TestSplitFollowsRateStep(t *testing.T) {
	checkStep(t, 0.5, 2*time.Second)
}

// checkStep runs the SOHO bond for 15 s, multiplies the LTE link's capacity by factor
// (starting it at half when the step is up, so it ends at its nominal rate), runs 15 s
// more and checks that the scheduler's split is back within the tolerance of the
// capacities within the limit.
func checkStep(t *testing.T, factor float64, within time.Duration) {
	t.Helper()
	links := soho()
	if factor > 1 {
		links[2].rate /= factor
	}
	s := newSim(links, nil)
	s.run(15 * time.Second)
	links[2].rate *= factor
	s.run(15 * time.Second)
	want := capacityShares(links)
	at := s.splitSettledAt(15*time.Second, want, settleTolerance)
	split, _ := s.split(20*time.Second, 30*time.Second)
	t.Logf("after the step (×%g) at 15 s: split %.3f (capacities %.3f), settled at %v", factor, split, want, at)
	if at < 0 || at-15*time.Second > within {
		t.Errorf("split did not follow the step (×%g) within %v (settled at %v, step at 15s)", factor, within, at)
	}
}

// A link that is never loaded keeps its prior: light traffic teaches nothing about a
// link's limit.
func TestLightTrafficKeepsTheEstimate(t *testing.T) {
	links := soho()
	s := newSim(links, []Config{{Prior: 1e6}, {Prior: 10e6}, {Prior: 15e6}})
	s.appLimit = 2e6
	s.run(10 * time.Second)
	for i, l := range links {
		if c := s.est[i].Capacity(); math.Abs(c-l.rate)/l.rate > 0.1 {
			t.Errorf("link %d capacity %.2f Mbit/s drifted from its prior %.2f under light load", i, c/1e6, l.rate/1e6)
		}
	}
}

// A cap is never exceeded, even by probing on a link faster than the cap.
func TestCapBoundsRateAndCapacity(t *testing.T) {
	links := soho()
	s := newSim(links, []Config{{}, {Cap: 4e6}, {}})
	s.run(20 * time.Second)
	if r, c := s.est[1].Rate(), s.est[1].Capacity(); r > 4e6 || c > 4e6 {
		t.Errorf("capped link: rate %.2f, capacity %.2f Mbit/s; cap 4", r/1e6, c/1e6)
	}
}

// The filter averages noise on a steady link and jumps to a lasting new level, but only
// on far samples that come one after the other.
func TestKalmanSmoothsNoiseAndFollowsSteps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var k kalman
	sample := func(z float64) {
		k.next()
		k.update(z, 0)
	}
	for range 200 {
		sample(10e6 * (1 + 0.2*(rng.Float64()-0.5)))
	}
	if math.Abs(k.x-10e6) > 0.05*10e6 {
		t.Errorf("noisy steady link: estimate %.2f Mbit/s, want 10 within 5%%", k.x/1e6)
	}

	// Two far samples with one between them that measured nothing (the estimator
	// does not fold in an app-limited sample) are two outliers, not a step.
	sample(1e6)
	k.next()
	sample(1e6)
	if k.x < 9e6 {
		t.Errorf("after two far samples that were not consecutive the estimate is %.2f Mbit/s, want about 10", k.x/1e6)
	}

	for range 3 {
		sample(5e6 * (1 + 0.2*(rng.Float64()-0.5)))
	}
	if math.Abs(k.x-5e6) > 0.15*5e6 {
		t.Errorf("three samples after a step to 5 Mbit/s the estimate is %.2f", k.x/1e6)
	}
}

// Samples that say nothing (no time passed, no data) change nothing.
func TestEmptySamplesAreIgnored(t *testing.T) {
	e := New(Config{Prior: 8e6})
	e.Update(Sample{})
	e.Update(Sample{Interval: simPeriod})
	if e.Rate() != 8e6 || e.Capacity() != 8e6 {
		t.Errorf("rate %.0f capacity %.0f after empty samples, want the prior 8e6", e.Rate(), e.Capacity())
	}
}

// A link whose queue stands clearly above the others' for two samples (not one) ends
// startup and is measured, and stays out of startup afterwards.
func TestRelativeQueueEndsStartup(t *testing.T) {
	e := New(Config{})
	smp := func(mbit float64, queue time.Duration) Sample {
		b := uint64(mbit * 1e6 / 8 / 10)
		return Sample{Interval: simPeriod, Delivered: b, Packets: uint32(b / simPacket), Sent: b,
			Queue: queue, HaveQueue: true, MostQueue: queue}
	}
	for e.Rate() < 40e6 {
		e.Update(smp(e.Rate()/1e6, 0))
	}
	e.Update(smp(30, 2500*time.Microsecond))
	if e.Phase() == PhaseDrain {
		t.Fatalf("one sample above the others already counted as saturated (phase %v)", e.Phase())
	}
	e.Update(smp(30, 2500*time.Microsecond))
	if e.Phase() != PhaseDrain || math.Abs(e.Capacity()-30e6) > 1e6 {
		t.Fatalf("after two samples 2.5 ms above the others: phase %v, capacity %.1f Mbit/s; want drain at 30", e.Phase(), e.Capacity()/1e6)
	}
	e.Update(smp(30, 0))
	if e.Phase() == PhaseStart || e.Rate() > 31e6 {
		t.Errorf("after the queue went: phase %v, rate %.1f Mbit/s; startup must not resume", e.Phase(), e.Rate()/1e6)
	}
}

// A receiver that stalls now and then (a busy machine, a bursty link) makes single
// periods deliver too little and the next too much; a sender that stalls sends too
// little in a period and reports its writes blocked, which counts as saturation. (Both
// are what the lab's VM showed: a 3 Mbit/s link's capacity estimate swung over
// 1.4..4.2 Mbit/s.) The estimates must not follow that noise: each link's capacity estimate stays near its real capacity, the split near the
// capacities, and the aggregate near the baselines'.
func TestNoisyReceiverDoesNotSwingTheEstimates(t *testing.T) {
	links := []*simLink{ // the lab's SOHO downstream: slow links, few packets a period
		{rate: 0.48e6, delay: 12 * time.Millisecond, buffer: 250 * time.Millisecond},
		{rate: 3e6, delay: 6 * time.Millisecond, buffer: 50 * time.Millisecond},
		{rate: 1.2e6, delay: 22 * time.Millisecond, buffer: 120 * time.Millisecond},
	}
	base := baselineSum(links)
	s := newSim(links, nil)
	s.stallReceiver(1, 0.0055, 40*time.Millisecond)
	s.stallSender(2, 0.005)
	s.run(30 * time.Second)
	want := capacityShares(links)
	split, _ := s.split(10*time.Second, 30*time.Second)
	_, rate := s.delivered(10*time.Second, 30*time.Second)
	t.Logf("split %.3f (capacities %.3f); aggregate %.2f Mbit/s = %.2f of the baselines' sum %.2f",
		split, want, rate/1e6, rate/base, base/1e6)
	for i, l := range links {
		lo, hi := math.Inf(1), 0.0
		for _, row := range s.capHistory[100:] {
			lo, hi = math.Min(lo, row[i]), math.Max(hi, row[i])
		}
		t.Logf("link %d (%.1f Mbit/s): capacity estimate over 10-30 s in %.2f..%.2f", i, l.rate/1e6, lo/1e6, hi/1e6)
		if lo < 0.7*l.rate || hi > 1.3*l.rate {
			t.Errorf("link %d: capacity estimate swung over %.2f..%.2f Mbit/s, real %.2f (want within 30%%)", i, lo/1e6, hi/1e6, l.rate/1e6)
		}
		if math.Abs(split[i]-want[i]) > 0.05 {
			t.Errorf("link %d carried %.3f of the traffic over 10-30 s, its capacity share is %.3f", i, split[i], want[i])
		}
	}
	if rate < 0.9*base {
		t.Errorf("aggregate %.2f Mbit/s is %.2f of the baselines' sum, want at least 0.9", rate/1e6, rate/base)
	}
}

// A jittery link (LTE) that the sender gives little in startup can show a queue of a
// few milliseconds from its jitter alone. That ends no startup and measures no
// capacity: the link goes on doubling once it is loaded.
func TestJitterOnALightlyLoadedLinkEndsNoStartup(t *testing.T) {
	e := New(Config{})
	light := Sample{Interval: simPeriod, Delivered: 1125, Packets: 4, Sent: 1125, // 0.09 Mbit/s, as in the lab
		Queue: 6 * time.Millisecond, HaveQueue: true, Jitter: 5 * time.Millisecond, MostQueue: 6 * time.Millisecond}
	e.Update(light)
	e.Update(light)
	if e.Phase() == PhaseStart || e.startup == false {
		t.Fatalf("after two lightly loaded samples with a jitter-sized queue: phase %v, startup %v; want startup to go on", e.Phase(), e.startup)
	}
	for range 8 { // loaded, no queue: doubling
		b := uint64(e.Rate() / 8 / 10)
		e.Update(Sample{Interval: simPeriod, Delivered: b, Packets: uint32(b/1500 + 4), Sent: b, HaveQueue: true})
	}
	if e.Rate() < 10e6 {
		t.Errorf("rate %.2f Mbit/s after eight loaded periods without a queue: startup stopped on jitter", e.Rate()/1e6)
	}
}

// A queue seen while the link was given far less than its rate and delivered all of
// it does not lower a measured capacity (the sender had nothing more for it) when every
// link of the bond has it: it is the sender's (a TCP filling the bond), not this link's.
func TestAppLimitedQueueKeepsTheCapacity(t *testing.T) {
	e := New(Config{Prior: 10e6})
	b := uint64(2e6 / 8 / 10) // 2 Mbit/s for 100 ms, all delivered
	for range 5 {
		e.Update(Sample{Interval: simPeriod, Delivered: b, Packets: uint32(b / 1500), Sent: b,
			Queue: 20 * time.Millisecond, HaveQueue: true, LeastQueue: 18 * time.Millisecond, MostQueue: 20 * time.Millisecond})
	}
	if c := e.Capacity(); c < 9e6 {
		t.Errorf("capacity %.2f Mbit/s after app-limited samples at 2 Mbit/s with a queue; want the prior 10 kept", c/1e6)
	}
	if e.Rate() > 10e6 {
		t.Errorf("rate %.2f Mbit/s: a queue must not let the rate grow", e.Rate()/1e6)
	}
}

// A link whose capacity fell while the sender, held back by the queue it builds there,
// gives it a little less than the old rate: every sample looks app-limited, yet the link
// queues far above the others. Its delivery is its capacity now (the lab's rate-step
// scenario: a link halved to 0.75 Mbit/s kept an estimate of 1.54 for five seconds, its
// queue at 40-60 ms, the others' at none). A smaller queue of its own, within the
// margin, does not count (TestOvershotStartupComesBackOnAQueue covers what it does).
func TestALinkQueueingAloneIsMeasuredWhateverItWasGiven(t *testing.T) {
	const before, after = 1.5e6, 0.75e6
	smp := func(sent, delivered float64, queue time.Duration) Sample {
		return Sample{Interval: simPeriod, Delivered: uint64(delivered / 8 / 10), Packets: uint32(delivered / 8 / 10 / simPacket),
			Sent: uint64(sent / 8 / 10), Queue: queue, HaveQueue: true, LeastQueue: 200 * time.Microsecond, MostQueue: queue}
	}
	e := New(Config{})
	e.Train(before)
	for range 5 { // saturated at the old capacity
		e.Update(smp(before, before, 8*time.Millisecond))
	}
	small := *e
	for range 10 { // a queue of its own, but within the margin: keeps the capacity
		small.Update(smp(0.7*before, 0.7*before, 20*time.Millisecond))
	}
	if c := small.Capacity(); c < 0.9*before {
		t.Errorf("capacity %.2f Mbit/s after app-limited samples with a 20 ms queue of its own; want the old %.2f kept", c/1e6, before/1e6)
	}
	for range 10 { // the capacity halved; the sender gives it 0.72 on an assumed 1.1 or more
		e.Update(smp(0.96*after, 0.96*after, 50*time.Millisecond))
	}
	if c := e.Capacity(); c > 1.1*after {
		t.Errorf("capacity %.2f Mbit/s after 1 s of a 50 ms queue of its own at %.2f Mbit/s delivered; want it down to that", c/1e6, 0.96*after/1e6)
	}
	if r := e.Rate(); r > after {
		t.Errorf("assumed rate %.2f Mbit/s on a link that delivers %.2f with a standing queue", r/1e6, 0.96*after/1e6)
	}
}

// A link whose estimate starts far too low (the lab's LTE downstream once came out of
// startup at a fifth of its rate) climbs back within seconds. It probes only while
// another link queues, and those episodes are short; the probing gain must carry over
// from one to the next instead of starting at a percent each time (which took 6-8 s).
func TestLowEstimateClimbsBack(t *testing.T) {
	links := []*simLink{ // the lab's SOHO downstream
		{rate: 0.48e6, delay: 12 * time.Millisecond, buffer: 250 * time.Millisecond},
		{rate: 3e6, delay: 6 * time.Millisecond, buffer: 50 * time.Millisecond},
		{rate: 1.2e6, delay: 22 * time.Millisecond, buffer: 120 * time.Millisecond},
	}
	s := newSim(links, []Config{{}, {}, {Prior: links[2].rate / 10}})
	s.run(10 * time.Second)
	reached := -1
	for i, row := range s.capHistory {
		if row[2] >= 0.9*links[2].rate {
			reached = i
			break
		}
	}
	t.Logf("LTE capacity estimate reached 90%% of its rate after %.1f s", float64(reached+1)/10)
	if reached < 0 || reached+1 > 60 {
		t.Errorf("LTE capacity estimate, started at a tenth of its rate, reached 90%% of it after %.1f s (want within 6 s)", float64(reached+1)/10)
	}
}

// A probe train's measure replaces startup, like a prior; a configured prior that
// arrives after it still wins, and a train after a prior or a measured queue is ignored.
func TestTrainEndsStartup(t *testing.T) {
	e := New(Config{})
	if !e.InStartup() {
		t.Fatal("a new estimator without a prior is not in startup")
	}
	e.Train(3e6)
	if e.InStartup() || e.Rate() != 3e6 || e.Capacity() != 3e6 {
		t.Fatalf("after a 3 Mbit/s train: startup %v, rate %.0f, capacity %.0f", e.InStartup(), e.Rate(), e.Capacity())
	}
	e.SetPrior(5e6, 5e6)
	if e.Rate() != 5e6 || e.Capacity() != 5e6 {
		t.Errorf("a prior after the train: rate %.0f, capacity %.0f, want the prior's 5 Mbit/s", e.Rate(), e.Capacity())
	}
	e.Train(1e6)
	if e.Rate() != 5e6 {
		t.Errorf("a train after a prior moved the rate to %.0f", e.Rate())
	}

	p := New(Config{Prior: 2e6})
	p.Train(9e6)
	if p.Rate() != 2e6 {
		t.Errorf("a train overrode the configured prior: rate %.0f", p.Rate())
	}
}

// The ACK trickle of a transfer the other way, with a "queue" the busy receiver's own
// lag made, says nothing about the link's capacity: it must not replace a measured one.
func TestTrickleWithQueueKeepsTheCapacity(t *testing.T) {
	e := New(Config{})
	e.Train(3e6)
	for range 20 {
		e.Update(Sample{Interval: 100 * time.Millisecond, Delivered: 500, Packets: 8, Sent: 750,
			Queue: 15 * time.Millisecond, HaveQueue: true, LeastQueue: 15 * time.Millisecond, MostQueue: 15 * time.Millisecond})
	}
	if c := e.Capacity(); c < 2.9e6 {
		t.Errorf("after 2 s of a 0.06 Mbit/s trickle with a 15 ms queue the capacity is %.2f Mbit/s, want the train's 3", c/1e6)
	}
}

// The ACKs of an upload ride the downstream of the link they take: in the lab's standby
// scenario 0.155 Mbit/s on a 3-Mbit/s cable downstream, just above tinyFrac of it. A
// period with a few milliseconds of "queue" (the busy receiver's own lag) in which a
// quarter of those small packets had not arrived by the cut read as drops, and replaced
// the trained 2.99 Mbit/s with 0.12; two such periods did the same to a capacity learned
// from traffic. A shortfall of a few hundred bytes is the period's cut, not drops.
func TestTrickleShortfallKeepsTheCapacity(t *testing.T) {
	const sent = 1940 // 14 ACKs of ~139 bytes on the wire: 0.155 Mbit/s for 100 ms
	trickle := Sample{Interval: 100 * time.Millisecond, Sent: sent, Delivered: sent * 74 / 100, Packets: 14,
		Queue: 6 * time.Millisecond, HaveQueue: true, MostQueue: 6 * time.Millisecond, Jitter: time.Millisecond}

	trained := New(Config{})
	trained.Train(2.99e6)
	learned := New(Config{})
	for range 30 { // saturated at 3 Mbit/s
		learned.Update(Sample{Interval: 100 * time.Millisecond, Sent: 37500, Delivered: 37500, Packets: 27,
			Queue: 8 * time.Millisecond, HaveQueue: true, LeastQueue: 8 * time.Millisecond, MostQueue: 8 * time.Millisecond})
	}
	for name, e := range map[string]*Estimator{"trained": trained, "learned": learned} {
		for range 5 {
			e.Update(trickle)
		}
		if c := e.Capacity(); c < 2.9e6 {
			t.Errorf("%s: after five periods of an ACK trickle a quarter short, the capacity is %.2f Mbit/s, want about 3", name, c/1e6)
		}
	}

	// What vanishes from a flow the link cannot carry is no cut: the capacity follows.
	e := New(Config{})
	e.Train(2.99e6)
	for range 5 {
		e.Update(Sample{Interval: 100 * time.Millisecond, Sent: 12500, Delivered: 6250, Packets: 9, Lost: 4,
			Queue: 30 * time.Millisecond, HaveQueue: true, MostQueue: 30 * time.Millisecond})
	}
	if c := e.Capacity(); c > 0.6e6 {
		t.Errorf("a link given 1 Mbit/s that delivered half of it with a 30-ms queue kept a capacity of %.2f Mbit/s, want about 0.5", c/1e6)
	}
}

// What we sent counts up to the report's arrival, what arrived only up to the peer's
// cut an RTT before: when a flow starts, much of what we sent is in flight, not lost.
// A link that was idle reports once a second; samples like these (the first window in
// flight, a 7-ms "queue" on a link with 2 ms of jitter) read as drops and replace a
// link's 1.48 Mbit/s with 0.08, as happened at a downstream transfer's start in the
// lab's lossy scenario, after which the link carried next to nothing. Only what the
// peer found missing is lost.
func TestPacketsInFlightAreNotLosses(t *testing.T) {
	start := Sample{Interval: time.Second, Delivered: 10000, Packets: 12, Sent: 25000,
		Queue: 7 * time.Millisecond, HaveQueue: true, MostQueue: 7 * time.Millisecond, Jitter: time.Millisecond}
	e := New(Config{Prior: 1.48e6})
	for range 3 {
		e.Update(start)
	}
	if c := e.Capacity(); c < 1.4e6 {
		t.Errorf("after three samples with a first window in flight the capacity is %.2f Mbit/s, want the 1.48 it had", c/1e6)
	}

	// The same samples with the peer finding more than half of it missing: a link that
	// loses what it is given at a queue delivers what it can.
	lossy := start
	lossy.Lost = 15
	e = New(Config{Prior: 1.48e6})
	for range 3 {
		e.Update(lossy)
	}
	if c := e.Capacity(); c > 0.2e6 {
		t.Errorf("a link that lost 15 of 27 packets at a 7-ms queue kept a capacity of %.2f Mbit/s, want about the 0.08 it delivered", c/1e6)
	}
}

// A startup doubling can overshoot to startupCeiling times what the link delivered.
// If the sender then gives the link less than loadedFrac of half that rate, every
// sample looks app-limited, even while the link stands clearly above the others' queue:
// twice, in CI's e2e test, a 30 Mbit/s link stayed assumed at 77 for the whole transfer,
// the split went wrong and the bond fell below its best link. A standing queue on an
// overshot link must bring the rate back to what the link has shown it delivers.
func TestOvershotStartupComesBackOnAQueue(t *testing.T) {
	const capacity = 25e6
	e := New(Config{})
	smp := func(sent, delivered float64, queue, jitter time.Duration) Sample {
		b := uint64(delivered / 8 / 10)
		return Sample{Interval: simPeriod, Delivered: b, Packets: uint32(b / simPacket), Sent: uint64(sent / 8 / 10),
			Queue: queue, HaveQueue: true, LeastQueue: time.Microsecond, MostQueue: queue, Jitter: jitter}
	}
	for e.Rate() < 2*capacity { // loaded, no queue: doubling, the last one capped
		e.Update(smp(e.Rate(), math.Min(e.Rate(), capacity), 0, 0))
	}
	t.Logf("startup overshot to %.2f Mbit/s on a %.2f Mbit/s link", e.Rate()/1e6, capacity/1e6)
	for range 6 { // the sender gives it a little below capacity; 2.3 ms above the others' queue
		e.Update(smp(0.96*capacity, 0.96*capacity, 2300*time.Microsecond, 2*time.Millisecond))
	}
	if e.Rate() > 1.1*capacity {
		t.Errorf("after 6 samples with a queue 2.3 ms above the others', rate %.2f Mbit/s on a %.2f Mbit/s link (phase %v, startup %v)",
			e.Rate()/1e6, capacity/1e6, e.Phase(), e.InStartup())
	}
}

// An unmeasured link that carries nothing (its probe train failed, and at StartRate the
// scheduler never picks it) grows its assumed rate while another link queues or every
// used link is loaded, up to a ceiling, so that the scheduler tries it; otherwise (the
// sender is the limit) it stays where it is, and a link with a measure does not grow
// blindly.
func TestIdleUnmeasuredLinkGrowsWhileTheBondQueues(t *testing.T) {
	probesOnly := func(bondQueue time.Duration) Sample {
		return Sample{Interval: time.Second, Delivered: 800, Packets: 10, Sent: 800, // the probes: 6.4 kbit/s
			LeastQueue: 0, MostQueue: bondQueue}
	}
	e := New(Config{})
	e.Update(probesOnly(0))
	if e.Rate() != StartRate {
		t.Fatalf("no other link queueing: rate %.0f, want it to stay at %.0f", e.Rate(), StartRate)
	}
	for i := 1; i <= 3; i++ {
		e.Update(probesOnly(20 * time.Millisecond))
		if want := StartRate * float64(int(1)<<i); e.Rate() != want || !e.InStartup() {
			t.Fatalf("after %d idle samples with the bond queueing: rate %.0f (startup %v), want %.0f", i, e.Rate(), e.InStartup(), want)
		}
	}
	for range 20 {
		e.Update(probesOnly(20 * time.Millisecond))
	}
	if e.Rate() != idleStartupCeiling {
		t.Errorf("blind growth reached %.0f, want the ceiling %.0f", e.Rate(), idleStartupCeiling)
	}

	// The same when no link queues but every used one takes all it is given (its rate
	// a configured cap, the excess waiting at the bond's entry).
	capped := New(Config{})
	loaded := probesOnly(0)
	loaded.BondLoaded = true
	capped.Update(loaded)
	if capped.Rate() != 2*StartRate {
		t.Errorf("bond loaded, no queue: rate %.0f, want %.0f", capped.Rate(), 2*StartRate)
	}

	trained := New(Config{})
	trained.Train(1e6)
	trained.Update(probesOnly(20 * time.Millisecond))
	if trained.Rate() != 1e6 {
		t.Errorf("a link with a train's measure grew blindly to %.0f", trained.Rate())
	}
}

// A feedback period that completes no sample of an unmeasured, unused link (it carried
// fewer than MinSamplePackets packets, so its sample goes on for up to a second) grows
// it as a sample would, once per period: grown once per sample, a link next to a
// measured one took a second per doubling. Not while its own packets queue, not while
// the bond has room, not once it has a measure.
func TestUnsampledPeriodGrowsAnUnmeasuredLink(t *testing.T) {
	wanting := Sample{Interval: 100 * time.Millisecond, BondLoaded: true}
	e := New(Config{})
	for i := 1; i <= 4; i++ {
		e.Unsampled(wanting)
		if want := StartRate * float64(int(1)<<i); e.Rate() != want || !e.InStartup() {
			t.Fatalf("after %d periods with the bond loaded: rate %.0f (startup %v), want %.0f", i, e.Rate(), e.InStartup(), want)
		}
	}
	for range 10 {
		e.Unsampled(wanting)
	}
	if e.Rate() != idleStartupCeiling {
		t.Errorf("blind growth reached %.0f, want the ceiling %.0f", e.Rate(), idleStartupCeiling)
	}

	queueing := New(Config{})
	queued := Sample{Interval: 100 * time.Millisecond, MostQueue: 20 * time.Millisecond, HaveQueue: true, Queue: 3 * time.Millisecond}
	queueing.Unsampled(queued)
	if queueing.Rate() != StartRate {
		t.Errorf("its own packets queued 3 ms: grew to %.0f", queueing.Rate())
	}
	queued.Queue = 0
	queueing.Unsampled(queued)
	if queueing.Rate() != 2*StartRate {
		t.Errorf("another link queues, its own packets do not: rate %.0f, want %.0f", queueing.Rate(), 2*StartRate)
	}

	roomy := New(Config{})
	roomy.Unsampled(Sample{Interval: 100 * time.Millisecond})
	if roomy.Rate() != StartRate {
		t.Errorf("the bond had room: grew to %.0f", roomy.Rate())
	}

	trained := New(Config{})
	trained.Train(1e6)
	trained.Unsampled(wanting)
	if trained.Rate() != 1e6 {
		t.Errorf("a link with a train's measure grew blindly to %.0f", trained.Rate())
	}
}

// A reload's new prior starts the estimate again from it, whatever was measured under
// the old one, and caps it; a removed prior lifts the cap and keeps the estimate.
func TestRestartTakesTheNewPrior(t *testing.T) {
	e := New(Config{Prior: 10e6, Cap: 10e6})
	e.Restart(20e6, 20e6)
	if e.Rate() != 20e6 || e.Capacity() != 20e6 || e.InStartup() {
		t.Errorf("raised to 20 Mbit/s: rate %.0f, capacity %.0f, startup %v", e.Rate(), e.Capacity(), e.InStartup())
	}
	e.Restart(4e6, 4e6)
	if e.Rate() != 4e6 || e.Capacity() != 4e6 {
		t.Errorf("lowered to 4 Mbit/s: rate %.0f, capacity %.0f", e.Rate(), e.Capacity())
	}
	e.Restart(0, 0)
	if e.Rate() != 4e6 {
		t.Errorf("prior removed: rate %.0f, want the 4 Mbit/s it had", e.Rate())
	}
	if e.clamp(50e6) != 50e6 {
		t.Errorf("prior removed: still capped at %.0f", e.clamp(50e6))
	}
}

// Equal links with 2 ms of jitter each (the lab's lossy scenario): period minima a
// millisecond or two apart are noise, not a queue on one link that the others should
// take over from. Taken for one, they let two of the lab's links probe to 1.3 and 1.5
// times their capacity (debug log of a lossy run, 2026-11-28), and once the load fell
// the inflated rates kept the third link at a fifth of the traffic for seconds. A
// queue that stands above the noise still has the others probe.
func TestJitterIsNotAQueueToProbeAgainst(t *testing.T) {
	const capacity = 1.5e6
	period := func(queues ...time.Duration) []Sample {
		smps := make([]Sample, len(queues))
		for i, q := range queues {
			b := uint64(capacity / 8 / 10)
			smps[i] = Sample{Interval: simPeriod, Delivered: b, Packets: uint32(b / simPacket), Sent: b,
				Queue: q, HaveQueue: true, Jitter: 3 * time.Millisecond}
		}
		SetBondQueues(smps)
		return smps
	}
	probed := func(queues ...time.Duration) float64 {
		e := New(Config{Prior: capacity})
		for range 20 { // 2 s of the least-queued link loaded at its rate, no queue of its own
			e.Update(period(queues...)[0])
		}
		return e.Rate() / capacity
	}
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	if r := probed(ms(0.4), ms(2.2), ms(0.9)); r > 1.01 {
		t.Errorf("the others' period minima 0.5-1.8 ms above this link's, on links with 3 ms of jitter: "+
			"assumed rate probed to %.2f times capacity", r)
	}
	if r := probed(ms(0.4), ms(9), ms(0.9)); r < 1.2 {
		t.Errorf("another link 8.6 ms above this one's queue with 3 ms of jitter: assumed rate only %.2f times capacity, "+
			"want probing", r)
	}
}

// A sample that queued only at its end, after most of it passed with nothing arriving
// (a burst of copies on a link that was unused), is no capacity measure: the link stays
// in startup and keeps its rate. The same delivery over samples the link was busy
// throughout is one, and ends startup.
func TestBurstAfterIdleTimeMeasuresNothing(t *testing.T) {
	burst := Sample{Interval: time.Second, Delivered: 80 * 1500, Packets: 80, Sent: 254 * 1500,
		Queue: 40 * time.Millisecond, HaveQueue: true, LeastQueue: 3 * time.Millisecond, MostQueue: 40 * time.Millisecond}
	idle := burst
	idle.Idle = 900 * time.Millisecond
	e := New(Config{})
	for range 4 {
		e.Unsampled(Sample{Interval: 100 * time.Millisecond, BondLoaded: true}) // grown blindly to 4 Mbit/s
	}
	was := e.Rate()
	e.Update(idle)
	if !e.InStartup() || e.Rate() != was {
		t.Errorf("a burst after 0.9 s idle: startup %v, rate %.2f Mbit/s (capacity %.2f); want startup on at %.2f",
			e.InStartup(), e.Rate()/1e6, e.Capacity()/1e6, was/1e6)
	}
	busy := New(Config{})
	busy.Update(burst)
	busy.Update(burst)
	if busy.InStartup() || math.Abs(busy.Capacity()-0.96e6) > 0.01e6 {
		t.Errorf("the same delivery, busy throughout: startup %v, capacity %.2f Mbit/s; want it measured at 0.96",
			busy.InStartup(), busy.Capacity()/1e6)
	}
}

// A startup ends on a queue in two samples of the last three, not on one: a single
// period's queue on a link carrying a trickle of the other direction's ACKs (the
// receiving host was late) left a 60 Mbit/s link measured at 1.2 Mbit/s. The one
// sample brings the rate back to what the link delivered; a second one measures it.
func TestOneQueuedSampleEndsNoStartup(t *testing.T) {
	e := New(Config{})
	acks := func(queue time.Duration) Sample {
		b := uint64(0.8e6 / 8 / 10) // 0.8 Mbit/s of ACKs, all delivered
		return Sample{Interval: simPeriod, Delivered: b, Packets: uint32(b / 80), Sent: b + b/40,
			Queue: queue, HaveQueue: true, LeastQueue: 90 * time.Microsecond, MostQueue: queue}
	}
	for e.Rate() < 2e6 {
		e.Unsampled(Sample{Interval: simPeriod, BondLoaded: true})
	}
	e.Update(acks(6500 * time.Microsecond))
	if !e.InStartup() {
		t.Fatalf("one period with a 6.5-ms queue ended startup at %.2f Mbit/s", e.Capacity()/1e6)
	}
	if e.Rate() > 0.85e6 {
		t.Errorf("after a period with a queue the rate is %.2f Mbit/s, want it back to what the link delivered (0.8)", e.Rate()/1e6)
	}
	e.Update(acks(20 * time.Microsecond))
	if !e.InStartup() {
		t.Fatal("a period without a queue after it ended startup")
	}
	e.Update(acks(6500 * time.Microsecond))
	if e.InStartup() || math.Abs(e.Capacity()-0.8e6) > 0.05e6 {
		t.Errorf("a second queued period of the last three: startup %v, capacity %.2f Mbit/s; want it measured at 0.8",
			e.InStartup(), e.Capacity()/1e6)
	}
}

// A transfer's first sample on a link that carried only probes before it delivers over
// part of its interval only: the traffic started within it. Taken for a measure (it is
// loaded, with a queue at its end), it took a lossy 1.5-Mbit/s link's trained 1.42
// Mbit/s down to 0.84 in the lab, and a loss-limited flow never gave it reason to climb
// back. It raises, never lowers; the same delivery in the samples after, busy from
// their start, measures the link.
func TestFirstBusySampleAfterIdleLowersNothing(t *testing.T) {
	e := New(Config{})
	e.Train(1.42e6)
	probesOnly := Sample{Interval: 400 * time.Millisecond, Delivered: 6500, Packets: 7, Sent: 6500,
		Queue: 3 * time.Millisecond, HaveQueue: true, Jitter: 1400 * time.Microsecond}
	e.Update(probesOnly)
	start := Sample{Interval: 114 * time.Millisecond, Delivered: 12000, Packets: 8, Sent: 25400,
		Queue: 8300 * time.Microsecond, HaveQueue: true, LeastQueue: 1400 * time.Microsecond,
		MostQueue: 7300 * time.Microsecond, Jitter: 2 * time.Millisecond}
	e.Update(start)
	if c := e.Capacity(); c < 1.4e6 {
		t.Errorf("a transfer's first sample after probes only took the trained 1.42 Mbit/s to %.2f", c/1e6)
	}
	if r := e.Rate(); r >= 1.42e6 {
		t.Errorf("its %v queue left the rate at %.2f Mbit/s, want it drained below the capacity", start.Queue, r/1e6)
	}
	// The same sample again, the link busy from its start, is a measure; but one over 8
	// packets, 40 % below a train's, is held back until the next confirms it.
	e.Update(start)
	if c := e.Capacity(); c < 1.4e6 {
		t.Errorf("one busy sample over 8 packets took the trained 1.42 Mbit/s to %.2f, want it held back", c/1e6)
	}
	e.Update(start)
	if c := e.Capacity(); math.Abs(c-0.84e6) > 0.05e6 {
		t.Errorf("a second busy sample confirming it gave capacity %.2f Mbit/s, want it measured at 0.84", c/1e6)
	}
}

// A probe train sent to re-measure a collapsed estimate replaces it only if it finds
// RetrainGain times as much; the rate restarts at half the measure and climbs back.
func TestRetrainTakesOnlyAMuchHigherMeasure(t *testing.T) {
	e := New(Config{})
	if e.Retrain(1.4e6) {
		t.Error("Retrain took a measure in startup (Train's job)")
	}
	e.Train(1.42e6)
	collapse := Sample{Interval: 100 * time.Millisecond, Delivered: 1000, Packets: 4, Sent: 18000,
		Queue: 20 * time.Millisecond, HaveQueue: true}
	for range 5 {
		e.Update(collapse)
	}
	low := e.Capacity()
	if low > 0.2e6 {
		t.Fatalf("setup: the samples left the capacity at %.2f Mbit/s, want it collapsed", low/1e6)
	}
	if e.Retrain(1.5 * low) {
		t.Errorf("a train at 1.5 times the estimate replaced it")
	}
	if e.Capacity() != low {
		t.Errorf("a refused train moved the capacity from %.3f to %.3f Mbit/s", low/1e6, e.Capacity()/1e6)
	}
	if !e.Retrain(1.4e6) || e.Capacity() != 1.4e6 || e.Rate() != 0.7e6 {
		t.Fatalf("a 1.4-Mbit/s train over a %.2f estimate: capacity %.2f, rate %.2f; want 1.4 and 0.7",
			low/1e6, e.Capacity()/1e6, e.Rate()/1e6)
	}
	given := Sample{Interval: 100 * time.Millisecond, Delivered: 9000, Packets: 6, Sent: 9000, HaveQueue: true}
	for range 4 {
		given.Delivered = uint64(e.Rate() / 8 / 10)
		given.Sent = given.Delivered
		e.Update(given)
	}
	if r := e.Rate(); r < 1.39e6 {
		t.Errorf("four periods taking all it was given without a queue left the rate at %.2f Mbit/s, want back at 1.4", r/1e6)
	}
}

// A scaled 0.2 Mbit/s ADSL upstream, measured over 4-5 packets a sample, as the lab's
// SOHO scenario logged it (the CI run of c8c4d2b, upstream CUBIC, the CPE's debug lines;
// delivered and sent as logged, to 0.01 Mbit/s). A probe train had measured 0.2. The
// first sample with a queue came over 4 packets in a short period and said 0.26; the
// ones after it said 0.16-0.20. Taken whole, that one sample stood for 3.7 s: every
// later one was held back as an outlier, and the link, assumed 30 % faster than it is,
// queued 60-80 ms again and again. A sample's coarseness (a packet's share of it) is
// noise the filter must expect, and the train's measure is as good as a sample over
// trainTrust packets: the coarse sample moves the estimate a little (with the noise
// floor alone, and the train trusted like a prior, it took the estimate to 0.248).
func TestACoarseSampleIsNotTakenForTheCapacity(t *testing.T) {
	type row struct {
		interval                   time.Duration
		delivered, sent            float64 // Mbit/s
		packets                    uint32
		queue, least, most, jitter time.Duration
		stalled                    time.Duration
	}
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	rows := []row{
		{ms(187.398), 0.20, 0.27, 4, 0, 0, ms(53.094), ms(0.205), ms(1.482)},
		{ms(215.476), 0.17, 0.22, 4, 0, 0, ms(45.709), ms(0.992), ms(0.548)},
		{ms(186.173), 0.26, 0.19, 4, ms(28.047), ms(28.047), ms(26.094), ms(3.907), ms(0.541)},
		{ms(299.822), 0.16, 0.20, 4, ms(80.04), ms(4.06), ms(78.306), ms(3.469), ms(2.119)},
		{ms(202.959), 0.19, 0.12, 5, ms(40.194), ms(1.156), ms(38.866), ms(2.656), ms(0.912)},
		{ms(296.378), 0.16, 0.12, 4, ms(2.461), ms(2.461), ms(1.572), ms(1.779), ms(0.395)},
		{ms(300.597), 0.16, 0.20, 4, 0, 0, ms(25.72), ms(1.192), ms(1.488)},
		{ms(205.541), 0.24, 0.18, 5, ms(1.397), ms(1.397), ms(15.676), ms(2.732), ms(1.007)},
		{ms(295.065), 0.16, 0.24, 4, ms(20.371), ms(0.87), ms(18.651), ms(3.441), ms(11.034)},
		{ms(299.374), 0.20, 0.20, 5, ms(78.301), ms(2.885), ms(75.611), ms(5.381), ms(0.236)},
		{ms(202.214), 0.18, 0.06, 4, ms(47.084), ms(6.356), ms(45.024), ms(4.12), ms(0.392)},
	}
	bytes := func(mbit float64, d time.Duration) uint64 { return uint64(mbit * 1e6 / 8 * d.Seconds()) }
	e := New(Config{})
	e.Train(0.2e6)
	var caps []float64
	highest := 0.0
	for _, r := range rows {
		e.Update(Sample{Interval: r.interval, Delivered: bytes(r.delivered, r.interval), Packets: r.packets,
			Sent: bytes(r.sent, r.interval), Queue: r.queue, HaveQueue: true, LeastQueue: r.least,
			MostQueue: r.most, Jitter: r.jitter, Stalled: r.stalled})
		caps = append(caps, e.Capacity()/1e6)
		highest = math.Max(highest, e.Capacity())
	}
	t.Logf("capacity after each sample (Mbit/s): %.3f", caps)
	if highest > 0.22e6 {
		t.Errorf("the capacity went up to %.3f Mbit/s on the replay (each sample: %.3f); want no sample to take it 10 %% above the train's 0.2",
			highest/1e6, caps)
	}
	if c := e.Capacity(); c > 0.22e6 {
		t.Errorf("capacity %.3f Mbit/s after %d samples of a 0.2 Mbit/s link (each sample: %.3f); want within 10 %% of 0.2",
			c/1e6, len(rows), caps)
	}
}
