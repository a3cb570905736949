package estimate

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/aggd/aggd/internal/sched"
)

// The simulation below is a bond in miniature, in simulated time: a sender whose
// rate adapts like a loss-based TCP, the real scheduler (internal/sched) splitting its
// packets, FIFO links with a rate, a base delay and a tail-drop buffer, and a receiver
// that reports each period what arrived per link and the smallest one-way delay. The
// reports reach the sender's estimators a reverse delay later, as feedback does. It
// lets the tests ask the questions the lab asks (does the split follow the links'
// capacities, how fast, what happens at a rate step) deterministically, with no clock.

const (
	simTick    = time.Millisecond
	simPeriod  = 100 * time.Millisecond // feedback period (the default probe interval)
	simReverse = 15 * time.Millisecond  // feedback's way back
	simPacket  = 1500                   // bytes, outer headers included
)

type simLink struct {
	rate   float64       // bits/s now
	delay  time.Duration // base one-way delay
	buffer time.Duration // tail-drop limit, in time at rate

	queue  []simPkt
	credit float64 // bits the link may still send this tick
	// The receiver's view this period, and the sender's.
	delivered, sent uint64
	owdMin          time.Duration
	floor           time.Duration
	haveFloor       bool
	total           uint64 // delivered over the whole run, for shares
	// lost is what the receiver found missing this period; gap is how many packets the
	// link dropped since the last one it queued (the receiver sees them missing when
	// the next one arrives).
	lost, gap uint32
	inFlight  []simPkt
	// unread holds packets that arrived while the receiver was stalled: it counts
	// them (and measures their delay) only when it runs again.
	unread []simPkt
}

type simPkt struct {
	sentAt, arriveAt time.Duration
	lostBefore       uint32 // the link dropped this many just before it
}

type simReport struct {
	at      time.Duration
	samples []Sample
}

type sim struct {
	now     time.Duration
	links   []*simLink
	est     []*Estimator
	sch     *sched.Scheduler
	reports []simReport

	// Sender: slow start (doubling per period) until the first loss, then AIMD, one
	// decrease per period at most.
	slowStartDone bool
	offered       float64
	credit        float64
	dropped       bool
	lastCut       time.Duration
	lastGrow      time.Duration
	growPerRTT    float64
	appLimit      float64 // 0: the sender is greedy

	// history of per-link delivered bytes per period, for share questions.
	history     [][]uint64
	sentHistory [][]uint64
	// rateHistory holds the rates the scheduler assumed at the end of each period.
	rateHistory [][]float64
	// capHistory holds the estimators' capacities at the end of each period.
	capHistory [][]float64

	// A stalling receiver (stalls != nil): a daemon that is not always on a CPU. Each
	// tick it is running, it stalls with probability stallProb for a uniform
	// 10..stallMax; packets that arrive meanwhile are counted (and their delay
	// measured) when it runs again, and a report due meanwhile is made then, over the
	// longer interval. This is the noise a short feedback period sees on a busy
	// machine (the lab's VM) or behind a bursty link (Wi-Fi, LTE aggregation).
	stalls     *rand.Rand
	stallProb  float64
	stallMax   time.Duration
	stallUntil time.Duration
	reportDue  bool
	lastReport time.Duration
	// A stalling sender (senderStalls != nil): the same for the sending daemon. While
	// it is stalled nothing is sent (what the sender offers piles up and leaves in a
	// burst afterwards), and the period's samples report the stall as Stalled, as a
	// daemon descheduled inside its socket writes does.
	senderStalls     *rand.Rand
	senderStallProb  float64
	senderStallUntil time.Duration
	senderStalled    time.Duration // in this period
}

// stallSender makes the simulated sender stall (see sim.senderStalls): each tick it
// runs, with probability prob, for a uniform 10..30 ms.
func (s *sim) stallSender(seed uint64, prob float64) {
	s.senderStalls, s.senderStallProb = rand.New(rand.NewPCG(seed, 11)), prob
}

// senderRuns tells whether the sender is on a CPU this tick (and may start a stall).
func (s *sim) senderRuns() bool {
	if s.senderStalls == nil {
		return true
	}
	if s.now >= s.senderStallUntil && s.senderStalls.Float64() < s.senderStallProb {
		s.senderStallUntil = s.now + 10*time.Millisecond + time.Duration(s.senderStalls.IntN(21))*time.Millisecond
	}
	if s.now < s.senderStallUntil {
		s.senderStalled += simTick
		return false
	}
	return true
}

