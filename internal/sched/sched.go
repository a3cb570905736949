// Package sched picks the link for each outgoing packet of a session: the
// earliest-expected-arrival scheduler of docs/architecture.md §5.
//
// For every candidate link the scheduler keeps a virtual backlog: the time at which
// the link would finish sending what it has been given, if it really runs at the
// rate the control plane believes. A packet's expected arrival on a link is
//
//	max(now, backlogEnd) + size*8/rate + baseOWD
//
// and the packet goes to the link where that is smallest. Light traffic therefore
// rides the lowest-delay link, the others join as its backlog grows, and under load
// each link's share settles in proportion to its rate with arrival times equalised,
// which is what keeps the receiver's reorder buffer small.
//
// Links whose expected arrivals lie within TieWindow of the earliest are a tie, and
// a tie is shared by rate (smooth weighted round-robin). Without that, links of
// equal delay split in proportion to their rates only while they are all
// backlogged: at partial load (a TCP flow recovering from a loss) every packet finds
// the links idle and goes to the one whose base delay was measured a fraction of a
// millisecond lower, so the split swings with the load, and that link alone carries
// the bursts. Sharing ties keeps the split at the links' rates at any load, for at
// most TieWindow of extra delay on a packet.
//
// One exception to the earliest arrival: while the bond is full, an idle slow link
// takes the packet (idleSlowLink). A link that takes 58 ms to send a full packet
// otherwise waits for every other link's queue to reach that, and every packet of the
// bond waits as long.
//
// This is per-packet code, mirrored by the BPF fast path: Pick does not allocate
// and works on plain integers and floats. A Scheduler is not safe for concurrent
// use; the session's transmit lock serialises Pick and SetLinks (and must, so that
// each link's packets leave in sequence order). Times are int64 nanoseconds of the
// caller's monotonic clock, passed in so that tests and BPF see the same arithmetic.
package sched

import (
	"math"
	"slices"

	"github.com/aggd/aggd/internal/wire"
)

// LinkParams is what the control plane knows about one link at the moment.
type LinkParams struct {
	ID      uint8
	Usable  bool // up and allowed to carry data
	Suspect bool // in doubt (missed probes, loss spike): its packets get a duplicate elsewhere
	Class   Class
	RateBps float64 // bits per second; a link below 1 bit/s (or NaN, or infinite) is never picked
	BaseOWD int64   // one-way delay without queueing, ns
	// PinnedWeight > 0 pins this link's share (user override); 0 leaves it automatic.
	PinnedWeight float64
	// OuterIPv6: the link's packets travel in IPv6, whose header is OuterIPv6Extra
	// bytes longer than the IPv4 one the sizes given to Pick, Charge and StandbyCopy
	// count. A link's rate is measured in the bytes its wire carries, so each of its
	// packets costs it that much more time.
	OuterIPv6 bool
}

// OuterIPv6Extra is how much longer an IPv6 header (40 bytes) is than an IPv4 one (20).
const OuterIPv6Extra = wire.OverheadIPv6 - wire.Overhead

// Config tunes a Scheduler. The zero value is usable.
type Config struct {
	// OverflowQueueDelay is when the primaries count as full: overflow links become
	// candidates once every usable primary's virtual backlog exceeds it (ns).
	// Default DefaultOverflowQueueDelay.
	OverflowQueueDelay int64
}

// DefaultOverflowQueueDelay is the overflow threshold when Config leaves it zero:
// 10 ms of queue is where interactive traffic starts to notice.
const DefaultOverflowQueueDelay = int64(10e6)

// TieWindow is how close two links' expected arrivals must be to count as a tie
// (ns): below the jitter of the links a bond is used on and the error of their
// base-delay estimates, which are what tell equal links apart, and small next to
// the reorder buffer's hold.
const TieWindow = int64(1e6)

// idle is the backlog end of a link that has never been charged. It is far in the
// past, yet far enough from math.MinInt64 that backlogEnd-now cannot overflow.
const idle = math.MinInt64 / 2

// linkState is one link's parameters plus the scheduler's per-packet bookkeeping.
type linkState struct {
	LinkParams
	nsPerByte  float64 // transmission time of one byte at RateBps, ns
	backlogEnd int64   // when the link's virtual queue drains
	swrr       float64 // smooth weighted round-robin credit, pinned mode only
	// tieCredit is the link's round-robin credit among tied links, in bits/s
	// (integers, as in the BPF twin, so the two decide alike).
	tieCredit int64
}

