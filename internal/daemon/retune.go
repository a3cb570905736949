package daemon

import (
	"context"
	"log/slog"
	"slices"
	"strings"

	"github.com/aggd/aggd/internal/config"
	"github.com/aggd/aggd/internal/netcfg"
	"github.com/aggd/aggd/internal/tunnel"
)

// CPE config reload (SIGHUP, `systemctl reload aggd-cpe`). The uplinks' class, rate
// priors, weight and data cap apply to the running session, without a new handshake: a metered
// LTE link can become a backup, or a line's rate be corrected, with nothing dropped.
// Everything else (an uplink added or removed, its interface or addresses, the tunnel,
// the keys) binds sockets, routes and programs and takes effect at the next restart;
// the reload says which settings differ. A config that does not validate changes
// nothing: the running one stays, and the log lists the problems.

// retuneUplinksOnRequest applies the config file's uplink tuning and data caps each
// time opts.Reload fires, until ctx ends.
func retuneUplinksOnRequest(ctx context.Context, log *slog.Logger, opts Options, running *config.CPE, cpe *tunnel.CPE, caps *capWatch) {
	// An uplink's interface may be missing for a while (a PPPoE line reconnecting, an
	// LTE modem reset): the file is no worse for it, and a reload then (to make that
	// link a backup, say) must not be refused.
	load := func(path string) (*config.CPE, error) {
		return config.LoadCPEWith(path, config.Options{InterfaceExists: func(name string) bool {
			if slices.ContainsFunc(running.Uplinks, func(u config.Uplink) bool { return u.Interface == name }) {
				return true
			}
			_, err := netcfg.InterfaceByName(name)
			return err == nil
		}})
	}
	onEachReload(ctx, log, opts, load, func(next *config.CPE) {
		same := sameUplinks(running.Uplinks, next.Uplinks)
		if keys := restartOnlyChanges(running, withTuningOf(next, running, same), ""); len(keys) > 0 {
			msg := "reload: these settings changed but take effect only at a restart"
			if !same {
				msg += " (uplinks added, removed, renamed or moved: their classes, rates, weights and data caps are left as they are too)"
			}
			log.Warn(msg, "keys", strings.Join(keys, ", "))
		}
		if !same {
			return
		}
		// running.Uplinks is replaced, not written into: the uplink watch shares the
		// slice it started with.
		ups := append([]config.Uplink(nil), running.Uplinks...)
		if retuneUplinks(log, cpe, running, next) {
			ups = withTuningOf(running, next, true).Uplinks
		}
		if changed := caps.apply(next.Uplinks); len(changed) > 0 {
			log.Info("reload: data caps applied", "changed", changed)
		}
		for i := range ups {
			ups[i].DataCap = next.Uplinks[i].DataCap
		}
		running.Uplinks = ups
	})
}

// retuneUplinks applies next's uplink classes, rates and weights to the running
// session; false if it could not.
func retuneUplinks(log *slog.Logger, cpe *tunnel.CPE, running, next *config.CPE) bool {
	tunings := make([]tunnel.LinkTuning, len(next.Uplinks))
	for i, u := range next.Uplinks {
		t, err := linkTuning(i, u)
		if err != nil {
			log.Error("reload: uplinks not retuned", "err", err)
			return false
		}
		tunings[i] = t
	}
	changed := cpe.RetuneUplinks(tunings)
	if len(changed) == 0 {
		log.Info("reload: no uplink's class, rates or weight changed")
		return true
	}
	for i, u := range next.Uplinks {
		if was := running.Uplinks[i]; slices.Contains(changed, u.Name) {
			log.Info("reload: uplink retuned in the running session", "link", u.Name,
				"class", u.Class, "was_class", was.Class, "rate_up", u.RateUp, "was_rate_up", was.RateUp,
				"rate_down", u.RateDown, "was_rate_down", was.RateDown, "weight", u.Weight, "was_weight", was.Weight)
		}
	}
	log.Info("reload: uplink classes, rates and weights applied", "changed", changed)
	return true
}

// sameUplinks says whether two configs list the same uplinks, by name, in the same
// order: only then can one's tuning be applied to the other's running links.
func sameUplinks(a, b []config.Uplink) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name {
			return false
		}
	}
	return true
}

// withTuningOf returns a copy of cfg whose uplinks have from's class, rates, weight
// and data cap (when same: the two list the same uplinks), so that comparing it with from
// shows only what a restart would change.
func withTuningOf(cfg, from *config.CPE, same bool) *config.CPE {
	out := *cfg
	if !same {
		return &out
	}
	out.Uplinks = append([]config.Uplink(nil), cfg.Uplinks...)
	for i := range out.Uplinks {
		f := from.Uplinks[i]
		out.Uplinks[i].Class, out.Uplinks[i].RateUp, out.Uplinks[i].RateDown, out.Uplinks[i].Weight = f.Class, f.RateUp, f.RateDown, f.Weight
		out.Uplinks[i].DataCap = f.DataCap // applied by the cap watch, not RetuneUplinks
	}
	return &out
}
