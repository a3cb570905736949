package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/aggd/aggd/internal/config"
	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/netcfg"
	"github.com/aggd/aggd/internal/netwatch"
	"github.com/aggd/aggd/internal/tunnel"
)

// uplinkWatch turns what netlink reports about the CPE's uplink interfaces into what
// the CPE must do (docs/architecture.md §6): carrier lost takes the link down at once,
// carrier back has it probed again, and an address change re-binds an uplink whose
// source follows its interface (uplinks[].source unset).
type uplinkWatch struct {
	log     *slog.Logger
	m       *metrics.Set
	cpe     *tunnel.CPE
	uplinks []config.Uplink
}

// watchUplinks starts following the uplinks until ctx ends. Without it (no netlink
// access) the links still fail over, only later: when their probes go unanswered.
func watchUplinks(ctx context.Context, log *slog.Logger, m *metrics.Set, cpe *tunnel.CPE, uplinks []config.Uplink) error {
	names := make([]string, 0, len(uplinks))
	for _, u := range uplinks {
		names = append(names, u.Interface)
	}
	w, err := netwatch.Start(ctx, netwatch.Config{Interfaces: names, Log: log})
	if err != nil {
		return err
	}
	uw := &uplinkWatch{log: log, m: m, cpe: cpe, uplinks: uplinks}
	go func() {
		for e := range w.Events() {
			if ctx.Err() == nil {
				uw.handle(e)
			}
		}
	}()
	return nil
}

// handle logs and counts one event and acts on it.
func (uw *uplinkWatch) handle(e netwatch.Event) {
	id := slices.IndexFunc(uw.uplinks, func(u config.Uplink) bool { return u.Interface == e.Interface })
	if id < 0 {
		return
	}
	u := uw.uplinks[id]
	uw.m.UplinkEvents.WithLabelValues(u.Name, e.Kind.String()).Inc()
	uw.log.Info("uplink event", "link", u.Name, "interface", e.Interface, "kind", e.Kind.String(), "event", e.String())
	switch e.Kind {
	case netwatch.CarrierLost:
		uw.cpe.UplinkCarrier(id, false)
	case netwatch.CarrierBack:
		uw.cpe.UplinkCarrier(id, true)
	case netwatch.AddressAdded, netwatch.AddressRemoved:
		uw.checkSource(id)
	case netwatch.RouteChanged:
		// Nothing to do: the uplink's socket is bound to the interface, so the kernel
		// routes its packets by the interface's routes as they are now.
	}
}

// checkSource compares the uplink's source address with the interface's addresses:
// gone, the link is offline, and an uplink that follows its interface re-binds to the
// interface's first address; back, the link is probed again.
func (uw *uplinkWatch) checkSource(id int) {
	u := uw.uplinks[id]
	cur := uw.cpe.UplinkSource(id)
	addrs, err := netcfg.GlobalAddresses(u.Interface, cur.Is6())
	if err != nil {
		uw.log.Warn("cannot read the uplink's addresses; its link is left as it is", "link", u.Name, "err", err)
		return
	}
	if slices.Contains(addrs, cur) {
		uw.cpe.UplinkSourcePresent(id, true)
		return
	}
	uw.cpe.UplinkSourcePresent(id, false)
	switch {
	case u.Source.IsValid():
		uw.log.Warn(fmt.Sprintf("uplink source %s is no longer on %s: the link stays down until the address is back "+
			"(remove uplinks[].source to follow the interface's address instead)", cur, u.Interface), "link", u.Name)
	case len(addrs) == 0:
		uw.log.Warn("uplink has no address: the link stays down until it gets one", "link", u.Name, "interface", u.Interface, "was", cur)
	default:
		if err := uw.cpe.RebindUplink(id, addrs[0]); err != nil {
			uw.log.Error("uplink not re-bound", "link", u.Name, "err", err)
		}
	}
}
