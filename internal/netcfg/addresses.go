package netcfg

import (
	"fmt"
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
