package tunnel

import (
	"slices"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/aqm"
	"github.com/aggd/aggd/internal/metrics"
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
