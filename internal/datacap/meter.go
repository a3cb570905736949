package datacap

import "time"

// Counters is one reading of an interface's byte counters, as the kernel keeps them
// from the interface's creation.
type Counters struct {
	// Index is the interface's index: another index under the same name is an
	// interface created anew (a PPPoE reconnect's new ppp0), whose counters start at 0.
	Index  int
	Rx, Tx uint64
}

// Meter counts what one uplink's interface carries in the current billing period,
// both directions together, against the period's limit.
type Meter struct {
	Name     string
	Limit    uint64
	Schedule Schedule

	start time.Time // the current period's start; zero before the first reading
	used  uint64
	// last is the previous reading, valid while haveLast. seen says the interface
	// was read at least once since the daemon started: when it then goes missing and
	// comes back, all of the new interface's counters are this period's traffic; at
	// the first reading they are not (they go back to the interface's creation, before
	// the daemon counted).
	last     Counters
	haveLast bool
	seen     bool
}

// Observe takes a reading of the interface (ok false: it is missing now) and adds
// what it carried since the previous one. A reading in a new period starts the count
// from zero.
func (m *Meter) Observe(now time.Time, c Counters, ok bool) {
	m.roll(now)
	if !ok {
		m.haveLast = false
		return
	}
	switch {
	case m.haveLast && c.Index == m.last.Index:
		m.used += since(m.last.Rx, c.Rx) + since(m.last.Tx, c.Tx)
	case m.seen:
		// A new interface, or the old one back after it was missing: its counters
		// count from its creation, which came after our last reading.
		m.used += c.Rx + c.Tx
	}
	m.last, m.haveLast, m.seen = c, true, true
}

// since is how much a counter advanced from a to b. A counter that went backwards was
// reset (the driver's counters cleared): all of b is new.
func since(a, b uint64) uint64 {
	if b >= a {
		return b - a
	}
	return b
}

// roll moves the meter into the period that now falls in, counting from zero there.
func (m *Meter) roll(now time.Time) {
	if start := m.Schedule.Start(now); !start.Equal(m.start) {
		m.start, m.used = start, 0
	}
}

// Restore takes the count a previous run saved for this uplink, if it belongs to the
// period now falls in; a count from another period is dropped (it is spent).
func (m *Meter) Restore(now time.Time, periodStart time.Time, used uint64) bool {
	m.roll(now)
	if !periodStart.Equal(m.start) {
		return false
	}
	m.used = used
	return true
}

// Used is what the uplink carried in the current period, in bytes.
func (m *Meter) Used() uint64 { return m.used }

// Reached says whether the current period's allowance is used up.
func (m *Meter) Reached() bool { return m.used >= m.Limit }

// PeriodStart and PeriodEnd bound the current period.
func (m *Meter) PeriodStart() time.Time { return m.start }

// PeriodEnd is when the current period ends and the allowance starts again.
func (m *Meter) PeriodEnd() time.Time { return m.Schedule.Next(m.start) }
