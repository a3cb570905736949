package tunnel

import (
	"testing"
	"time"

	"github.com/aggd/aggd/internal/sched"
)

// The bond's entry tolerates the configured queue, or one full-size packet's time on
// its fastest usable primary link if that is longer (no link carrying data measures
// less), within bounds. A slow link beside faster ones does not raise it: the scheduler
// uses it when it is idle, without the others queueing its packet time.
func TestAQMTargetCoversTheFastestLinksPacket(t *testing.T) {
	link := func(rate float64, usable bool, class sched.Class) sched.LinkParams {
		return sched.LinkParams{RateBps: rate, Usable: usable, Class: class}
	}
	cases := []struct {
		name  string
		links []sched.LinkParams
		want  time.Duration
	}{
		{"fast links: the configured target", []sched.LinkParams{link(10e6, true, sched.ClassPrimary), link(30e6, true, sched.ClassPrimary)}, 10 * time.Millisecond},
		{"a 0.2 Mbit/s ADSL upstream beside 1.5 Mbit/s: the configured target", []sched.LinkParams{link(0.2e6, true, sched.ClassPrimary), link(1.5e6, true, sched.ClassPrimary)}, 10 * time.Millisecond},
		{"two 0.5 Mbit/s links: 24 ms", []sched.LinkParams{link(0.5e6, true, sched.ClassPrimary), link(0.5e6, true, sched.ClassPrimary)}, 24 * time.Millisecond},
		{"slower than 120 kbit/s: capped", []sched.LinkParams{link(50e3, true, sched.ClassPrimary), link(60e3, true, sched.ClassPrimary)}, 100 * time.Millisecond},
		{"a slow link that is down does not count", []sched.LinkParams{link(0.2e6, false, sched.ClassPrimary), link(10e6, true, sched.ClassPrimary), link(10e6, true, sched.ClassPrimary)}, 10 * time.Millisecond},
		{"a lone usable link: the whole budget", []sched.LinkParams{link(10e6, false, sched.ClassPrimary), link(2e6, true, sched.ClassBackup)}, 100 * time.Millisecond},
		{"nor a slow overflow link", []sched.LinkParams{link(0.2e6, true, sched.ClassOverflow), link(10e6, true, sched.ClassPrimary)}, 10 * time.Millisecond},
	}
	for _, c := range cases {
		if got := aqmTarget(10*time.Millisecond, 100*time.Millisecond, c.links); got != c.want {
			t.Errorf("%s: target %s, want %s", c.name, got, c.want)
		}
	}
	// A lower ceiling (aqm.max_target) keeps the latency: two 0.2 Mbit/s lines' 60 ms is
	// cut to it, and a ceiling at the target keeps the target.
	adsl := []sched.LinkParams{link(0.2e6, true, sched.ClassPrimary), link(0.2e6, true, sched.ClassPrimary)}
	for _, c := range []struct{ ceiling, want time.Duration }{{30 * time.Millisecond, 30 * time.Millisecond},
		{10 * time.Millisecond, 10 * time.Millisecond}, {0, 10 * time.Millisecond}} {
		if got := aqmTarget(10*time.Millisecond, c.ceiling, adsl); got != c.want {
			t.Errorf("ceiling %s: target %s, want %s", c.ceiling, got, c.want)
		}
	}
}

// An AQM drop's answer can show two RTTs of the fastest link carrying traffic and a
// report period later at the soonest; links that carry nothing now do not count.
func TestAQMReactionIsTheEarliestAnswer(t *testing.T) {
	const period = 100 * time.Millisecond
	ms := time.Millisecond
	link := func(usable bool, class sched.Class) sched.LinkParams {
		return sched.LinkParams{RateBps: 1e6, Usable: usable, Class: class}
	}
	cases := []struct {
		name  string
		links []sched.LinkParams
		rtts  []time.Duration
		want  time.Duration
	}{
		{"the faster of two primaries", []sched.LinkParams{link(true, sched.ClassPrimary), link(true, sched.ClassPrimary)},
			[]time.Duration{75 * ms, 20 * ms}, 140 * ms},
		{"an idle backup does not count", []sched.LinkParams{link(true, sched.ClassPrimary), link(true, sched.ClassBackup)},
			[]time.Duration{40 * ms, 10 * ms}, 180 * ms},
		{"nor a dead primary", []sched.LinkParams{link(false, sched.ClassPrimary), link(true, sched.ClassPrimary)},
			[]time.Duration{5 * ms, 40 * ms}, 180 * ms},
		{"the backup alone, once the primaries are down", []sched.LinkParams{link(false, sched.ClassPrimary), link(true, sched.ClassBackup)},
			[]time.Duration{12 * ms, 75 * ms}, 250 * ms},
		{"nothing usable: a period", []sched.LinkParams{link(false, sched.ClassPrimary)}, []time.Duration{50 * ms}, period},
	}
	for _, c := range cases {
		if got := aqmReaction(period, c.links, c.rtts); got != c.want {
			t.Errorf("%s: reaction %s, want %s", c.name, got, c.want)
		}
	}
}
