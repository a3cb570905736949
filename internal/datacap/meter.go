package datacap

import "time"

// Counters is one reading of an interface's counters, as the kernel keeps them from
// the interface's creation: the IP bytes it received and sent (IPBytes).
type Counters struct {
	// Index is the interface's index: another index under the same name is an
	// interface created anew (a PPPoE reconnect's new ppp0), whose counters start at 0.
	Index  int
	Rx, Tx uint64
}

// EthernetHeaderLen is what an Ethernet interface's byte counters count per packet
// beyond its IP bytes (the MAC header; not the preamble or the FCS).
const EthernetHeaderLen = 14

// IPBytes is what an interface's byte count holds of IP packets, given its packet
// count and the link-layer header it counts with each (EthernetHeaderLen on Ethernet,
// 0 on an IP-level interface such as ppp0 or a raw-IP WWAN device). Providers bill IP
// bytes; the link-layer headers are about 1 % of a full packet, more of small ones.
// Both counters only grow, and every packet counted brings its header, so the result
// only grows too.
func IPBytes(bytes, packets, headerLen uint64) uint64 {
	return bytes - min(bytes, packets*headerLen)
}

// Meter counts what one uplink's interface carries in the current billing period,
// both directions together, against the period's limit.
type Meter struct {
	Name     string
	Limit    uint64
	Schedule Schedule
	// Boot is the running kernel's boot ID (BootID): saved with the last reading, it
	// tells a restart whether the interface's counters went on while aggd was stopped
	// (the same boot) or started again from zero (another). Empty: what the interface
	// carries while aggd is stopped is not counted.
	Boot string

	start time.Time // the current period's start; zero before the first reading
	used  uint64
	// last is the last successful reading, valid once seen. The first reading is
	// only a baseline: its counters go back to the interface's creation, before the
	// daemon counted. A reading that fails (the interface missing, or netlink not
	// answering) changes nothing: the next one is compared with last, and only an
	// interface index other than last's (an interface created anew, which counts from
	// zero) has all of its counters counted.
	last Counters
	seen bool
}

// Observe takes a reading of the interface (ok false: it could not be read now) and
// adds what it carried since the last reading. A reading in a new period starts the
// count from zero.
func (m *Meter) Observe(now time.Time, c Counters, ok bool) {
	m.roll(now)
	if !ok {
		return
	}
	switch {
	case !m.seen:
	case c.Index == m.last.Index:
		m.used += since(m.last.Rx, c.Rx) + since(m.last.Tx, c.Tx)
	default:
		// A new interface: its counters count from its creation, after our last
		// reading of the old one.
		m.used += c.Rx + c.Tx
	}
	m.last, m.seen = c, true
}

// since is how much a counter advanced from a to b. A counter that went backwards by
// more than readJitter was reset (the driver's counters cleared): all of b is new. A
// smaller step back is a reading whose packet count was taken a packet ahead of its
// byte count (IPBytes), which counts nothing.
func since(a, b uint64) uint64 {
	switch {
	case b >= a:
		return b - a
	case a-b <= readJitter:
		return 0
	}
	return b
}

// readJitter bounds how far IPBytes can step back between two readings: a few
// packets' headers at most, far below what a reset takes away.
const readJitter = 64 << 10

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

// resume takes the last reading a previous run saved in this period (nil: none), so
// that the first reading counts what the interface carried while aggd was stopped:
// from that reading on, in the same boot (counters that went on); everything the
// interface has counted, after a reboot (counters that started again from zero after
// the reading). It is for the period Restore took the count of; across a period's end
// the split of the gap between the periods is unknown, and the old count is dropped.
//
// A reading in another unit (a version that counted link-layer headers too) is not
// comparable with this run's: the first reading is then a baseline, as without one.
func (m *Meter) resume(r *reading) {
	switch {
	case r == nil || m.Boot == "" || r.Unit != readingUnit:
	case r.Boot == m.Boot:
		m.last, m.seen = Counters{Index: r.Index, Rx: r.Rx, Tx: r.Tx}, true
	default:
		m.last, m.seen = Counters{}, true // index 0 is no interface's: all of the next reading counts
	}
}

// Used is what the uplink carried in the current period, in bytes.
func (m *Meter) Used() uint64 { return m.used }

// Reached says whether the current period's allowance is used up.
func (m *Meter) Reached() bool { return m.used >= m.Limit }

// PeriodStart and PeriodEnd bound the current period.
func (m *Meter) PeriodStart() time.Time { return m.start }

// PeriodEnd is when the current period ends and the allowance starts again.
func (m *Meter) PeriodEnd() time.Time { return m.Schedule.Next(m.start) }
