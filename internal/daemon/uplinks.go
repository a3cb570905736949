package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"

	"github.com/aggd/aggd/internal/config"
	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/netcfg"
	"github.com/aggd/aggd/internal/netwatch"
	"github.com/aggd/aggd/internal/tunnel"
)

// uplinkWatch turns what netlink reports about the CPE's uplink interfaces into what
// the CPE must do (docs/architecture.md §6): carrier lost takes the link down at once,
// carrier back has it probed again, an address change re-binds an uplink whose
// source follows its interface (uplinks[].source unset), and an interface created
// anew (a PPPoE reconnect's new ppp0) gets the uplink's socket, its route to the
// headend and the receive programs (created) bound to it again.
type uplinkWatch struct {
	log     *slog.Logger
	m       *metrics.Set
	cpe     *tunnel.CPE
	uplinks []config.Uplink
	headend []netip.Addr        // the headend's address as each uplink reaches it
	created func(ifname string) // attaches the receive programs; nil without BPF

	// recreated marks uplinks whose interface was created anew and whose socket is
	// still bound to the old one: the next address check re-binds it. Only the event
	// goroutine touches it.
	recreated []bool
}

// watchUplinks starts following the uplinks until ctx ends. Without it (no netlink
// access) the links still fail over, only later: when their probes go unanswered.
func watchUplinks(ctx context.Context, log *slog.Logger, m *metrics.Set, cpe *tunnel.CPE, uplinks []config.Uplink,
	headend []netip.Addr, created func(string)) error {
	names := make([]string, 0, len(uplinks))
	for _, u := range uplinks {
		names = append(names, u.Interface)
	}
	w, err := netwatch.Start(ctx, netwatch.Config{Interfaces: names, Log: log})
	if err != nil {
		return err
	}
	uw := &uplinkWatch{log: log, m: m, cpe: cpe, uplinks: uplinks, headend: headend, created: created,
		recreated: make([]bool, len(uplinks))}
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
	case netwatch.Created:
		uw.onCreated(id)
	}
}

// onCreated rebuilds what was bound to the uplink's old interface: the receive
// programs at once, the route to the headend through the uplink's gateway (the kernel
// deleted it with the interface), and the socket as soon as the interface has the
// uplink's address (it usually gets it a moment after it appears).
func (uw *uplinkWatch) onCreated(id int) {
	u := uw.uplinks[id]
	if uw.created != nil {
		uw.created(u.Interface)
	}
	if u.Gateway.IsValid() {
		if err := netcfg.AddGatewayRoute(uw.headend[id], u.Gateway, u.Interface, gatewayRouteMetric(id)); err != nil {
			uw.log.Warn("cannot restore the route to the headend through the uplink's gateway; its packets follow the other routes", "link", u.Name, "err", err)
		}
	}
	uw.recreated[id] = true
	uw.checkSource(id)
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
		if uw.recreated[id] {
			uw.recreated[id] = false
			if err := uw.cpe.RebindUplink(id, cur); err != nil {
				uw.log.Error("uplink not re-bound to its new interface", "link", u.Name, "err", err)
			}
			return
		}
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
		uw.recreated[id] = false
		if err := uw.cpe.RebindUplink(id, addrs[0]); err != nil {
			uw.log.Error("uplink not re-bound", "link", u.Name, "err", err)
		}
	}
}

// gatewayRouteMetric is the metric of the route to the headend through uplink i's
// gateway (uplinks[].gateway).
func gatewayRouteMetric(i int) int { return 50 + i }
