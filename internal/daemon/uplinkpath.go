package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/aggd/aggd/internal/config"
	"github.com/aggd/aggd/internal/netcfg"
	"github.com/aggd/aggd/internal/sched"
	"github.com/aggd/aggd/internal/tunnel"
	"github.com/aggd/aggd/internal/wire"
)

// resolveUplinks decides how each uplink reaches the headend: its source address (the
// config's, or the interface's first global one), the headend's address of the same IP
// version, and its MTU. It returns the uplinks and the tunnel MTU they allow: the
// smallest of their MTUs minus the overhead of their outer IP version.
func resolveUplinks(ctx context.Context, ups []config.Uplink, headend config.Endpoint) ([]tunnel.Uplink, int, error) {
	out := make([]tunnel.Uplink, 0, len(ups))
	tunnelMTU := 0
	for i, u := range ups {
		what := fmt.Sprintf("uplinks[%d] (%s)", i, u.Name)
		waiting := ""
		src, ep, err := uplinkPath(ctx, i, u, headend)
		if errors.Is(err, errNotYet) {
			// The uplink joins when its interface and address appear (uplinkWatch).
			waiting = u.Interface + " has no global address yet"
			if _, ierr := netcfg.InterfaceByName(u.Interface); ierr != nil {
				waiting = "interface " + u.Interface + " not found"
			}
			src, ep, err = waitingUplinkPath(ctx, i, u, headend)
		}
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", what, err)
		}
		inner, err := innerMTU(u, src)
		known := inner // what the headend is told; 0 while unknown
		if err != nil {
			// Missing at start: the tunnel MTU assumes an Ethernet-sized uplink.
			inner, known = assumedUplinkMTU-wire.OverheadFor(src), 0
		}
		if tunnelMTU == 0 || inner < tunnelMTU {
			tunnelMTU = inner
		}
		t, err := linkTuning(i, u)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, tunnel.Uplink{
			Interface: u.Interface, Source: src, Endpoint: ep, Waiting: waiting, MTU: known,
			Spec: tunnel.LinkSpec{
				ID: uint8(i), Name: u.Name, Class: t.Class, TxRate: t.TxRate, RxRate: t.RxRate, Weight: t.Weight,
			},
		})
	}
	return out, tunnelMTU, nil
}

// linkTuning is what uplink i's config says of its class, rate priors and weight.
func linkTuning(i int, u config.Uplink) (tunnel.LinkTuning, error) {
	class, err := sched.ParseClass(string(u.Class))
	if err != nil {
		return tunnel.LinkTuning{}, fmt.Errorf("uplinks[%d].class: %w", i, err)
	}
	return tunnel.LinkTuning{Class: class, TxRate: float64(u.RateUp), RxRate: float64(u.RateDown), Weight: float64(u.Weight)}, nil
}

// uplinkPath returns uplink i's source address and the headend's address it sends to,
// both of one IP version: the source's if the config sets it, else the version of a
// literal endpoint, else IPv4 if the interface has a global IPv4 address and IPv6 if
// not (an IPv6-only line), with a host name resolved for that version.
func uplinkPath(ctx context.Context, i int, u config.Uplink, headend config.Endpoint) (netip.Addr, netip.AddrPort, error) {
	e, key := headend, "headend.endpoint"
	if !u.Endpoint.IsZero() {
		e, key = u.Endpoint, fmt.Sprintf("uplinks[%d].endpoint", i)
	}
	literal, err := netip.ParseAddr(e.Host)
	isLiteral := err == nil
	literal = literal.Unmap()
	src := u.Source.Unmap()
	if !src.IsValid() {
		v6 := isLiteral && literal.Is6()
		if !isLiteral {
			if _, err := netcfg.FirstAddress(u.Interface, false); err != nil {
				v6 = true // no IPv4 address: an IPv6-only uplink, if it has IPv6
			}
		}
		if src, err = netcfg.FirstAddress(u.Interface, v6); err != nil {
			if isLiteral && !v6 {
				if a6, err6 := netcfg.FirstAddress(u.Interface, true); err6 == nil {
					return netip.Addr{}, netip.AddrPort{}, fmt.Errorf("%s has no global IPv4 address, which %s (%s) needs, but IPv6 %s: "+
						"set uplinks[%d].endpoint to the headend's IPv6 address", u.Interface, key, e, a6, i)
				}
			}
			return netip.Addr{}, netip.AddrPort{}, fmt.Errorf("%w: %w", errNotYet, err)
		}
	}
	network, version := "ip4", "IPv4"
	if src.Is6() {
		network, version = "ip6", "IPv6"
	}
	if isLiteral {
		if literal.Is4() != src.Is4() {
			return netip.Addr{}, netip.AddrPort{}, fmt.Errorf("source %s and %s (%s) are of different IP versions; set uplinks[%d].endpoint "+
				"to the headend's address of the source's version", src, key, e, i)
		}
		return src, netip.AddrPortFrom(literal, e.Port), nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, network, e.Host)
	if err != nil || len(addrs) == 0 {
		return netip.Addr{}, netip.AddrPort{}, fmt.Errorf("%s: cannot resolve %q to an %s address for source %s: %v "+
			"(fix DNS, or write the headend's address)", key, e.Host, version, src, err)
	}
	return src, netip.AddrPortFrom(addrs[0].Unmap(), e.Port), nil
}

// innerMTU is the largest inner packet uplink u carries when it sends from src: its
// MTU (uplinks[].mtu, else its interface's) less the outer headers of src's version.
func innerMTU(u config.Uplink, src netip.Addr) (int, error) {
	mtu := u.MTU
	if mtu == 0 {
		var err error
		if mtu, err = netcfg.InterfaceMTU(u.Interface); err != nil {
			return 0, err
		}
	}
	return mtu - wire.OverheadFor(src), nil
}

// errNotYet marks an uplink whose interface is missing or has no address yet: the CPE
// starts without it, and it joins when they appear.
var errNotYet = errors.New("not usable yet")

// assumedUplinkMTU sizes the tunnel for an uplink missing at start with no
// uplinks[].mtu: an Ethernet-sized line.
const assumedUplinkMTU = 1500

// waitingUplinkPath is uplinkPath for an uplink without an address yet: the headend's
// address of the version the config implies (its source's, else a literal endpoint's,
// else IPv4), and the unspecified address of that version as the source. An IPv6-only
// line missing at start needs uplinks[].endpoint (or source) to say it is IPv6.
func waitingUplinkPath(ctx context.Context, i int, u config.Uplink, headend config.Endpoint) (netip.Addr, netip.AddrPort, error) {
	e := headend
	if !u.Endpoint.IsZero() {
		e = u.Endpoint
	}
	src := netip.IPv4Unspecified()
	if lit, err := netip.ParseAddr(e.Host); err == nil && lit.Unmap().Is6() {
		src = netip.IPv6Unspecified()
	}
	if u.Source.IsValid() {
		src = u.Source.Unmap()
	}
	u.Source = src // resolves the endpoint for this version, as for a pinned source
	return uplinkPath(ctx, i, u, headend)
}
