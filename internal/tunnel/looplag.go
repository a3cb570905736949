package tunnel

// The control loop's own lateness. Every health verdict is a silence measured on the
// wall clock, and a daemon that could not run for half a second (a router's CPU busy
// with forwarding, a stalled VM) sees every link silent for that long when it runs
// again: its probes were not sent, and the replies already in its sockets not read.
// The lab's loaded VM suspected healthy links that way, all of a session's at once on
// both sides. How late the loop runs is measured here, exported, and logged, so that
// an operator can tell a CPU too busy for aggd from links that fail.

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// lateWarnAfter is how many loop intervals late a run must come to be logged: the
// suspicion time (three probe intervals), by when a healthy link may be suspected for
// a silence that was aggd's own.
const lateWarnAfter = 3

// lateWarnEvery bounds the warnings to one per this period; the metric counts them all.
const lateWarnEvery = 10 * time.Second

// loopLag measures how late each run of a control loop comes. Not safe for concurrent
// use: one loop owns it.
type loopLag struct {
	interval time.Duration
	late     prometheus.Observer
	log      *slog.Logger
	last     time.Time // the previous run
	warned   time.Time // the last warning
	unwarned int       // late runs since then that were not logged
}

func newLoopLag(interval time.Duration, late prometheus.Observer, log *slog.Logger) *loopLag {
	return &loopLag{interval: interval, late: late, log: log}
}

// observe notes a run of the loop at now (the wall clock when it runs: the ticker's
// own time says when it fired, not when aggd got to it) and returns how late it came,
// the gap since the previous run beyond the interval.
func (l *loopLag) observe(now time.Time) time.Duration {
	prev := l.last
	l.last = now
	if prev.IsZero() {
		return 0
	}
	late := max(0, now.Sub(prev)-l.interval)
	l.late.Observe(late.Seconds())
	if late >= lateWarnAfter*l.interval {
		if now.Sub(l.warned) >= lateWarnEvery {
			l.log.Warn("control loop ran late: aggd could not run (a CPU too busy?); links may be suspected for its own silence",
				"late", late.Round(time.Millisecond), "interval", l.interval, "late_runs_not_logged", l.unwarned)
			l.warned, l.unwarned = now, 0
		} else {
			l.unwarned++
		}
	}
	return late
}
