// Package estimate tells the scheduler how fast each link really is, from what the
// peer reports receiving on it (docs/architecture.md §6).
//
// One Estimator per link and direction. Every feedback period it gets a Sample: how
// many bytes the peer received on the link in that period, how many we sent, and the
// link's queueing delay (the period's smallest one-way delay above the link's floor).
// From those it keeps two numbers:
//
//   - Capacity: the link's delivery rate at the onset of queueing. While the link
//     has a standing queue, its bottleneck is busy all the time, so what it delivers is
//     its capacity; those samples go through a Kalman filter (kalman.go). A link seen
//     delivering more than the estimate without a queue lifts the estimate to that.
//   - Rate: what the scheduler assumes. It follows the capacity, with two corrections
//     that make the control loop: below capacity while the link's queue is above the
//     target and above the other links' queues (so the queue drains and its traffic
//     moves to links that have room), and
//     above the estimate, a few percent per period, while the link carries all the
//     scheduler gives it without any queue (probing: the capacity may have grown).
//
// Configured rates are a prior (the starting point) and a cap, nothing more. Without a
// prior a link starts low, at StartRate, and doubles its rate every period it carries
// what it is given without a queue (startup, like TCP's slow start): an optimistic
// start would instead make every unmeasured link look far better than a measured one
// and keep the measured ones idle until each had been overloaded in turn. Startup ends
// with the link's first standing queue.
//
// The Estimator is not safe for concurrent use; the link's mutex guards it.
package estimate

import (
	"math"
	"math/bits"
	"time"
)

// Config is a link's estimator setup.
type Config struct {
	// Prior is the configured rate in bits/s, the starting point; 0: none.
	Prior float64
	// Cap bounds capacity and rate, bits/s; 0: no cap.
	Cap float64
	// QueueTarget is the standing queue the controller tolerates on a link before
	// moving traffic off it. Default DefaultQueueTarget.
	QueueTarget time.Duration
}

const (
	// StartRate is the rate assumed for a link before anything is known about it: low,
	// because overshooting a slow link with a deep buffer (an ADSL upstream) costs
	// seconds of queue before the first feedback can tell; doubling reaches 100 Mbit/s
	// in nine periods.
	StartRate = 250e3
	// DefaultQueueTarget: a few milliseconds, well above the jitter that survives the
	// period minimum, well below what interactive traffic notices.
	DefaultQueueTarget = 5 * time.Millisecond
	// MinRate keeps a working link in the schedule however slow it measured.
	MinRate = 64e3

	// startupCeiling bounds a startup doubling to this multiple of what the link was
	// seen to deliver.
	startupCeiling = 2.5
	// probeGain is the rate's increase in the first period the link carries what it is
	// given without a queue; every further such period in a row multiplies it by
	// probeGrowth, up to maxProbeGain. Gentle first, so that links at their capacity do
	// not overload each other in turn (each overload costs the whole bond a TCP
	// backoff), then fast, so that a link whose capacity really grew (LTE) is followed
	// within a second or two.
	probeGain    = 0.01
	probeGrowth  = 1.3
	maxProbeGain = 0.25
	// recoverGain is the increase per period back up to the capacity estimate (after a
	// drain, or when load returns).
	recoverGain = 0.25
	// loadedFrac: a link counts as loaded (and so as able to tell whether it has room)
	// when we sent it at least this fraction of its assumed rate.
	loadedFrac = 0.8
	// policedFrac: a loaded link that delivers less than this fraction of what it was
	// sent (the rest lost, Sample.Lost), without a queue, is dropping rather than
	// queueing.
	policedFrac = 0.75
	// probeCeiling bounds probing to this multiple of what the link was seen to deliver,
	// so a link that is loaded only now and then does not drift upwards without limit.
	probeCeiling = 1.5
	// busyFrac: a queue above the least-queued link's counts against a link only if it
	// was sent at least this fraction of its assumed rate in the period (the other
	// direction's ACK trickle made a link look saturated at 3 Mbit/s on the e2e veths).
	busyFrac = 0.5
	// relativeQueue is how much more standing queue than the least-queued link (plus
	// half the link's jitter) marks a link as the saturated one.
	relativeQueue = time.Millisecond
	// tinyFrac: a link sent less than this fraction of its capacity estimate cannot be
	// saturated by what it was sent (a wrong prior ten times the capacity still sends it
	// a tenth, and must be corrected).
	tinyFrac = 0.05
	// stalledFrac: writes that stalled for this much of a sample mean a full local
	// queue (see Sample.Stalled).
	stalledFrac = 0.5
	// drainSpan is the queue above the target at which the rate is halved: the rate
	// drops linearly from the capacity at the target to half of it at target+drainSpan.
	drainSpan = 100 * time.Millisecond
	// idleStartupCeiling bounds the doubling of an unmeasured link's assumed rate while
	// it carries nothing and the bond queues elsewhere: enough for the scheduler to try
	// it (it then measures by its traffic), not so much that a link nothing ever uses
	// (a backup) looks like a fast one.
	idleStartupCeiling = 64 * StartRate
	// aloneQueue is how far a link's standing queue must stand above the target and
	// the other links' queues (beyond its jitter and one packet's time) for its delivery
	// to count as its capacity whatever it was given (queuesAlone).
	aloneQueue = 10 * time.Millisecond
	// vanishedBytes: what the peer found missing in a sample counts as drops only
	// beyond two full-size packets (Sample.vanished).
	vanishedBytes = 2 * 1500
)

