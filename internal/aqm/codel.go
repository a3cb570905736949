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
//
// Unlike a local queue's sojourn time, that measure changes only when a report comes
// in, and a drop's effect (the sender's smaller window, a draining queue) shows only in
// a report made after it. So once dropping, the next drop waits for a newer measure than
// the one the last drop acted on, whatever the control law says: CoDel's faster and
// faster drops, acting on the same stale figure, each cost a TCP flow another window
// reduction before the first one could show (in the lab's 3 × 1.5 Mbit/s bond, about
// eight drops per queue cycle, the queue collapsing to nothing and the links idling).
//
// A newer measure is not yet an answer, either. A drop shows in a measure only after
// the sender has seen it (the flow's RTT), its smaller window has reached the links,
// and a report period holding those packets has come back: two RTTs and a report
// period at the soonest (SetReaction), and only a measure that came that late can show
// it. Until then another drop only cuts the same flow's window again: behind a lone
// 45-ms LTE link the bond dropped every 100 ms, so one queue cycle cost a CUBIC flow
// two or three reductions, its window fell below the link's bandwidth-delay product,
// and the link idled (the lab's standby scenario, where the flow settled at 0.88-0.92
// of what the link gives it without the bond).
package aqm

import "math"

// Codel is one bond direction's dropper. Not safe for concurrent use: the session's
// transmit lock guards it. Times are nanoseconds of a monotonic clock.
type Codel struct {
	target, interval int64
	reaction         int64 // SetReaction
	lastDrop         int64 // when the last drop was made; 0: none yet
	settledAt        int64 // when the path the measure comes from last changed (Settle); 0: never

	firstAbove int64 // when the queue would have been above target for an interval; 0: below
	dropping   bool
	count      int // drops in the current dropping state
	lastCount  int
	dropNext   int64
	dropGen    uint64 // the measure the last drop acted on

	// measureGen is the newest measure seen, measureAt when it was first seen: about
	// when it arrived, as packets pass all the time while a sender keeps a queue.
	measureGen uint64
	measureAt  int64
}

// New returns a dropper for the given target queueing delay and interval (ns).
func New(target, interval int64) *Codel {
	return &Codel{target: target, interval: interval}
}

// SetTarget changes the target queueing delay (ns).
func (c *Codel) SetTarget(target int64) { c.target = target }

// SetReaction sets how long after a drop a measure can first show the senders'
// response to it (ns): no drop acts on a measure that came sooner, whatever the control
// law says.
func (c *Codel) SetReaction(reaction int64) { c.reaction = reaction }

// answered tells whether the current measure can show the last drop's effect: it came
// at least the reaction time after the drop. The time since the drop is not enough: a
// measure that came before the reaction time still shows the queue the drop acted on,
// and it stays the current one until the next report. Behind the lab's lone 45-ms LTE
// backup (reaction about 250 ms, a report every 100) the bond dropped again on the
// report that came 200 ms after a drop, 40 ms before the one that showed the queue
// drained, and the flow's doubly cut window left the link idling.
func (c *Codel) answered() bool {
	since := max(c.lastDrop, c.settledAt)
	return since == 0 || c.measureAt-since >= c.reaction
}

// Drop reports whether the packet being sent at now should be dropped, given the
// bond's current standing queue (ns) and that measure's generation gen (a number that
// changes with every new measure).
func (c *Codel) Drop(now, queue int64, gen uint64) bool {
	if gen != c.measureGen {
		c.measureGen, c.measureAt = gen, now
	}
	if queue < c.target {
		c.firstAbove, c.dropping = 0, false
		return false
	}
	if c.firstAbove == 0 {
		c.firstAbove = now + c.interval
		return false
	}
	if !c.dropping {
		if now < c.firstAbove || !c.answered() {
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
		c.dropGen, c.lastDrop = gen, now
		return true
	}
	if now < c.dropNext || gen == c.dropGen || !c.answered() {
		return false
	}
	c.count++
	c.dropNext = c.next(c.dropNext)
	c.dropGen, c.lastDrop = gen, now
	return true
}

// Idle tells the dropper that the sender offered nothing for an interval before the
// packet being sent: whatever queue the last measure showed is not being fed, and
// drains, so the dropper leaves its dropping state as CoDel does when its queue
// empties, and the queue must stand above target for an interval again before the next
// drop. The packet is not dropped. (Acting on the measure instead dropped a TCP flow's
// tail-loss probe 140 ms into the outage of the lab's standby scenario, on a 40-ms
// queue the dying links' last report showed: the flow then halved its window on the
// backup alone.)
func (c *Codel) Idle() {
	c.firstAbove, c.dropping = 0, false
}

// Settle tells the dropper that the links its measure comes from changed at now (a
// failover ended: the links in doubt were found down, or came back). It leaves its
// dropping state as Idle does, and, as after a drop, no drop acts on a measure that came
// sooner than the reaction time after now: until then a measure shows what the failover
// itself queued on the links left (the copies sent while a link was in doubt, the
// senders' resends), not what the senders' windows keep there, and a drop would cut a
// window that has not yet met the new path. In the lab's standby scenario with the fast
// path, one or two drops on the lone LTE backup within the first second after the
// primaries were found down cost the upload its recovery by 0.02 s in two runs of six
// (BENCHMARKS.md, "Late copies, and no AQM drop in a failover").
func (c *Codel) Settle(now int64) {
	c.Idle()
	c.settledAt = now
}

// Spacing is Drop for a dropper that does not see the packets: the kernel fast path
// sends them, and drops one when a spacing is first set and then one per spacing
// (bpf/include/aggd_aqm.h). Called with every new measure of the bond's standing queue
// (gen as for Drop), it returns the spacing between drops from now on, or 0 when the
// bond is not to drop. Like Drop it counts at most one drop per measure, and the
// spacing is never shorter than period, the time between measures, or the reaction
// time: one drop per measure that can show the last one's answer, as Drop allows. It
// counts a drop as made when one was due: exact while packets come at least as often
// as drops are due, which is so while a sender keeps a queue.
func (c *Codel) Spacing(now, queue int64, gen uint64, period int64) int64 {
	if !c.Drop(now, queue, gen) && !c.dropping {
		return 0
	}
	return max(c.next(0), period, c.reaction)
}

func (c *Codel) next(from int64) int64 {
	return from + int64(float64(c.interval)/math.Sqrt(float64(c.count)))
}
