package aqm

import "testing"

const ms = int64(1e6)

// dropsIn counts drops over d of packets every 1 ms with the given queue.
func dropsIn(c *Codel, from, d, queue int64) (n int, last int64) {
	for t := from; t < from+d; t += ms {
		if c.Drop(t, queue) {
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
// an interval, then interval/√count, shrinking as the drops due are counted, and 0 as
// soon as the queue is below target.
func TestSpacingFollowsCoDel(t *testing.T) {
	c := New(10*ms, 100*ms)
	if g := c.Spacing(0, 50*ms); g != 0 {
		t.Errorf("queue just above target: spacing %d, want 0", g)
	}
	if g := c.Spacing(50*ms, 50*ms); g != 0 {
		t.Errorf("above target for half an interval: spacing %d, want 0", g)
	}
	if g := c.Spacing(100*ms, 50*ms); g != 100*ms {
		t.Errorf("above target for an interval: spacing %d, want the interval (count 1)", g)
	}
	// A second later, as many drops as were due: 100 ms, 70.7 ms, 57.7 ms, ...
	g := c.Spacing(1100*ms, 50*ms)
	if g <= 0 || g >= 40*ms {
		t.Errorf("a second later: spacing %.1f ms, want below 40 ms (count grown)", float64(g)/float64(ms))
	}
	if c.count < 5 {
		t.Errorf("count %d after a second of dropping, want the drops due counted", c.count)
	}
	if g := c.Spacing(1200*ms, 5*ms); g != 0 {
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
