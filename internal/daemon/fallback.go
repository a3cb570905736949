package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/aggd/aggd/internal/config"
	"github.com/aggd/aggd/internal/fallback"
	"github.com/aggd/aggd/internal/metrics"
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
	uplink  config.Uplink // the uplink direct traffic leaves by, and its exit
	exit    fallback.Exit
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
		u, exit, err := w.chooseExit()
		if err == nil {
			err = w.router.Direct(exit)
		}
		if err != nil {
			w.log.Warn("headend silent, but cannot route directly; LAN traffic keeps waiting for the bond",
				"silent", silent.Round(time.Second), "err", err)
			return
		}
		w.direct, w.uplink, w.exit = true, u, exit
		w.m.FallbackDirect.Set(1)
		w.m.FallbackTransitions.WithLabelValues("direct").Inc()
		w.log.Warn("headend silent: new LAN connections now leave directly (NAT to the uplink's address)",
			"silent", silent.Round(time.Second), "via", exit.Interface, "gateway", exit.Gateway)
	case w.direct && silent < w.heard:
		if err := w.router.Bond(); err != nil {
			w.log.Warn("headend answers again, but cannot switch new connections back to the bond", "err", err)
			return
		}
		w.direct = false
		w.m.FallbackDirect.Set(0)
		w.m.FallbackTransitions.WithLabelValues("bond").Inc()
		w.log.Info("headend answers again: new connections use the bond; direct ones stay direct until they end",
			"via", w.exit.Interface)
	}
}

// keepExit moves direct routing to another uplink if the current one lost its carrier,
// its address or its next hop (and re-installs the route, which the kernel deletes when
// the interface goes down). Connections already direct through the old uplink keep its
// address and break; new ones work.
func (w *headendWatch) keepExit() {
	exit, err := usableExit(w.uplink)
	if err == nil && exit == w.exit {
		if err := w.router.Refresh(exit); err != nil {
			w.log.Warn("cannot refresh the direct route", "via", exit.Interface, "err", err)
		}
		return
	}
	u, exit, err := w.chooseExit()
	if err == nil {
		err = w.router.Direct(exit)
	}
	if err != nil {
		w.log.Warn("direct uplink lost and no other can carry direct traffic", "was", w.exit.Interface, "err", err)
		return
	}
	w.log.Warn("direct traffic moved to another uplink", "from", w.exit.Interface, "to", exit.Interface, "gateway", exit.Gateway)
	w.uplink, w.exit = u, exit
}

// chooseExit picks the uplink for direct traffic: the first primary uplink (in config
// order) that has carrier, an IPv4 address and a next hop (its configured gateway, the
// gateway of a default route on it, or none on a point-to-point link); then the others.
func (w *headendWatch) chooseExit() (config.Uplink, fallback.Exit, error) {
	var errs []error
	for _, primary := range []bool{true, false} {
		for _, u := range w.uplinks {
			if (u.Class == config.ClassPrimary) != primary {
				continue
			}
			exit, err := usableExit(u)
			if err == nil {
				return u, exit, nil
			}
			errs = append(errs, fmt.Errorf("%s: %w", u.Name, err))
		}
	}
	return config.Uplink{}, fallback.Exit{}, fmt.Errorf("no uplink can carry direct traffic: %w", errors.Join(errs...))
}

func usableExit(u config.Uplink) (fallback.Exit, error) {
	l, err := netlink.LinkByName(u.Interface)
	if err != nil {
		return fallback.Exit{}, err
	}
	a := l.Attrs()
	if a.RawFlags&unix.IFF_LOWER_UP == 0 || a.Flags&net.FlagUp == 0 {
		return fallback.Exit{}, errors.New("no carrier")
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil || len(addrs) == 0 {
		return fallback.Exit{}, errors.New("no IPv4 address")
	}
	exit := fallback.Exit{Interface: u.Interface}
	if u.Gateway.Is4() {
		exit.Gateway = u.Gateway
		return exit, nil
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4,
		&netlink.Route{LinkIndex: a.Index, Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err == nil {
		for _, r := range routes {
			if (r.Dst == nil || r.Dst.IP.IsUnspecified()) && r.Gw != nil {
				if gw, ok := netip.AddrFromSlice(r.Gw); ok && gw.Unmap().Is4() {
					exit.Gateway = gw.Unmap()
					return exit, nil
				}
			}
		}
	}
	if a.Flags&net.FlagPointToPoint != 0 {
		return exit, nil
	}
	return fallback.Exit{}, errors.New("no gateway: set the uplink's gateway in the config")
}
