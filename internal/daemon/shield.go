package daemon

import (
	"log/slog"
	"net"

	"github.com/cilium/ebpf/link"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/aggd/aggd/internal/bpf"
	"github.com/aggd/aggd/internal/tunnel"
)

// shield is the XDP receive shield attached to the interfaces tunnel traffic arrives
// on. It drops malformed packets, unknown sessions and bad tags before the kernel
// allocates an skb; the daemon keeps its session map current.
type shield struct {
	log    *slog.Logger
	prog   *bpf.Shield
	links  []link.Link
	ifaces []string // where it is attached
}

// startShield loads and attaches the shield. Failing to do so is not fatal: the
// daemon checks every packet itself too, so it goes on without, and says why.
//
// With pins (the fast path's persistence) its maps and links are pinned there, and an
// earlier run's are adopted: the session keys it holds keep the earlier run's traffic
// passing until its sessions are retired.
func startShield(log *slog.Logger, port uint16, ifaces []string, reg *prometheus.Registry, pins string) *shield {
	prog, err := bpf.LoadShieldPinned(port, pins)
	if err != nil {
		log.Warn("XDP shield not loaded; the daemon checks every packet itself (slower under attack)", "err", err)
		return nil
	}
	s := &shield{log: log, prog: prog}
	for _, name := range ifaces {
		ifc, err := net.InterfaceByName(name)
		if err != nil {
			log.Warn("XDP shield: interface not found", "interface", name, "err", err)
			continue
		}
		l, mode, err := prog.AttachPinned(ifc.Index, bpf.LinkPin(pins, "xdp", name))
		if err != nil {
			log.Warn("XDP shield not attached", "interface", name, "err", err)
			continue
		}
		s.links = append(s.links, l)
		s.ifaces = append(s.ifaces, name)
		log.Info("XDP shield attached", "interface", name, "mode", mode)
	}
	if len(s.links) == 0 {
		prog.Close()
		return nil
	}
	reg.MustRegister(shieldCollector{prog: prog})
	return s
}

// interfaces lists the interfaces the shield guards.
func (s *shield) interfaces() []string { return s.ifaces }

// sessionKeys adapts the shield to the tunnel's key observer.
func (s *shield) observer() tunnel.KeyObserver {
	if s == nil {
		return nil
	}
	return shieldKeys{s.prog, s.log}
}

func (s *shield) close() {
	if s == nil {
		return
	}
	for _, l := range s.links {
		l.Close()
	}
	s.prog.Close()
}

type shieldKeys struct {
	prog *bpf.Shield
	log  *slog.Logger
}

func (k shieldKeys) SessionKeys(index uint32, gens []tunnel.KeyGeneration) {
	keys := make([]bpf.SessionKey, 0, len(gens))
	for _, g := range gens {
		keys = append(keys, bpf.SessionKey{ID: g.ID, Key: g.Key})
	}
	if err := k.prog.SetSession(index, keys); err != nil {
		k.log.Warn("XDP shield: cannot install session keys; its packets will be dropped as unknown_session", "session", index, "err", err)
	}
}

func (k shieldKeys) SessionClosed(index uint32) {
	if err := k.prog.DeleteSession(index); err != nil {
		k.log.Warn("XDP shield: cannot remove session", "session", index, "err", err)
	}
}

// shieldCollector exports the shield's per-reason counters at scrape time.
type shieldCollector struct{ prog *bpf.Shield }

var xdpDesc = prometheus.NewDesc("aggd_xdp_packets_total",
	"Tunnel-port packets judged by the XDP shield, by verdict: pass, or the drop reason.",
	[]string{"reason"}, nil)

func (c shieldCollector) Describe(ch chan<- *prometheus.Desc) { ch <- xdpDesc }

func (c shieldCollector) Collect(ch chan<- prometheus.Metric) {
	stats, err := c.prog.Stats()
	if err != nil {
		return
	}
	for reason, v := range stats {
		ch <- prometheus.MustNewConstMetric(xdpDesc, prometheus.CounterValue, float64(v), reason)
	}
}

// shieldInterfaces lists where the headend's tunnel traffic may arrive: every interface
// that is up, except loopback and the tunnel itself (its packets are inner traffic).
func shieldInterfaces(tunName string) []string {
	ifcs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	var out []string
	for _, i := range ifcs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 || i.Name == tunName {
			continue
		}
		out = append(out, i.Name)
	}
	return out
}
