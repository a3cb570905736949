package tunnel

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/aggd/aggd/internal/wire"
)

// Probe trains: a first capacity measure for each link before any traffic.
//
// When a link first comes up and its estimator knows nothing yet (no configured rate),
// the sender puts shortTrain padded probes on it back to back. The link's bottleneck
// passes them one after the other, so at the peer they arrive spaced by the time each
// took to serialise there; the peer answers each with its arrival time (a train probe's
// PROBE_REPLY carries it, docs/wire-format.md). The median of the spaces between
// consecutive arrivals after a token bucket's burst gives the capacity: an idle
// shaper's full bucket lets the first probes through at line rate (burstGaps), and the
// median, because a busy receiver stamps some packets late (single pairs either way);
// where the receiver stamped many late, the median time over a few probes
// (bottleneckSpacing).
//
// The arrival times are the peer's kernel's receive times (SO_TIMESTAMPNS, readLoop):
// its daemon's reading times would show the daemon's scheduling, not the link (read in
// bursts on a loaded machine, a 60 Mbit/s link's train looked like 167 to 622 Mbit/s).
// Where the kernel gives none, the daemon's time stands in, so a train must also last
// long enough for that to matter little: at least trainMinSpan. A short train that
// passed faster (a fast link) is followed once by a long one; a long one that still
// passed faster measures nothing. Nor does a train the link passed as fast as we sent it
// (our own pacing), or one with fewer than trainMinReplies answers (an old peer without
// trains answers none). The link's rate is then found by its traffic, as without trains.
//
// A short train's seven spacings are at the mercy of one stall of either host, so on a
// link fast enough for a long train to pass within confirmTrainMax the long one follows
// and its measure is taken, the short one's only if the long one measures nothing (an
// e2e host stalling every few ms measured a 10-Mbit/s link at 7.85 with 8 probes, and at
// 9.6-10.0 with 48).

const (
	shortTrain = 8
	longTrain  = 48
	// trainDatagram is each train probe's size without the outer IPv4 and UDP headers:
	// MTU-sized for the serialisation to dominate the receiver's timing noise, yet below
	// any uplink's MTU (PPPoE: 1492).
	trainDatagram   = 1372
	trainMinReplies = 4
	// trainMinSpan: a train whose arrivals spread over less than this is read too fast
	// for the reader's timing to measure it.
	trainMinSpan = 5 * time.Millisecond
	// trainWait is how long replies are waited for: a short train spends at most
	// shortTrain × 1400 bytes in the slowest link's queue (0.9 s at 100 kbit/s); a long
	// one is sent only over a link that passed the short one within trainMinSpan.
	trainWait = 2 * time.Second
	// senderBoundFrac: a median spacing not clearly above our own sending pace means
	// the train was paced by us.
	senderBoundFrac = 1.25
	// irregularFrac: the upper quartile of the spacings may be at most this multiple of
	// the lower one.
	irregularFrac = 2.0
	// A short train whose spacings came out irregular, or as slow as our own sending,
	// is sent again, up to maxTrainRetries times, trainRetryAfter after the last one
	// and twice as long after each further one: both are the hosts' timing (a busy peer
	// reading in bursts, a sender descheduled within the train), which passes, though
	// not always within a second (an e2e CPE's three trains failed on two links at the
	// start, 0.6 s apart, all three times). Without a measure the link starts at
	// estimate.StartRate and doubles per period from there: in the lab (3 × 1.5 Mbit/s,
	// every link's train sent at once as the bond came up) about one train in four
	// failed so, and the first transfer's first second then ran on one link or two.
	maxTrainRetries = 4
	trainRetryAfter = 500 * time.Millisecond
	// confirmTrainMax: a link whose short train measured it fast enough to pass a long
	// one within this gets the long one too (67 kB: 54 ms at 10 Mbit/s). Slower links
	// keep the short train's measure: a long one would hold their queue for seconds
	// (2.7 s at 0.2 Mbit/s).
	confirmTrainMax = 100 * time.Millisecond
	// An even stretch is at least stretchMin spacings in a row (five probes) whose
	// largest is at most stretchSpread times the smallest (evenStretchSpacing).
	stretchMin    = 4
	stretchSpread = 1.5
)

