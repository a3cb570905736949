package daemon

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	// capSaveInterval is how often the counts are saved while they change (a CPE's
	// flash should not be rewritten every minute for years); sooner when one moved by
	// a hundredth of its limit. Each count is saved with the interface reading it
	// counts up to, so a daemon that crashes forgets nothing (the next start counts
	// from that reading); a power cut, which takes the interfaces' counters with it,
	// forgets at most this much.
	capSaveInterval = 10 * time.Minute
)

// capWatch is the data-cap accounting of a CPE's uplinks. Its fields are per uplink,
// by index; meters[i] is nil for an uplink without a cap. mu guards them against a
// reload (apply) while a poll runs.
type capWatch struct {
	log     *slog.Logger
	m       *metrics.Set
	cpe     *tunnel.CPE
	path    string
	mu      sync.Mutex
	meters  []*datacap.Meter
	ifaces  []string
	saved   map[string]uint64  // each meter's count at the last save
	warned  map[string]warning // when a meter's 90 % was logged
	saveErr bool               // the last save failed (logged once until one works)
	boot    string             // the kernel's boot ID, saved with each meter's last reading
}

// watchDataCaps starts counting the capped uplinks of cfg, restoring the counts a
// previous run saved for the current periods (an uplink over its cap is a backup from
// the start). The returned watch takes reloaded caps (apply); its wait waits for the
// final save after ctx ends.
func watchDataCaps(ctx context.Context, log *slog.Logger, m *metrics.Set, cfg *config.CPE, cpe *tunnel.CPE) (w *capWatch, wait func()) {
	n := len(cfg.Uplinks)
	w = &capWatch{log: log, m: m, cpe: cpe, path: filepath.Join(cfg.StateDir, datacap.FileName),
		meters: make([]*datacap.Meter, n), ifaces: make([]string, n), boot: datacap.BootID()}
	for i, u := range cfg.Uplinks {
		w.ifaces[i] = u.Interface
		if u.DataCap.Enabled() {
			w.meters[i] = w.newMeter(u)
		}
	}
	now := time.Now()
	if capped := w.capped(); len(capped) > 0 {
		if w.boot == "" {
			log.Warn("data caps: cannot read the kernel's boot ID; what the uplinks carry while aggd is stopped will not be counted",
				"file", datacap.BootIDFile)
		}
		restored, err := datacap.Load(w.path, now, capped)
		if err != nil {
			log.Warn("data caps: counting this period from zero", "err", err)
		}
		before := make([]uint64, n)
		for i, mt := range w.meters {
			if mt != nil {
				before[i] = mt.Used()
			}
		}
		w.poll(now) // a restored meter's first reading adds what its line carried while aggd was stopped
		for i, mt := range w.meters {
			if mt != nil {
				w.logCounting(mt, i, slices.Contains(restored, mt.Name), mt.Used()-min(mt.Used(), before[i]))
			}
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(ctx)
	}()
	return w, func() { <-done }
}

// capped is the meters of the uplinks that have a cap.
func (w *capWatch) capped() []*datacap.Meter {
	var out []*datacap.Meter
	for _, mt := range w.meters {
		if mt != nil {
			out = append(out, mt)
		}
	}
	return out
}

// newMeter is a meter for uplink u's data cap.
func (w *capWatch) newMeter(u config.Uplink) *datacap.Meter {
	return &datacap.Meter{Name: u.Name, Limit: uint64(u.DataCap.Limit), Schedule: schedule(u.DataCap), Boot: w.boot}
}

// logCounting says that an uplink's traffic is counted, from which count: restored
// from the state file, and stopped the bytes its interface carried while aggd was not
// running (since the count was saved).
func (w *capWatch) logCounting(mt *datacap.Meter, i int, restored bool, stopped uint64) {
	w.log.Info("data cap: counting the uplink's traffic", "link", mt.Name, "limit_bytes", mt.Limit,
		"used_bytes", mt.Used(), "restored", restored, "while_stopped_bytes", stopped,
		"period_start", mt.PeriodStart().Format(time.RFC3339), "period_end", mt.PeriodEnd().Format(time.RFC3339),
		"interface", w.ifaces[i])
}

// apply takes the data caps of a reloaded config that lists the same uplinks (a limit
// raised by a top-up, a cap added or removed) and reports whether any changed. A cap
// added counts from now; a changed period starts its count again.
func (w *capWatch) apply(ups []config.Uplink) (changed []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	for i, u := range ups {
		mt := w.meters[i]
		switch {
		case !u.DataCap.Enabled() && mt == nil:
			continue
		case !u.DataCap.Enabled():
			w.meters[i] = nil
			for _, g := range []*prometheus.GaugeVec{w.m.DataUsed, w.m.DataCap, w.m.DataCapReached, w.m.DataPeriodEnd} {
				g.DeleteLabelValues(u.Name)
			}
			w.cpe.SetCapReached(i, false)
			w.log.Info("reload: data cap removed; the uplink carries traffic by its class again", "link", u.Name)
		case mt == nil:
			mt = w.newMeter(u)
			w.meters[i] = mt
			mt.Observe(now, datacap.Counters{}, false) // into its period; counting from the next reading
			w.logCounting(mt, i, false, 0)
		case mt.Limit == uint64(u.DataCap.Limit) && mt.Schedule == schedule(u.DataCap):
			continue
		default:
			w.log.Info("reload: data cap changed", "link", u.Name, "limit_bytes", uint64(u.DataCap.Limit), "was_limit_bytes", mt.Limit)
			mt.Limit, mt.Schedule = uint64(u.DataCap.Limit), schedule(u.DataCap)
		}
		changed = append(changed, u.Name)
	}
	if len(changed) > 0 {
		w.pollLocked(now)
		w.saveLocked()
	}
	return changed
}

// warning is the period and limit a 90 % warning was logged for: a new period or a
// new limit (a top-up) warns again.
type warning struct {
	period int64 // its start, Unix time
	limit  uint64
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
			if w.poll(now) || w.saveDue(now.Sub(lastSave) >= capSaveInterval) {
				w.save()
				lastSave = now
			}
		}
	}
}

