package daemon

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/aggd/aggd/internal/config"
	"github.com/aggd/aggd/internal/datacap"
	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/tunnel"
)

// Data caps (uplinks[].data_cap): each capped uplink's interface counters are read
// every capPollInterval and added up per billing period; an uplink whose allowance is
// used up carries traffic only as a backup until its next period begins. The counts
// are saved in state_dir, so that a restart does not start the period over.

const (
	// capPollInterval is how often the interfaces' counters are read: a link at
	// 100 Mbit/s overshoots its cap by at most this much traffic (25 MB).
	capPollInterval = 2 * time.Second
	// capSaveInterval is how often the counts are saved while they change; a crash
	// (not a stop: that saves) forgets at most this much of the count.
	capSaveInterval = time.Minute
)

// capWatch is the data-cap accounting of a CPE's uplinks.
type capWatch struct {
	log     *slog.Logger
	m       *metrics.Set
	cpe     *tunnel.CPE
	path    string
	meters  []*datacap.Meter
	ids     []int    // the uplink index of each meter
	ifaces  []string // the uplink interface of each meter
	reached []bool
	saveErr bool // the last save failed (logged once until one works)
}

// watchDataCaps starts counting the capped uplinks of cfg, restoring the counts a
// previous run saved for the current periods (an uplink over its cap is a backup from
// the start). The returned function waits for the final save after ctx ends; it is a
// no-op when no uplink has a cap.
func watchDataCaps(ctx context.Context, log *slog.Logger, m *metrics.Set, cfg *config.CPE, cpe *tunnel.CPE) (wait func()) {
	w := &capWatch{log: log, m: m, cpe: cpe, path: filepath.Join(cfg.StateDir, datacap.FileName)}
	for i, u := range cfg.Uplinks {
		if !u.DataCap.Enabled() {
			continue
		}
		w.meters = append(w.meters, &datacap.Meter{Name: u.Name, Limit: uint64(u.DataCap.Limit), Schedule: schedule(u.DataCap)})
		w.ids = append(w.ids, i)
		w.ifaces = append(w.ifaces, u.Interface)
		w.reached = append(w.reached, false)
	}
	if len(w.meters) == 0 {
		return func() {}
	}
	now := time.Now()
	restored, err := datacap.Load(w.path, now, w.meters)
	if err != nil {
		log.Warn("data caps: counting this period from zero", "err", err)
	}
	w.poll(now)
	for k, mt := range w.meters {
		log.Info("data cap: counting the uplink's traffic", "link", mt.Name, "limit_bytes", mt.Limit,
			"used_bytes", mt.Used(), "restored", slices.Contains(restored, mt.Name),
			"period_start", mt.PeriodStart().Format(time.RFC3339), "period_end", mt.PeriodEnd().Format(time.RFC3339),
			"interface", w.ifaces[k])
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(ctx)
	}()
	return func() { <-done }
}

// schedule turns a config's data cap into its billing schedule.
func schedule(d config.DataCap) datacap.Schedule {
	p := map[config.CapPeriod]datacap.Period{config.CapMonthly: datacap.Monthly, config.CapWeekly: datacap.Weekly,
		config.CapDaily: datacap.Daily}[d.EffectivePeriod()]
	return datacap.Schedule{Period: p, Day: d.EffectiveResetDay()}
}

// run reads the counters every capPollInterval and saves them every capSaveInterval,
// at a change of state and when ctx ends.
func (w *capWatch) run(ctx context.Context) {
	poll := time.NewTicker(capPollInterval)
	defer poll.Stop()
	lastSave := time.Now()
	for {
		select {
		case <-ctx.Done():
			w.poll(time.Now())
			w.save()
			return
		case now := <-poll.C:
			if w.poll(now) || now.Sub(lastSave) >= capSaveInterval {
				w.save()
				lastSave = now
			}
		}
	}
}

// poll reads each capped uplink's interface, updates its meter and metrics, and moves
// the uplink in or out of its capped state. It reports whether any uplink did.
func (w *capWatch) poll(now time.Time) (changed bool) {
	for k, mt := range w.meters {
		c, ok := interfaceCounters(w.ifaces[k])
		mt.Observe(now, c, ok)
		lbl := mt.Name
		w.m.DataUsed.WithLabelValues(lbl).Set(float64(mt.Used()))
		w.m.DataCap.WithLabelValues(lbl).Set(float64(mt.Limit))
		w.m.DataPeriodEnd.WithLabelValues(lbl).Set(float64(mt.PeriodEnd().Unix()))
		reached := mt.Reached()
		w.m.DataCapReached.WithLabelValues(lbl).Set(boolGauge(reached))
		if reached == w.reached[k] {
			continue
		}
		w.reached[k], changed = reached, true
		w.cpe.SetCapReached(w.ids[k], reached)
		if reached {
			w.log.Warn("uplink used up its data cap: it carries traffic only as a backup (while no primary or overflow "+
				"link is up) until the period ends", "link", mt.Name, "used_bytes", mt.Used(), "limit_bytes", mt.Limit,
				"until", mt.PeriodEnd().Format(time.RFC3339))
		} else {
			w.log.Info("data cap: a new period began; the uplink carries traffic by its class again", "link", mt.Name,
				"period_end", mt.PeriodEnd().Format(time.RFC3339))
		}
	}
	return changed
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// save writes the counts to the state file. A failure is logged once (the counting
// goes on in memory) until a save works again.
func (w *capWatch) save() {
	err := datacap.Save(w.path, w.meters)
	switch {
	case err != nil && !w.saveErr:
		w.log.Warn("data caps: cannot save the uplinks' counts; a restart will count this period from zero", "err", err)
	case err == nil && w.saveErr:
		w.log.Info("data caps: the uplinks' counts are saved again", "file", w.path)
	}
	w.saveErr = err != nil
}

// interfaceCounters reads an interface's byte counters; ok is false when it is
// missing (or the kernel keeps no statistics for it).
func interfaceCounters(name string) (datacap.Counters, bool) {
	l, err := netlink.LinkByName(name)
	if err != nil || l.Attrs().Statistics == nil {
		return datacap.Counters{}, false
	}
	a := l.Attrs()
	return datacap.Counters{Index: a.Index, Rx: a.Statistics.RxBytes, Tx: a.Statistics.TxBytes}, true
}
