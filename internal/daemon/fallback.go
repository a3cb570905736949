package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/aggd/aggd/internal/config"
	"github.com/aggd/aggd/internal/fallback"
	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/netcfg"
	"github.com/aggd/aggd/internal/sched"
	"github.com/aggd/aggd/internal/tunnel"
)

// headendWatch switches the CPE's LAN traffic to direct routing while the headend is
// silent and back to the bond when it answers (fallback.enabled).
type headendWatch struct {
	log     *slog.Logger
	m       *metrics.Set
	cfg     config.Fallback
	heard   time.Duration // silence shorter than this counts as "the headend answers"
	uplinks []config.Uplink
	router  fallback.Router
	cpe     *tunnel.CPE
	direct  bool
	exits   []directExit // where direct traffic leaves, one per IP version that can
}

// directExit is the uplink direct traffic of one IP version leaves by, and its exit.
type directExit struct {
	uplink config.Uplink
	exit   fallback.Exit
}

// fallbackPoll is how often the watch looks at the headend's silence.
const fallbackPoll = 500 * time.Millisecond

// watchHeadend starts the watch; the returned stop ends it and removes what it
// installed (established direct connections then take the bond, and break).
func watchHeadend(ctx context.Context, log *slog.Logger, m *metrics.Set, cfg *config.CPE, tunName string, cpe *tunnel.CPE) (stop func()) {
	w := &headendWatch{
		log: log.With("part", "fallback"), m: m, cfg: cfg.Fallback, heard: cfg.Probe.DownAfter,
		uplinks: cfg.Uplinks, cpe: cpe, router: fallback.Router{Tunnel: tunName},
	}
	for _, u := range cfg.Uplinks {
		w.router.Uplinks = append(w.router.Uplinks, u.Interface)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

func (w *headendWatch) run(ctx context.Context) {
	t := time.NewTicker(fallbackPoll)
	defer t.Stop()
	defer func() {
		if err := fallback.Remove(); err != nil {
			w.log.Warn("could not remove the direct-routing rules", "err", err)
		}
		w.m.FallbackDirect.Set(0)
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.check()
		}
	}
}

// check switches to direct routing after cfg.DirectAfter of silence and back once the
// headend is heard again.
func (w *headendWatch) check() {
	silent := w.cpe.Silence()
	if w.direct && silent >= w.heard {
		w.keepExit()
		return
	}
	switch {
	case !w.direct && silent > w.cfg.DirectAfter:
		exits, err := w.chooseExits(nil)
		if err == nil {
			err = w.router.Direct(exitsOf(exits))
		}
		if err != nil {
			w.log.Warn("headend silent, but cannot route directly; LAN traffic keeps waiting for the bond",
				"silent", silent.Round(time.Second), "err", err)
			return
		}
		w.direct, w.exits = true, exits
		w.m.FallbackDirect.Set(1)
		w.m.FallbackTransitions.WithLabelValues("direct").Inc()
		w.log.Warn("headend silent: new LAN connections now leave directly (NAT to the uplink's address)",
			"silent", silent.Round(time.Second), "exits", describeExits(exits))
	case w.direct && silent < w.heard:
		if err := w.router.Bond(); err != nil {
			w.log.Warn("headend answers again, but cannot switch new connections back to the bond", "err", err)
			return
		}
		w.direct = false
		w.m.FallbackDirect.Set(0)
		w.m.FallbackTransitions.WithLabelValues("bond").Inc()
		w.log.Info("headend answers again: new connections use the bond; direct ones stay direct until they end",
			"exits", describeExits(w.exits))
	}
}

// keepExit moves direct routing of an IP version to another uplink if its current one
// lost its carrier, its address or its next hop, and re-installs the routes (the kernel
// deletes a route when its interface goes down). Connections already direct through
// the old uplink keep its address and break; new ones work.
func (w *headendWatch) keepExit() {
	exits, err := w.chooseExits(w.exits)
	if err == nil && slices.Equal(exitsOf(exits), exitsOf(w.exits)) {
		if err := w.router.Refresh(exitsOf(exits)); err != nil {
			w.log.Warn("cannot refresh the direct routes", "err", err)
		}
		return
	}
	if err == nil {
		err = w.router.Direct(exitsOf(exits))
	}
	if err != nil {
		w.log.Warn("direct uplinks lost and no other can carry direct traffic", "exits", describeExits(w.exits), "err", err)
		return
	}
	w.log.Warn("direct traffic moved to other uplinks", "from", describeExits(w.exits), "to", describeExits(exits))
	w.exits = exits
}

// chooseExits picks, for IPv4 and for IPv6, the uplink direct traffic leaves by: the
// current one (in was) while it still can, else the first primary uplink (in config
// order) that has carrier, an address of the version and a next hop (its configured
// gateway, the gateway of a default route on it, or none on a point-to-point link),
// then the others. A version no uplink can carry is left out (its new connections
// keep waiting for the bond); none at all is an error.
func (w *headendWatch) chooseExits(was []directExit) ([]directExit, error) {
	var out []directExit
	var errs []error
	for _, v6 := range []bool{false, true} {
		if e, ok := w.chooseExit(was, v6, &errs); ok {
			out = append(out, e)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no uplink can carry direct traffic: %w", errors.Join(errs...))
	}
	return out, nil
}

func (w *headendWatch) chooseExit(was []directExit, v6 bool, errs *[]error) (directExit, bool) {
	for _, cur := range was {
		if cur.exit.IPv6 == v6 {
			if exit, err := usableExit(cur.uplink, v6); err == nil && exit == cur.exit {
				return cur, true
			}
		}
	}
	for _, primary := range []bool{true, false} {
		for i, u := range w.uplinks {
			// The class as it is now: a reload may have made a primary a backup.
			if (w.cpe.UplinkClass(i) == sched.ClassPrimary) != primary {
				continue
			}
			exit, err := usableExit(u, v6)
			if err == nil {
				return directExit{u, exit}, true
			}
			*errs = append(*errs, fmt.Errorf("%s: %w", u.Name, err))
		}
	}
	return directExit{}, false
}

func exitsOf(d []directExit) []fallback.Exit {
	out := make([]fallback.Exit, 0, len(d))
	for _, e := range d {
		out = append(out, e.exit)
	}
	return out
}

// describeExits names each IP version's exit, for the log.
func describeExits(d []directExit) string {
	desc := map[bool]string{false: "none", true: "none"}
	for _, e := range d {
		desc[e.exit.IPv6] = e.exit.Interface
		if e.exit.Gateway.IsValid() {
			desc[e.exit.IPv6] += " via " + e.exit.Gateway.String()
		}
	}
	return "IPv4: " + desc[false] + ", IPv6: " + desc[true]
}

// usableExit returns the exit uplink u offers IPv4 (IPv6 if v6) direct traffic, or why
// it offers none.
func usableExit(u config.Uplink, v6 bool) (fallback.Exit, error) {
	l, err := netlink.LinkByName(u.Interface)
	if err != nil {
		return fallback.Exit{}, err
	}
	a := l.Attrs()
	if a.RawFlags&unix.IFF_LOWER_UP == 0 || a.Flags&net.FlagUp == 0 {
		return fallback.Exit{}, errors.New("no carrier")
	}
	fam, version := netlink.FAMILY_V4, "IPv4"
	if v6 {
		fam, version = netlink.FAMILY_V6, "IPv6"
	}
	if addrs, err := netcfg.GlobalAddresses(u.Interface, v6); err != nil || len(addrs) == 0 {
		return fallback.Exit{}, fmt.Errorf("no global %s address", version)
	}
	exit := fallback.Exit{Interface: u.Interface, IPv6: v6}
	if u.Gateway.IsValid() && u.Gateway.Is6() == v6 {
		exit.Gateway = u.Gateway
		return exit, nil
	}
	routes, err := netlink.RouteListFiltered(fam,
		&netlink.Route{LinkIndex: a.Index, Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err == nil {
		for _, r := range routes {
			if netcfg.IsDefaultRoute(&r) && r.Gw != nil {
				if gw, ok := netip.AddrFromSlice(r.Gw); ok && gw.Unmap().Is6() == v6 {
					exit.Gateway = gw.Unmap()
					return exit, nil
				}
			}
		}
	}
	if a.Flags&net.FlagPointToPoint != 0 {
		return exit, nil
	}
	return fallback.Exit{}, fmt.Errorf("no %s gateway: set the uplink's gateway in the config, or give it a default route", version)
}