// Re-measuring a collapsed estimate. A link's estimate can fall far below what its
// train measured (one bad sample is enough), and it climbs back only while another
// link queues, which a sender held back by losses or its own CPU never makes happen:
// the lab's lossy scenario ran a whole downstream transfer with a 1.5-Mbit/s link
// assumed at 0.08 and left unused, twice in CI. So a link whose capacity estimate has
// stood below collapsedFrac of its last train's measure (or of the highest estimate
// since, if higher) for retrainFirst gets another short train. If that finds
// estimate.RetrainGain times the estimate, the estimator starts again from it
// (Estimator.Retrain); if it finds less, the link really slowed, and its measure
// becomes the reference. Each retrain waits twice as long after the
// one before, up to retrainMax, until the estimate has stood for retrainMax without
// collapsing: a train is 11 kB, it queues for a while on a really slow link, and a
// train that keeps disagreeing with what the traffic measures (a shared LTE cell) must
// not overload the link every two seconds.
const (
	collapsedFrac = 0.25
	retrainFirst  = 2 * time.Second
	retrainMax    = 32 * time.Second
)

// retrainWatch times the re-measuring of a link whose estimate collapsed. Guarded by
// the link's mu.
type retrainWatch struct {
	ref    float64       // the link's last train's measure, or the highest estimate since, bits/s (0: no train)
	since  time.Time     // the estimate has stood collapsed since (zero: it has not)
	last   time.Time     // the last retrain
	wait   time.Duration // the least time from the last retrain to the next
	active bool          // a retraining train is out
}

// retrainDue reports whether the link's collapsed estimate should be measured again
// now, and makes room for the train. Only an up link that is not standing by (a
// standby link waits unused, and its estimate is not the bond's concern until it is
// used), whose startup is over and which has no train out.
func (l *link) retrainDue(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := &l.retrain
	if l.state != stateUp || l.isStandbyLocked() || l.est.InStartup() || w.ref == 0 ||
		l.train != nil && !l.train.done {
		return false
	}
	w.ref = max(w.ref, l.est.Capacity()) // a link that grew since its train collapses from where it got to
	ref := w.ref
	if _, limit := l.prior(); limit > 0 {
		ref = min(ref, limit) // the configured cap bounds the estimate, not a collapse
	}
	if l.est.Capacity() >= collapsedFrac*ref {
		w.since = time.Time{}
		if now.Sub(w.last) >= retrainMax {
			w.wait = 0
		}
		return false
	}
	if w.since.IsZero() {
		w.since = now
	}
	if now.Sub(w.since) < retrainFirst || now.Sub(w.last) < w.wait {
		return false
	}
	l.logger().Info("link capacity estimate far below its probe train's; measuring it again",
		"mbit_s", round2(l.est.Capacity()/1e6), "train_mbit_s", round2(w.ref/1e6), "collapsed_for", now.Sub(w.since))
	w.last, w.wait, w.active = now, min(2*max(w.wait, retrainFirst), retrainMax), true
	l.train = nil
	return true
}

// train is one link's probe train in flight. Guarded by the link's mu.
type train struct {
	result   trainResult // once done
	probes   int
	sent     time.Time
	pace     time.Duration // our time per probe while sending it
	sendDone bool          // pace is known: the train can be judged
	done     bool          // judged
	arrivals []uint32      // the peer's arrival times, µs on its clock
	// outer: the outer IP and UDP headers' bytes per probe, which the link carries too.
	outer int
	// measured is what this train measured, bits/s (0: nothing); fallback is the short
	// train's measure that a long one confirms, taken if the long one measures nothing.
	measured, fallback float64
}

// trainResult is what a settled train measured.
type trainResult int

const (
	trainMeasured  trainResult = iota
	trainTooFew                // fewer than trainMinReplies replies
	trainPaced                 // as fast as we sent it
	trainTooShort              // over in less than trainMinSpan
	trainIrregular             // spacings too uneven to be a bottleneck's
)

