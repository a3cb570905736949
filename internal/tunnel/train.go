package tunnel

import (
	"slices"
	"time"

	"github.com/aggd/aggd/internal/wire"
)

// Probe trains: a first capacity measure for each link before any traffic.
//
// When a link first comes up and its estimator knows nothing yet (no configured rate),
// the sender puts trainLen padded probes on it back to back. The link's bottleneck
// passes them one after the other, so at the peer they arrive spaced by the time each
// took to serialise there; the peer answers each with its arrival time (a train probe's
// PROBE_REPLY carries it, docs/wire-format.md). The median of the spaces between
// consecutive arrivals gives the capacity: the median, because a token bucket lets its
// burst through at line rate (the first pairs) and a busy receiver reads some packets
// late (single pairs either way). A train the link passed as fast as we sent it says
// only that the link is faster than our sending, not how fast: it is not used. Neither
// is one with fewer than trainMinReplies answers (an old peer without trains answers
// none).

const (
	trainLen = 8
	// trainDatagram is each train probe's size without the outer IPv4 and UDP headers:
	// MTU-sized for the serialisation to dominate the receiver's timing noise, yet below
	// any uplink's MTU (PPPoE: 1492).
	trainDatagram   = 1372
	trainMinReplies = 4
	// trainWait is how long replies are waited for: the train spends at most
	// trainLen × 1400 bytes in the slowest link's queue (0.9 s at 100 kbit/s).
	trainWait = 2 * time.Second
	// senderBoundFrac: a median spacing not clearly above our own sending pace means
	// the train was paced by us.
	senderBoundFrac = 1.25
)

// train is one link's probe train in flight. Guarded by the link's mu.
type train struct {
	sent     time.Time
	pace     time.Duration // our time per probe while sending it
	arrivals []uint32      // the peer's arrival times, µs on its clock
}

// capacity evaluates the train: bits/s, or ok false if it measured nothing.
func (t *train) capacity() (bps float64, ok bool) {
	if len(t.arrivals) < trainMinReplies {
		return 0, false
	}
	first := t.arrivals[0]
	rel := make([]int64, len(t.arrivals))
	for i, a := range t.arrivals {
		rel[i] = int64(int32(a - first)) // replies can overtake each other; wrap-safe
	}
	slices.Sort(rel)
	gaps := make([]int64, len(rel)-1)
	for i := range gaps {
		gaps[i] = rel[i+1] - rel[i]
	}
	slices.Sort(gaps)
	median := time.Duration(gaps[len(gaps)/2]) * time.Microsecond
	if median <= 0 || float64(median) <= senderBoundFrac*float64(t.pace) {
		return 0, false
	}
	return float64((trainDatagram+28)*8) / median.Seconds(), true
}

// sendTrain puts a probe train on a link whose capacity is unknown (CPE: upstream;
// headend: downstream). The probes carry the link's watermark like any probe.
func (s *Session) sendTrain(l *link) {
	l.mu.Lock()
	if !l.est.InStartup() || l.train != nil {
		l.mu.Unlock()
		return
	}
	t := &train{sent: time.Now()}
	l.train = t
	l.mu.Unlock()
	pad := trainDatagram - wire.HeaderLen - wire.ProbeBodyLen
	start := time.Now()
	for range trainLen {
		s.sendProbe(l, pad)
	}
	l.mu.Lock()
	t.pace = time.Since(start) / trainLen
	l.mu.Unlock()
}

// onTrainReply records one answer to the link's train; the last one settles it.
func (l *link) onTrainReply(arrival uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.train == nil || l.trainDone {
		return
	}
	l.train.arrivals = append(l.train.arrivals, arrival)
	if len(l.train.arrivals) == trainLen {
		l.settleTrain()
	}
}

// checkTrain settles a train whose replies stopped coming (some were lost).
func (l *link) checkTrain(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.train != nil && !l.trainDone && now.Sub(l.train.sent) > trainWait {
		l.settleTrain()
	}
}

// settleTrain hands the train's measure to the estimator. Caller holds mu.
func (l *link) settleTrain() {
	l.trainDone = true
	bps, ok := l.train.capacity()
	if !ok {
		l.log.Info("probe train measured nothing; the link's rate is found by its traffic",
			"replies", len(l.train.arrivals), "of", trainLen)
		return
	}
	l.est.Train(bps)
	l.log.Info("link capacity measured by a probe train", "mbit_s", round2(bps/1e6), "replies", len(l.train.arrivals))
}
