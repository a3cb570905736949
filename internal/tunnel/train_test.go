package tunnel

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/estimate"
	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/sched"
)

// freshLink is a new link of a session that is never ticked: nothing measured, no
// prior, its metrics those of m.
func freshLink(t *testing.T, m *metrics.Set) *link {
	cfg := testSession()
	cfg.Peer = "hub"
	s := newSession(cfg, m, discard, 1, func([]byte) {})
	t.Cleanup(s.close)
	return s.addLink(LinkSpec{ID: 0, Name: "cable"}, func(*link, []byte) error { return nil })
}

// arrivalsEvery returns n arrival times spaced by gap, starting at first (µs).
func arrivalsEvery(first uint32, gap time.Duration, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = first + uint32(i)*uint32(gap/time.Microsecond)
	}
	return out
}

// clumpsOfThree is a short train's arrivals in clumps of three, 20 ms apart (µs).
func clumpsOfThree() []uint32 {
	out := make([]uint32, shortTrain)
	for i := range out {
		out[i] = uint32(i/3) * 20000
	}
	return out
}

// arrivalsSpaced returns the arrival times (µs) of a train whose consecutive spacings
// were gaps, as a daemon's debug log prints them (`msg="probe train" spacings_us=...`).
func arrivalsSpaced(gaps ...uint32) []uint32 {
	out := make([]uint32, 1, len(gaps)+1)
	for _, g := range gaps {
		out = append(out, out[len(out)-1]+g)
	}
	return out
}

