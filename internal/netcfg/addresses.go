package netcfg

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// GlobalAddresses returns an interface's global-scope IPv4 addresses (IPv6 when v6 is
// true) that a socket can send from, in the kernel's order: the first is what
// FirstAddress returns. An IPv6 address still in duplicate address detection, failed
// it, or deprecated (its preferred lifetime over) is left out.
func GlobalAddresses(name string, v6 bool) ([]netip.Addr, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("netcfg: find %s: %w", name, err)
	}
	fam := netlink.FAMILY_V4
	if v6 {
		fam = netlink.FAMILY_V6
	}
	addrs, err := netlink.AddrList(l, fam)
	if err != nil {
		return nil, fmt.Errorf("netcfg: addresses of %s: %w", name, err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if a.Scope != unix.RT_SCOPE_UNIVERSE || a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED|unix.IFA_F_DEPRECATED) != 0 {
			continue
		}
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// InterfaceWithAddress returns the name of the interface that holds addr.
func InterfaceWithAddress(addr netip.Addr) (string, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return "", fmt.Errorf("netcfg: list addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == addr.Unmap() {
			l, err := netlink.LinkByIndex(a.LinkIndex)
			if err != nil {
				return "", fmt.Errorf("netcfg: interface of %s: %w", addr, err)
			}
			return l.Attrs().Name, nil
		}
	}
	return "", fmt.Errorf("netcfg: no interface has %s", addr)
}

// IsDefaultRoute reports whether r is a default route (0.0.0.0/0 or ::/0; the library
// gives older kernels' ones a nil Dst) of the main table.
func IsDefaultRoute(r *netlink.Route) bool {
	if r.Table != 0 && r.Table != unix.RT_TABLE_MAIN {
		return false
	}
	if r.Dst == nil {
		return true
	}
	ones, _ := r.Dst.Mask.Size()
	return ones == 0
}

// DefaultRouteInterfaces returns the names of the interfaces the main table's default
// routes (IPv4 and IPv6, each next hop of a multipath one) go out of, in no order and
// possibly repeated. Errors leave a family out: the caller asks where traffic from the
// internet arrives, and no answer is an answer.
func DefaultRouteInterfaces() []string {
	var names []string
	add := func(index int) {
		if l, err := netlink.LinkByIndex(index); err == nil && l.Attrs().Flags&net.FlagLoopback == 0 {
			names = append(names, l.Attrs().Name)
		}
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := netlink.RouteList(nil, fam)
		if err != nil {
			continue
		}
		for _, r := range routes {
			if r.Type != unix.RTN_UNICAST || !IsDefaultRoute(&r) {
				continue // unreachable, blackhole, prohibit defaults say "dev lo": no traffic arrives there
			}
			if r.LinkIndex != 0 {
				add(r.LinkIndex)
			}
			for _, nh := range r.MultiPath {
				add(nh.LinkIndex)
			}
		}
	}
	return names
}
