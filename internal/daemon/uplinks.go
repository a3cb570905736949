package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"

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
// headend and the receive programs (created) bound to it again; an MTU that changes,
// or an interface that comes or goes, moves the tunnel's automatic MTU (tunnelmtu.go).
type uplinkWatch struct {
	log     *slog.Logger
	m       *metrics.Set
	cpe     *tunnel.CPE
	uplinks []config.Uplink
	headend []netip.Addr        // the headend's address as each uplink reaches it
	created func(ifname string) // attaches the receive programs; nil without BPF

	tunName string // the tunnel interface
	// autoMTU: the tunnel's MTU is automatic (tunnel.mtu unset) and follows the
	// uplinks; it goes back up raiseAfter (tunnel.mtu_raise_after) after they allow more.
	autoMTU    bool
	raiseAfter time.Duration
	// mtuChanged tells the fast path the tunnel's new MTU; nil without it.
	mtuChanged func(mtu int)
	// uplinkChanged tells the fast path that an uplink's interface changed, so that it
	// looks its links' next hops up afresh; nil without it.
	uplinkChanged func(ifname string)
	// neighbours deletes an uplink's unresolved neighbour entries at its carrier's
	// return and in the moments after.
	neighbours *neighbourRechecks

	// Only the event goroutine touches these.
	//
	// recreated marks uplinks whose interface was created anew and whose socket is
	// still bound to the old one: the next address check re-binds it. raiseDue fires
	// when a planned wait for the tunnel's MTU ends (nil: none planned). tooSmall marks
	// the uplinks an error says the tunnel does not follow (warnTooSmall).
	recreated []bool
	raiseDue  <-chan time.Time
	tooSmall  []bool
}

// watch starts following the uplinks until ctx ends. Without it (no netlink access)
// the links still fail over, only later: when their probes go unanswered.
func (uw *uplinkWatch) watch(ctx context.Context) error {
	names := make([]string, 0, len(uw.uplinks))
	for _, u := range uw.uplinks {
		names = append(names, u.Interface)
	}
	w, err := netwatch.Start(ctx, netwatch.Config{Interfaces: names, Log: uw.log})
	if err != nil {
		return err
	}
	uw.recreated = make([]bool, len(uw.uplinks))
	uw.tooSmall = make([]bool, len(uw.uplinks))
	go func() {
		uw.catchUp()
		for {
			select {
			case <-ctx.Done():
				return // the daemon is stopping: the tunnel goes with it
			case e, ok := <-w.Events():
				if !ok {
					return
				}
				if ctx.Err() == nil {
					uw.handle(e)
				}
			case <-uw.raiseDue:
				uw.raiseDue = nil
				uw.endWait()
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
		if _, err := netcfg.InterfaceByName(u.Interface); err == nil {
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
	if e.Kind == netwatch.CarrierBack {
		uw.prepareReturn(id) // before the link is probed again
	}
	if uw.uplinkChanged != nil {
		uw.uplinkChanged(e.Interface)
	}
	if e.Kind == netwatch.CarrierLost || e.Kind == netwatch.Deleted {
		uw.neighbours.carrier(uw.log, e.Interface, false) // the rechecks of its last return stop
	}
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
	case netwatch.MTUChanged, netwatch.Deleted:
		// Deleted: the small uplink may have gone (a PPPoE line's ppp0 at a reconnect).
		uw.reviewMTU()
	}
}

// prepareReturn readies an uplink whose carrier is back for its link's return:
//
//   - the route to the headend through its gateway (uplinks[].gateway) is put back:
//     setting an interface down deletes its routes, and no address event follows when
//     it comes up with its address kept (without an address yet, the address event
//     puts the route back instead: rebind);
//   - its neighbour entries still unresolved are deleted. A packet the fast path sent in
//     the moment between the interface going down and the link leaving the schedule
//     left one behind, whose first solicitation went nowhere; the kernel asks again only
//     a second later, and the link's packets to that next hop were lost until then
//     while its probes, sent to another, got through (netcfg.FlushUnresolvedNeighbours).
//     Those still unanswered in the moments after are deleted again (neighbourRechecks).
func (uw *uplinkWatch) prepareReturn(id int) {
	u := uw.uplinks[id]
	if err := uw.putBackGatewayRoute(id); err != nil {
		uw.log.Debug("route to the headend through the uplink's gateway not put back yet; it is when the uplink's address comes",
			"link", u.Name, "err", err)
	}
	uw.neighbours.carrier(uw.log.With("link", u.Name), u.Interface, true)
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
	if _, err := netcfg.InterfaceByName(u.Interface); err != nil {
		// Gone (a PPPoE line's ppp0 at a disconnect): its addresses went with it, and
		// its carrier event has taken the link down. It re-binds when it is back.
		uw.cpe.UplinkSourcePresent(id, false)
		return
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
	if err := uw.putBackGatewayRoute(id); err != nil {
		uw.log.Warn("cannot put back the route to the headend through the uplink's gateway; its packets follow the other routes",
			"link", u.Name, "err", err)
	}
	if err := uw.cpe.RebindUplink(id, addr); err != nil {
		// recreated stays set: the next address event tries again.
		uw.log.Error("uplink not re-bound", "link", u.Name, "err", err)
		return
	}
	uw.recreated[id] = false
	// The uplink joined late or came back as a new interface: it may carry less than
	// the start assumed (a PPPoE line's 1492, a mobile network's 1430).
	uw.reviewMTU()
}

// putBackGatewayRoute adds (or replaces) the route to the headend through uplink id's
// gateway, if it has one (uplinks[].gateway); the callers say how much a failure matters.
func (uw *uplinkWatch) putBackGatewayRoute(id int) error {
	u := uw.uplinks[id]
	if !u.Gateway.IsValid() {
		return nil
	}
	return netcfg.AddGatewayRoute(uw.headend[id], u.Gateway, u.Interface, gatewayRouteMetric(id))
}

// gatewayRouteMetric is the metric of the route to the headend through uplink i's
// gateway (uplinks[].gateway).
func gatewayRouteMetric(i int) int { return 50 + i }
