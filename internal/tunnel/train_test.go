package tunnel

import (
	"math"
	"testing"
	"time"
)

// arrivalsEvery returns n arrival times spaced by gap, starting at first (µs).
func arrivalsEvery(first uint32, gap time.Duration, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = first + uint32(i)*uint32(gap/time.Microsecond)
	}
	return out
}

func TestTrainCapacity(t *testing.T) {
	wire := float64((trainDatagram + 28) * 8)
	spacing := 7500 * time.Microsecond // a 1400-byte probe at 1.49 Mbit/s
	want := wire / spacing.Seconds()
	near := func(got float64) bool { return math.Abs(got-want) < 0.01*want }

	tr := &train{pace: 20 * time.Microsecond, arrivals: arrivalsEvery(1000, spacing, trainLen)}
	if got, ok := tr.capacity(); !ok || !near(got) {
		t.Errorf("evenly spaced: %.0f bit/s (%v), want %.0f", got, ok, want)
	}

	// A token bucket's burst lets the first probes through at once; a receiver that
	// read two probes late stamps them together. The median spacing holds.
	burst := arrivalsEvery(5000, spacing, trainLen)
	burst[1], burst[2] = burst[0], burst[0]+10
	burst[5] = burst[6]
	tr = &train{pace: 20 * time.Microsecond, arrivals: burst}
	if got, ok := tr.capacity(); !ok || !near(got) {
		t.Errorf("burst and a late read: %.0f bit/s (%v), want %.0f", got, ok, want)
	}

	// Replies overtaking each other, and the peer's clock wrapping, change nothing.
	wrapped := arrivalsEvery(^uint32(0)-20000, spacing, trainLen)
	wrapped[2], wrapped[5] = wrapped[5], wrapped[2]
	tr = &train{pace: 20 * time.Microsecond, arrivals: wrapped}
	if got, ok := tr.capacity(); !ok || !near(got) {
		t.Errorf("reordered across the clock's wrap: %.0f bit/s (%v), want %.0f", got, ok, want)
	}

	// Paced by us: the link was faster than our sending, so the train says nothing.
	tr = &train{pace: 7 * time.Millisecond, arrivals: arrivalsEvery(0, spacing, trainLen)}
	if got, ok := tr.capacity(); ok {
		t.Errorf("a train as slow as our sending measured %.0f bit/s", got)
	}
	// Too few replies (an old peer answers none; a lossy link some).
	tr = &train{pace: 20 * time.Microsecond, arrivals: arrivalsEvery(0, spacing, trainMinReplies-1)}
	if got, ok := tr.capacity(); ok {
		t.Errorf("%d replies measured %.0f bit/s", trainMinReplies-1, got)
	}
	// All at once (a link behind a burst larger than the train): nothing.
	tr = &train{pace: 20 * time.Microsecond, arrivals: make([]uint32, trainLen)}
	if got, ok := tr.capacity(); ok {
		t.Errorf("simultaneous arrivals measured %.0f bit/s", got)
	}
}
