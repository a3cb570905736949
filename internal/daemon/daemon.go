// Package daemon turns a validated configuration into a running CPE or headend: it
// prepares the host (tunnel interface, addresses, routes, NAT), starts the datapath and
// the metrics endpoint, and undoes every change on shutdown. Leftovers of a crashed run
// are removed first, so a restart always starts from a clean host.
package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"

	"github.com/aggd/aggd/internal/config"
	"github.com/aggd/aggd/internal/handshake"
	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/nat"
	"github.com/aggd/aggd/internal/netcfg"
	"github.com/aggd/aggd/internal/sched"
	"github.com/aggd/aggd/internal/tunnel"
	"github.com/aggd/aggd/internal/wire"
)

// Options are command-line choices that override the file.
type Options struct {
	NoBPF    bool
	FastPath bool // turn the kernel fast path on whatever bpf.fast_path says
}

// NewLogger builds the daemon's structured logger from the config.
func NewLogger(l config.Log) *slog.Logger {
	opts := &slog.HandlerOptions{Level: l.Level.SlogLevel()}
	if l.Format == config.LogJSON {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// RunCPE runs the CPE until ctx ends.
func RunCPE(ctx context.Context, cfg *config.CPE, opts Options, log *slog.Logger) error {
	key, err := handshake.LoadPrivateKeyFile(cfg.PrivateKeyFile)
	if err != nil {
		return err
	}
	endpoint, err := resolveEndpoint(ctx, cfg.Headend.Endpoint)
	if err != nil {
		return err
	}
	uplinks, minMTU, err := resolveUplinks(cfg.Uplinks)
	if err != nil {
		return err
	}
	mtu := cfg.Tunnel.MTU
	if mtu == 0 {
		mtu = minMTU - wire.Overhead
	}
	if !cfg.BPF.Enabled || opts.NoBPF {
		log.Info("BPF disabled (--no-bpf or bpf.enabled: false): forwarding in userspace, no XDP shield")
	}

	fastPathOn := cfg.BPF.Enabled && !opts.NoBPF && (cfg.BPF.FastPath || opts.FastPath)
	host := &hostChanges{log: log, tunName: cfg.Tunnel.Interface, pinRoot: cfg.BPF.PinDir}
	defer host.undo()
	host.prepare(planPersistence(log, fastPathOn, cfg.BPF.PinDir, cfg.Tunnel.Interface))
	for i, u := range cfg.Uplinks {
		if u.Gateway.IsValid() {
			// A route to the headend through this uplink's gateway, so the uplink's
			// socket finds its way even when the uplink has no default route.
			if err := netcfg.AddGatewayRoute(endpoint.Addr(), u.Gateway, u.Interface, 50+i); err != nil {
				return err
			}
		}
	}
	dev, err := host.tunnel(mtu, cfg.Tunnel.Address)
	if err != nil {
		return err
	}
	if err := netcfg.AddRoutes(dev.Name(), cfg.Tunnel.Routes, int(cfg.Tunnel.RouteMetric)); err != nil {
		return err
	}
	if cfg.Tunnel.NAT {
		// LAN hosts leave through agg0 with the CPE's tunnel address.
		if err := host.nat([]nat.Masquerade{{OutIface: dev.Name()}}); err != nil {
			return err
		}
	}
	m, err := startMetrics(ctx, cfg.Metrics, log)
	if err != nil {
		return err
	}
	session := sessionConfig("headend", cfg.Reorder, cfg.Probe, cfg.AQM)
	var localPort uint16
	if cfg.BPF.Enabled && !opts.NoBPF {
		ifaces := make([]string, 0, len(uplinks))
		for _, u := range uplinks {
			ifaces = append(ifaces, u.Interface)
		}
		// The shield spots tunnel packets by destination port: the uplink sockets bind
		// the headend's port so that replies to them carry it.
		if sh := startShield(log, endpoint.Port(), ifaces, m.Registry, host.keep.dir); sh != nil {
			defer sh.close()
			session.Keys = sh.observer()
			localPort = endpoint.Port()
			if fp := tryFastPath(log, fastPathOn, endpoint.Port(), dev.Name(), mtu, sh, m, host.keep); fp != nil {
				defer fp.close()
				session.FastPath = fp
				session.Routes = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
			}
		}
	}
	cpe, err := tunnel.NewCPE(tunnel.CPEConfig{
		Local: key, HeadendKey: handshake.PublicKey(cfg.Headend.PublicKey), Endpoint: endpoint,
		Uplinks: uplinks, Session: session, Rekey: cfg.RekeyInterval, LocalPort: localPort,
	}, dev, m, log)
	if err != nil {
		return err
	}
	if err := watchUplinks(ctx, log, m, cpe, cfg.Uplinks); err != nil {
		log.Warn("not watching the uplinks: a dead uplink leaves the bond only when its probes go unanswered, and an address change is not followed", "err", err)
	}
	if cfg.Fallback.Enabled {
		defer watchHeadend(ctx, log, m, cfg, dev.Name(), cpe)()
	}
	log.Info("cpe running", "tunnel", dev.Name(), "mtu", mtu, "headend", endpoint, "uplinks", len(uplinks))
	return cpe.Run(ctx)
}

// RunHeadend runs the headend until ctx ends.
func RunHeadend(ctx context.Context, cfg *config.Headend, opts Options, log *slog.Logger) error {
	key, err := handshake.LoadPrivateKeyFile(cfg.PrivateKeyFile)
	if err != nil {
		return err
	}
	mtu := cfg.Tunnel.MTU
	if mtu == 0 {
		mtu = 1500 - wire.Overhead
	}
	if !cfg.BPF.Enabled || opts.NoBPF {
		log.Info("BPF disabled (--no-bpf or bpf.enabled: false): forwarding in userspace, no XDP shield")
	}

	fastPathOn := cfg.BPF.Enabled && !opts.NoBPF && (cfg.BPF.FastPath || opts.FastPath)
	host := &hostChanges{log: log, tunName: cfg.Tunnel.Interface, pinRoot: cfg.BPF.PinDir}
	defer host.undo()
	host.prepare(planPersistence(log, fastPathOn, cfg.BPF.PinDir, cfg.Tunnel.Interface))
	dev, err := host.tunnel(mtu, cfg.Tunnel.Address)
	if err != nil {
		return err
	}
	var peers []tunnel.Peer
	for _, p := range cfg.Peers {
		prefixes := append(append([]netip.Prefix{}, p.TunnelAddress...), p.Routes...)
		if err := netcfg.AddRoutes(dev.Name(), prefixes, 0); err != nil {
			return err
		}
		peers = append(peers, tunnel.Peer{Name: p.Name, Key: handshake.PublicKey(p.PublicKey), Prefixes: prefixes})
	}
	if cfg.NAT.Enabled {
		rule := nat.Masquerade{InIface: dev.Name(), NotOutIface: dev.Name()}
		if cfg.NAT.OutInterface != "" {
			rule = nat.Masquerade{InIface: dev.Name(), OutIface: cfg.NAT.OutInterface}
		}
		if err := host.nat([]nat.Masquerade{rule}); err != nil {
			return err
		}
	}
	m, err := startMetrics(ctx, cfg.Metrics, log)
	if err != nil {
		return err
	}
	session := sessionConfig("", cfg.Reorder, cfg.Probe, cfg.AQM)
	if cfg.BPF.Enabled && !opts.NoBPF {
		if sh := startShield(log, cfg.Listen.Port(), shieldInterfaces(dev.Name()), m.Registry, host.keep.dir); sh != nil {
			defer sh.close()
			session.Keys = sh.observer()
			if fp := tryFastPath(log, fastPathOn, cfg.Listen.Port(), dev.Name(), mtu, sh, m, host.keep); fp != nil {
				defer fp.close()
				session.FastPath = fp
			}
		}
	}
	he, err := tunnel.NewHeadend(tunnel.HeadendConfig{
		Local: key, Listen: cfg.Listen, Peers: peers, Session: session,
	}, dev, m, log)
	if err != nil {
		return err
	}
	log.Info("headend running", "tunnel", dev.Name(), "mtu", mtu, "listen", cfg.Listen, "peers", len(peers))
	return he.Run(ctx)
}

// tryFastPath starts the kernel forwarding path behind the XDP shield. It is only
// worth having, and only sound, on the interfaces the shield guards (the receive
// program trusts the shield's tag check). Failing is not fatal: the daemon forwards
// everything itself and says why.
func tryFastPath(log *slog.Logger, wanted bool, port uint16, tunName string, mtu int, sh *shield, m *metrics.Set, keep persistence) *fastPath {
	if !wanted {
		log.Info("forwarding in userspace behind the XDP shield (bpf.fast_path: false, the default)")
		return nil
	}
	fp, err := startFastPath(log, port, tunName, mtu, sh, m.Registry, keep)
	if err != nil {
		log.Warn("BPF fast path not loaded: forwarding in userspace (same behaviour, slower)", "err", err)
		return nil
	}
	log.Info("BPF fast path on: data packets are striped, encapsulated and delivered in the kernel; the daemon handles the rest")
	return fp
}

func sessionConfig(peer string, r config.Reorder, p config.Probe, a config.AQM) tunnel.SessionConfig {
	return tunnel.SessionConfig{
		Peer: peer, MaxHold: r.MaxHold, MaxBuffer: int(r.MaxBuffer),
		Probe: p.Interval, DownAfter: p.DownAfter,
		AQMTarget: a.Target, AQMMaxTarget: a.MaxTarget,
	}
}

func startMetrics(ctx context.Context, c config.Metrics, log *slog.Logger) (*metrics.Set, error) {
	m := metrics.New()
	if !c.Enabled {
		return m, nil
	}
	if err := metrics.Serve(ctx, c.Listen.String(), m.Registry); err != nil {
		return nil, err
	}
	log.Info("metrics", "url", "http://"+c.Listen.String()+"/metrics")
	return m, nil
}

// resolveEndpoint turns the configured headend host:port into an address.
func resolveEndpoint(ctx context.Context, e config.Endpoint) (netip.AddrPort, error) {
	if a, err := netip.ParseAddr(e.Host); err == nil {
		return netip.AddrPortFrom(a.Unmap(), e.Port), nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip4", e.Host)
	if err != nil || len(addrs) == 0 {
		return netip.AddrPort{}, fmt.Errorf("headend.endpoint: cannot resolve %q: %v (use an IPv4 address, or fix DNS)", e.Host, err)
	}
	return netip.AddrPortFrom(addrs[0].Unmap(), e.Port), nil
}

// resolveUplinks fills in each uplink's source address and MTU from the interface
// when the config leaves them out, and returns the smallest MTU.
func resolveUplinks(ups []config.Uplink) ([]tunnel.Uplink, int, error) {
	out := make([]tunnel.Uplink, 0, len(ups))
	minMTU := 0
	for i, u := range ups {
		src := u.Source
		if !src.IsValid() {
			a, err := netcfg.FirstAddress(u.Interface, false)
			if err != nil {
				return nil, 0, fmt.Errorf("uplinks[%d] (%s): %w", i, u.Name, err)
			}
			src = a
		}
		mtu := u.MTU
		if mtu == 0 {
			m, err := netcfg.InterfaceMTU(u.Interface)
			if err != nil {
				return nil, 0, fmt.Errorf("uplinks[%d] (%s): %w", i, u.Name, err)
			}
			mtu = m
		}
		if minMTU == 0 || mtu < minMTU {
			minMTU = mtu
		}
		class, err := sched.ParseClass(string(u.Class))
		if err != nil {
			return nil, 0, fmt.Errorf("uplinks[%d].class: %w", i, err)
		}
		out = append(out, tunnel.Uplink{
			Interface: u.Interface, Source: src,
			Spec: tunnel.LinkSpec{
				ID: uint8(i), Name: u.Name, Class: class,
				TxRate: float64(u.RateUp), RxRate: float64(u.RateDown), Weight: float64(u.Weight),
			},
		})
	}
	return out, minMTU, nil
}
