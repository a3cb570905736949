package daemon

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/aggd/aggd/internal/netcfg"
)

// When an interface's carrier comes back (a CPE's uplink, a headend's interface), its
// neighbour entries left unresolved while it was down are deleted, so that they are
// asked for again at once rather than a retrans time later (a second by default). The
// next hop may also miss the first question asked after the return: the far end of a
// cable that came back, or the other end of a veth pair, can have its carrier before
// its own transmit queue is running again, and its answer is dropped. The entry then
// stays INCOMPLETE until the kernel asks again, a retrans time later, and the link's
// probes and data wait in it (the CI run of 15fa6e0: with a retrans time of 20 s, up3
// carried nothing after its return). So the interface's entries are looked at again a
// few times in the moments after the return, and those left unanswered are deleted
// once more.

// recheckAt is when, after the carrier's return, the interface's entries are looked at
// again: by then a next hop that came back with us has long answered.
var recheckAt = []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond}

// unansweredAfter is how long an entry waits for its answer before a recheck takes it
// for unanswered: a neighbour on the link answers within a few milliseconds, and a
// younger entry is one a packet created a moment ago, its question still on the way.
const unansweredAfter = 100 * time.Millisecond

// neighbourRechecks deletes interfaces' unresolved neighbour entries at their
// carrier's return and in the moments after it, until the carrier goes again or ctx
// ends.
type neighbourRechecks struct {
	ctx context.Context
	// at is recheckAt, and flush netcfg.FlushUnresolvedNeighbours, but in tests.
	at    []time.Duration
	flush func(ifname string, olderThan time.Duration) (int, error)

	mu  sync.Mutex
	gen map[string]uint64 // per interface: the current return; a carrier change ends it
}

func newNeighbourRechecks(ctx context.Context) *neighbourRechecks {
	return &neighbourRechecks{ctx: ctx, at: recheckAt, flush: netcfg.FlushUnresolvedNeighbours, gen: make(map[string]uint64)}
}

// carrier is told that interface ifname lost its carrier (up false: the rechecks of its
// last return stop; so for a deleted interface) or has it again: its unresolved entries
// are deleted now, and those still unanswered at each of recheckAt.
func (r *neighbourRechecks) carrier(log *slog.Logger, ifname string, up bool) {
	r.mu.Lock()
	r.gen[ifname]++
	gen := r.gen[ifname]
	r.mu.Unlock()
	if !up {
		return
	}
	r.delete(log, ifname, 0)
	for _, at := range r.at {
		time.AfterFunc(at, func() {
			if r.current(ifname, gen) {
				r.delete(log, ifname, at)
			}
		})
	}
}

// current reports whether gen is still interface ifname's return, and the daemon runs.
func (r *neighbourRechecks) current(ifname string, gen uint64) bool {
	if r.ctx.Err() != nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gen[ifname] == gen
}

// delete deletes an interface's unresolved neighbour entries and logs what it did: at
// the carrier's return (since 0) all of them, left unresolved while it was down; at a
// recheck since the return, those left unanswered for unansweredAfter.
func (r *neighbourRechecks) delete(log *slog.Logger, ifname string, since time.Duration) {
	olderThan := time.Duration(0)
	if since > 0 {
		olderThan = unansweredAfter
	}
	n, err := r.flush(ifname, olderThan)
	if err != nil {
		log.Warn("cannot delete the interface's unresolved neighbour entries; a next hop left unresolved may take a second to answer",
			"interface", ifname, "err", err)
	}
	switch {
	case n == 0:
	case since == 0:
		log.Info("neighbour entries left unresolved while the interface was down deleted, so that they resolve at once",
			"interface", ifname, "entries", n)
	default:
		log.Info("neighbour entries still unanswered after the carrier's return deleted, so that they are asked again at once: "+
			"the next hop missed the first question (its side was not ready yet)",
			"interface", ifname, "entries", n, "since_return", since)
	}
}