// Scheduler assigns packets to links. Create it with New.
type Scheduler struct {
	overflowDelay int64
	links         []linkState // ordered by ID, so ties always go to the lowest ID
}

// New returns a scheduler with no links; Pick reports !ok until SetLinks gives it some.
func New(cfg Config) *Scheduler {
	if cfg.OverflowQueueDelay <= 0 {
		cfg.OverflowQueueDelay = DefaultOverflowQueueDelay
	}
	return &Scheduler{overflowDelay: cfg.OverflowQueueDelay}
}

// SetLinks replaces the link parameters. A link that was already known keeps its
// virtual backlog and round-robin credit, so a parameter update (which happens
// every control tick) does not make a busy link look idle; new links start idle and
// links not listed are forgotten. If an ID is listed twice, the last entry wins.
func (s *Scheduler) SetLinks(links []LinkParams) {
	next := make([]linkState, 0, len(links))
	for _, p := range links {
		st := linkState{LinkParams: p, backlogEnd: idle}
		if old := s.find(p.ID); old != nil {
			st.backlogEnd, st.swrr, st.tieCredit = old.backlogEnd, old.swrr, old.tieCredit
		}
		if validRate(p.RateBps) {
			st.nsPerByte = 8e9 / p.RateBps
		}
		if i := slices.IndexFunc(next, func(l linkState) bool { return l.ID == p.ID }); i >= 0 {
			next[i] = st
			continue
		}
		next = append(next, st)
	}
	slices.SortFunc(next, func(a, b linkState) int { return int(a.ID) - int(b.ID) })
	s.links = next
}

// Backlog returns how far the link's virtual queue reaches beyond now (0 when it is
// drained), and false for an unknown link. It is for metrics and tests.
func (s *Scheduler) Backlog(now int64, id uint8) (int64, bool) {
	l := s.find(id)
	if l == nil {
		return 0, false
	}
	return max(0, l.backlogEnd-now), true
}

// Charge adds a packet of size bytes (counted as Pick's, over IPv4) sent at now on link
// id to its virtual backlog: for packets the caller sends on a link of its own choosing
// (a dead link's packets re-sent elsewhere), so that the next picks see the queue they
// make. An unknown link is ignored.
func (s *Scheduler) Charge(id uint8, now int64, size int) {
	if l := s.find(id); l != nil {
		s.charge(l, now, size)
	}
}

// Pick chooses the link for a packet of size bytes sent at now (the datagram with an
// outer IPv4 and UDP header: wire.Overhead more than the inner packet) and charges its
// virtual backlog. If that link is suspect it also chooses a second link for a
// duplicate (hasDup) and charges that one too. ok is false when no link is usable.
//
// The class rules come first and decide the candidates. Among them, if the user
// pinned any weights, the pinned candidates share the traffic by weight (unpinned
// candidates get nothing); otherwise the earliest expected arrival wins, and links
// within TieWindow of it share by rate.
func (s *Scheduler) Pick(now int64, size int) (primary uint8, dup uint8, hasDup bool, ok bool) {
	allowed := s.allowedClasses(now)
	var best int
	if s.anyPinned(allowed) {
		best = s.pickPinned(allowed)
	} else {
		best = s.pickEarliest(now, size, allowed)
	}
	if best < 0 {
		return 0, 0, false, false
	}
	s.charge(&s.links[best], now, size)
	primary = s.links[best].ID
	if !s.links[best].Suspect {
		return primary, 0, false, true
	}
	if d := s.pickDuplicate(now, size, allowed, best); d >= 0 {
		s.charge(&s.links[d], now, size)
		return primary, s.links[d].ID, true, true
	}
	return primary, 0, false, true
}

// classSet is a bit set of Class values.
type classSet uint8

func (cs classSet) has(c Class) bool { return cs&(1<<c.effective()) != 0 }

const (
	onlyPrimary  = classSet(1 << ClassPrimary)
	withOverflow = onlyPrimary | 1<<ClassOverflow
	noPrimary    = classSet(1<<ClassOverflow | 1<<ClassBackup)
	anyClass     = onlyPrimary | noPrimary
)

