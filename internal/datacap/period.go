// Package datacap counts what each metered uplink carries in its billing period and
// says when the period's allowance is used up, so that the CPE can stop relying on
// the link until the next period (docs/architecture.md, "Data caps").
package datacap

import "time"

// Period is a billing period's length.
type Period int

// The periods a data cap can have.
const (
	Monthly Period = iota
	Weekly
	Daily
)

// Schedule says when a cap's periods start: at midnight local time, every day
// (Daily), on a weekday (Weekly: Day 1 = Monday .. 7 = Sunday) or on a day of the
// month (Monthly: Day 1..28).
type Schedule struct {
	Period Period
	Day    int
}

// Start is the beginning of the period that now falls in, in now's location.
func (s Schedule) Start(now time.Time) time.Time {
	y, m, d := now.Date()
	midnight := time.Date(y, m, d, 0, 0, 0, 0, now.Location())
	switch s.Period {
	case Weekly:
		// time.Weekday has Sunday = 0; the config has Monday = 1 .. Sunday = 7.
		back := (int(midnight.Weekday()) - s.Day%7 + 7) % 7
		return midnight.AddDate(0, 0, -back)
	case Monthly:
		start := time.Date(y, m, s.Day, 0, 0, 0, 0, now.Location())
		if start.After(now) {
			start = start.AddDate(0, -1, 0)
		}
		return start
	default:
		return midnight
	}
}

// Next is the beginning of the period after the one that starts at start (a value
// Start returned).
func (s Schedule) Next(start time.Time) time.Time {
	switch s.Period {
	case Weekly:
		return start.AddDate(0, 0, 7)
	case Monthly:
		// Day is at most 28, so AddDate never spills into the month after.
		return start.AddDate(0, 1, 0)
	default:
		return start.AddDate(0, 0, 1)
	}
}