// FullPacketTime is how long a full-size (1500-byte) packet takes to pass a link at
// rateBps: what a queue measured against the smallest packets' delay can include, and
// what the slowest link makes every packet of the bond wait.
func FullPacketTime(rateBps float64) time.Duration {
	return time.Duration(1500 * 8 / rateBps * float64(time.Second))
}

// MinSamplePackets is the fewest packets a sample must span to measure a capacity
// (fewer make a rate too coarse and a minimum delay a lottery). Callers should extend
// a sample over several feedback periods until it has them (or a time limit passes).
const MinSamplePackets = 4

// Sample is what one feedback period showed about a link.
type Sample struct {
	// Interval is the length of the period, on the peer's clock.
	Interval time.Duration
	// Delivered is how many bytes the peer received on the link in the period, in
	// Packets packets.
	Delivered uint64
	Packets   uint32
	// Sent is how many bytes we sent on the link over the same period (as near as our
	// clock can tell).
	Sent uint64
	// Lost is how many packets the peer found missing from the link's sequence in the
	// period: gaps below the highest link sequence number that arrived. What was sent
	// after that one is in flight, not lost.
	Lost uint32
	// Queue is the link's queueing delay: the period's smallest one-way delay minus
	// the link's floor. Meaningful only if HaveQueue.
	Queue     time.Duration
	HaveQueue bool
	// LeastQueue is the smallest queue among all the session's links that carried
	// traffic in the period (this one included). A queue every link has is the
	// sender's doing (a TCP filling the bond), not a wrong split: moving traffic
	// between links cannot drain it, so only the excess over LeastQueue moves traffic.
	LeastQueue time.Duration
	// MostQueue is the largest queue among them beyond its link's own delay noise
	// (SetBondQueues). Probing a link above its capacity estimate makes sense only
	// when some other link is queueing (the sender wants more than the bond gives):
	// when none is, the sender is the limit, and probing would only skew the split.
	MostQueue time.Duration
	// Stalled is how long our own writes to the link stalled in the period. Most of
	// the period (stalledFrac) means its queue is local (the uplink's qdisc is full and
	// pushes back on the socket): the peer sees no queueing delay, yet the link is
	// saturated all the same. Less is no sign of anything: a sender descheduled inside
	// its writes now and then (a busy router; in the lab's VM a tenth of the period
	// stalled in a third of a 3 Mbit/s link's samples) says nothing about the link.
	Stalled time.Duration
	// Jitter is the link's usual spread of one-way delay within a period (smoothed),
	// which a queue must exceed before it counts against the link.
	Jitter time.Duration
	// Idle is how much of the interval lay in report periods that showed nothing
	// arriving on the link: a sample spans several when the link carries little.
	Idle time.Duration
	// BondLoaded: every link that carried data in the period was given about all its
	// assumed rate (Loaded), so the sender offered the bond all it would take. With
	// a link's rate a configured cap, or the bond's excess waiting at its entry, the
	// links need not queue for the sender to want more.
	BondLoaded bool
}

