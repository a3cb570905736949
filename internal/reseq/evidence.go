package reseq

// evidence is the FIFO-evidence rule's state. For each link it keeps an exclusive
// bound: every sequence number below it that was sent on the link has arrived or is
// lost. Data packet s on a link proves s+1; a probe proves its watermark. A missing
// number below every current link's bound cannot still be on its way.
//
// A link whose receiver asked for a repair (AwaitRepair) is frozen: until the repair
// may have come, its bound stays where it was before the gap, and what it shows in the
// meantime waits as its pending bound.
type evidence struct {
	bound [256]uint32
	has   [256]bool
	set   []uint8 // the session's current links

	frozenUntil [256]int64 // 0: not frozen
	pending     [256]uint32
	hasPending  [256]bool
	frozen      int // links with frozenUntil set
}

// note raises link's bound to b if that says more than it did, or, while the link is
// frozen, its pending bound. A bound that is not beyond next carries no information
// and is not stored.
func (e *evidence) note(link uint8, b, next uint32) {
	if int32(b-next) <= 0 {
		return
	}
	if e.frozenUntil[link] != 0 {
		if !e.hasPending[link] || int32(b-e.pending[link]) > 0 {
			e.pending[link], e.hasPending[link] = b, true
		}
		return
	}
	if e.has[link] && int32(b-e.bound[link]) <= 0 {
		return
	}
	e.bound[link], e.has[link] = b, true
}

// freeze holds link's bound where it is until the time until (extending an earlier
// freeze, never shortening it).
func (e *evidence) freeze(link uint8, until int64) {
	if e.frozenUntil[link] == 0 {
		e.frozen++
	}
	e.frozenUntil[link] = max(e.frozenUntil[link], until)
}

// thaw ends the freezes that are over at now and applies their pending bounds.
func (e *evidence) thaw(now int64, next uint32) {
	if e.frozen == 0 {
		return
	}
	for id := range e.frozenUntil {
		if until := e.frozenUntil[id]; until != 0 && until <= now {
			e.unfreeze(uint8(id), next)
		}
	}
}

// unfreeze ends link's freeze and applies its pending bound.
func (e *evidence) unfreeze(link uint8, next uint32) {
	e.frozenUntil[link] = 0
	e.frozen--
	if e.hasPending[link] {
		e.hasPending[link] = false
		e.note(link, e.pending[link], next)
	}
}

// nextThaw returns when the earliest freeze ends, if any link is frozen.
func (e *evidence) nextThaw() (int64, bool) {
	if e.frozen == 0 {
		return 0, false
	}
	first, ok := int64(0), false
	for _, until := range e.frozenUntil {
		if until != 0 && (!ok || until < first) {
			first, ok = until, true
		}
	}
	return first, ok
}

// floor returns the lowest bound over the session's links: every missing number
// before it is lost. It returns next when the rule cannot resolve anything: no
// links, or a link without a bound beyond next.
func (e *evidence) floor(next uint32) uint32 {
	if len(e.set) == 0 {
		return next
	}
	lowest := int32(Window)
	for _, id := range e.set {
		if !e.has[id] {
			return next
		}
		d := int32(e.bound[id] - next)
		if d <= 0 {
			e.has[id] = false // passed: forget it before it can alias
			return next
		}
		lowest = min(lowest, d)
	}
	return next + uint32(lowest)
}

// forgetBehind drops every bound that next has reached. Such a bound means nothing
// any more, and if kept for 2^31 numbers it would look like a bound far ahead.
func (e *evidence) forgetBehind(next uint32) {
	for id := range e.has {
		if e.has[id] && int32(e.bound[id]-next) <= 0 {
			e.has[id] = false
		}
		if e.hasPending[id] && int32(e.pending[id]-next) <= 0 {
			e.hasPending[id] = false
		}
	}
}

// forget drops every bound and freeze (a restart of the numbering).
func (e *evidence) forget() {
	e.has, e.hasPending, e.frozenUntil, e.frozen = [256]bool{}, [256]bool{}, [256]int64{}, 0
}
