package daemon

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/aggd/aggd/internal/bpf"
	"github.com/aggd/aggd/internal/config"
	"github.com/aggd/aggd/internal/netcfg"
	"github.com/aggd/aggd/internal/tunnel"
)

// shield is the XDP receive shield attached to the interfaces tunnel traffic arrives
// on. It drops malformed packets, unknown sessions and bad tags before the kernel
// allocates an skb; the daemon keeps its session map current.
type shield struct {
	log  *slog.Logger
	prog *bpf.Shield
	pins string

	mu     sync.Mutex
	links  map[string]attachment // by interface name
	ifaces []string              // where it is attached, in the order attached
}

// attachment is the shield's link on one interface, and that interface's index.
type attachment struct {
	link  link.Link
	index int
}

// shieldInits is the shield's limit on the INITs that carry no mac2, before the
// daemon reads them. Each one the daemon reads costs it a receive, a mac check and,
// under a flood, a cookie reply: 14-15 µs at 5000 a second on a 2-vCPU machine, and
// the pings through the bond did not notice; at about 7000 the read loop, which also
// reads every CPE's data, fell behind (41 µs each) and the pings took up to 37 ms
// (BENCHMARKS.md, "Reconnecting during a handshake flood"). 5000 a second is 50 times
// the responder's own limit, so a CPE's INIT still finds its cookie reply in most
// floods; the burst (500 INITs) takes a headend restart's herd of CPEs.
var shieldInits = bpf.InitLimit{PerSecond: 5000, Burst: 100 * time.Millisecond}

// startShield loads and attaches the shield. Failing to do so is not fatal: the
// daemon checks every packet itself too, so it goes on without, and says why.
//
// With pins (the fast path's persistence) its maps and links are pinned there, and an
// earlier run's are adopted: the session keys it holds keep the earlier run's traffic
// passing until its sessions are retired. With more, the shield is kept even when it
// is attached nowhere yet: the caller attaches it to interfaces as they come.
func startShield(log *slog.Logger, port uint16, ifaces []string, more bool, reg *prometheus.Registry, pins string) *shield {
	prog, err := bpf.LoadShieldPinned(port, shieldInits, pins)
	if err != nil {
		log.Warn("XDP shield not loaded; the daemon checks every packet itself (slower under attack)", "err", err)
		return nil
	}
	s := &shield{log: log, prog: prog, pins: pins, links: make(map[string]attachment)}
	missing := 0
	for _, name := range ifaces {
		if _, err := netcfg.InterfaceByName(name); err != nil {
			log.Warn("XDP shield: interface not found (attached when it appears)", "interface", name, "err", err)
			missing++
			continue
		}
		s.attachTo(name)
	}
	if len(s.links) == 0 && missing == 0 {
		if !more {
			log.Warn("XDP shield not attached anywhere; the daemon checks every packet itself (slower under attack)")
			prog.Close()
			return nil
		}
		log.Warn("XDP shield not attached anywhere yet (no interface to attach to: no default route, and bpf.interfaces unset?); " +
			"the daemon checks every packet itself until one comes up")
	}
	reg.MustRegister(shieldCollector{prog: prog})
	return s
}