// SetBondQueues sets on each of one period's samples (one per link of a session)
// LeastQueue, the smallest queue among the links that carried traffic in the period,
// and MostQueue, the most any of them held beyond its own delay noise: its queue less
// half its Jitter, the margin saturated allows a link's own queue. It returns
// LeastQueue. Counted whole, period minima a millisecond or two apart on links with
// 2 ms of jitter (the lab's lossy scenario) let two of three equal links probe to 1.3
// and 1.5 times their capacity, and a lighter load then kept the third at a fifth of
// the traffic. Jitter also takes in a queue that grows within the period, so a link
// filling up counts for less here than its queue; its queue still counts in full once
// it stands (in the lab's SOHO downstream the cable link's 20-45 ms under TCP kept the
// LTE link probing throughout).
func SetBondQueues(smps []Sample) (least time.Duration) {
	least, most := time.Duration(-1), time.Duration(0)
	for _, s := range smps {
		if !s.HaveQueue || s.Delivered == 0 {
			continue
		}
		if least < 0 || s.Queue < least {
			least = s.Queue
		}
		most = max(most, s.Queue-s.Jitter/2)
	}
	least = max(least, 0)
	for i := range smps {
		smps[i].LeastQueue, smps[i].MostQueue = least, most
	}
	return least
}

// mostlyIdle tells whether more than half the sample lay in report periods with
// nothing arriving on the link. A link busy all along delivers something in every
// period (a 0.2 Mbit/s ADSL upstream a full-size packet every 60 ms).
func (s Sample) mostlyIdle() bool {
	return s.Idle > s.Interval/2
}

// Loaded tells whether a link was given about all of rate (bits/s) in the sample.
func (s Sample) Loaded(rate float64) bool {
	return s.Interval > 0 && float64(s.Sent)*8/s.Interval.Seconds() >= loadedFrac*rate
}

// vanished tells whether much of what the link was sent in the sample was lost: the
// peer found more than 1-policedFrac of the packets missing from the link's sequence,
// and more than vanishedBytes of them (at the sample's mean packet size).
//
// It counts the peer's gaps, not what we sent less what arrived: our count of what we
// sent runs up to the report's arrival, the peer's count of what arrived only up to its
// cut, an RTT before, so a flow that is speeding up has much in flight that looks
// missing: a quarter of an ACK trickle in flight, behind a 6-ms "queue", once read as
// saturated and not app-limited and replaced a cable link's 2.99 Mbit/s with 0.12, and
// a downstream transfer's first window in flight can do the same (probably what took a
// lossy link from 1.48 Mbit/s to 0.08 in the lab; BENCHMARKS.md, "A collapsed
// estimate"). The byte floor is for a trickle's real losses: one burst of the lossy
// link (four packets on average) is more than a quarter of the 14 ACKs a period
// carries behind an upload, yet says nothing of the link's capacity.
func (s Sample) vanished() bool {
	if s.Lost == 0 {
		return false
	}
	size := 1500.0
	if s.Packets > 0 {
		size = float64(s.Delivered) / float64(s.Packets)
	}
	return float64(s.Lost) > (1-policedFrac)*float64(s.Packets+s.Lost) && float64(s.Lost)*size > vanishedBytes
}

// Phase names what the controller did with the last sample (for metrics and logs).
type Phase uint8

const (
	PhaseStart   Phase = iota // startup: no limit seen yet, the rate doubles while loaded
	PhaseIdle                 // the link carried less than it could: nothing learned about its limit
	PhaseProbing              // loaded and no queue: the rate creeps up
	PhaseDrain                // a standing queue: capacity measured, rate below it
)

func (p Phase) String() string {
	return [...]string{"start", "idle", "probing", "drain"}[p]
}

