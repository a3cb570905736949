// Package netcfg configures interfaces, addresses and routes through rtnetlink. Everything
// it installs is tied to the tunnel interface or recorded, so that the daemon can remove it
// on shutdown and find it again after a crash.
package netcfg

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RouteProtocol marks routes installed by aggd (rtnetlink "protocol" field), so that
// leftovers from a crashed daemon can be recognised and removed.
const RouteProtocol = 0xa6

// ConfigureTunnel sets the tunnel interface's MTU and addresses and brings it up.
func ConfigureTunnel(name string, mtu int, addrs []netip.Prefix) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("netcfg: find %s: %w", name, err)
	}
	if err := netlink.LinkSetMTU(l, mtu); err != nil {
		return fmt.Errorf("netcfg: set MTU %d on %s: %w", mtu, name, err)
	}
	for _, p := range addrs {
		a := &netlink.Addr{IPNet: prefixToIPNet(p)}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD // a TUN has no neighbours; DAD would only delay use
		}
		if err := netlink.AddrReplace(l, a); err != nil {
			return fmt.Errorf("netcfg: add address %s to %s: %w", p, name, err)
		}
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("netcfg: bring %s up: %w", name, err)
	}
	return nil
}

// ipv6MinMTU is the smallest MTU IPv6 allows on a link (RFC 8200).
const ipv6MinMTU = 1280

// AddRoutes routes each prefix into the named interface with the given metric.
func AddRoutes(name string, prefixes []netip.Prefix, metric int) error {
	return AddRoutesMTU(name, prefixes, metric, 0)
}

// AddRoutesMTU is AddRoutes with a path MTU on each route (0: none, the interface's
// MTU applies). It replaces routes of the same prefix and metric, so it also changes
// the MTU of routes already there. The kernel fragments, or answers "fragmentation
// needed" / "packet too big" for, packets larger than a route's MTU before they reach
// the interface. An IPv6 route gets no MTU below IPv6's minimum, 1280: IPv6 senders
// do not go below it, whatever "packet too big" says.
func AddRoutesMTU(name string, prefixes []netip.Prefix, metric, mtu int) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("netcfg: find %s: %w", name, err)
	}
	for _, p := range prefixes {
		mtu := mtu
		if p.Addr().Is6() && mtu != 0 && mtu < ipv6MinMTU {
			mtu = ipv6MinMTU
		}
		r := &netlink.Route{
			LinkIndex: l.Attrs().Index,
			Dst:       prefixToIPNet(p),
			Priority:  metric,
			Protocol:  RouteProtocol,
			Scope:     netlink.SCOPE_LINK,
			MTU:       mtu,
		}
		if err := netlink.RouteReplace(r); err != nil {
			what := fmt.Sprintf("metric %d", metric)
			if mtu != 0 {
				what += fmt.Sprintf(", mtu %d", mtu)
			}
			return fmt.Errorf("netcfg: route %s via %s (%s): %w", p, name, what, err)
		}
	}
	return nil
}

// DelRoutes removes routes AddRoutes installed into interface name (with that metric);
// a route already gone is not an error.
func DelRoutes(name string, prefixes []netip.Prefix, metric int) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("netcfg: find %s: %w", name, err)
	}
	var errs []error
	for _, p := range prefixes {
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: prefixToIPNet(p), Priority: metric, Protocol: RouteProtocol, Scope: netlink.SCOPE_LINK}
		if err := netlink.RouteDel(r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("netcfg: delete route %s via %s: %w", p, name, err))
		}
	}
	return errors.Join(errs...)
}

// AddGatewayRoute routes dst through gw on dev with the given metric. It is used for the
// route from each uplink to the headend, so that a socket bound to that uplink finds a
// route even when the uplink's own default route is missing.
func AddGatewayRoute(dst, gw netip.Addr, dev string, metric int) error {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("netcfg: find uplink %s: %w", dev, err)
	}
	r := &netlink.Route{
		LinkIndex: l.Attrs().Index,
		Dst:       prefixToIPNet(netip.PrefixFrom(dst, dst.BitLen())),
		Gw:        gw.AsSlice(),
		Priority:  metric,
		Protocol:  RouteProtocol,
	}
	if err := netlink.RouteReplace(r); err != nil {
		return fmt.Errorf("netcfg: route %s via %s dev %s: %w", dst, gw, dev, err)
	}
	return nil
}

// RemoveOwnRoutes deletes every route aggd installed (by protocol), in all families,
// and returns how many it deleted.
func RemoveOwnRoutes() (int, error) {
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return 0, fmt.Errorf("netcfg: list routes: %w", err)
	}
	var errs []error
	deleted := 0
	for i := range routes {
		if err := netlink.RouteDel(&routes[i]); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("netcfg: delete route %s: %w", routes[i].Dst, err))
			continue
		}
		deleted++
	}
	return deleted, errors.Join(errs...)
}

// DeleteLink removes an interface if it exists (a TUN left over from a crash).
func DeleteLink(name string) (existed bool, err error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return false, nil
		}
		return false, fmt.Errorf("netcfg: find %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil {
		return true, fmt.Errorf("netcfg: delete %s: %w", name, err)
	}
	return true, nil
}

// SetMTU sets the MTU of an interface.
func SetMTU(name string, mtu int) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("netcfg: find %s: %w", name, err)
	}
	if err := netlink.LinkSetMTU(l, mtu); err != nil {
		return fmt.Errorf("netcfg: set the MTU of %s to %d: %w", name, mtu, err)
	}
	return nil
}

// InterfaceMTU returns the MTU of an interface.
func InterfaceMTU(name string) (int, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return 0, fmt.Errorf("netcfg: find %s: %w", name, err)
	}
	return l.Attrs().MTU, nil
}

// FirstAddress returns the first global-scope IPv4 address of an interface (or IPv6 when
// v6 is true).
func FirstAddress(name string, v6 bool) (netip.Addr, error) {
	addrs, err := GlobalAddresses(name, v6)
	if err != nil {
		return netip.Addr{}, err
	}
	if len(addrs) == 0 {
		version := "IPv4"
		if v6 {
			version = "IPv6"
		}
		return netip.Addr{}, fmt.Errorf("netcfg: %s has no global %s address yet; set uplinks[].source or wait for DHCP", name, version)
	}
	return addrs[0], nil
}

// EnableForwarding turns on IPv4 and IPv6 forwarding, which a router needs.
func EnableForwarding() error {
	for _, p := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile(p, []byte("1\n"), 0o644); err != nil {
			return fmt.Errorf("netcfg: enable forwarding (%s): %w", p, err)
		}
	}
	return nil
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