func TestTrainCapacity(t *testing.T) {
	wire := float64((trainDatagram + 28) * 8)
	spacing := 7500 * time.Microsecond // a 1400-byte probe at 1.49 Mbit/s
	want := wire / spacing.Seconds()
	near := func(got float64) bool { return math.Abs(got-want) < 0.01*want }

	tr := &train{outer: 28, pace: 20 * time.Microsecond, arrivals: arrivalsEvery(1000, spacing, shortTrain)}
	if got, r := tr.capacity(); r != trainMeasured || !near(got) {
		t.Errorf("evenly spaced: %.0f bit/s (%s), want %.0f", got, r, want)
	}
	// Over IPv6 each probe carries 20 more bytes of outer header at the same spacing.
	tr = &train{outer: 48, pace: 20 * time.Microsecond, arrivals: arrivalsEvery(1000, spacing, shortTrain)}
	if got, _ := tr.capacity(); math.Abs(got-want*(trainDatagram+48)/(trainDatagram+28)) > 1 {
		t.Errorf("evenly spaced over IPv6: %.0f bit/s, want %.0f", got, want*(trainDatagram+48)/(trainDatagram+28))
	}

	// A token bucket's burst lets the first probes through at once; one probe stamped
	// late. The median spacing holds.
	burst := append([]uint32{5000}, arrivalsEvery(5000, spacing, shortTrain-1)...)
	burst[4] += uint32(spacing / time.Microsecond / 2)
	tr = &train{outer: 28, pace: 20 * time.Microsecond, arrivals: burst}
	if got, r := tr.capacity(); r != trainMeasured || !near(got) {
		t.Errorf("burst and a late read: %.0f bit/s (%s), want %.0f", got, r, want)
	}

	// A bucket that lets three probes through at once (the lab's 3-Mbit/s cable
	// downstream: a 10-ms bucket), behind a little jitter that spaces the burst by a
	// fraction of a millisecond: two of the seven spacings are the burst's, and the
	// shaped rate spaces the rest.
	cable := 3730 * time.Microsecond // a 1400-byte probe at 3 Mbit/s
	shaped := append([]uint32{0, 300}, arrivalsEvery(800, cable, shortTrain-2)...)
	tr = &train{outer: 28, pace: 20 * time.Microsecond, arrivals: shaped}
	wantCable := wire / cable.Seconds()
	if got, r := tr.capacity(); r != trainMeasured || math.Abs(got-wantCable) > 0.01*wantCable {
		t.Errorf("a three-probe burst: %.0f bit/s (%s), want %.0f", got, r, wantCable)
	}
	// A burst that leaves fewer than three spacings to the shaped rate says too little:
	// too short, so a long train follows the short one.
	tail := append(arrivalsEvery(0, 100*time.Microsecond, 6), arrivalsEvery(8000, spacing, 2)...)
	tr = &train{outer: 28, probes: shortTrain, pace: 20 * time.Microsecond, arrivals: tail}
	if got, r := tr.capacity(); r != trainTooShort {
		t.Errorf("a burst of six probes in eight: %.0f bit/s (%s), want %s", got, r, trainTooShort)
	}

	// Replies overtaking each other, and the peer's clock wrapping, change nothing.
	wrapped := arrivalsEvery(^uint32(0)-20000, spacing, shortTrain)
	wrapped[2], wrapped[5] = wrapped[5], wrapped[2]
	tr = &train{outer: 28, pace: 20 * time.Microsecond, arrivals: wrapped}
	if got, r := tr.capacity(); r != trainMeasured || !near(got) {
		t.Errorf("reordered across the clock's wrap: %.0f bit/s (%s), want %.0f", got, r, want)
	}

	// Paced by us: the link was faster than our sending, so the train says nothing.
	tr = &train{outer: 28, pace: 7 * time.Millisecond, arrivals: arrivalsEvery(0, spacing, shortTrain)}
	if got, r := tr.capacity(); r != trainPaced {
		t.Errorf("a train as slow as our sending: %.0f bit/s (%s), want %s", got, r, trainPaced)
	}
	// Too few replies (an old peer answers none; a lossy link some).
	tr = &train{outer: 28, pace: 20 * time.Microsecond, arrivals: arrivalsEvery(0, spacing, trainMinReplies-1)}
	if got, r := tr.capacity(); r != trainTooFew {
		t.Errorf("%d replies: %.0f bit/s (%s), want %s", trainMinReplies-1, got, r, trainTooFew)
	}
	// All at once (a link behind a burst larger than the train): nothing.
	tr = &train{outer: 28, pace: 20 * time.Microsecond, arrivals: make([]uint32, shortTrain)}
	if got, r := tr.capacity(); r == trainMeasured {
		t.Errorf("simultaneous arrivals measured %.0f bit/s", got)
	}
	// Probes stamped in pairs (a busy receiver's late NAPI poll, a shaper's late timer
	// releasing two at once): single spacings alternate between nothing and twice the
	// bottleneck's, and the time over two probes is the bottleneck's.
	pairs := make([]uint32, shortTrain)
	for i := range pairs {
		pairs[i] = uint32(i/2) * 2 * uint32(spacing/time.Microsecond)
	}
	tr = &train{outer: 28, pace: 20 * time.Microsecond, arrivals: pairs}
	if got, r := tr.capacity(); r != trainMeasured || !near(got) {
		t.Errorf("probes stamped in pairs: %.0f bit/s (%s), want %.0f", got, r, want)
	}
	// Clumps of three apart (a sender descheduled twice within the train): irregular at
	// every scale a short train can time, so nothing.
	tr = &train{outer: 28, pace: 20 * time.Microsecond, arrivals: clumpsOfThree()}
	if got, r := tr.capacity(); r != trainIrregular {
		t.Errorf("probes in clumps of three: %.0f bit/s (%s), want %s", got, r, trainIrregular)
	}
	// A long train over a 30-Mbit/s link (373 µs per probe) on a busy host: every stamp
	// late by up to 1 ms, at random. Single spacings vary several-fold; the time over a
	// few probes still gives the rate.
	busy := arrivalsEvery(0, 373*time.Microsecond, longTrain)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range busy {
		busy[i] += uint32(rng.IntN(1000))
	}
	tr = &train{outer: 28, probes: longTrain, pace: 20 * time.Microsecond, arrivals: busy}
	want30 := wire / 373e-6
	if got, r := tr.capacity(); r != trainMeasured || got < 0.8*want30 || got > 1.25*want30 {
		t.Errorf("a long train stamped up to 1 ms late: %.2f Mbit/s (%s), want %.2f", got/1e6, r, want30/1e6)
	}
	// The same link's short train is over too fast to time (2.6 ms), however irregular
	// it came out: the long train follows at once rather than another short one.
	tr = &train{outer: 28, probes: shortTrain, pace: 20 * time.Microsecond, arrivals: busy[:shortTrain]}
	if got, r := tr.capacity(); r != trainTooShort {
		t.Errorf("a busy host's 8 probes at 30 Mbit/s: %.0f bit/s (%s), want %s", got, r, trainTooShort)
	}
	// Over too fast for the reader's timing (8 probes at 60 Mbit/s: 1.3 ms): nothing,
	// and a long train is due.
	tr = &train{outer: 28, probes: shortTrain, pace: 20 * time.Microsecond, arrivals: arrivalsEvery(0, 187*time.Microsecond, shortTrain)}
	if got, r := tr.capacity(); r != trainTooShort {
		t.Errorf("a 1.3-ms train: %.0f bit/s (%s), want %s", got, r, trainTooShort)
	}
	l := quietLink(&link{train: tr})
	if !l.settleTrain() {
		t.Error("a short train too fast to time asks for no long one")
	}
	// The long one over the same link lasts long enough.
	tr = &train{outer: 28, probes: longTrain, pace: 20 * time.Microsecond, arrivals: arrivalsEvery(0, 187*time.Microsecond, longTrain)}
	if got, r := tr.capacity(); r != trainMeasured || math.Abs(got-wire/187e-6) > 0.01*wire/187e-6 {
		t.Errorf("a %d-probe train at 60 Mbit/s: %.0f bit/s (%s)", longTrain, got, r)
	}

	// Long trains over the e2e topology's TBFs on a host that stalled for 1-4 ms every few
	// ms, as the headend's debug log printed them: each stall holds the shaper's timer,
	// its bucket (3 kB, then 15 kB) lets two or ten queued probes out at once, and the
	// rest of the stall's time is lost to the link. The sums of consecutive spacings put
	// the 60-Mbit/s link (193 µs per probe) at 33-43 Mbit/s; between the stalls the
	// shaper spaced the probes at its rate. The 30-Mbit/s (373 µs) and 10-Mbit/s (1120
	// µs) links' trains, less disturbed, were measured right before and still are.
	for _, c := range []struct {
		name          string
		pace, spacing time.Duration
		gaps          []uint32
	}{
		{"60 Mbit/s, 3-kB bucket", 13874 * time.Nanosecond, 193 * time.Microsecond, []uint32{41, 137, 174, 201, 238, 1168, 1, 136, 201, 183, 202, 179, 188, 191, 188, 178, 187, 3390, 2, 95, 191, 301, 72, 897, 1, 142, 199, 999, 1, 123, 735, 1, 789, 1, 425, 1, 759, 1, 137, 186, 868, 1, 131, 503, 1, 832, 11}},
		{"60 Mbit/s, 3-kB bucket, again", 44260 * time.Nanosecond, 193 * time.Microsecond, []uint32{522, 139, 79, 123, 192, 185, 443, 2, 151, 190, 956, 0, 148, 169, 1548, 1, 129, 203, 436, 0, 1559, 1, 125, 831, 1, 107, 189, 195, 183, 194, 182, 197, 181, 195, 182, 198, 179, 819, 0, 2376, 2, 148, 1755, 0, 92, 450, 0}},
		{"60 Mbit/s, 15-kB bucket", 10905 * time.Nanosecond, 193 * time.Microsecond, []uint32{17, 12, 15, 17, 21, 13, 15, 14, 13, 75, 188, 193, 186, 214, 170, 193, 184, 3308, 1, 0, 0, 0, 1, 0, 0, 18, 0, 29, 19, 201, 175, 211, 173, 2120, 15, 0, 0, 0, 0, 0, 1, 17, 0, 35, 73, 199, 174}},
		{"30 Mbit/s, 15-kB bucket", 110645 * time.Nanosecond, 373 * time.Microsecond, []uint32{37, 20, 28, 19, 14, 319, 384, 3442, 2, 0, 0, 0, 0, 0, 0, 99, 218, 385, 2262, 1, 0, 0, 0, 100, 273, 362, 390, 380, 367, 383, 379, 378, 1967, 0, 0, 0, 0, 284, 388, 382, 374, 378, 376, 374, 387, 366, 365}},
		{"10 Mbit/s, 15-kB bucket", 14028 * time.Nanosecond, 1120 * time.Microsecond, []uint32{21, 19, 449, 1128, 4189, 1, 0, 335, 2769, 1, 621, 1146, 1144, 2000, 246, 1135, 1131, 1129, 1141, 1139, 1118, 1126, 1142, 2657, 1, 731, 1192, 1095, 1125, 1599, 662, 1107, 1152, 1114, 2470, 2, 953, 1118, 1129, 1131, 1138, 1121, 1161, 1130, 1190, 1092, 1139}},
	} {
		tr = &train{outer: 28, probes: longTrain, pace: c.pace, arrivals: arrivalsSpaced(c.gaps...)}
		want := wire / c.spacing.Seconds()
		if got, r := tr.capacity(); r != trainMeasured || math.Abs(got-want) > 0.05*want {
			t.Errorf("a long train on a stalling host, %s: %.2f Mbit/s (%s), want %.2f", c.name, got/1e6, r, want/1e6)
		}
	}
	// Where the host stalled through most of the train (the 60-Mbit/s link again:
	// nowhere five probes evenly spaced at its rate) there are no even stretches.
	tr = &train{outer: 28, probes: longTrain, pace: 48091 * time.Nanosecond, arrivals: arrivalsSpaced(75, 14, 10, 12, 38, 186, 1112, 1, 0, 0, 0, 21, 560, 0, 10, 187, 644, 0, 0, 3553, 0, 0, 0, 0, 0, 0, 0, 37, 0, 7, 107, 2306, 0, 0, 1, 0, 0, 0, 0, 49, 1, 0, 87, 195, 206, 164, 623)}
	if _, ok := evenStretchSpacing(tr.spacings(), time.Duration(senderBoundFrac*float64(tr.pace))); ok {
		t.Error("a train stalled throughout has even stretches")
	}
}