// Estimator is one link's capacity estimate and scheduler rate.
type Estimator struct {
	cfg     Config
	startup bool // no prior, no queue seen yet: double while loaded
	// trained: the starting point came from a probe train, and no saturated sample has
	// measured the capacity since; a configured prior that arrives now (the headend
	// learns the CPE's) wins, and a trickle's sample cannot replace it.
	trained bool
	// streak counts the periods spent probing since the link last saturated: the
	// probing gain grows with it.
	streak int
	// aboveBits: bit i set = the queue of the sample i samples ago was clearly above
	// the least-queued link's (the last three samples).
	aboveBits uint8
	// satBits: bit i set = the sample i samples ago was saturated (the last three).
	satBits uint8
	// policedLast: the previous period lost much of what it was sent, without a queue.
	policedLast bool
	// busyLast: the previous sample kept the link busy (busy), so this one's delivery
	// ran from its start.
	busyLast bool
	kf       kalman
	rate     float64
	phase    Phase
	queue    time.Duration
}

// New returns an estimator at the configured prior (or DefaultRate).
func New(cfg Config) *Estimator {
	if cfg.QueueTarget <= 0 {
		cfg.QueueTarget = DefaultQueueTarget
	}
	e := &Estimator{cfg: cfg, rate: StartRate, startup: true}
	if cfg.Prior > 0 {
		e.kf.prior(cfg.Prior)
		e.rate, e.startup = cfg.Prior, false
	}
	e.rate = e.clamp(e.rate)
	return e
}

// SetPrior changes the prior and the cap (the headend learns the CPE's downstream
// rates after its links exist). A prior replaces what startup has found so far, but not
// a capacity measured at saturation; the cap applies at once.
func (e *Estimator) SetPrior(prior, limit float64) {
	e.cfg.Prior, e.cfg.Cap = prior, limit
	if (e.startup || e.trained) && prior > 0 {
		if e.trained {
			e.kf.prior(prior)
		} else {
			e.kf.prior(math.Max(prior, e.kf.x))
		}
		e.rate, e.startup, e.trained = prior, false, false
	}
	e.rate = e.clamp(e.rate)
	if e.kf.valid() && limit > 0 {
		e.kf.x = math.Min(e.kf.x, limit)
	}
}

// Restart starts the estimate again from a new configured prior, as New does: the
// user said the link's rate is different now (a config reload), so what was measured
// under the old one no longer counts. A prior of 0 only removes the cap: the estimate
// carries on from where it is.
func (e *Estimator) Restart(prior, limit float64) {
	if prior <= 0 {
		e.SetPrior(prior, limit)
		return
	}
	e.cfg.Prior, e.cfg.Cap = prior, limit
	e.kf.prior(prior)
	e.rate, e.startup, e.trained, e.streak = e.clamp(prior), false, false, 0
}

// InStartup reports whether nothing is known of the link's capacity yet: no prior,
// no probe train, no queue seen.
func (e *Estimator) InStartup() bool { return e.startup }

// Train takes a capacity measured with a probe train (the spread of a few padded probes
// sent back to back, at the peer) as the starting point, if nothing better is known
// yet: like a configured prior, it ends startup, so that the first traffic is split by
// measured capacities instead of equally (an equal first split buried a scaled ADSL
// upstream under a third of a TCP flow's first burst: 345 ms of queue in the lab,
// which stalled the whole bond's ordering). Unlike a prior, it is trusted as a
// measurement (kalman.measured).
func (e *Estimator) Train(capacity float64) {
	if !e.startup || capacity <= 0 {
		return
	}
	e.kf.measured(capacity)
	e.rate, e.startup, e.trained = e.clamp(capacity), false, true
}

// RetrainGain is how much more than the capacity estimate a probe train sent to
// re-measure a link must find for Retrain to take it.
const RetrainGain = 2.0

// Retrain takes the measure of a probe train sent to a link whose estimate fell far
// below an earlier measure, and tells whether it did: only if it found RetrainGain
// times the estimate or more (less, and the estimate may well be right). The filter
// starts again at the train's measure, trusted like a prior, and the rate at half of it,
// from where the rate climbs back to the capacity as a drained rate does, a quarter
// per period the link takes what it is given: the train measures the bottleneck, not
// what cross traffic leaves of it. Why it is needed: a link's rate rises above what it
// is given only while some link of the bond queues (probing), and a sender held back by
// losses or its own CPU never makes one queue, so an estimate that went wrong kept the
// link unused for the rest of a transfer (BENCHMARKS.md, "A collapsed estimate").
func (e *Estimator) Retrain(capacity float64) bool {
	if e.startup || capacity < RetrainGain*e.kf.x {
		return false
	}
	e.kf.prior(capacity)
	e.rate, e.streak = e.clamp(capacity/2), 0
	return true
}

