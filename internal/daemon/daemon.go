// Package daemon turns a validated configuration into a running CPE or headend: it
// prepares the host (tunnel interface, addresses, routes, NAT), starts the datapath and
// the metrics endpoint, and undoes every change on shutdown. Leftovers of a crashed run
// are removed first, so a restart always starts from a clean host.
package daemon

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"

	"github.com/aggd/aggd/internal/config"
	"github.com/aggd/aggd/internal/handshake"
	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/nat"
	"github.com/aggd/aggd/internal/netcfg"
	"github.com/aggd/aggd/internal/tunnel"
	"github.com/aggd/aggd/internal/wire"
)

// Options are command-line choices that override the file.
type Options struct {
	NoBPF    bool
	FastPath bool // turn the kernel fast path on whatever bpf.fast_path says
	// Reload receives a value for each reload request (SIGHUP); ConfigPath is the file
	// to read again then. The headend applies its peers[] (reload.go), the CPE its
	// uplinks' classes, rates and weights (retune.go).
	Reload     <-chan struct{}
	ConfigPath string
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
	uplinks, autoMTU, err := resolveUplinks(ctx, cfg.Uplinks, cfg.Headend.Endpoint)
	if err != nil {
		return err
	}
	mtu := cfg.Tunnel.MTU
	if mtu == 0 {
		mtu = autoMTU
	}
	for i := range uplinks {
		// What the headend is told: no uplink takes more than the tunnel does.
		uplinks[i].MTU = min(uplinks[i].MTU, mtu)
	}
	port := cfg.Headend.Endpoint.Port // every uplink's endpoint has it (config check)
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
			if err := netcfg.AddGatewayRoute(uplinks[i].Endpoint.Addr(), u.Gateway, u.Interface, gatewayRouteMetric(i)); err != nil {
				if uplinks[i].Waiting == "" {
					return err
				}
				// Put in place when the uplink gets its address (uplinkWatch.rebind).
				log.Info("route to the headend through the uplink's gateway deferred: the uplink is not usable yet", "link", u.Name, "err", err)
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
	var masq []nat.Masquerade
	if cfg.Tunnel.NAT {
		// LAN hosts leave through agg0 with the CPE's tunnel address.
		masq = []nat.Masquerade{{OutIface: dev.Name()}}
	}
	if err := host.netfilter(masq); err != nil {
		return err
	}
	m, err := startMetrics(ctx, cfg.Metrics, log)
	if err != nil {
		return err
	}
	session := sessionConfig("headend", cfg.Reorder, cfg.Probe, cfg.AQM)
	var localPort uint16
	var created func(string)       // an uplink's interface created anew: its receive programs
	var mtuChanged func(int)       // the tunnel's MTU moved: the fast path's
	var uplinkChanged func(string) // an uplink's carrier, address or routes changed: the fast path's
	if cfg.BPF.Enabled && !opts.NoBPF {
		ifaces := make([]string, 0, len(uplinks))
		for _, u := range uplinks {
			ifaces = append(ifaces, u.Interface)
		}
		// The shield spots tunnel packets by destination port: the uplink sockets bind
		// the headend's port so that replies to them carry it.
		if sh := startShield(log, port, ifaces, false, m.Registry, host.keep.dir); sh != nil {
			defer sh.close()
			session.Keys = sh.observer()
			localPort = port
			fp := tryFastPath(log, fastPathOn, port, dev.Name(), mtu, sh, m, host.keep)
			dropUnwantedAttachments(log, host.keep, sh, fp)
			if fp != nil {
				defer fp.close()
				session.FastPath = fp
				session.Routes = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
				mtuChanged = fp.setMTU
				uplinkChanged = fp.uplinkChanged
			}
			created = func(name string) { interfaceCreated(log, sh, fp, name) }
		} else {
			dropUnwantedAttachments(log, host.keep, nil, nil)
		}
	}
	cpe, err := tunnel.NewCPE(tunnel.CPEConfig{
		Local: key, HeadendKey: handshake.PublicKey(cfg.Headend.PublicKey),
		Uplinks: uplinks, Session: session, Rekey: cfg.RekeyInterval, LocalPort: localPort,
	}, dev, m, log)
	if err != nil {
		return err
	}
	headend := make([]netip.Addr, len(uplinks))
	for i, u := range uplinks {
		headend[i] = u.Endpoint.Addr()
	}
	uw := &uplinkWatch{log: log, m: m, cpe: cpe, uplinks: cfg.Uplinks, headend: headend, created: created,
		tunName: dev.Name(), autoMTU: cfg.Tunnel.MTU == 0, raiseAfter: cfg.Tunnel.MTURaiseAfter, mtuChanged: mtuChanged,
		uplinkChanged: uplinkChanged, neighbours: newNeighbourRechecks(ctx)}
	if err := uw.watch(ctx); err != nil {
		log.Warn("not watching the uplinks: a dead uplink leaves the bond only when its probes go unanswered, and an address change is not followed", "err", err)
	}
	if cfg.Fallback.Enabled {
		defer watchHeadend(ctx, log, m, cfg, dev.Name(), cpe)()
	}
	// The caps' final save waits for their watch to stop, which it does when the CPE
	// stops for whatever reason (deferred calls run last first).
	capCtx, stopCaps := context.WithCancel(ctx)
	caps, waitCaps := watchDataCaps(capCtx, log, m, cfg, cpe)
	defer waitCaps()
	defer stopCaps()
	go retuneUplinksOnRequest(ctx, log, opts, cfg, cpe, caps)
	log.Info("cpe running", "tunnel", dev.Name(), "mtu", mtu, "headend", cfg.Headend.Endpoint.String(), "uplinks", len(uplinks))
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
		// Sized for Ethernet uplinks, and for IPv6 outer headers when the headend
		// listens on IPv6 (or both): a CPE's IPv6-only uplink then carries a full
		// packet unfragmented.
		mtu = 1500 - wire.OverheadFor(cfg.Listen.Addr())
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
	peers := headendPeers(cfg.Peers)
	for _, p := range peers {
		if err := netcfg.AddRoutes(dev.Name(), p.Prefixes, 0); err != nil {
			return err
		}
	}
	var masq []nat.Masquerade
	if cfg.NAT.Enabled {
		rule := nat.Masquerade{InIface: dev.Name(), NotOutIface: dev.Name()}
		if cfg.NAT.OutInterface != "" {
			rule = nat.Masquerade{InIface: dev.Name(), OutIface: cfg.NAT.OutInterface}
		}
		masq = []nat.Masquerade{rule}
	}
	if err := host.netfilter(masq); err != nil {
		return err
	}
	m, err := startMetrics(ctx, cfg.Metrics, log)
	if err != nil {
		return err
	}
	session := sessionConfig("", cfg.Reorder, cfg.Probe, cfg.AQM)
	mtus := newPeerMTUs(log, dev.Name(), mtu, peers)
	session.PeerMTU = mtus.announced
	var sh *shield
	var fp *fastPath
	if cfg.BPF.Enabled && !opts.NoBPF {
		ifaces := headendInterfaces(cfg, dev.Name())
		if len(cfg.BPF.Interfaces) == 0 {
			log.Info("XDP shield goes on the interfaces of the default routes and of the listen address "+
				"(set bpf.interfaces if the CPEs' packets arrive elsewhere)", "interfaces", strings.Join(ifaces, ","))
		}
		if sh = startShield(log, cfg.Listen.Port(), ifaces, true, m.Registry, host.keep.dir); sh != nil {
			defer sh.close()
			session.Keys = sh.observer()
			fp = tryFastPath(log, fastPathOn, cfg.Listen.Port(), dev.Name(), mtu, sh, m, host.keep)
			dropUnwantedAttachments(log, host.keep, sh, fp)
			if fp != nil {
				defer fp.close()
				session.FastPath = fp
			}
		} else {
			dropUnwantedAttachments(log, host.keep, nil, nil)
		}
	}
	// The interface watch runs with or without the shield: the sessions follow the
	// carrier of every interface their links' packets arrive on. It starts before the
	// headend exists and tells it once there is one (before, no session has a link to
	// take down). Stopped before the fast path and the shield close (defers run last
	// first).
	var running atomic.Pointer[tunnel.Headend]
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	neighbours := newNeighbourRechecks(wctx)
	watchNewInterfaces(wctx, log, sh, func() []string { return headendInterfaces(cfg, dev.Name()) },
		func(name string) { interfaceCreated(log, sh, fp, name) },
		func(name string) { interfaceDeleted(sh, fp, name); neighbours.carrier(log, name, false) },
		func(name string, index int, up bool) {
			if at, ok := sh.attached()[name]; ok && at == index {
				interfaceCarrier(log, fp, neighbours, name, up)
			}
			if he := running.Load(); he != nil {
				he.InterfaceCarrier(index, up)
			}
		})
	he, err := tunnel.NewHeadend(tunnel.HeadendConfig{
		Local: key, Listen: cfg.Listen, Peers: peers, Session: session,
	}, dev, m, log)
	if err != nil {
		return err
	}
	running.Store(he)
	log.Info("headend running", "tunnel", dev.Name(), "mtu", mtu, "listen", cfg.Listen, "peers", len(peers))
	reloads := make(chan struct{})
	go func() { defer close(reloads); reloadPeersOnRequest(ctx, log, opts, cfg, he, mtus) }()
	err = he.Run(ctx) // returns once ctx is done
	<-reloads         // a reload under way finishes before the deferred undo
	return err
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
		Peer: peer, MaxHold: r.MaxHold, MaxBuffer: int(r.MaxBuffer), LossRepair: r.LossRepair, SparseFlows: r.SparseFlows,
		Probe: p.Interval, DownAfter: p.DownAfter, StandbyProbe: p.StandbyInterval,
		AQMTarget: a.Target, AQMMaxTarget: a.MaxTarget, AQMECN: a.ECN,
	}
}

func startMetrics(ctx context.Context, c config.Metrics, log *slog.Logger) (*metrics.Set, error) {
	m := metrics.New()
	if !c.Enabled {
		return m, nil
	}
	if err := metrics.Serve(ctx, c.Listen.String(), m); err != nil {
		return nil, err
	}
	log.Info("metrics", "url", "http://"+c.Listen.String()+"/metrics")
	return m, nil
}