// allowedClasses applies the class rules: primaries normally; overflow links too
// once every usable primary's backlog exceeds the threshold; overflow and backup
// links when no primary is usable (which also covers a bond with no primaries).
func (s *Scheduler) allowedClasses(now int64) classSet {
	anyPrimary, allFull := false, true
	for i := range s.links {
		l := &s.links[i]
		if !l.usable() || l.Class.effective() != ClassPrimary {
			continue
		}
		anyPrimary = true
		if l.backlogEnd-now <= s.overflowDelay {
			allFull = false
		}
	}
	switch {
	case !anyPrimary:
		return noPrimary
	case allFull:
		return withOverflow
	default:
		return onlyPrimary
	}
}

// pickEarliest returns the index of the allowed link with the earliest expected
// arrival, or -1. Links whose arrival is within TieWindow of the earliest are tied:
// each of them earns its rate in credit, the one with the most (the lowest ID among
// equals) is picked and pays what they earned together, so over many ties each
// link's count follows its rate.
func (s *Scheduler) pickEarliest(now int64, size int, allowed classSet) int {
	best, bestArrival := -1, int64(0)
	for i := range s.links {
		l := &s.links[i]
		if !l.usable() || !allowed.has(l.Class) {
			continue
		}
		if a := l.arrival(now, size); best < 0 || a < bestArrival {
			best, bestArrival = i, a
		}
	}
	if best < 0 {
		return -1
	}
	if idle := s.idleSlowLink(now, size, allowed, best, bestArrival); idle >= 0 {
		return idle
	}
	pick, earned := -1, int64(0)
	for i := range s.links {
		l := &s.links[i]
		if !l.usable() || !allowed.has(l.Class) || l.arrival(now, size) > bestArrival+TieWindow {
			continue
		}
		l.tieCredit += l.weight()
		earned += l.weight()
		if pick < 0 || l.tieCredit > s.links[pick].tieCredit {
			pick = i
		}
	}
	s.links[pick].tieCredit -= earned
	return pick
}

// idleSlowLink returns an allowed link that is idle while the bond is full, and whose
// base delay is no later than the earliest arrival, or -1. Such a link is later than the
// earliest only by this packet's transmission time on it. Waiting for the others'
// queues to grow that long before using it (earliest arrival alone) makes every packet
// of the bond wait that long in a queue; giving it the packet now makes only the
// packets sent while it transmits wait for it, at the receiver, half as long on
// average. The bond is full when the earliest link's backlog is beyond the overflow
// threshold: below it a packet on a slow link would only delay the next ones.
func (s *Scheduler) idleSlowLink(now int64, size int, allowed classSet, best int, bestArrival int64) int {
	if s.links[best].backlogEnd-now < s.overflowDelay {
		return -1
	}
	pick, pickArrival := -1, int64(0)
	for i := range s.links {
		l := &s.links[i]
		if i == best || !l.usable() || !allowed.has(l.Class) || l.backlogEnd > now || now+l.BaseOWD > bestArrival {
			continue
		}
		if a := l.arrival(now, size); pick < 0 || a < pickArrival {
			pick, pickArrival = i, a
		}
	}
	return pick
}

// pickDuplicate chooses where the copy of a suspect link's packet goes: the other
// usable link with the earliest arrival, preferring links that are not suspect
// themselves and then links whose class is currently allowed. A copy may use a link
// the class rules would not (a backup when the only primary is in doubt): that is
// exactly the insurance a duplicate is for.
func (s *Scheduler) pickDuplicate(now int64, size int, allowed classSet, exclude int) int {
	best, bestTier, bestArrival := -1, 0, int64(0)
	for i := range s.links {
		l := &s.links[i]
		if i == exclude || !l.usable() {
			continue
		}
		tier := 0
		if l.Suspect {
			tier += 2
		}
		if !allowed.has(l.Class) {
			tier++
		}
		a := l.arrival(now, size)
		if best < 0 || tier < bestTier || (tier == bestTier && a < bestArrival) {
			best, bestTier, bestArrival = i, tier, a
		}
	}
	return best
}

