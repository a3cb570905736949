package aqm

import "testing"

const ms = int64(1e6)

var gen uint64

// dropsIn counts drops over d of packets every 1 ms with the given queue.
func dropsIn(c *Codel, from, d, queue int64) (n int, last int64) {
	for t := from; t < from+d; t += ms {
		gen++ // a fresh measure for every packet: CoDel's own behaviour
		if c.Drop(t, queue, gen) {
			n++
			last = t
		}
	}
	return n, last
}

func TestNoDropsBelowTarget(t *testing.T) {
	c := New(10*ms, 100*ms)
	if n, _ := dropsIn(c, ms, 10_000*ms, 9*ms); n != 0 {
		t.Errorf("%d drops with the queue below target", n)
	}
}

func TestFirstDropAfterAnIntervalAbove(t *testing.T) {
	c := New(10*ms, 100*ms)
	n, _ := dropsIn(c, ms, 99*ms, 50*ms)
	if n != 0 {
		t.Fatalf("%d drops before the queue had been above target for an interval", n)
	}
	if n, _ := dropsIn(c, 100*ms, 2*ms, 50*ms); n != 1 {
		t.Errorf("%d drops right after an interval above target, want 1", n)
	}
}

// While the queue stays above target, drops come faster and faster (interval/√count).
func TestDropRateRisesWhileQueueStays(t *testing.T) {
	c := New(10*ms, 100*ms)
	first, _ := dropsIn(c, ms, 1000*ms, 50*ms)
	second, _ := dropsIn(c, 1001*ms, 1000*ms, 50*ms)
	if first < 3 || second <= first {
		t.Errorf("drops in the first second %d, in the second %d: want a rising rate", first, second)
	}
}

// The kernel fast path's schedule: no spacing until the queue has been above target for
// an interval, then interval/√count with count grown once per measure while drops are
// due, never below the period between measures, and 0 as soon as the queue is below
// target.
func TestSpacingFollowsCoDel(t *testing.T) {
	c := New(10*ms, 100*ms)
	const period = 20 * ms // measures every 20 ms
	var gen uint64
	spacing := func(now, queue int64) int64 {
		gen++
		return c.Spacing(now, queue, gen, period)
	}
	if g := spacing(0, 50*ms); g != 0 {
		t.Errorf("queue just above target: spacing %d, want 0", g)
	}
	if g := spacing(60*ms, 50*ms); g != 0 {
		t.Errorf("above target for 60%% of an interval: spacing %d, want 0", g)
	}
	if g := spacing(100*ms, 50*ms); g != 100*ms {
		t.Errorf("above target for an interval: spacing %d, want the interval (count 1)", g)
	}
	var g int64
	for now := 120 * ms; now <= 1100*ms; now += period {
		g = spacing(now, 50*ms)
	}
	if g < period || g >= 50*ms {
		t.Errorf("a second later: spacing %.1f ms, want below 50 ms (count grown) and at least the period", float64(g)/float64(ms))
	}
	// The same measure again counts no further drop.
	before := c.count
	if c.Spacing(1120*ms, 50*ms, gen, period); c.count != before {
		t.Errorf("count went from %d to %d on a measure already acted on", before, c.count)
	}
	// A long-running drop state: the spacing stops at the period.
	for now := 1120 * ms; now <= 20000*ms; now += period {
		g = spacing(now, 50*ms)
	}
	if g != period {
		t.Errorf("after 20 s above target: spacing %.1f ms, want the period", float64(g)/float64(ms))
	}
	if g := spacing(20020*ms, 5*ms); g != 0 {
		t.Errorf("queue below target: spacing %d, want 0", g)
	}
}

// The queue falling below target ends dropping at once.
func TestQueueBelowTargetStopsDropping(t *testing.T) {
	c := New(10*ms, 100*ms)
	dropsIn(c, ms, 1000*ms, 50*ms)
	if n, _ := dropsIn(c, 1001*ms, 1000*ms, 5*ms); n != 0 {
		t.Errorf("%d drops after the queue went below target", n)
	}
}

// A measure that does not change between drops allows no further drop: the next one
// waits for a newer measure, which comes once per report period.
func TestNoSecondDropOnTheSameMeasure(t *testing.T) {
	c := New(10*ms, 100*ms)
	n := 0
	var g uint64 = 1
	for now := ms; now < 1000*ms; now += ms {
		if now%(100*ms) == 0 {
			g++ // a report every 100 ms
		}
		if c.Drop(now, 50*ms, g) {
			n++
		}
	}
	// Above target from the start: the first drop after 100 ms, then one per report.
	if n < 8 || n > 10 {
		t.Errorf("%d drops in a second with a report every 100 ms, want one per report (8-10)", n)
	}
}