// Rate is the rate the scheduler should assume for the link, bits/s.
func (e *Estimator) Rate() float64 { return e.rate }

// Capacity is the filtered capacity estimate, bits/s (0 until measured or given).
func (e *Estimator) Capacity() float64 { return e.clamp0(e.kf.x) }

// Queue is the last queueing delay seen.
func (e *Estimator) Queue() time.Duration { return e.queue }

// Phase is what the controller did last.
func (e *Estimator) Phase() Phase { return e.phase }

// Update folds in one period's sample and adjusts the rate.
func (e *Estimator) Update(s Sample) {
	if s.Interval <= 0 {
		return
	}
	e.kf.next()
	secs := s.Interval.Seconds()
	delivered := float64(s.Delivered) * 8 / secs
	sent := float64(s.Sent) * 8 / secs
	switch {
	case s.HaveQueue:
		e.queue = max(0, s.Queue)
	case s.Delivered == 0:
		e.queue = 0 // nothing arrived, so nothing waited
	}
	policed := false
	defer func() { e.policedLast = policed }()
	saturated, sure := e.saturated(s) // once per sample: it keeps state across samples
	// fromIdle: the link was not kept busy in the sample before, so it may have idled
	// through the first part of this one, the traffic only starting within it: what it
	// delivered over the whole interval then understates what it can carry, however
	// long the queue at the end. (A transfer's first sample on a lossy 1.5-Mbit/s link
	// in the lab delivered 0.84 Mbit/s over 114 ms with an 8-ms queue, after 400 ms of
	// probes only, and took the trained 1.42 down to 0.84; the loss-limited flow never
	// queued a link again, so nothing probed it back up and the link carried 18 % of
	// the downstream for the rest of the transfer. In CI the same took a link to 0.08,
	// and left it unused.) Such a sample may raise the capacity, and its queue drains
	// the rate; the next one, busy from its start, measures.
	fromIdle := !e.busyLast
	e.busyLast = e.busy(s, saturated)
	if saturated {
		// Probing starts small again after a queue. Only a queue resets it: samples in
		// which the link merely was not probed (no other link queued, or the sender
		// had little for it) keep the gain, or a link whose estimate started low climbs
		// a percent at a time in every short episode of the others queueing (5 s from
		// a fifth of its rate in the simulation of the lab's SOHO downstream).
		e.streak = 0
	}
	// appLimited: the link was given less than its rate and delivered about all of
	// it, so its delivery says how much the sender had for it, not what it can carry.
	// Like BBR's app-limited delivery-rate samples, such a sample may raise the
	// capacity estimate but never lower it, and a queue seen in it ends no startup:
	// it drains the rate, nothing more. (In the lab, LTE's jitter alone showed 6 ms
	// of "queue" on a link carrying 0.1 Mbit/s in startup; taking that for its
	// capacity left the link nearly unused for 14 s.)
	//
	// A capacity a probe train measured is not replaced by a sample of a trickle (below
	// tinyFrac of it), whatever that delivered: a queue on such a link is not of our
	// making (the ACK trickle of a transfer the other way, 0.06 Mbit/s on a 3 Mbit/s link
	// with a 15 ms "queue" that the busy receiving daemon's own lag made, was once taken
	// for the link's capacity right after its train; the downstream transfer that
	// followed got 0.43 of the links' sum). Only the train's measure is guarded so: the
	// same rule for every estimate made a single-flow e2e test fail about one run in
	// twenty, not understood.
	//
	// Unless the link queues alone (queuesAlone): then what it delivered is all it has
	// now, however little we gave it.
	appLimited := !s.Loaded(e.given()) && !s.vanished() && !e.queuesAlone(s) ||
		e.trained && sent < tinyFrac*e.kf.x || fromIdle
	// A startup ends on a queue seen in two samples of the last three, not one: the
	// queue of a single period can be the receiving host's lag. In an e2e run a 60
	// Mbit/s link carrying the other direction's ACKs (0.8 Mbit/s, "loaded" against
	// half its doubled startup rate) showed 6.5 ms for one period, left startup
	// measured at 1.2 Mbit/s, and then probed up a few percent a period while the
	// bond fell below its best link. A real overshoot still queues at the next sample,
	// at the rate brought back to what the link delivered (below).
	unsure := e.startup && !sure
	switch {
	case saturated && s.mostlyIdle():
		// A queue at the end of a sample the link idled through: a burst, such as a
		// suspect link's packets in flight copied to it at once. What it delivered,
		// spread over the idle time, is no capacity: taken for one, it measured an
		// unused 60 Mbit/s link at 0.17 and ended its startup there, where nothing ever
		// sent it enough to measure it again (BENCHMARKS.md, "Three false
		// measures"). The queue drains the rate of a measured link; startup goes on.
		e.phase = PhaseDrain
		e.liftCapacity(delivered, s.Packets)
		if !e.startup && e.kf.valid() {
			e.rate = math.Min(e.rate, e.drainedRate(s))
		}
	case saturated && (appLimited || unsure):
		e.phase = PhaseDrain
		e.liftCapacity(delivered, s.Packets)
		switch {
		case e.startup:
			// Startup goes on, but its rate comes back to the most the link has been
			// seen to deliver: a doubling can overshoot to startupCeiling times that,
			// and a sender that then gives the link a little less than loadedFrac of
			// half the overshot rate makes every sample look app-limited, however much
			// the link queues. (In CI's e2e test a 30 Mbit/s link stayed assumed at 77
			// for a whole transfer, and the bond fell below its best link.) If the
			// queue was real, the next sample is loaded at this rate and ends startup;
			// if it was jitter, the next loaded one without a queue doubles again.
			e.rate = math.Min(e.rate, e.kf.x)
		case e.kf.valid():
			e.rate = math.Min(e.rate, e.drainedRate(s))
		}
	case saturated && s.Packets >= MinSamplePackets:
		// Standing queue: the bottleneck never idled, so it delivered its capacity.
		e.phase, e.startup, e.trained = PhaseDrain, false, false
		e.kf.update(delivered, s.Packets)
		e.rate = e.drainedRate(s)
	case saturated:
		// A queue, but on too few packets to measure a rate by (a slow link in a short
		// period, or a lone probe that waited for a busy host): the capacity estimate
		// stays; the rate drains all the same.
		e.phase = PhaseDrain
		if e.kf.valid() {
			e.rate = math.Min(e.rate, e.drainedRate(s))
		}
	case s.Loaded(e.rate) && s.vanished():
		// Loaded, no queue, yet much of it vanished, two periods running: a policer (or
		// a shallow buffer) that drops instead of queueing. What got through is the
		// capacity. (One such period can be a burst of random loss.)
		if e.policedLast {
			e.phase, e.startup, e.streak, e.trained = PhaseDrain, false, 0, false
			e.kf.update(delivered, s.Packets)
			e.rate = e.kf.x
		}
		policed = true
	case s.Loaded(e.rate) || !e.startup && e.hasRoom(s) && sent >= busyFrac*e.rate:
		// It took what it was given without queueing: it has room, or at least this.
		// (While another link queues, the sender is held back by that link, so this one
		// is given less than its rate; it still has room, and must grow to take over.)
		e.phase = PhaseProbing
		e.liftCapacity(delivered, s.Packets)
		if e.startup {
			e.phase = PhaseStart
			e.rate = math.Min(2*e.rate, startupCeiling*delivered)
		} else if e.rate < e.kf.x {
			e.rate = math.Min(e.kf.x, math.Max(e.rate*(1+recoverGain), e.kf.x/2))
		} else if e.bondQueueing(s) {
			// Probe, but never far beyond what the link was actually given this
			// period: a link given half its rate (the sender held back by another
			// link) has not shown it can take more, and a rate that compounds
			// untested skews the split the moment the sender speeds up.
			gain := math.Min(probeGain*math.Pow(probeGrowth, float64(e.streak)), maxProbeGain)
			tested := math.Max(e.kf.x, (1+maxProbeGain)*sent)
			e.rate = math.Max(e.rate, min(e.rate*(1+gain), probeCeiling*math.Max(e.kf.x, delivered), tested))
			e.streak++
		}
	default:
		// Application-limited: the link's limit was not reached, so keep what we know.
		e.phase = PhaseIdle
		e.liftCapacity(delivered, s.Packets)
		if !e.growBlind(s, e.queue) && e.kf.valid() {
			e.rate = math.Max(e.rate, math.Min(e.kf.x, e.rate*(1+recoverGain)))
		}
	}
	e.rate = e.clamp(e.rate)
}

