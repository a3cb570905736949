// Package aqm keeps the bond's standing queue short by dropping at its entry: CoDel's
// control law (Nichols and Jacobson, RFC 8289) applied to the queueing delay the peer
// measures on the links, instead of to a local queue's sojourn time.
//
// Why the bond needs it: the queues that matter are not on this machine but in the
// modems, and a DSL modem's can hold a second. A TCP flow through the bond fills them
// all (the scheduler spreads its excess evenly, that is its job), and every user of the
// line waits behind it. The scheduler cannot drain a queue that every link has: that
// queue is the sender's doing, and only the sender can shrink it, when it sees a loss.
// So when even the least-queued link that carries traffic has stayed above the target
// for an interval, the bond drops a packet, and then more often (interval/√count) until
// the queue is back under the target, as CoDel does.
//
// The measured queue is the smallest one-way delay above the floor over a feedback
// period, so it is already a "standing" queue in CoDel's sense; it arrives half an RTT
// and up to a period late, which the interval (longer than both) absorbs.
package aqm

import "math"

// Codel is one bond direction's dropper. Not safe for concurrent use: the session's
// transmit lock guards it. Times are nanoseconds of a monotonic clock.
type Codel struct {
	target, interval int64

	firstAbove int64 // when the queue would have been above target for an interval; 0: below
	dropping   bool
	count      int // drops in the current dropping state
	lastCount  int
	dropNext   int64
}

// New returns a dropper for the given target queueing delay and interval (ns).
func New(target, interval int64) *Codel {
	return &Codel{target: target, interval: interval}
}

// SetTarget changes the target queueing delay (ns).
func (c *Codel) SetTarget(target int64) { c.target = target }

// Drop reports whether the packet being sent at now should be dropped, given the
// bond's current standing queue (ns).
func (c *Codel) Drop(now, queue int64) bool {
	if queue < c.target {
		c.firstAbove, c.dropping = 0, false
		return false
	}
	if c.firstAbove == 0 {
		c.firstAbove = now + c.interval
		return false
	}
	if !c.dropping {
		if now < c.firstAbove {
			return false
		}
		c.dropping = true
		// Coming back soon after the last dropping state: resume near its rate.
		if c.count > 2 && now-c.dropNext < 16*c.interval {
			c.count -= 2
		} else {
			c.count = 1
		}
		c.lastCount = c.count
		c.dropNext = c.next(now)
		return true
	}
	if now < c.dropNext {
		return false
	}
	c.count++
	c.dropNext = c.next(c.dropNext)
	return true
}

// Spacing is Drop for a dropper that does not see the packets: the kernel fast path
// sends them, and drops one when a spacing is first set and then one per spacing
// (bpf/include/aggd_aqm.h). Called now and then (every feedback period) with the
// bond's standing queue, it returns the spacing between drops from now on, or 0 when
// the bond is not to drop. It counts every drop it scheduled up to now as made: exact
// while packets come at least as often as drops are due, which is the case while a
// sender keeps a queue, and otherwise a little quicker to drop than CoDel.
func (c *Codel) Spacing(now, queue int64) int64 {
	if !c.Drop(now, queue) && !c.dropping {
		return 0
	}
	for i := 0; c.dropNext <= now && i < maxCatchUp; i++ {
		c.count++
		c.dropNext = c.next(c.dropNext)
	}
	return c.next(0)
}

// maxCatchUp bounds Spacing's catching up with the drops due since its last call (at
// a 100-ms feedback period that is a spacing of 0.1 ms, a count of a million).
const maxCatchUp = 1000

func (c *Codel) next(from int64) int64 {
	return from + int64(float64(c.interval)/math.Sqrt(float64(c.count)))
}
