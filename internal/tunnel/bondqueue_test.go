package tunnel

import (
	"testing"
	"time"

	"github.com/aggd/aggd/internal/aqm"
	"github.com/aggd/aggd/internal/metrics"
)

// What the links carry in the tests below: per 50-ms step sent, per report arrived
// (togetherRig.step), about 0.5 and 3 Mbit/s.
var (
	bothSend    = perLink{dsl: 1, cable: 6}
	bothArrive  = perLink{dsl: 2, cable: 12}
	dslSends    = perLink{dsl: 1}
	dslArrives  = perLink{dsl: 2}
	cableArrive = perLink{cable: 12}
)

// bondQueueRig is a togetherRig whose links have delivered for 800 ms with 10-ms floors
// and then for 400 ms with the ADSL line queueing 36 ms and the cable 2.
func bondQueueRig(t *testing.T) *togetherRig {
	r := newTogetherRig(t)
	r.owd = map[*link]int32{r.dsl: 10_000, r.cable: 10_000}
	for range 16 {
		r.step(bothSend, bothArrive, r.dsl, r.cable, r.lte)
	}
	r.owd[r.dsl], r.owd[r.cable] = 46_000, 12_000
	for range 8 {
		r.step(bothSend, bothArrive, r.dsl, r.cable, r.lte)
	}
	if q := r.s.bondQueue.Load(); q != int64(2*time.Millisecond) {
		t.Fatalf("with both links delivering the bond's queue is %v, want the cable's 2 ms", time.Duration(q))
	}
	return r
}

// inSchedule reports whether l is up or suspect.
func inSchedule(l *link) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state.inSchedule()
}

// When a busy link dies, the peer's reports after the death show data arriving on its
// companions alone, and the least queue among the links that delivered is then a slow
// companion's, long by nature: no measure of the bond's queue, and the AQM must not
// act on it (Session.publishBondQueue). Once the link is found down its companions'
// queues are the bond's.
func TestABusyLinksSilenceIsNoMeasureOfTheBondsQueue(t *testing.T) {
	r := bondQueueRig(t)
	// The cable dies halfway to the next report: it shows the first half of what the
	// cable was sent arriving, and owes the rest.
	r.step(bothSend, bothArrive, r.dsl, r.lte)
	r.step(bothSend, perLink{dsl: 2, cable: 6}, r.dsl, r.lte)
	if q := r.s.bondQueue.Load(); q != int64(2*time.Millisecond) {
		t.Fatalf("the report that shows the cable's last packets: the bond's queue is %v, want the cable's 2 ms", time.Duration(q))
	}
	gen := r.s.bondQueueGen.Load()
	reports := 0
	for range 40 {
		r.step(bothSend, dslArrives, r.dsl, r.lte)
		if r.now%(100*time.Millisecond) != 0 {
			continue
		}
		reports++
		if !inSchedule(r.cable) {
			break
		}
		if g, q := r.s.bondQueueGen.Load(), r.s.bondQueue.Load(); g != gen || q != int64(2*time.Millisecond) || !r.s.bondUnmeasured.Load() {
			t.Fatalf("report %d after the cable died, with the cable still in the schedule: measure %d after %d, queue %v, unmeasured %v; want none (2 ms still), unmeasured",
				reports, g, gen, time.Duration(q), r.s.bondUnmeasured.Load())
		}
	}
	if inSchedule(r.cable) || reports < 2 {
		t.Fatalf("the cable was not found down over %d reports after its death, or at once", reports)
	}
	// The ADSL line completes a sample every other report: its queue is measured then.
	var most int64
	for range 4 {
		r.step(dslSends, dslArrives, r.dsl, r.lte)
		most = max(most, r.s.bondQueue.Load())
	}
	if g := r.s.bondQueueGen.Load(); g == gen || most != int64(36*time.Millisecond) || r.s.bondUnmeasured.Load() {
		t.Errorf("after the cable was found down: measure %d after %d, the longest queue %v, unmeasured %v; want new ones, the ADSL line's 36 ms",
			g, gen, time.Duration(most), r.s.bondUnmeasured.Load())
	}
}

// The ADSL line, one or two packets a report, delivers nothing in two: that means
// little, and the reports measure the cable's queue.
func TestALightLinksSilenceLeavesTheMeasure(t *testing.T) {
	r := bondQueueRig(t)
	gen := r.s.bondQueueGen.Load()
	for range 4 {
		r.step(bothSend, cableArrive, r.dsl, r.cable, r.lte)
	}
	if g, q := r.s.bondQueueGen.Load(), r.s.bondQueue.Load(); g != gen+2 || q != int64(2*time.Millisecond) {
		t.Errorf("two reports without the ADSL line's packets: %d measures, the last %v; want 2, of 2 ms",
			g-gen, time.Duration(q))
	}
}

// A link the scheduler stops giving packets to falls silent too, but it owes nothing:
// the reports measure the bond's queue.
func TestALinkLeftUnusedLeavesTheMeasure(t *testing.T) {
	r := bondQueueRig(t)
	gen := r.s.bondQueueGen.Load()
	for range 4 {
		r.step(dslSends, dslArrives, r.dsl, r.cable, r.lte)
	}
	if !inSchedule(r.cable) {
		t.Fatal("the cable, given nothing, was taken out of the schedule")
	}
	if g := r.s.bondQueueGen.Load(); g != gen+2 {
		t.Errorf("two reports after the scheduler stopped using the cable, the bond's queue was measured %d times, want 2", g-gen)
	}
}

// While the last report was no measure, the AQM signals nothing, in the daemon and in
// the kernel's schedule alike, and takes up again with the next measure.
func TestTheAQMSignalsNothingWhileTheBondsQueueIsUnmeasured(t *testing.T) {
	const ms = int64(time.Millisecond)
	t.Run("userspace", func(t *testing.T) {
		s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
		s.aqm = aqm.New(int64(time.Millisecond), int64(10*time.Millisecond))
		s.bondQueue.Store(50 * ms)
		signals := func(from int64) (n int) {
			s.txMu.Lock()
			defer s.txMu.Unlock()
			for now := from; now < from+200*ms; now += ms {
				if now%(20*ms) == 0 {
					s.bondQueueGen.Add(1) // a measure every 20 ms, as ever
				}
				if s.aqmSignal(now) {
					n++
				}
			}
			return n
		}
		start := int64(time.Hour)
		if signals(start) == 0 {
			t.Fatal("setup: no signal in 200 ms of packets every ms on a 50-ms queue")
		}
		s.bondUnmeasured.Store(true)
		if n := signals(start + 200*ms); n != 0 {
			t.Errorf("the bond's queue unmeasured: %d signals in 200 ms, want none", n)
		}
		s.bondUnmeasured.Store(false)
		if signals(start+400*ms) == 0 {
			t.Error("measured again: no signal in 200 ms on the 50-ms queue")
		}
	})
	t.Run("fast path", func(t *testing.T) {
		s, _, sp, measure := kernelAQMDropping(t)
		s.bondUnmeasured.Store(true)
		s.refreshSchedule()
		if gap := sp.programmed.AQMGap; gap != 0 {
			t.Errorf("the bond's queue unmeasured: the kernel drops every %s, want no drop", gap)
		}
		s.bondUnmeasured.Store(false)
		if gap := measure(); gap == 0 {
			t.Error("measured again: no drop schedule on the 50-ms queue")
		}
	})
}
