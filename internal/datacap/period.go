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

// Schedule says when a cap's periods start: at the start of a day in local time,
// every day (Daily), on a weekday (Weekly: Day 1 = Monday .. 7 = Sunday) or on a day
// of the month (Monthly: Day 1..28).
//
// The arithmetic is on calendar dates, turned into an instant only at the end
// (dayStart): where a change to summer time skips midnight (Chile, Cuba, Lebanon), a
// midnight computed with time.Date lands in the day before, which moved weekdays and
// period starts within a period, and so restarted its count.
type Schedule struct {
	Period Period
	Day    int
}

// Start is the beginning of the period that now falls in, in now's location.
func (s Schedule) Start(now time.Time) time.Time {
	y, m, d := now.Date()
	loc := now.Location()
	switch s.Period {
	case Weekly:
		// time.Weekday has Sunday = 0; the config has Monday = 1 .. Sunday = 7. Noon
		// exists on every date.
		back := (int(time.Date(y, m, d, 12, 0, 0, 0, loc).Weekday()) - s.Day%7 + 7) % 7
		return dayStart(y, m, d-back, loc)
	case Monthly:
		if start := dayStart(y, m, s.Day, loc); !start.After(now) {
			return start
		}
		return dayStart(y, m-1, s.Day, loc)
	default:
		return dayStart(y, m, d, loc)
	}
}

// Next is the beginning of the period after the one that starts at start (a value
// Start returned).
func (s Schedule) Next(start time.Time) time.Time {
	y, m, d := start.Date()
	loc := start.Location()
	switch s.Period {
	case Weekly:
		return dayStart(y, m, d+7, loc)
	case Monthly:
		// Day is at most 28, so the month after has it.
		return dayStart(y, m+1, s.Day, loc)
	default:
		return dayStart(y, m, d+1, loc)
	}
}

// dayStart is the first instant of a calendar date (normalised as time.Date does: day
// 0 is the month before's last) in loc: its midnight, or, where a change of clocks
// skips midnight, the first hour that date has.
func dayStart(y int, m time.Month, d int, loc *time.Location) time.Time {
	noon := time.Date(y, m, d, 12, 0, 0, 0, loc)
	y, m, d = noon.Date()
	for h := 0; h < 12; h++ {
		if t := time.Date(y, m, d, h, 0, 0, 0, loc); t.Day() == d && t.Hour() == h {
			return t
		}
	}
	return noon
}