// stallReceiver makes the simulated receiver stall (see sim.stalls), deterministically.
func (s *sim) stallReceiver(seed uint64, prob float64, longest time.Duration) {
	s.stalls, s.stallProb, s.stallMax = rand.New(rand.NewPCG(seed, 7)), prob, longest
}

// receiverRuns tells whether the receiver is on a CPU this tick (and may start a stall).
func (s *sim) receiverRuns() bool {
	if s.stalls == nil {
		return true
	}
	if s.now < s.stallUntil {
		return false
	}
	if s.stalls.Float64() < s.stallProb {
		d := 10*time.Millisecond + time.Duration(s.stalls.Int64N(int64(s.stallMax-10*time.Millisecond)+1))
		s.stallUntil = s.now + d.Truncate(simTick)
		return false
	}
	return true
}

func newSim(links []*simLink, cfg []Config) *sim {
	s := &sim{links: links, sch: sched.New(sched.Config{}), offered: 1e6}
	var total float64
	for i, l := range links {
		c := Config{}
		if cfg != nil {
			c = cfg[i]
		}
		s.est = append(s.est, New(c))
		total += l.rate
	}
	s.growPerRTT = total / 50
	s.program()
	return s
}

// program hands the estimators' rates and the measured base delays to the scheduler.
func (s *sim) program() {
	var minFloor time.Duration = math.MaxInt64
	for _, l := range s.links {
		if l.haveFloor && l.floor < minFloor {
			minFloor = l.floor
		}
	}
	params := make([]sched.LinkParams, len(s.links))
	for i, l := range s.links {
		p := sched.LinkParams{ID: uint8(i), Usable: true, RateBps: s.est[i].Rate()}
		if l.haveFloor {
			p.BaseOWD = int64(l.floor - minFloor)
		}
		params[i] = p
	}
	s.sch.SetLinks(params)
}

// run advances the simulation by d.
func (s *sim) run(d time.Duration) {
	for end := s.now + d; s.now < end; s.now += simTick {
		s.send()
		runs := s.receiverRuns()
		for _, l := range s.links {
			s.serve(l, runs)
		}
		if s.now%simPeriod == 0 && s.now > 0 {
			s.reportDue = true
		}
		if s.reportDue && runs {
			s.endPeriod()
		}
		s.deliverReports()
	}
}

func (s *sim) send() {
	rate := s.offered
	if s.appLimit > 0 {
		rate = math.Min(rate, s.appLimit)
	}
	s.credit += rate * simTick.Seconds()
	if !s.senderRuns() {
		return
	}
	for s.credit >= simPacket*8 {
		s.credit -= simPacket * 8
		id, _, _, ok := s.sch.Pick(int64(s.now), simPacket)
		if !ok {
			return
		}
		l := s.links[id]
		l.sent += simPacket
		if time.Duration(float64(len(l.queue)*simPacket*8)/l.rate*1e9) > l.buffer {
			s.dropped = true
			l.gap++
			continue
		}
		l.queue = append(l.queue, simPkt{sentAt: s.now, lostBefore: l.gap})
		l.gap = 0
	}
	// AIMD once per period: halve-ish on a drop, else grow.
	if s.now-s.lastGrow >= simPeriod {
		s.lastGrow = s.now
		switch {
		case s.dropped && s.now-s.lastCut >= simPeriod:
			s.offered *= 0.7
			s.lastCut, s.slowStartDone = s.now, true
		case !s.dropped && !s.slowStartDone:
			s.offered *= 2
		case !s.dropped:
			s.offered += s.growPerRTT
		}
		s.dropped = false
	}
}

// serve sends what the link's rate allows this tick and lands what has arrived; the
// receiver counts it if it runs, else later.
func (s *sim) serve(l *simLink, receiverRuns bool) {
	l.credit += l.rate * simTick.Seconds()
	for len(l.queue) > 0 && l.credit >= simPacket*8 {
		l.credit -= simPacket * 8
		p := l.queue[0]
		l.queue = l.queue[1:]
		p.arriveAt = s.now + l.delay
		l.inFlight = append(l.inFlight, p)
	}
	if len(l.queue) == 0 {
		l.credit = math.Min(l.credit, simPacket*8) // an idle link saves no credit
	}
	for len(l.inFlight) > 0 && l.inFlight[0].arriveAt <= s.now {
		l.unread = append(l.unread, l.inFlight[0])
		l.inFlight = l.inFlight[1:]
	}
	if !receiverRuns {
		return
	}
	for _, p := range l.unread {
		owd := s.now - p.sentAt
		if l.delivered == 0 || owd < l.owdMin {
			l.owdMin = owd
		}
		l.delivered += simPacket
		l.lost += p.lostBefore
		l.total += simPacket
	}
	l.unread = l.unread[:0]
}