var trainResultNames = [...]string{"measured", "too few replies", "paced by our own sending", "too short to time", "irregular spacing"}

func (r trainResult) String() string { return trainResultNames[r] }

// capacity evaluates the train: bits/s when it measured the link.
func (t *train) capacity() (bps float64, r trainResult) {
	if len(t.arrivals) < trainMinReplies {
		return 0, trainTooFew
	}
	gaps := t.spacings()
	burst := burstGaps(gaps)
	if len(gaps)-burst < trainMinReplies-1 {
		return 0, trainTooShort
	}
	// Over too fast to time, however regular it looked: a short train is followed by a
	// long one (settleTrain) before its regularity is judged, as a fast link's short
	// train is timed at the scale where the hosts' timing shows most.
	if time.Duration(sum(gaps))*time.Microsecond < trainMinSpan {
		return 0, trainTooShort
	}
	spacing, regular := bottleneckSpacing(gaps[burst:], time.Duration(senderBoundFrac*float64(t.pace)))
	switch {
	case !regular:
		// A bottleneck spaces the probes evenly; spacings that vary this much at
		// every scale were made elsewhere (a sender descheduled within the train).
		return 0, trainIrregular
	case spacing <= 0 || float64(spacing) <= senderBoundFrac*float64(t.pace):
		return 0, trainPaced
	}
	return float64((trainDatagram+t.outer)*8) / spacing.Seconds(), trainMeasured
}

// bottleneckSpacing finds the time the bottleneck took per probe from the spacings
// after a burst. Regular single spacings (their upper quartile at most irregularFrac
// times the lower one) give it by their median. Otherwise it is found where the train
// passed undisturbed, in its even stretches (evenStretchSpacing); failing those, in
// the median of the sums of k consecutive spacings, for the smallest k (2, 4, …) at
// which those sums are regular. floor is the spacing of our own sending: an even
// stretch no slower than that is our pace, not the bottleneck's.
//
// A busy host stamps packets late in batches (a late NAPI poll, a shaper's late timer
// releasing two probes at once), which makes single spacings alternate between nothing
// and twice the bottleneck's; the time over k probes is off by one late stamp at most,
// so the sums are regular again. On a CI machine a 30-Mbit/s link's trains (373 µs per
// probe) came out irregular this way all five times. k stops where fewer than 2k (and
// trainMinReplies-1) sums remain: the median of the sums must outvote one stalled
// stretch. It cannot outvote several: see evenStretchSpacing.
func bottleneckSpacing(gaps []int64, floor time.Duration) (time.Duration, bool) {
	s, regular, enough := spacingOverSums(gaps, 1)
	if regular || !enough {
		return s, regular
	}
	if s, ok := evenStretchSpacing(gaps, floor); ok {
		return s, true
	}
	for k := 2; enough; k *= 2 {
		if s, regular, enough = spacingOverSums(gaps, k); regular {
			return s, true
		}
	}
	return 0, false
}

// spacingOverSums judges the sums of k consecutive spacings: if they are regular, their
// median over k is the time per probe. enough says there were at least 2k sums (and
// trainMinReplies-1) to judge.
func spacingOverSums(gaps []int64, k int) (spacing time.Duration, regular, enough bool) {
	n := len(gaps) - k + 1
	if n < max(trainMinReplies-1, 2*k) {
		return 0, false, false
	}
	sums := make([]int64, n)
	for i := range sums {
		sums[i] = sum(gaps[i : i+k])
	}
	slices.Sort(sums)
	if q1, q3 := sums[n/4], sums[3*n/4]; float64(q3) > irregularFrac*float64(q1) {
		return 0, false, true
	}
	return time.Duration(sums[n/2]) * time.Microsecond / time.Duration(k), true, true
}