// busy tells whether the sample kept the link busy to its end, so that the next one's
// delivery runs from its start: the link queued, or was given about all of its rate,
// and the sample did not lie mostly in report periods with nothing arriving. Call it
// before the sample changes the rate (given).
func (e *Estimator) busy(s Sample, saturated bool) bool {
	return (saturated || s.Loaded(e.given())) && !s.mostlyIdle()
}

// growBlind doubles the assumed rate of a link that is unmeasured and unused while the
// sender wants more than the links it uses carry (queue is the link's own queue in the
// period), and tells whether it did. Without it the link never gets the traffic its
// startup needs: a link starts at StartRate, and the earliest-arrival scheduler gives a
// 0.25 Mbit/s link a packet only when the others' queues are 48 ms long. A link too fast
// for its probe train (the daemon cannot send the probes faster than it passes them)
// next to one with a configured 30 Mbit/s carried nothing while the TCP flow ran on the
// 30 Mbit/s link alone (TestUnmeasurableFastLinkIsUsed); in CI a 60 Mbit/s link whose
// train failed carried 1 % of a flow for a whole test. idleStartupCeiling bounds this
// blind growth (a backup link stays unused for good); traffic takes over from there.
func (e *Estimator) growBlind(s Sample, queue time.Duration) bool {
	if !e.startup || !(e.bondQueueing(s) || s.BondLoaded) || queue > relativeQueue {
		return false
	}
	e.rate = e.clamp(math.Max(e.rate, math.Min(2*e.rate, idleStartupCeiling)))
	return true
}