// endPeriod makes the receiver's report and queues it for the reverse trip.
func (s *sim) endPeriod() {
	rep := simReport{at: s.now + simReverse}
	interval := s.now - s.lastReport
	s.lastReport, s.reportDue = s.now, false
	row := make([]uint64, len(s.links))
	sentRow := make([]uint64, len(s.links))
	for i, l := range s.links {
		smp := Sample{Interval: interval, Delivered: l.delivered, Packets: uint32(l.delivered / simPacket), Sent: l.sent,
			Lost: l.lost, Stalled: s.senderStalled}
		if l.delivered > 0 {
			if !l.haveFloor || l.owdMin < l.floor {
				l.floor, l.haveFloor = l.owdMin, true
			}
			smp.Queue, smp.HaveQueue = l.owdMin-l.floor, true
		}
		rep.samples = append(rep.samples, smp)
		row[i], sentRow[i] = l.delivered, l.sent
		l.delivered, l.sent, l.lost = 0, 0, 0
	}
	SetBondQueues(rep.samples) // the simulated links have no jitter: MostQueue is the largest queue
	s.senderStalled = 0
	s.history = append(s.history, row)
	s.sentHistory = append(s.sentHistory, sentRow)
	rates, caps := make([]float64, len(s.est)), make([]float64, len(s.est))
	for i, e := range s.est {
		rates[i], caps[i] = e.Rate(), e.Capacity()
	}
	s.rateHistory = append(s.rateHistory, rates)
	s.capHistory = append(s.capHistory, caps)
	s.reports = append(s.reports, rep)
}

func (s *sim) deliverReports() {
	for len(s.reports) > 0 && s.reports[0].at <= s.now {
		for i, smp := range s.reports[0].samples {
			s.est[i].Update(smp)
		}
		s.reports = s.reports[1:]
		s.program()
	}
}

// delivered and split return, for periods [from, to), each link's share of the bytes
// delivered (what the links carried) or sent (the scheduler's split), and the
// aggregate rate.
func (s *sim) delivered(from, to time.Duration) ([]float64, float64) {
	return sharesOf(s.history, from, to)
}

func (s *sim) split(from, to time.Duration) ([]float64, float64) {
	return sharesOf(s.sentHistory, from, to)
}

func sharesOf(h [][]uint64, from, to time.Duration) (share []float64, rate float64) {
	a, b := int(from/simPeriod), min(int(to/simPeriod), len(h))
	share = make([]float64, len(h[0]))
	var total float64
	for _, row := range h[a:b] {
		for i, v := range row {
			share[i] += float64(v)
			total += float64(v)
		}
	}
	for i := range share {
		share[i] /= total
	}
	return share, total * 8 / (to - from).Seconds()
}

// splitSettledAt returns the first time from which, at every later period's end, the
// scheduler's split under load (each link's share of the sum of the assumed rates) is
// within tol of want, or -1 if it never settles. (The split of the packets actually
// sent also moves whenever the sender backs off: light traffic rides the
// lowest-delay link, by design.)
func (s *sim) splitSettledAt(from time.Duration, want []float64, tol float64) time.Duration {
	settled := time.Duration(-1)
	for i := int(from / simPeriod); i < len(s.rateHistory); i++ {
		var sum float64
		for _, r := range s.rateHistory[i] {
			sum += r
		}
		ok := true
		for j := range want {
			ok = ok && math.Abs(s.rateHistory[i][j]/sum-want[j]) <= tol
		}
		switch {
		case ok && settled < 0:
			settled = time.Duration(i+1) * simPeriod
		case !ok:
			settled = -1
		}
	}
	return settled
}

// baseline is what the same sender gets over link l alone, measured like the lab's
// single-flow baselines: the delivered rate over [warm, warm+d).
func baseline(l simLink, warm, d time.Duration) float64 {
	alone := l
	s := newSim([]*simLink{&alone}, nil)
	s.run(warm + d)
	_, rate := s.delivered(warm, warm+d)
	return rate
}
