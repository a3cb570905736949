package reseq

// evidence is the FIFO-evidence rule's state. For each link it keeps an exclusive
// bound: every sequence number below it that was sent on the link has arrived or is
// lost. Data packet s on a link proves s+1; a probe proves its watermark. A missing
// number below every current link's bound cannot still be on its way.
type evidence struct {
	bound [256]uint32
	has   [256]bool
	set   []uint8 // the session's current links
}

// note raises link's bound to b if that says more than it did. A bound that is not
// beyond next carries no information and is not stored.
func (e *evidence) note(link uint8, b, next uint32) {
	if int32(b-next) <= 0 {
		return
	}
	if e.has[link] && int32(b-e.bound[link]) <= 0 {
		return
	}
	e.bound[link], e.has[link] = b, true
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
	}
}

// forget drops every bound (a restart of the numbering).
func (e *evidence) forget() { e.has = [256]bool{} }