// Unsampled takes a feedback period that completed no sample of the link: it carried
// fewer than MinSamplePackets packets since its last sample, which therefore goes on
// (up to a second). s is that period: the bond's state in it (LeastQueue, MostQueue and
// BondLoaded, from the samples it completed on the other links) and the link's queue
// so far in the sample, if any of its packets arrived (HaveQueue).
//
// An unmeasured link grows blindly here as on a sample (growBlind): its samples are
// exactly the long ones while it carries nothing, and growing once per sample grew it
// once a second. In CI a 60 Mbit/s link whose probe trains failed, next to a 30 Mbit/s
// link a train had measured, carried almost nothing for the first 3.5 s of an 8-s
// downstream flow (0.25 to 2 Mbit/s, a second per doubling, while the 30 Mbit/s link
// held a 3-4 ms queue that was never long enough for the scheduler to try the slower
// one), and the bond fell below its best link.
func (e *Estimator) Unsampled(s Sample) {
	queue := e.queue
	if s.HaveQueue {
		queue = max(0, s.Queue)
	}
	if e.growBlind(s, queue) {
		e.phase = PhaseIdle
	}
}

// saturated tells whether the link's bottleneck was busy all period (call it once per
// sample: it remembers whether the last one was above the others): its own writes
// stalled on a full local queue, or the peer saw a standing queue, either above the
// target or clearly above the least-queued link's (a link with a millisecond or two of
// standing queue, where the others have none, is the one the sender is waiting for,
// even if its buffer is too shallow ever to reach the target).
//
// sure says whether the sign held in two of the last three samples, this one included
// (the relative sign must, to count at all).
func (e *Estimator) saturated(s Sample) (sat, sure bool) {
	sat, sure = e.saturatedNow(s)
	e.satBits = (e.satBits << 1) & 0b111
	if sat {
		e.satBits |= 1
	}
	return sat, sure || bits.OnesCount8(e.satBits) >= 2
}

