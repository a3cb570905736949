package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"

	"github.com/aggd/aggd/internal/config"
	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/netcfg"
	"github.com/aggd/aggd/internal/netwatch"
	"github.com/aggd/aggd/internal/tunnel"
	"github.com/aggd/aggd/internal/wire"
)

// uplinkWatch turns what netlink reports about the CPE's uplink interfaces into what
// the CPE must do (docs/architecture.md §6): carrier lost takes the link down at once,
// carrier back has it probed again, an address change re-binds an uplink whose
// source follows its interface (uplinks[].source unset), and an interface created
// anew (a PPPoE reconnect's new ppp0) gets the uplink's socket, its route to the
// headend and the receive programs (created) bound to it again; a smaller MTU lowers
// the tunnel's (fitMTU).
type uplinkWatch struct {
	log     *slog.Logger
	m       *metrics.Set
	cpe     *tunnel.CPE
	uplinks []config.Uplink
	headend []netip.Addr        // the headend's address as each uplink reaches it
	tunName string              // the tunnel interface
	autoMTU bool                // its MTU is automatic (tunnel.mtu unset): fitMTU may lower it
	created func(ifname string) // attaches the receive programs; nil without BPF

	// recreated marks uplinks whose interface was created anew and whose socket is
	// still bound to the old one: the next address check re-binds it. Only the event
	// goroutine touches it.
	recreated []bool
}

// watchUplinks starts following the uplinks until ctx ends. Without it (no netlink
// access) the links still fail over, only later: when their probes go unanswered.
func watchUplinks(ctx context.Context, log *slog.Logger, m *metrics.Set, cpe *tunnel.CPE, uplinks []config.Uplink,
	headend []netip.Addr, tunName string, autoMTU bool, created func(string)) error {
	names := make([]string, 0, len(uplinks))
	for _, u := range uplinks {
		names = append(names, u.Interface)
	}
	w, err := netwatch.Start(ctx, netwatch.Config{Interfaces: names, Log: log})
	if err != nil {
		return err
	}
	uw := &uplinkWatch{log: log, m: m, cpe: cpe, uplinks: uplinks, headend: headend, tunName: tunName, autoMTU: autoMTU, created: created,
		recreated: make([]bool, len(uplinks))}
	go func() {
		uw.catchUp()
		for e := range w.Events() {
			if ctx.Err() == nil {
				uw.handle(e)
			}
		}
	}()
	return nil
}

// catchUp handles what changed between the start's look at the uplinks and the
// watch's own (the shield, the fast path and the sockets came in between): an uplink
// that was not usable then but whose interface is there now is taken as created, so
// that it is bound at once if it has its address by now.
func (uw *uplinkWatch) catchUp() {
	for id, u := range uw.uplinks {
		if !uw.cpe.UplinkWaiting(id) {
			continue
		}
		if _, err := net.InterfaceByName(u.Interface); err == nil {
			uw.log.Info("uplink not usable at the start has its interface now", "link", u.Name, "interface", u.Interface)
			uw.onCreated(id)
		}
	}
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
	case netwatch.MTUChanged:
		if !uw.cpe.UplinkWaiting(id) {
			uw.fitMTU(id, uw.cpe.UplinkSource(id))
		}
	}
}

// onCreated rebuilds what was bound to the uplink's old interface: the receive
// programs at once; the socket and the route to the headend through the uplink's
// gateway (the kernel deleted it with the interface) as soon as the interface has the
// uplink's address (it usually gets it a moment after it appears).
func (uw *uplinkWatch) onCreated(id int) {
	u := uw.uplinks[id]
	if uw.created != nil {
		uw.created(u.Interface)
	}
	uw.recreated[id] = true
	uw.checkSource(id)
}

