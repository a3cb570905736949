package netwatch

import (
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/aggd/aggd/internal/netcfg"
)

// ifState is what the watcher knows about one watched interface.
type ifState struct {
	index    int // 0 while the interface does not exist
	carrier  bool
	mtu      int
	addrs    map[netip.Prefix]bool
	gateways map[int]netip.Addr // default route's gateway by family; absent: no default route
}

func newIfState() *ifState {
	return &ifState{addrs: map[netip.Prefix]bool{}, gateways: map[int]netip.Addr{}}
}

// readState asks the kernel for an interface's state. A missing interface is a state
// (no index, no carrier), not an error.
func readState(h *netlink.Handle, name string) (*ifState, error) {
	st := newIfState()
	l, err := h.LinkByName(name)
	if err != nil {
		if _, missing := err.(netlink.LinkNotFoundError); missing {
			return st, nil
		}
		return nil, err
	}
	st.index = l.Attrs().Index
	st.carrier = hasCarrier(l.Attrs())
	st.mtu = l.Attrs().MTU
	addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if p, ok := globalPrefix(a.IPNet, a.Scope); ok {
			st.addrs[p] = true
		}
	}
	routes, err := h.RouteList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	for _, r := range routes {
		if netcfg.IsDefaultRoute(&r) {
			st.gateways[r.Family] = gatewayOf(&r)
		}
	}
	return st, nil
}

// diff lists the events that turn old into cur, every one with the given cause.
func diff(name string, old, cur *ifState, cause string) []Event {
	var evs []Event
	if cur.index != 0 && cur.index != old.index {
		evs = append(evs, Event{Interface: name, Kind: Created, Cause: cause})
	}
	if old.carrier != cur.carrier {
		evs = append(evs, carrierEvent(name, cur.carrier, cause))
	}
	if cur.index != 0 && cur.index == old.index && cur.mtu != old.mtu {
		evs = append(evs, Event{Interface: name, Kind: MTUChanged, MTU: cur.mtu, Cause: cause})
	}
	for p := range old.addrs {
		if !cur.addrs[p] {
			evs = append(evs, Event{Interface: name, Kind: AddressRemoved, Address: p, Cause: cause})
		}
	}
	for p := range cur.addrs {
		if !old.addrs[p] {
			evs = append(evs, Event{Interface: name, Kind: AddressAdded, Address: p, Cause: cause})
		}
	}
	for fam, gw := range cur.gateways {
		if was, ok := old.gateways[fam]; !ok || was != gw {
			evs = append(evs, Event{Interface: name, Kind: RouteChanged, Gateway: gw, Cause: cause})
		}
	}
	for fam := range old.gateways {
		if _, ok := cur.gateways[fam]; !ok {
			evs = append(evs, Event{Interface: name, Kind: RouteChanged, Cause: cause})
		}
	}
	if old.index != 0 && cur.index == 0 {
		evs = append(evs, Event{Interface: name, Kind: Deleted, Cause: cause})
	}
	return evs
}

func carrierEvent(name string, carrier bool, cause string) Event {
	k := CarrierLost
	if carrier {
		k = CarrierBack
	}
	return Event{Interface: name, Kind: k, Cause: cause}
}

// hasCarrier: the interface is administratively up, its lower layer is up (cable in,
// modem attached, veth peer up), and the kernel has made it operational. The carrier
// flag goes off at once when the carrier does; when it comes back, the oper state
// follows a moment later (the kernel's link watch), and only then does the interface
// transmit: until then the carrier is not back for us. Drivers that report no oper
// state (unknown) are taken by their flags.
func hasCarrier(a *netlink.LinkAttrs) bool {
	return a.Flags&net.FlagUp != 0 && a.RawFlags&unix.IFF_LOWER_UP != 0 &&
		(a.OperState == netlink.OperUp || a.OperState == netlink.OperUnknown)
}

// carrierCause describes a link's state for the log.
func carrierCause(a *netlink.LinkAttrs) string {
	switch {
	case a.Flags&net.FlagUp == 0:
		return "interface set down"
	case a.RawFlags&unix.IFF_LOWER_UP == 0:
		return "no carrier (oper state " + a.OperState.String() + ")"
	}
	return "oper state " + a.OperState.String()
}

// globalPrefix converts a global-scope address; other scopes (link-local, host) are not
// addresses an uplink sends from.
func globalPrefix(n *net.IPNet, scope int) (netip.Prefix, bool) {
	if n == nil || scope != unix.RT_SCOPE_UNIVERSE {
		return netip.Prefix{}, false
	}
	ip, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(ip.Unmap(), ones), true
}

func gatewayOf(r *netlink.Route) netip.Addr {
	gw, _ := netip.AddrFromSlice(r.Gw)
	return gw.Unmap()
}