// saturatedNow is saturated's verdict on one sample, and whether the relative sign
// made it (which is sure already).
func (e *Estimator) saturatedNow(s Sample) (sat, sure bool) {
	if s.Stalled > time.Duration(stalledFrac*float64(s.Interval)) {
		return true, false
	}
	if !s.HaveQueue {
		return false, false
	}
	if e.queue > e.cfg.QueueTarget+s.Jitter/2 {
		return true, false // above the target by more than the link's own delay noise
	}
	// The relative sign must hold in two of the last three samples, this one included:
	// one sample's minimum on a jittery link can sit a millisecond above its floor by
	// chance, and a saturated link behind a token bucket alternates between a standing
	// queue and an emptied one.
	above := e.queue > s.LeastQueue+relativeQueue+s.Jitter/2 &&
		float64(s.Sent)*8/s.Interval.Seconds() >= busyFrac*e.given()
	e.aboveBits = (e.aboveBits << 1) & 0b111
	if above {
		e.aboveBits |= 1
	}
	sat = above && bits.OnesCount8(e.aboveBits) >= 2
	return sat, sat
}

// queuesAlone tells whether the link holds a standing queue of its own, far beyond
// anything noise could make: above the target and the least-queued link's by aloneQueue,
// its jitter and a full-size packet's time at its estimated capacity, over enough
// packets to measure by. Its bottleneck was then busy all period, so its delivery is
// what it can carry now, even if we gave it less than the rate we assume for it. That
// is what a link whose capacity fell looks like: the assumed rate, still the old one,
// gets it a little less than the scheduler believes it gives (the sender is held back
// by the very queue it builds there), so every sample looked app-limited and the
// capacity estimate never came down. In the lab's rate-step scenario a link halved to
// 0.75 Mbit/s kept an estimate of 1.54 and an assumed rate of 1.07-1.19 for five
// seconds, its queue at 40-60 ms while the others had none, and every packet of the
// bond waited for it in the peer's resequencer.
func (e *Estimator) queuesAlone(s Sample) bool {
	if !s.HaveQueue || s.Packets < MinSamplePackets {
		return false
	}
	margin := aloneQueue + s.Jitter
	if e.kf.valid() {
		margin += FullPacketTime(e.kf.x)
	}
	return e.queue > max(e.cfg.QueueTarget, s.LeastQueue)+margin
}

// bondQueueing tells whether some link of the bond has a standing queue: above the
// target, or clearly above the least-queued link's.
func (e *Estimator) bondQueueing(s Sample) bool {
	return s.MostQueue > e.cfg.QueueTarget || s.MostQueue > s.LeastQueue+relativeQueue
}

// hasRoom tells whether another link of the bond queues while this one has no queue
// at all: the sender is held back by that link.
func (e *Estimator) hasRoom(s Sample) bool {
	return s.HaveQueue && e.queue <= relativeQueue && e.bondQueueing(s)
}

// liftCapacity takes a delivery rate seen without a queue as a lower bound of the
// capacity: believed outright in startup (where it is the only measure there is),
// filtered afterwards (one period can deliver more than the link's rate: a burst that
// waited upstream; the lab's VM showed 3.5 Mbit/s from a 3 Mbit/s link).
func (e *Estimator) liftCapacity(delivered float64, packets uint32) {
	if e.startup {
		e.kf.raise(delivered)
		return
	}
	e.kf.lowerBound(delivered, packets)
}

// given is the rate the link can be expected to have been given when it is busy: its
// assumed rate, or half of it in startup (which may have just doubled past anything
// the link was ever given).
func (e *Estimator) given() float64 {
	if e.startup {
		return e.rate / 2
	}
	return e.rate
}

// drainedRate is the rate for a link whose standing queue (e.queue) the sample showed
// above the target, or above the bond's least queue if that is higher: the capacity
// estimate, less the drain (drainFactor).
func (e *Estimator) drainedRate(s Sample) float64 {
	return e.kf.x * drainFactor(e.queue-max(e.cfg.QueueTarget, s.LeastQueue))
}

// drainFactor is the fraction of capacity to assume for a link whose queue is excess
// above the target (or above the least queue of the bond's links, if that is higher).
func drainFactor(excess time.Duration) float64 {
	return math.Min(1, math.Max(0.5, 1-0.5*float64(excess)/float64(drainSpan)))
}

func (e *Estimator) clamp(r float64) float64 {
	if e.cfg.Cap > 0 {
		r = math.Min(r, e.cfg.Cap)
	}
	return math.Max(r, MinRate)
}

func (e *Estimator) clamp0(r float64) float64 {
	if r <= 0 {
		return 0
	}
	return e.clamp(r)
}
