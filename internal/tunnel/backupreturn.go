package tunnel

// The primaries' return (docs/architecture.md §5, link classes). A backup link carries
// traffic only while no primary is up. Read literally, the traffic leaves it the moment
// the first primary answers again, whatever that primary's rate: in the lab's standby
// scenario the 0.2-Mbit/s ADSL upstream answered 0.18 s before cable and got the whole
// 2-Mbit/s flow the LTE backup had been carrying, eleven packets in 0.1 s, which its
// queue could not hold (TCP retransmitted all eleven and its window went with them).
//
// So until the primaries that are back can carry what the backups could (their rates
// summed), and for backupReturnWindow after the last moment without a primary at the
// most, backup links are scheduled as overflow links: they take what the primaries
// cannot (once every one of them has the overflow threshold queued, sched.Config), and
// nothing while those can. Then they are backups again, and the bond's AQM makes the
// flows fit the primaries: a window cut where there was a burst of losses. Ending the
// window as soon as the primaries can take the load keeps a flow from growing into the
// backup when the primaries are the faster ones (downstream in the lab, where cable
// alone is faster than LTE): it would only lose what it grew by when the window ends.
//
// Why here and not in sched.allowedClasses: the window needs a clock and a memory of
// the outage, and the scheduler's class rules are per-packet arithmetic mirrored by the
// BPF fast path (aggd_sched.h). Rewriting the classes the control plane hands to both
// keeps the two schedulers deciding alike with no new state in either.

import (
	"time"

	"github.com/aggd/aggd/internal/sched"
)

// backupReturnWindow is how long backups stay overflow links after a primary is back,
// at the most: long enough for the other primaries to answer too (they come back
// within a probe interval or two of each other when one cause took them down) and for
// the flows to settle on them; short enough that a metered backup carries at most a
// couple of seconds of overflow for each outage.
const backupReturnWindow = 2 * time.Second

// backupReturn tracks that window for one session. Guarded by the session's txMu.
type backupReturn struct {
	until  int64 // clock.Nanos when the window ends; 0: no outage of the primaries to end
	inside bool  // the window is running: a primary is back, backups are overflow links
	// standbyBps is what the usable standby links could carry (their rates summed) when
	// the bond was last without a primary: what the primaries must take over.
	standbyBps float64
	// primaryWasUp: a primary has been usable in this session. Only primaries that
	// were up can come back: at start-up a backup that answers a few milliseconds
	// before the primaries stood in for nothing (a data-capped backup carried 5 % of a
	// transfer after a restart in CI's e2e test).
	primaryWasUp bool
}

// apply rewrites params, the links as the schedulers are about to get them at now, for
// the window: backup links that are usable become overflow links while it runs. began
// and ended report that it started or ran out with this call, for the log.
func (b *backupReturn) apply(params []sched.LinkParams, now int64) (began, ended bool) {
	primary, standby := false, false
	var primaryBps, standbyBps float64
	for _, p := range params {
		if !p.Usable {
			continue
		}
		if p.Class == sched.ClassPrimary {
			primary = true
			primaryBps += p.RateBps
		} else {
			standby = true
			standbyBps += p.RateBps
		}
	}
	if primary {
		b.primaryWasUp = true
	}
	switch {
	case !primary:
		// The standby links carry the traffic (or nothing does): the window starts
		// when a primary is back. Without a standby link there is nothing to hand back.
		if standby && b.primaryWasUp {
			b.until, b.standbyBps = now+int64(backupReturnWindow), standbyBps
		}
		b.inside = false
		return false, false
	case b.until == 0:
		return false, false
	case now >= b.until || primaryBps >= b.standbyBps:
		ended = b.inside
		b.until, b.inside = 0, false
		return false, ended
	}
	began, b.inside = !b.inside, true
	for i := range params {
		if params[i].Usable && params[i].Class >= sched.ClassBackup {
			params[i].Class = sched.ClassOverflow
		}
	}
	return began, false
}

// pending reports whether the window may still have to begin or end: the session
// refreshes the schedule on its tick while it does, so that it ends on time.
func (b *backupReturn) pending() bool { return b.until != 0 }
