package tunnel

// Taking back an AQM drop (docs/architecture.md §5, the AQM). The bond's AQM drops a
// packet to tell a flow that the links it runs on hold a standing queue. If those links
// die before the flow can have answered, and the links left can carry at least what
// they did, the drop tells of a queue that no longer exists, and costs the flow twice:
// the window cut, and the climb to what the links left give. So while a failover is
// under way (a link that carries traffic is in doubt) the last drop is sent after all,
// as a new packet on the links left, about when the rescue copies what the dying links
// had in flight (rescue.go): the flow's hole is filled before it sees one, or, if it had
// resent the packet already, its resend shows spurious (a D-SACK) and it undoes the
// cut, as it does after a loss repair (repair.go).
//
// Why: in the lab's standby scenario (an upload on ADSL and cable, which die together,
// onto a faster LTE backup) half the upstream recoveries above 1 s had an AQM drop
// 10–50 ms before the outage. TCP found that hole only once the rescue's copies reached
// the headend, a quarter of a second later, resent the packet and cut its window from
// 15 to 11 kB, and then needed about a second to grow past LTE's 17 kB of
// bandwidth-delay product (BENCHMARKS.md, "Taking back an AQM drop").
//
// A drop is taken back only when the dying links showed no sign of life later than a
// reaction time after it (the flow could not have answered it on them: its resend
// died with them or was never sent), and only when the links left carry at least what
// the links that carried traffic at the drop did: where a failover leaves less (one
// of three equal links dies), the flow has to shrink anyway, and the drop stands.
// Userspace only: the kernel fast path keeps no copy of what it drops.

import (
	"slices"
	"time"

	"github.com/aggd/aggd/internal/sched"
)

// droppedPacket is an AQM drop kept for a take-back: the packet with its headroom
// (empty: none kept), when it was dropped, and the rate of the links that carried
// traffic then (bits/s).
type droppedPacket struct {
	pkt      []byte
	at       time.Time
	capacity float64
}

// forget drops the kept packet, keeping its buffer for the next.
func (d *droppedPacket) forget() { d.pkt = d.pkt[:0] }

// keepDrop keeps the packet the AQM just dropped, buf as SendData got it. Caller holds
// txMu.
func (s *Session) keepDrop(buf []byte) {
	if s.fp != nil {
		return
	}
	d := &s.dropped
	d.pkt = append(d.pkt[:0], buf...)
	d.at, d.capacity = time.Now(), s.carrying
}

// takeBack sends the kept drop again if a failover under way makes it stale: the links
// that carry traffic and are in doubt (params, with signs their last signs of life)
// showed none later than reaction after the drop, and the links left carry at least
// the rate that carried traffic at the drop. A drop too old for this failover is
// forgotten; one the links left cannot carry yet is kept, for when the doubt spreads
// (the primaries die together, and go into doubt a report or two apart). Caller holds
// txMu.
func (s *Session) takeBack(now int64, params []sched.LinkParams, signs []time.Time, reaction time.Duration) {
	d := &s.dropped
	if len(d.pkt) == 0 {
		return
	}
	carries := carriesTraffic(params)
	var last time.Time
	for i, p := range params {
		if carries(p) && p.Suspect && signs[i].After(last) {
			last = signs[i]
		}
	}
	if last.After(d.at.Add(reaction)) {
		s.log.Debug("aqm drop stands: the links in doubt carried traffic long after it",
			"dropped_ago", time.Since(d.at), "sign_after_drop", last.Sub(d.at), "reaction", reaction)
		d.forget()
		return
	}
	left := capacityLeft(params)
	if left < d.capacity {
		return
	}
	k := s.keys.sending()
	if k == nil {
		return
	}
	if s.stripe(k, now, d.pkt) {
		s.pm.aqmTakenBack.Inc()
		s.log.Debug("aqm drop taken back: the links it was made on died before the flow could answer it",
			"dropped_ago", time.Since(d.at), "rate_then_mbit_s", d.capacity/1e6, "rate_left_mbit_s", left/1e6)
	}
	d.forget()
}

// carryingRate is the rate (bits/s) of the links that carry traffic now: the usable
// primaries, or the usable links if no primary is.
func carryingRate(params []sched.LinkParams) float64 {
	carries := carriesTraffic(params)
	var sum float64
	for _, p := range params {
		if carries(p) {
			sum += p.RateBps
		}
	}
	return sum
}

// capacityLeft is the rate (bits/s) of the links that will carry traffic if those in
// doubt die: carryingRate of the links not in doubt (the usable primaries among them,
// or, if none is, the standby links the class rules then let in).
func capacityLeft(params []sched.LinkParams) float64 {
	return carryingRate(slices.DeleteFunc(slices.Clone(params), func(p sched.LinkParams) bool { return p.Suspect }))
}
