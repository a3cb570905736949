package netcfg

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
)

// InterfaceByName looks up one network interface by its name with a single rtnetlink
// request. The standard library's net.InterfaceByName lists every interface of the
// machine to find one, so a daemon that looks up each of its interfaces that way pays
// the square of their number: on a headend with an interface per customer line, 400
// of them took half its CPU (BENCHMARKS.md, "One headend, many CPEs").
func InterfaceByName(name string) (*net.Interface, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		if errors.As(err, new(netlink.LinkNotFoundError)) {
			return nil, fmt.Errorf("no network interface named %q", name)
		}
		return nil, fmt.Errorf("look up network interface %q: %w", name, err)
	}
	a := l.Attrs()
	return &net.Interface{Index: a.Index, MTU: a.MTU, Name: a.Name, HardwareAddr: a.HardwareAddr, Flags: a.Flags}, nil
}