// checkSource compares the uplink's source address with the interface's addresses:
// gone, the link is offline, and an uplink that follows its interface re-binds to the
// interface's first address; back (or there for the first time, for an uplink that
// was not usable at the start), the link is bound and probed again.
func (uw *uplinkWatch) checkSource(id int) {
	u := uw.uplinks[id]
	cur := uw.cpe.UplinkSource(id)
	want := cur // the address the uplink's socket should have
	if u.Source.IsValid() {
		want = u.Source.Unmap()
	}
	addrs, err := netcfg.GlobalAddresses(u.Interface, want.Is6())
	if err != nil {
		uw.log.Warn("cannot read the uplink's addresses; its link is left as it is", "link", u.Name, "err", err)
		return
	}
	if slices.Contains(addrs, want) {
		if want != cur || uw.recreated[id] {
			uw.rebind(id, want)
			return
		}
		uw.cpe.UplinkSourcePresent(id, true)
		return
	}
	uw.cpe.UplinkSourcePresent(id, false)
	switch {
	case u.Source.IsValid():
		uw.log.Warn(fmt.Sprintf("uplink source %s is not on %s: the link stays down until the address is there "+
			"(remove uplinks[].source to follow the interface's address instead)", want, u.Interface), "link", u.Name)
	case len(addrs) == 0:
		uw.log.Warn("uplink has no address: the link stays down until it gets one", "link", u.Name, "interface", u.Interface, "was", cur)
	default:
		uw.rebind(id, addrs[0])
	}
}

// rebind binds the uplink's socket to addr on its interface as it is now, and puts
// back the route through its gateway (the kernel removes it with the interface, and
// it cannot exist before the interface has an address on the gateway's subnet).
func (uw *uplinkWatch) rebind(id int, addr netip.Addr) {
	u := uw.uplinks[id]
	uw.restoreGatewayRoute(id)
	if err := uw.cpe.RebindUplink(id, addr); err != nil {
		// recreated stays set: the next address event tries again.
		uw.log.Error("uplink not re-bound", "link", u.Name, "err", err)
		return
	}
	uw.recreated[id] = false
	uw.fitMTU(id, addr)
}

// fitMTU sizes the tunnel, and what the headend is told, to an uplink bound to an
// interface the start did not see (it joined late, or came back as a new interface),
// or whose MTU changed: it may carry less than assumed (a PPPoE line's 1492, a mobile
// network's 1430).
func (uw *uplinkWatch) fitMTU(id int, src netip.Addr) {
	u := uw.uplinks[id]
	inner, err := innerMTU(u, src)
	if err != nil {
		return
	}
	tunMTU, err := netcfg.InterfaceMTU(uw.tunName)
	if err != nil {
		uw.cpe.SetUplinkMTU(id, inner)
		return
	}
	if uw.autoMTU && inner < tunMTU {
		tunMTU = uw.lowerTunnelMTU(u, inner, inner+wire.OverheadFor(src), tunMTU)
	}
	uw.cpe.SetUplinkMTU(id, min(inner, tunMTU))
}

// lowerTunnelMTU lowers the tunnel's automatic MTU from cur to inner, for an uplink
// (of MTU uplinkMTU) that carries less, and returns the tunnel's MTU after. New
// connections then use the lower MTU, and the kernel tells senders of larger packets
// (path MTU discovery). It never raises the MTU back.
func (uw *uplinkWatch) lowerTunnelMTU(u config.Uplink, inner, uplinkMTU, cur int) int {
	if inner < config.MinMTUIPv6 {
		uw.log.Error(fmt.Sprintf("uplink MTU %d leaves %d for the tunnel, below IPv6's 1280: the tunnel stays at %d and the link's full-size packets will not fit; "+
			"set tunnel.mtu, or leave this uplink out", uplinkMTU, inner, cur), "link", u.Name)
		return cur
	}
	if err := netcfg.SetMTU(uw.tunName, inner); err != nil {
		uw.log.Warn("cannot lower the tunnel MTU to fit the uplink; its full-size packets will not fit", "link", u.Name, "err", err)
		return cur
	}
	uw.cpe.CapUplinkMTUs(inner)
	uw.log.Warn("tunnel MTU lowered to fit the uplink (set uplinks[].mtu or tunnel.mtu to have it from the start)",
		"link", u.Name, "uplink_mtu", uplinkMTU, "from", cur, "to", inner)
	return inner
}

func (uw *uplinkWatch) restoreGatewayRoute(id int) {
	u := uw.uplinks[id]
	if !u.Gateway.IsValid() {
		return
	}
	if err := netcfg.AddGatewayRoute(uw.headend[id], u.Gateway, u.Interface, gatewayRouteMetric(id)); err != nil {
		uw.log.Warn("cannot put back the route to the headend through the uplink's gateway; its packets follow the other routes",
			"link", u.Name, "err", err)
	}
}

// gatewayRouteMetric is the metric of the route to the headend through uplink i's
// gateway (uplinks[].gateway).
func gatewayRouteMetric(i int) int { return 50 + i }