// A short train that measured a link fast enough for a long one to pass within
// confirmTrainMax is followed by the long one, whose measure is taken; where the long
// one measures nothing, the short one's stands. A slow link keeps its short train's.
func TestLongTrainConfirmsAFastLinksShortOne(t *testing.T) {
	wire := float64((trainDatagram + 28) * 8)
	// The e2e 10-Mbit/s link's short train on a host that stalled: 7.85 Mbit/s.
	short := func(l *link) {
		l.train = &train{outer: 28, probes: shortTrain, pace: 25 * time.Microsecond, sendDone: true,
			arrivals: arrivalsSpaced(103, 899, 1427, 775, 1451, 2601, 0)}
	}
	long := func(l *link, arrivals []uint32) {
		l.train = l.newTrain(longTrain)
		l.train.outer, l.train.pace, l.train.sendDone, l.train.arrivals = 28, 20*time.Microsecond, true, arrivals
	}

	l := freshLink(t, metrics.New())
	short(l)
	if !l.settleTrain() {
		t.Fatal("a 10-Mbit/s link's short train asks for no long one")
	}
	if !l.est.InStartup() {
		t.Fatal("the short train's measure was taken before the long one's")
	}
	long(l, arrivalsEvery(0, 1120*time.Microsecond, longTrain))
	if l.settleTrain() {
		t.Error("a long train asks for another")
	}
	if got, want := l.est.Capacity(), wire/1120e-6; math.Abs(got-want) > 0.01*want {
		t.Errorf("after the long train the capacity is %.2f Mbit/s, want its %.2f", got/1e6, want/1e6)
	}

	l = freshLink(t, metrics.New())
	short(l)
	l.settleTrain()
	long(l, clumpsOfThree())
	l.settleTrain()
	if got, want := l.est.Capacity(), wire/1427e-6; math.Abs(got-want) > 0.01*want {
		t.Errorf("after an irregular long train the capacity is %.2f Mbit/s, want the short one's %.2f", got/1e6, want/1e6)
	}
	if l.retryTrain(time.Now().Add(time.Minute)) {
		t.Error("a link measured by its short train is sent another")
	}

	l = freshLink(t, metrics.New())
	l.train = &train{outer: 28, probes: shortTrain, pace: 20 * time.Microsecond, sendDone: true,
		arrivals: arrivalsEvery(0, 7500*time.Microsecond, shortTrain)}
	if l.settleTrain() || l.est.InStartup() {
		t.Error("a 1.5-Mbit/s link's short train is not taken as it is")
	}
}