// StandbyCopy chooses a standby link for one more copy of a packet sent at now while
// the bond is in doubt: some usable primary is suspect. Primaries die together (one
// power cut, one street cabinet), though rarely at the same instant, and until the
// second one is suspect too, the copies of the first one's packets go to it
// (pickDuplicate prefers a primary not in doubt), and its own packets get none. In the
// lab's standby scenario that lost the packets TCP sent in the 40–150 ms between the
// two doubts in four of 31 captured runs, and all four missed the 1-s recovery: each
// was one more window cut on the LTE backup alone. The standby link is the one left if
// they do die together.
//
// The link is the usable standby link (overflow or backup, not carrying originals now:
// its class is not allowed) with the earliest arrival that is not in doubt itself, not
// the one Pick chose for the packet's duplicate (dup, if hasDup; the original's link
// carries originals, so it is never a candidate) and whose virtual backlog is at most
// maxBacklog: copies of a faster bond must not fill a slow backup's queue, where they
// would delay what it carries once it is alone. The link is charged. ok is false when
// no primary is in doubt or no link qualifies.
func (s *Scheduler) StandbyCopy(now int64, size int, maxBacklog int64, dup uint8, hasDup bool) (id uint8, ok bool) {
	doubt := false
	for i := range s.links {
		l := &s.links[i]
		if l.usable() && l.Suspect && l.Class.effective() == ClassPrimary {
			doubt = true
			break
		}
	}
	if !doubt {
		return 0, false
	}
	allowed := s.allowedClasses(now)
	best, bestArrival := -1, int64(0)
	for i := range s.links {
		l := &s.links[i]
		if !l.usable() || l.Suspect || allowed.has(l.Class) || l.backlogEnd-now > maxBacklog ||
			(hasDup && l.ID == dup) {
			continue
		}
		if a := l.arrival(now, size); best < 0 || a < bestArrival {
			best, bestArrival = i, a
		}
	}
	if best < 0 {
		return 0, false
	}
	s.charge(&s.links[best], now, size)
	return s.links[best].ID, true
}

// anyPinned reports whether the user pinned the weight of any allowed usable link;
// if so the pinned links share the traffic by weight instead of by arrival time.
func (s *Scheduler) anyPinned(allowed classSet) bool {
	for i := range s.links {
		l := &s.links[i]
		if l.usable() && allowed.has(l.Class) && l.pinned() {
			return true
		}
	}
	return false
}

// pickPinned is smooth weighted round-robin (as in nginx) over the allowed pinned
// links: every pick adds each link's weight to its credit, the link with the most
// credit wins and pays the total. Over any window the counts track the weights, and
// a link's packets are spread out rather than sent in bursts.
func (s *Scheduler) pickPinned(allowed classSet) int {
	best, total := -1, 0.0
	for i := range s.links {
		l := &s.links[i]
		if !l.usable() || !allowed.has(l.Class) || !l.pinned() {
			continue
		}
		l.swrr += l.PinnedWeight
		total += l.PinnedWeight
		if best < 0 || l.swrr > s.links[best].swrr {
			best = i
		}
	}
	if best >= 0 {
		s.links[best].swrr -= total
	}
	return best
}

// charge appends a packet to the link's virtual queue. Pinned mode charges too, so
// that the overflow rule and a later return to automatic mode see real backlogs.
func (s *Scheduler) charge(l *linkState, now int64, size int) {
	l.backlogEnd = max(now, l.backlogEnd) + l.txTime(size)
}

// usable reports whether the link may be picked at all.
func (l *linkState) usable() bool { return l.Usable && l.nsPerByte > 0 }

// pinned reports whether the user fixed this link's weight (a usable one: positive
// and finite).
func (l *linkState) pinned() bool { return l.PinnedWeight > 0 && !math.IsInf(l.PinnedWeight, 1) }

// weight is the link's share of a tie: its rate in whole bits/s, as the fast path
// holds it.
func (l *linkState) weight() int64 { return int64(l.RateBps) }

// txTime is how long the link takes to send a datagram of size bytes over IPv4, ns:
// over IPv6, OuterIPv6Extra bytes more.
func (l *linkState) txTime(size int) int64 {
	if l.OuterIPv6 {
		size += OuterIPv6Extra
	}
	return int64(float64(size) * l.nsPerByte)
}

// arrival is the packet's expected arrival time on this link.
func (l *linkState) arrival(now int64, size int) int64 {
	return max(now, l.backlogEnd) + l.txTime(size) + l.BaseOWD
}

func (s *Scheduler) find(id uint8) *linkState {
	for i := range s.links {
		if s.links[i].ID == id {
			return &s.links[i]
		}
	}
	return nil
}

// validRate rejects rates below 1 bit/s (including zero, negative and NaN) and
// infinite ones: such a link has no sensible transmission time, so it is never picked.
func validRate(r float64) bool { return r >= 1 && !math.IsInf(r, 1) }