// Until a drop can have shown in a measure (the reaction time), fresh measures that
// still show the queue above target allow no further drop: they were taken before the
// sender answered. Once the reaction time has passed, the control law resumes.
func TestNoSecondDropBeforeTheFirstCanShow(t *testing.T) {
	c := New(10*ms, 100*ms)
	c.SetReaction(250 * ms)
	var drops []int64
	var g uint64
	for now := ms; now < 2000*ms; now += ms {
		if now%(20*ms) == 0 {
			g++ // a report every 20 ms, every one above target
		}
		if c.Drop(now, 50*ms, g) {
			drops = append(drops, now)
		}
	}
	if len(drops) < 2 {
		t.Fatalf("drops at %v: want the control law to go on after the reaction time", drops)
	}
	for i := 1; i < len(drops); i++ {
		if gap := drops[i] - drops[i-1]; gap < 250*ms {
			t.Errorf("drops at %d and %d ms: %d ms apart, within the 250-ms reaction time", drops[i-1]/ms, drops[i]/ms, gap/ms)
		}
	}
	// Without a reaction time the same measures drop at CoDel's own pace.
	c = New(10*ms, 100*ms)
	n := 0
	for now := ms; now < 2000*ms; now += ms {
		if now%(20*ms) == 0 {
			g++
		}
		if c.Drop(now, 50*ms, g) {
			n++
		}
	}
	if n <= len(drops) {
		t.Errorf("%d drops without a reaction time, %d with one: want more without", n, len(drops))
	}
}

// A measure that came before the reaction time was up stays the current one after it,
// until the next report; it still shows the queue the last drop acted on, so it allows
// no drop either. With a report every 100 ms and a 250-ms reaction, each drop after the
// first waits for the report 300 ms after the one before, not the 250 ms alone.
func TestNoDropOnAMeasureThatCameTooSoon(t *testing.T) {
	c := New(10*ms, 100*ms)
	c.SetReaction(250 * ms)
	var g uint64
	var measureAt int64
	var drops, acted []int64
	for now := ms; now < 3000*ms; now += ms {
		if now%(100*ms) == 0 {
			g, measureAt = g+1, now // a report every 100 ms, every one above target
		}
		if c.Drop(now, 50*ms, g) {
			drops, acted = append(drops, now), append(acted, measureAt)
		}
	}
	if len(drops) < 3 {
		t.Fatalf("drops at %v: want the control law to go on, one drop per answered measure", drops)
	}
	for i := 1; i < len(drops); i++ {
		if since := acted[i] - drops[i-1]; since < 250*ms {
			t.Errorf("the drop at %d ms acted on the measure of %d ms, %d ms after the drop at %d ms: within the 250-ms reaction time",
				drops[i]/ms, acted[i]/ms, since/ms, drops[i-1]/ms)
		}
	}
}

// The fast path's spacing never undercuts the reaction time either.
func TestSpacingWaitsForTheReaction(t *testing.T) {
	c := New(10*ms, 100*ms)
	c.SetReaction(250 * ms)
	var g uint64
	for now := int64(0); now <= 3000*ms; now += 20 * ms {
		g++
		if sp := c.Spacing(now, 50*ms, g, 20*ms); sp != 0 && sp < 250*ms {
			t.Fatalf("at %d ms: spacing %d ms, below the reaction time", now/ms, sp/ms)
		}
	}
}

// A sender that offered nothing for an interval is not feeding the queue the last
// measure showed: after Idle the dropper waits for the queue to stand above target for
// a whole interval again, on the same measure as before.
func TestIdleEndsDropping(t *testing.T) {
	c := New(10*ms, 100*ms)
	const g = 1 // one measure throughout: a 50-ms queue the links' last report showed
	drops := 0
	for now := ms; now < 300*ms; now += ms {
		if c.Drop(now, 50*ms, g) {
			drops++
		}
	}
	if drops != 1 {
		t.Fatalf("setup: %d drops on one measure, want 1", drops)
	}
	c.Idle() // the sender stalled; its next packet comes 140 ms later
	for now := 440 * ms; now < 539*ms; now += ms {
		if c.Drop(now, 50*ms, g+1) {
			t.Fatalf("drop %d ms after the sender came back from idle, on a queue it was not feeding", (now-440*ms)/ms)
		}
	}
	if !c.Drop(540*ms, 50*ms, g+2) {
		t.Errorf("no drop once the queue had stood above target for an interval after the idle spell")
	}
}

// After Settle (a failover ended) the first drop acts only on a measure that came at
// least the reaction time later, though the queue stood above target for an interval
// sooner: earlier measures show what the failover queued, not the senders' windows.
// Idle alone would have dropped an interval after it.
func TestSettleWaitsForAMeasureOfTheLinksLeft(t *testing.T) {
	firstDrop := func(settle bool) (drop, acted int64) {
		c := New(10*ms, 100*ms)
		c.SetReaction(250 * ms)
		var g uint64
		var measureAt int64
		for now := ms; now < 3000*ms; now += ms {
			if now%(20*ms) == 0 {
				g, measureAt = g+1, now // a report every 20 ms, every one above target
			}
			if now == 1000*ms {
				if settle {
					c.Settle(now)
				} else {
					c.Idle()
				}
			}
			if c.Drop(now, 50*ms, g) && now >= 1000*ms {
				return now, measureAt
			}
		}
		return 0, 0
	}
	drop, acted := firstDrop(true)
	if drop == 0 {
		t.Fatal("no drop after Settle on a queue that stayed above target: want the control law to resume")
	}
	if since := acted - 1000*ms; since < 250*ms {
		t.Errorf("the first drop after Settle (at %d ms) acted on the measure of %d ms, %d ms after it: within the 250-ms reaction time",
			drop/ms, acted/ms, since/ms)
	}
	if idle, _ := firstDrop(false); idle == 0 || idle >= drop {
		t.Errorf("setup: after Idle alone the first drop came at %d ms, after Settle at %d ms: want Idle's sooner", idle/ms, drop/ms)
	}
}