// Replies that all arrive while the train is still being sent (a fast link, a short
// way back) wait for our pace to be known before the train is judged.
func TestTrainWaitsForItsPace(t *testing.T) {
	m := metrics.New()
	l := freshLink(t, m)
	l.train = &train{outer: 28, probes: shortTrain}
	for _, a := range arrivalsEvery(0, 7500*time.Microsecond, shortTrain) {
		l.onTrainReply(a)
	}
	if l.train.done {
		t.Fatal("the train was judged before its sending pace was known")
	}
	l.train.pace, l.train.sendDone = 20*time.Microsecond, true
	if l.settleTrain(); !l.train.done || l.est.InStartup() {
		t.Errorf("settled train: done %v, estimator still in startup %v", l.train.done, l.est.InStartup())
	}
	// The capacity metric shows the train's measure at once, not when the link's first
	// sample completes (never, on a link that stays idle).
	if got, want := gauge(m.LinkCapacity.WithLabelValues("hub", "cable")), l.est.Capacity(); got != want || got == 0 {
		t.Errorf("after the train the capacity metric shows %.2f Mbit/s, the estimate is %.2f", got/1e6, want/1e6)
	}
}

// A short train whose spacings came out irregular goes out again, a little later, a
// bounded number of times, and only while the link's capacity is still unknown.
func TestIrregularTrainIsRetried(t *testing.T) {
	l := quietLink(&link{est: estimate.New(estimate.Config{})})
	sent := time.Now()
	irregular := func() {
		l.train = &train{outer: 28, probes: shortTrain, sent: sent, pace: 20 * time.Microsecond, sendDone: true, arrivals: clumpsOfThree()}
		l.settleTrain()
	}
	for i := range maxTrainRetries {
		irregular()
		wait := trainRetryAfter << i // each retry waits twice as long as the one before
		if l.retryTrain(sent.Add(wait - time.Millisecond)) {
			t.Fatalf("retry %d before %s", i+1, wait)
		}
		if !l.retryTrain(sent.Add(wait)) {
			t.Fatalf("no retry %d %s after an irregular train", i+1, wait)
		}
		if l.train != nil {
			t.Fatal("the retry left the old train in place: sendTrain would refuse a short one")
		}
	}
	irregular()
	if l.retryTrain(sent.Add(time.Minute)) {
		t.Errorf("more than %d retries", maxTrainRetries)
	}

	// Nor one paced by our own sending beyond the retries; a fresh link's is retried.
	l = freshLink(t, metrics.New())
	l.train = &train{outer: 28, probes: shortTrain, sent: sent, pace: 8 * time.Millisecond, sendDone: true, arrivals: arrivalsEvery(0, 7500*time.Microsecond, shortTrain)}
	l.settleTrain()
	if !l.retryTrain(sent.Add(trainRetryAfter)) {
		t.Error("a train paced by our own sending is not sent again")
	}

	// A measured link is not retried.
	l = freshLink(t, metrics.New())
	l.train = &train{outer: 28, probes: shortTrain, sent: sent, pace: 20 * time.Microsecond, sendDone: true, arrivals: arrivalsEvery(0, 7500*time.Microsecond, shortTrain)}
	l.settleTrain()
	if l.retryTrain(sent.Add(time.Minute)) {
		t.Error("a train that measured the link is sent again")
	}
}