// attachTo attaches the shield to the interface now named name, in place of an
// attachment to an earlier interface of that name, and says whether it is attached.
func (s *shield) attachTo(name string) bool {
	ifc, err := netcfg.InterfaceByName(name)
	if err != nil {
		s.log.Warn("XDP shield: interface not found", "interface", name, "err", err)
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.detachLocked(name)
	l, mode, err := s.prog.AttachPinned(ifc.Index, bpf.LinkPin(s.pins, "xdp", name))
	if err != nil {
		s.log.Warn("XDP shield not attached", "interface", name, "err", err)
		return false
	}
	s.links[name] = attachment{l, ifc.Index}
	if !slices.Contains(s.ifaces, name) {
		s.ifaces = append(s.ifaces, name)
	}
	s.log.Info("XDP shield attached", "interface", name, "index", ifc.Index, "mode", mode)
	return true
}

// detach forgets the attachment to the interface named name (deleted: its link is
// defunct), freeing the link and its pin.
func (s *shield) detach(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.detachLocked(name)
}

func (s *shield) detachLocked(name string) {
	if old, ok := s.links[name]; ok {
		_ = old.link.Close()
		delete(s.links, name)
	}
}

// attached returns the index of the interface each attachment is on, by name (none
// for a headend without a shield: nil).
func (s *shield) attached() map[string]int {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	index := make(map[string]int, len(s.links))
	for name, a := range s.links {
		index[name] = a.index
	}
	return index
}

// interfaces lists the interfaces the shield guards.
func (s *shield) interfaces() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ifaces)
}

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
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.links {
		a.link.Close()
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

// headendInterfaces lists where the CPEs' tunnel traffic arrives at the headend, so
// where the shield goes: bpf.interfaces if set, else the interfaces of the default
// routes and the one holding the listen address (unless it is loopback). Not every
// interface that is up: a host running containers has a veth or a bridge per container,
// and a shield on those would make their traffic pay for XDP (a veth copies every
// packet an XDP program may see) and, with the fast path, steer their receive
// processing to one CPU.
func headendInterfaces(cfg *config.Headend, tunName string) []string {
	if len(cfg.BPF.Interfaces) > 0 {
		return slices.Clone(cfg.BPF.Interfaces)
	}
	names := netcfg.DefaultRouteInterfaces()
	if a := cfg.Listen.Addr(); !a.IsUnspecified() {
		if name, err := netcfg.InterfaceWithAddress(a); err == nil && name != "lo" {
			names = append(names, name)
		}
	}
	names = slices.DeleteFunc(names, func(n string) bool { return n == tunName })
	slices.Sort(names)
	return slices.Compact(names)
}

// watchNewInterfaces follows the headend's interfaces until ctx ends, so that tunnel
// traffic is guarded (and, with the fast path, delivered in the kernel) on whichever
// it arrives: created is called for each interface wanted lists (headendInterfaces, at
// the time) that is up and not attached to under its current index (one that came up
// after the start, or came back as a new interface of an old name), deleted for each
// attached one that goes away, and carrier when any interface (name, index) loses its
// carrier (up false; also when it is deleted) or has it again: the sessions follow the
// interfaces their links' packets arrive on, which need not be the shield's (sh nil: a
// headend without one). The CPE follows its uplinks through netwatch instead
// (uplinkWatch).
func watchNewInterfaces(ctx context.Context, log *slog.Logger, sh *shield, wanted func() []string, created, deleted func(name string),
	carrier func(name string, index int, up bool)) {
	go func() {
		for ctx.Err() == nil {
			// Each subscription lists the existing interfaces first: what came up
			// before it (or between two of them) is not missed.
			updates := make(chan netlink.LinkUpdate, 64)
			err := netlink.LinkSubscribeWithOptions(updates, ctx.Done(), netlink.LinkSubscribeOptions{
				ListExisting: true,
				ErrorCallback: func(err error) {
					if ctx.Err() == nil { // at the stop the library closes its socket under its read
						log.Warn("watching for new interfaces", "err", err)
					}
				},
			})
			if err != nil {
				log.Warn("cannot watch for new interfaces; retrying", "err", err)
			} else {
				followInterfaces(updates, sh, wanted, created, deleted, carrier)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
}

// followInterfaces acts on link updates until the channel closes. Every recheck it also
// looks at what wanted lists now: without bpf.interfaces that follows the default
// routes, which can appear or move (DHCP, a second line) with no link update at all.
func followInterfaces(updates <-chan netlink.LinkUpdate, sh *shield, wanted func() []string, created, deleted func(string),
	carrier func(string, int, bool)) {
	tried := make(map[string]int) // the index created was last called for, by name: once per interface
	running := make(map[int]bool) // every interface's carrier as last seen, by index
	// unattached: the interface is up and neither attached to nor tried under its index.
	unattached := func(name string, index int, up bool) bool {
		at, ok := sh.attached()[name]
		return up && (!ok || at != index) && tried[name] != index
	}
	attach := func(name string, index int) {
		tried[name] = index
		created(name)
	}
	tick := time.NewTicker(recheck)
	defer tick.Stop()
	for {
		select {
		case u, open := <-updates:
			if !open {
				return
			}
			a := u.Attrs()
			if u.Header.Type == unix.RTM_DELLINK {
				delete(tried, a.Name)
				if running[a.Index] {
					carrier(a.Name, a.Index, false)
				}
				delete(running, a.Index)
				if at, ok := sh.attached()[a.Name]; ok && at == a.Index {
					deleted(a.Name)
				}
				continue
			}
			if sh != nil && unattached(a.Name, a.Index, a.Flags&net.FlagUp != 0) && slices.Contains(wanted(), a.Name) {
				attach(a.Name, a.Index)
			}
			up := a.Flags&net.FlagUp != 0 && a.RawFlags&unix.IFF_LOWER_UP != 0
			if was, seen := running[a.Index]; seen && was != up {
				carrier(a.Name, a.Index, up)
			}
			running[a.Index] = up
		case <-tick.C:
			if sh == nil {
				continue
			}
			for _, name := range wanted() {
				if ifc, err := netcfg.InterfaceByName(name); err == nil && unattached(name, ifc.Index, ifc.Flags&net.FlagUp != 0) {
					attach(name, ifc.Index)
				}
			}
		}
	}
}

// recheck is how often followInterfaces looks at the interfaces it wants unprompted.
const recheck = 10 * time.Second
