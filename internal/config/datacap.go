package config

// DataCap is an uplink's volume allowance per billing period: a metered LTE line's
// 20 GB a month, say. The daemon counts what the uplink's interface carries and, once
// the allowance is used up, uses the link only as a backup until the next period.
type DataCap struct {
	// Limit is the volume allowed per period, received and sent together, as the
	// uplink's interface counts it: everything on the line, not only the bond's
	// packets. 0 (unset) means no cap.
	Limit Size `yaml:"limit"`
	// Period is how often the allowance starts again, at midnight local time:
	// monthly (the default), weekly or daily.
	Period CapPeriod `yaml:"period"`
	// ResetDay is the day a period starts: for monthly the day of the month (1..28),
	// for weekly the day of the week (1 = Monday .. 7 = Sunday). 0 (unset) means 1.
	// Daily periods start every midnight and take no day.
	ResetDay int `yaml:"reset_day"`
}

// CapPeriod is the length of a data cap's billing period.
type CapPeriod string

// The billing periods.
const (
	CapMonthly CapPeriod = "monthly"
	CapWeekly  CapPeriod = "weekly"
	CapDaily   CapPeriod = "daily"
)

func (p *CapPeriod) parseScalar(s string) error {
	return parseEnum(s, p, CapMonthly, CapWeekly, CapDaily)
}

// Enabled says whether the uplink has a cap at all.
func (d DataCap) Enabled() bool { return d.Limit > 0 }

// EffectivePeriod is Period with its default filled in.
func (d DataCap) EffectivePeriod() CapPeriod {
	if d.Period == "" {
		return CapMonthly
	}
	return d.Period
}

// EffectiveResetDay is ResetDay with its default filled in (0 for daily periods).
func (d DataCap) EffectiveResetDay() int {
	if d.EffectivePeriod() == CapDaily {
		return 0
	}
	if d.ResetDay == 0 {
		return 1
	}
	return d.ResetDay
}

// minDataCap is the smallest limit accepted: less is a unit typed wrong ("20MB" for
// "20GB"), as an uplink's probes alone take a few MB a day.
const minDataCap = 1 << 20

// DefaultStateDir is state_dir's default, systemd's StateDirectory for aggd.
const DefaultStateDir = "/var/lib/aggd"

func (c *collector) checkDataCap(path string, d DataCap) {
	if !d.Enabled() {
		if d.Period != "" || d.ResetDay != 0 {
			c.add(path+".limit", "missing; write the volume the line includes per period, e.g. \"20GB\", or remove %s", path)
		}
		return
	}
	if d.Limit < minDataCap {
		c.add(path+".limit", "%s is below 1MiB; an uplink's probes alone take a few MB a day: check the unit (e.g. \"20GB\")", d.Limit)
	}
	switch day := d.ResetDay; d.EffectivePeriod() {
	case CapMonthly:
		if day < 0 || day > 28 {
			c.add(path+".reset_day", "%d is out of range 1..28 for a monthly period (not every month has a day 29 to 31: "+
				"a period that starts on the 1st follows the last day)", day)
		}
	case CapWeekly:
		if day < 0 || day > 7 {
			c.add(path+".reset_day", "%d is out of range 1..7 for a weekly period (1 = Monday, 7 = Sunday)", day)
		}
	case CapDaily:
		if day != 0 {
			c.add(path+".reset_day", "a daily period starts every midnight; remove reset_day")
		}
	}
}
