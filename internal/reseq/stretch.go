package reseq

// The hold timer's own correction. The caller sets the hold from what the links show:
// their delay spread and jitter, plus a margin. What the links cannot show is how long
// a packet may wait inside the receiving host before it reaches the resequencer. On a
// busy machine the kernel puts its receive processing off now and then. On this
// project's 2-CPU test machine, in the e2e fast-path test, the 10-ms timer gave up
// as many as 155 sequence numbers per run on lossless links; every one of them arrived
// 0.02–0.4 ms after the timer fired. With a 30-ms hold, none was given up.
//
// A packet that arrives after the timer gave its number up proves the hold too short.
// The first such packet after a timeout lengthens the hold by stretchStep. The extra is
// at most maxStretchSteps steps, and the hold with it at most Config.MaxHold. Every
// stretchFade in which no late packet lengthens it, the extra halves, so the hold comes
// back once the host has calmed down. Only a timeout counts: a number skipped by FIFO
// evidence, a loss notice or the memory cap would not have been saved by a longer hold.
//
// The step is fixed, not a share of the hold: a host's stalls do not grow with the
// links' delay spread. A first version stepped by the whole hold. In the lab's SOHO
// downstream, 4 late packets at the start of a transfer doubled the CPE's hold from 79
// to 158 ms, and that transfer reached 0.869 of the links' sum (one run).

const (
	// stretchStep is what one late packet adds to the hold: the size of the stalls
	// seen (10-30 ms on the test machine).
	stretchStep = int64(10e6)
	// maxStretchSteps bounds the extra: a host slow enough to need more than that
	// loses packets rather than hold every gap longer.
	maxStretchSteps = 3
	// stretchFade is how long the extra lasts at full size without a late packet;
	// it then halves, again and again.
	stretchFade = int64(10e9)
)

// stretch is what late packets added to the hold time.
type stretch struct {
	extra     int64 // ns added to the hold, as of changedAt
	changedAt int64 // when extra was last set (its fading starts there)
	timeoutAt int64 // when the timer last gave a number up
	armed     bool  // a timeout that no late packet has answered yet
}

// timedOut records that the hold timer gave numbers up at now.
func (s *stretch) timedOut(now int64) { s.timeoutAt, s.armed = now, true }

// late is called for a packet that arrived at now after its number had been given up.
// If it is the first since a timeout, and within the longest hold of it, it lengthens
// the hold by a step and returns true.
func (s *stretch) late(now, maxHold int64) bool {
	if !s.armed || now-s.timeoutAt > maxHold {
		return false
	}
	s.armed = false
	s.extra = min(s.current(now)+stretchStep, maxStretchSteps*stretchStep)
	s.changedAt = now
	return true
}

// current returns the extra in force at now: halved for every whole stretchFade since
// it was set.
func (s *stretch) current(now int64) int64 {
	if s.extra == 0 {
		return 0
	}
	halvings := max(now-s.changedAt, 0) / stretchFade
	if halvings >= 63 {
		return 0
	}
	return s.extra >> halvings
}

// apply returns hold lengthened by the extra in force at now, at most maxHold.
func (s *stretch) apply(hold, maxHold, now int64) int64 {
	return min(hold+s.current(now), maxHold)
}
