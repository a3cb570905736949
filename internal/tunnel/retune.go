package tunnel

import "github.com/aggd/aggd/internal/sched"

// LinkTuning is what a config reload may change of a CPE's uplink while its session
// runs: when the link carries traffic (its class), its rate priors and caps, and its
// pinned weight. Everything else of an uplink (its interface, addresses, endpoint)
// binds sockets and routes and takes a restart.
type LinkTuning struct {
	Class          sched.Class
	TxRate, RxRate float64 // bits/s, 0: measured from nothing
	Weight         float64 // 0: automatic
}

// tuning is the uplink's LinkTuning as its spec has it.
func tuning(s LinkSpec) LinkTuning {
	return LinkTuning{Class: s.Class, TxRate: s.TxRate, RxRate: s.RxRate, Weight: s.Weight}
}

// RetuneUplinks gives uplink i the tuning t[i], in the running session at once and in
// every later one, and tells the headend (the class and downstream prior travel in
// LINK_PARAMS, sent now). It returns the names of the uplinks whose tuning changed;
// t must have one entry per uplink.
func (c *CPE) RetuneUplinks(t []LinkTuning) []string {
	// Not while a handshake makes a new session from the old tuning and installs it
	// after this looked for one (lock order: hsMu, then tuningMu, as in newSession).
	c.hsMu.Lock()
	defer c.hsMu.Unlock()
	c.tuningMu.Lock()
	var changed []string
	var specs []LinkSpec // of the changed uplinks
	for i := range c.tuning {
		if c.tuning[i] != t[i] {
			c.tuning[i] = t[i]
			changed = append(changed, c.cfg.Uplinks[i].Spec.Name)
			specs = append(specs, c.uplinkSpecLocked(i))
		}
	}
	c.tuningMu.Unlock()
	if len(changed) == 0 {
		return nil
	}
	c.applySpecs(specs)
	return changed
}

// SetCapReached says whether uplink id has used up its data cap for the period: while
// it has, the link is used as a backup whatever its class (only while no primary link
// is up), in the running session and every later one, and the headend
// is told at once. It reports whether the uplink's capped state changed.
func (c *CPE) SetCapReached(id int, reached bool) bool {
	c.hsMu.Lock() // as in RetuneUplinks
	defer c.hsMu.Unlock()
	c.tuningMu.Lock()
	if c.capReached[id] == reached {
		c.tuningMu.Unlock()
		return false
	}
	was := c.uplinkSpecLocked(id).Class
	c.capReached[id] = reached
	spec := c.uplinkSpecLocked(id)
	c.tuningMu.Unlock()
	if spec.Class != was {
		c.applySpecs([]LinkSpec{spec})
	}
	return true
}

// applySpecs gives the running session's links their new tuning and tells the headend.
func (c *CPE) applySpecs(specs []LinkSpec) {
	if s := c.session.Load(); s != nil {
		for _, spec := range specs {
			if l := s.link(spec.ID); l != nil {
				l.retune(spec)
			}
		}
		s.schedDue.Store(true)
	}
	c.requestAnnouncement()
}

// UplinkClass is uplink id's class as it is now: as configured (RetuneUplinks changes
// it), or backup while its data cap is reached.
func (c *CPE) UplinkClass(id int) sched.Class {
	c.tuningMu.Lock()
	defer c.tuningMu.Unlock()
	return c.uplinkSpecLocked(id).Class
}

// uplinkSpecs is each uplink's spec with its tuning as it is now.
func (c *CPE) uplinkSpecs() []LinkSpec {
	c.tuningMu.Lock()
	defer c.tuningMu.Unlock()
	specs := make([]LinkSpec, len(c.cfg.Uplinks))
	for i := range specs {
		specs[i] = c.uplinkSpecLocked(i)
	}
	return specs
}

// uplinkSpecLocked is uplink i's spec with its tuning, and its class lowered to
// backup while its data cap is reached. Caller holds tuningMu.
func (c *CPE) uplinkSpecLocked(i int) LinkSpec {
	spec, t := c.cfg.Uplinks[i].Spec, c.tuning[i]
	spec.Class, spec.TxRate, spec.RxRate, spec.Weight = t.Class, t.TxRate, t.RxRate, t.Weight
	if c.capReached[i] {
		spec.Class = max(spec.Class, sched.ClassBackup)
	}
	return spec
}

// retune takes the class, rate prior and weight of spec for the link (our side of
// it: the CPE's own uplink).
// The estimate starts again from a new rate prior, as from a configured one at the
// start (a removed one only lifts the cap); a class or weight alone leaves it as it is.
func (l *link) retune(spec LinkSpec) {
	l.mu.Lock()
	defer l.mu.Unlock()
	newRate := spec.TxRate != l.spec.TxRate
	l.spec.Class, l.spec.TxRate, l.spec.RxRate, l.spec.Weight = spec.Class, spec.TxRate, spec.RxRate, spec.Weight
	if newRate {
		l.restartEstimate()
	}
}