// The bond is loaded when every link that carried data was given about all its rate;
// idle links and probe trickles do not count, and nothing carried is not loaded.
func TestBondLoaded(t *testing.T) {
	mk := func(rate float64) *link {
		l := quietLink(&link{est: estimate.New(estimate.Config{Prior: rate})})
		return l
	}
	busy, trickle, idle := mk(30e6), mk(60e6), mk(10e6)
	sample := func(bps float64, packets uint32) estimate.Sample {
		return estimate.Sample{Interval: 100 * time.Millisecond, Sent: uint64(bps / 8 / 10), Packets: packets}
	}
	full := []period{{busy, sample(29e6, 240)}, {trickle, sample(60e3, 5)}, {idle, sample(0, 0)}}
	if !bondLoaded(full) {
		t.Error("a link at its rate beside a trickle and an idle one: not loaded")
	}
	half := []period{{busy, sample(29e6, 240)}, {trickle, sample(20e6, 160)}}
	if bondLoaded(half) {
		t.Error("a link given a third of its rate: loaded")
	}
	if bondLoaded([]period{{idle, sample(0, 0)}}) {
		t.Error("nothing carried: loaded")
	}
}

// A link whose estimate collapsed far below its train's measure gets another train
// after retrainFirst; a measure well above the estimate restores it, one about as low
// leaves it (and stops the retraining). A standby link is never retrained.
func TestCollapsedEstimateIsMeasuredAgain(t *testing.T) {
	sent := time.Now()
	trainAt := func(l *link, gap time.Duration) {
		l.train = &train{outer: 28, probes: shortTrain, sent: sent, pace: 20 * time.Microsecond, sendDone: true,
			arrivals: arrivalsEvery(0, gap, shortTrain)}
		l.settleTrain()
	}
	collapsed := func(standby bool) *link {
		l := freshLink(t, metrics.New())
		if standby {
			l.spec.Class = sched.ClassBackup
		}
		trainAt(l, 7500*time.Microsecond) // 1.49 Mbit/s
		l.state = stateUp
		for range 5 {
			l.est.Update(estimate.Sample{Interval: 100 * time.Millisecond, Delivered: 1000, Packets: 4, Sent: 18000,
				Queue: 20 * time.Millisecond, HaveQueue: true})
		}
		if c := l.est.Capacity(); c > 0.2e6 {
			t.Fatalf("setup: capacity %.2f Mbit/s, want it collapsed", c/1e6)
		}
		return l
	}

	l := collapsed(false)
	if l.retrainDue(sent) || l.retrainDue(sent.Add(retrainFirst-time.Millisecond)) {
		t.Fatal("retrained before the estimate stood collapsed for retrainFirst")
	}
	if !l.retrainDue(sent.Add(retrainFirst)) {
		t.Fatal("no retrain after the estimate stood collapsed for retrainFirst")
	}
	if l.train != nil || !l.retrain.active {
		t.Fatal("the retrain left no room for a short train: sendTrain would refuse it")
	}
	trainAt(l, 7600*time.Microsecond)
	if c := l.est.Capacity(); c < 1.4e6 {
		t.Errorf("after a retrain that measured 1.47 Mbit/s the capacity is %.2f", c/1e6)
	}
	if l.retrainDue(sent.Add(time.Minute)) {
		t.Error("a restored estimate is retrained")
	}

	// A train that measures nothing (or one taken whose estimate collapses again) waits
	// twice as long for the next, until the estimate stands for retrainMax.
	l = collapsed(false)
	l.retrainDue(sent)
	at := sent.Add(retrainFirst)
	for i, wait := range []time.Duration{0, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 32 * time.Second} {
		at = at.Add(wait)
		if wait > 0 && l.retrainDue(at.Add(-time.Millisecond)) {
			t.Fatalf("retrain %d less than %v after the one before", i+1, wait)
		}
		if !l.retrainDue(at) {
			t.Fatalf("no retrain %d %v after the one before", i+1, wait)
		}
		l.train = &train{outer: 28, probes: shortTrain, sent: at, pace: 20 * time.Microsecond, sendDone: true, arrivals: clumpsOfThree()}
		l.settleTrain()
	}

	l = collapsed(false)
	low := l.est.Capacity()
	l.retrainDue(sent)
	if !l.retrainDue(sent.Add(retrainFirst)) {
		t.Fatal("no retrain")
	}
	trainAt(l, time.Duration(float64((trainDatagram+28)*8)/(1.5*low)*float64(time.Second)))
	if l.est.Capacity() != low {
		t.Errorf("a retrain at 1.5 times the estimate moved it from %.3f to %.3f Mbit/s", low/1e6, l.est.Capacity()/1e6)
	}
	if l.retrainDue(sent.Add(time.Hour)) {
		t.Error("a link whose retrain confirmed its low estimate is retrained again")
	}

	l = collapsed(true)
	if l.retrainDue(sent) || l.retrainDue(sent.Add(time.Hour)) {
		t.Error("a standby link is retrained")
	}

	// A link that grew past its train's measure collapses from where it got to.
	l = freshLink(t, metrics.New())
	trainAt(l, 30*time.Millisecond) // 0.37 Mbit/s
	l.state = stateUp
	l.est.Restart(1.5e6, 0) // stands for traffic that measured it at 1.5
	l.retrainDue(sent)
	for range 5 { // to 0.16 Mbit/s: above a quarter of the train's measure
		l.est.Update(estimate.Sample{Interval: 100 * time.Millisecond, Delivered: 2000, Packets: 4, Sent: 18000,
			Queue: 20 * time.Millisecond, HaveQueue: true})
	}
	l.retrainDue(sent)
	if !l.retrainDue(sent.Add(retrainFirst)) {
		t.Errorf("a link measured at 1.5 Mbit/s after a 0.37-Mbit/s train, now at %.2f, is not retrained", l.est.Capacity()/1e6)
	}
}