// evenStretchSpacing finds the bottleneck's spacing in the stretches of a train it
// passed undisturbed: runs of at least stretchMin spacings within stretchSpread of
// each other. A host that stalls every few milliseconds (an e2e host did, for 1.5-4.6
// ms at a time) holds a software shaper's timer: the probes queued behind it leave at
// once when it fires, as many as its bucket allows, and the time the stall took is
// lost to the link. Between stalls the shaper spaces the probes at its rate. Stalls of
// that kind put a 60-Mbit/s link's 48-probe trains at 33-43 Mbit/s by the sums of
// consecutive spacings, and at 59.3-59.6 by their even stretches (TestTrainCapacity).
//
// A stretch counts if it is slower than our own sending (floor) and between 0.4 and
// 1.25 times the train's mean spacing: stalls lengthen the mean, so the bottleneck's
// spacing can be well below it; one above it would mean the rest of the train passed
// faster than the bottleneck. The stretches must hold at least 8 spacings and a fifth
// of the train, so that a few evenly spaced probes by chance do not decide it; their
// median spacing is the measure.
func evenStretchSpacing(gaps []int64, floor time.Duration) (time.Duration, bool) {
	if len(gaps) == 0 {
		return 0, false
	}
	mean := float64(sum(gaps)) / float64(len(gaps))
	var even []int64
	for i := 0; i < len(gaps); {
		lo, hi, j := gaps[i], gaps[i], i+1
		for ; j < len(gaps) && float64(max(hi, gaps[j])) <= stretchSpread*float64(min(lo, gaps[j])); j++ {
			lo, hi = min(lo, gaps[j]), max(hi, gaps[j])
		}
		run := gaps[i:j]
		i = j
		if len(run) < stretchMin {
			continue
		}
		m := float64(median(run))
		if time.Duration(m)*time.Microsecond > floor && m >= 0.4*mean && m <= 1.25*mean {
			even = append(even, run...)
		}
	}
	if len(even) < max(8, len(gaps)/5) {
		return 0, false
	}
	return time.Duration(median(even)) * time.Microsecond, true
}

// median of xs (not empty), which it leaves as it was.
func median(xs []int64) int64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func sum(xs []int64) (s int64) {
	for _, x := range xs {
		s += x
	}
	return s
}

// burstGaps counts the spacings (in arrival order) at the head of a train that a token
// bucket's burst made: the bucket of an idle shaper is full, so the first probes pass
// at the line's rate, and only then does the shaped rate space them. Those are the
// leading spacings shorter than half the median of the train's second half, which the
// shaped rate spaced. Left in, they made the lab's 3-Mbit/s cable downstream's trains
// irregular (a 10-ms bucket lets three 1.4-kB probes through: two near-zero spacings
// of seven, and the lower quartile is one), all five tries in 49 of 65 SOHO and
// standby runs, and the link then went into its first transfer at the 0.06 Mbit/s its
// probes had carried. A burst longer than half the train is not found: it comes out
// irregular and is tried again, as before.
func burstGaps(gaps []int64) int {
	late := slices.Clone(gaps[len(gaps)/2:])
	slices.Sort(late)
	ref := late[len(late)/2]
	n := 0
	for n < len(gaps) && 2*gaps[n] < ref {
		n++
	}
	return n
}

// sendTrain puts a probe train of n probes on a link whose capacity is unknown (CPE:
// upstream; headend: downstream). The probes carry the link's watermark like any probe.
func (s *Session) sendTrain(l *link, n int) {
	l.mu.Lock()
	if !l.est.InStartup() && !l.retrain.active || (l.train != nil && n == shortTrain) {
		l.mu.Unlock()
		return
	}
	t := l.newTrain(n)
	l.train = t
	l.mu.Unlock()
	pad := trainDatagram - wire.HeaderLen - wire.ProbeBodyLen
	start := time.Now()
	for range n {
		s.sendProbe(l, pad)
	}
	l.mu.Lock()
	t.pace, t.sendDone = time.Since(start)/time.Duration(n), true
	longer := len(t.arrivals) == t.probes && !t.done && l.settleTrain() // every reply came while we sent
	l.mu.Unlock()
	if longer {
		s.sendTrain(l, longTrain)
	}
}