func (w *capWatch) poll(now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pollLocked(now)
}

// pollLocked reads each capped uplink's interface, updates its meter and metrics, and
// moves the uplink in or out of its capped state. It reports whether any uplink did.
func (w *capWatch) pollLocked(now time.Time) (changed bool) {
	for i, mt := range w.meters {
		if mt == nil {
			continue
		}
		c, ok := interfaceCounters(w.ifaces[i])
		mt.Observe(now, c, ok)
		lbl := mt.Name
		w.m.DataUsed.WithLabelValues(lbl).Set(float64(mt.Used()))
		w.m.DataCap.WithLabelValues(lbl).Set(float64(mt.Limit))
		w.m.DataPeriodEnd.WithLabelValues(lbl).Set(float64(mt.PeriodEnd().Unix()))
		reached := mt.Reached()
		w.m.DataCapReached.WithLabelValues(lbl).Set(boolGauge(reached))
		if key := (warning{mt.PeriodStart().Unix(), mt.Limit}); !reached && mt.Used() >= mt.Limit/10*9 && w.warned[lbl] != key {
			if w.warned == nil {
				w.warned = map[string]warning{}
			}
			w.warned[lbl] = key
			w.log.Info("uplink has used 90 % of its data cap", "link", lbl, "used_bytes", mt.Used(), "limit_bytes", mt.Limit,
				"period_end", mt.PeriodEnd().Format(time.RFC3339))
		}
		if !w.cpe.SetCapReached(i, reached) {
			continue
		}
		changed = true
		if reached {
			w.log.Warn("uplink used up its data cap: it carries traffic only as a backup (while no primary link is up, "+
				"and for up to 2 s after one is back what the primaries cannot carry yet) "+
				"until the period ends", "link", mt.Name, "used_bytes", mt.Used(), "limit_bytes", mt.Limit,
				"until", mt.PeriodEnd().Format(time.RFC3339))
		} else {
			w.log.Info("data cap: the uplink is within its cap again (a new period, or a higher limit); it carries traffic by its class",
				"link", mt.Name, "used_bytes", mt.Used(), "limit_bytes", mt.Limit, "period_end", mt.PeriodEnd().Format(time.RFC3339))
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

// saveDue says whether the counts are to be saved now: one moved by a hundredth of its
// limit since the last save, or, when the save interval is over (late), moved at all.
func (w *capWatch) saveDue(late bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, mt := range w.capped() {
		moved := mt.Used() - min(mt.Used(), w.saved[mt.Name]) // a new period counts from 0
		if moved >= mt.Limit/100 || (late && mt.Used() != w.saved[mt.Name]) {
			return true
		}
	}
	return false
}

func (w *capWatch) save() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.saveLocked()
}

// saveLocked writes the counts to the state file. A failure is logged once (the
// counting goes on in memory) until a save works again.
func (w *capWatch) saveLocked() {
	capped := w.capped()
	if len(capped) == 0 {
		return // no cap: no file
	}
	err := datacap.Save(w.path, capped)
	switch {
	case err != nil && !w.saveErr:
		w.log.Warn("data caps: cannot save the uplinks' counts; a restart will count this period from zero", "err", err)
	case err == nil && w.saveErr:
		w.log.Info("data caps: the uplinks' counts are saved again", "file", w.path)
	}
	w.saveErr = err != nil
	if err == nil {
		w.saved = map[string]uint64{}
		for _, mt := range capped {
			w.saved[mt.Name] = mt.Used()
		}
	}
}

// interfaceCounters reads what an interface carried in IP bytes (its byte counters
// less the Ethernet headers they include on an Ethernet interface); ok is false when
// it is missing (or the kernel keeps no statistics for it).
func interfaceCounters(name string) (datacap.Counters, bool) {
	l, err := netlink.LinkByName(name)
	if err != nil || l.Attrs().Statistics == nil {
		return datacap.Counters{}, false
	}
	a := l.Attrs()
	var hdr uint64
	if a.EncapType == "ether" {
		hdr = datacap.EthernetHeaderLen
	}
	s := a.Statistics
	return datacap.Counters{Index: a.Index, Rx: datacap.IPBytes(s.RxBytes, s.RxPackets, hdr), Tx: datacap.IPBytes(s.TxBytes, s.TxPackets, hdr)}, true
}