// newTrain is the link's next train, of n probes: a long one carries the short one's
// measure, which stands if the long one measures nothing. Caller holds mu.
func (l *link) newTrain(n int) *train {
	t := &train{probes: n, sent: time.Now(), outer: l.outerLen()}
	if l.train != nil && n == longTrain {
		t.fallback = l.train.measured
	}
	return t
}

// onTrainReply records one answer to the link's train; the last one settles it. longer
// says a long train should follow (see settleTrain).
func (l *link) onTrainReply(arrival uint32) (longer bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.train == nil || l.train.done {
		return false
	}
	l.train.arrivals = append(l.train.arrivals, arrival)
	if len(l.train.arrivals) == l.train.probes && l.train.sendDone {
		return l.settleTrain()
	}
	return false
}

// checkTrain settles a train whose replies stopped coming (some were lost).
func (l *link) checkTrain(now time.Time) (longer bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.train != nil && !l.train.done && now.Sub(l.train.sent) > trainWait {
		return l.settleTrain()
	}
	return false
}

// retryTrain reports whether a short train should go out again (and makes room for
// it): the last one measured nothing because of the hosts' timing (irregular spacing,
// or paced by our own sending), the link's capacity is still unknown, and retries are
// left.
func (l *link) retryTrain(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.train
	if t == nil || !t.done || (t.result != trainIrregular && t.result != trainPaced) || !l.est.InStartup() ||
		l.trainRetries >= maxTrainRetries || now.Sub(t.sent) < trainRetryAfter<<l.trainRetries {
		return false
	}
	l.trainRetries++
	l.train = nil
	return true
}

// settleTrain hands the train's measure to the estimator, and reports whether a long
// train should follow a short one that passed too fast to time. Caller holds mu.
func (l *link) settleTrain() (longer bool) {
	t := l.train
	t.done = true
	bps, r := t.capacity()
	t.result = r
	if r == trainTooShort && t.probes == shortTrain {
		return true
	}
	if l.logger().Enabled(context.Background(), slog.LevelDebug) {
		l.logger().Debug("probe train", "probes", t.probes, "pace", t.pace, "spacings_us", t.spacings(), "result", r)
	}
	if r == trainMeasured {
		t.measured = bps
		if t.probes == shortTrain && longTrainTime(bps) <= confirmTrainMax {
			return true
		}
	}
	retraining := l.retrain.active
	l.retrain.active = false
	if r != trainMeasured {
		if t.fallback == 0 {
			l.logger().Info("probe train measured nothing; the link's rate is found by its traffic",
				"why", r, "probes", t.probes, "replies", len(t.arrivals))
			return false
		}
		l.logger().Info("long probe train measured nothing; the short one's measure stands", "why", r,
			"replies", len(t.arrivals))
		bps = t.fallback
	}
	l.retrain.ref = bps
	if retraining {
		was := l.est.Capacity()
		taken := l.est.Retrain(bps)
		if taken {
			l.publishCapacity()
		}
		l.logger().Info("link capacity measured again by a probe train", "mbit_s", round2(bps/1e6),
			"estimate_mbit_s", round2(was/1e6), "taken", taken, "probes", t.probes)
		return false
	}
	l.est.Train(bps)
	l.publishCapacity()
	l.logger().Info("link capacity measured by a probe train", "mbit_s", round2(bps/1e6),
		"probes", t.probes, "replies", len(t.arrivals))
	return false
}

// longTrainTime is how long a long train takes to pass a link of bps bits/s.
func longTrainTime(bps float64) time.Duration {
	return time.Duration(float64(longTrain*trainDatagram*8) / bps * float64(time.Second))
}

// spacings lists the spaces between the train's arrivals, µs in arrival order (replies
// can overtake each other; the peer's clock can wrap).
func (t *train) spacings() []int64 {
	if len(t.arrivals) < 2 {
		return nil
	}
	rel := make([]int64, len(t.arrivals))
	for i, a := range t.arrivals {
		rel[i] = int64(int32(a - t.arrivals[0])) // wrap-safe
	}
	slices.Sort(rel)
	gaps := make([]int64, len(rel)-1)
	for i := range gaps {
		gaps[i] = rel[i+1] - rel[i]
	}
	return gaps
}
