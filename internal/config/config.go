// Package config loads and checks aggd's YAML config files, one for each mode: CPE and
// headend.
//
// Everything is checked before anything touches the network, and every problem is
// reported at once: the Load and Parse functions return *Problems, which lists each
// problem with its line and field path. A CLI prints it with
//
//	var probs *config.Problems
//	if errors.As(err, &probs) {
//		probs.WriteTo(os.Stderr)
//	}
//
// The documented examples are configs/cpe.example.yaml and configs/headend.example.yaml.
package config

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/aggd/aggd/internal/netcfg"
	"github.com/aggd/aggd/internal/wire"
)

// Options control how a config is checked.
type Options struct {
	// File names the config in messages ("cpe.yaml:12: ..."). The Load functions set it
	// to the path they were given.
	File string
	// InterfaceExists reports whether a network interface of that name exists on this
	// machine. nil means: ask the kernel (netcfg.InterfaceByName). Tests pass a fake.
	InterfaceExists func(name string) bool
	// Offline skips every check against this machine, for checking a file that is meant
	// for another one (`aggd check-config --offline`).
	Offline bool
}

// interfaceExists returns the check to use, or nil when checks against this machine are
// off.
func (o Options) interfaceExists() func(string) bool {
	switch {
	case o.Offline:
		return nil
	case o.InterfaceExists != nil:
		return o.InterfaceExists
	}
	return func(name string) bool {
		_, err := netcfg.InterfaceByName(name)
		return err == nil
	}
}

// readFile reads a config file, with an error that says what to do about it.
func readFile(path, example string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read config: %w (start from %s, or give another path)", err, example)
	}
	return data, nil
}

// Reorder bounds the receiver's resequencing buffer.
type Reorder struct {
	// MaxHold is the longest a packet waits for the ones before it before the gap is
	// given up as lost. The adaptive timer stays below it.
	MaxHold time.Duration `yaml:"max_hold"`
	// MaxBuffer caps the memory held for out-of-order packets per session.
	MaxBuffer Size `yaml:"max_buffer"`
	// LossRepair asks the peer to send again what a link lost at random, and delivers
	// it late, out of order, when it comes: TCP then undoes its reaction to the loss
	// (userspace datapath; BENCHMARKS.md, "Loss repair without the wait"). On by
	// default.
	LossRepair bool `yaml:"loss_repair"`
	// SparseFlows marks the packets this end sends of flows that send sparsely (a ping,
	// a DNS query, a game's or a call's packets further apart than the links' largest
	// RTT), so that the peer delivers them at once rather than behind the bond's
	// reordering of a bulk transfer (wire.FlagSparse). On by default; an aggd from before
	// 2026-12-08 drops such packets (bad_flags), so turn it off on this end while the
	// peer runs one.
	SparseFlows bool `yaml:"sparse_flows"`
}

// AQM sets the standing queue the bond tolerates before it drops (or marks) at its entry
// (CoDel on the queueing delay the peer measures on the links; both datapaths).
type AQM struct {
	// Target is the standing queue tolerated on every link that carries traffic.
	Target time.Duration `yaml:"target"`
	// MaxTarget bounds how far the target rises: to the fastest usable primary link's
	// one-packet time where that is longer than Target (no link carrying data measures
	// less), and to all of MaxTarget with a single usable link (nothing is reordered
	// then, and one TCP flow on a lossy line needs the queue). Lower it (down to Target)
	// for lower latency under load.
	MaxTarget time.Duration `yaml:"max_target"`
	// ECN: mark ECN-capable packets Congestion Experienced where the AQM would drop
	// them (RFC 3168): a sender that negotiated ECN then slows down without losing a
	// packet.
	ECN bool `yaml:"ecn"`
}

// Probe sets how often links are probed and when a silent one is declared down.
type Probe struct {
	// Interval between probes on each link, idle or in doubt (a busy one is probed
	// every fourth interval); also how often each side reports what it received.
	Interval time.Duration `yaml:"interval"`
	// DownAfter is how long a link may stay silent before it is declared down and its
	// traffic moves to the others.
	DownAfter time.Duration `yaml:"down_after"`
	// StandbyInterval is how often an idle standby link (class overflow or backup) is
	// probed instead: it carries nothing until the primaries fill up or fail, and a
	// metered line bills every probe. Its silence is suspect after three of these
	// intervals.
	StandbyInterval time.Duration `yaml:"standby_interval"`
}

// DefaultMetricsListen is where metrics are served unless metrics.listen says otherwise
// (aggd status looks there too).
const DefaultMetricsListen = "127.0.0.1:9469"

// Metrics configures the Prometheus endpoint.
type Metrics struct {
	// Enabled serves metrics over HTTP.
	Enabled bool `yaml:"enabled"`
	// Listen is the local ip:port to serve /metrics on.
	Listen netip.AddrPort `yaml:"listen"`
}

// Log configures logging to stderr.
type Log struct {
	// Level is the least severe message printed.
	Level LogLevel `yaml:"level"`
	// Format is text (key=value, for people) or json (for collectors).
	Format LogFormat `yaml:"format"`
}

// BPF configures the kernel fast path.
type BPF struct {
	// Enabled loads the XDP/tc programs. When false, or when they cannot load, the
	// daemon forwards everything itself (slower, same behaviour).
	Enabled bool `yaml:"enabled"`
	// FastPath also forwards data packets in the kernel (tc programs on agg0 and the
	// uplinks) instead of only checking them at XDP. Experimental and off by default
	// (docs/fastpath.md, Known problems).
	FastPath bool `yaml:"fast_path"`
	// PinDir is where the fast path pins its maps and program attachments on a BPF
	// filesystem, so that forwarding outlives the daemon and the next one adopts it
	// (docs/fastpath.md, Restarts).
	PinDir string `yaml:"pin_dir"`
}

// Defaults shared by both modes.
const (
	defaultTunnelInterface = "agg0"
	defaultMaxHold         = 200 * time.Millisecond
	defaultMaxBuffer       = 4 << 20
	defaultProbeInterval   = 100 * time.Millisecond
	// defaultDownAfter: six probe intervals without a reply. Short enough that an idle
	// link's death is known (and its share moved) within a second, even with the health
	// check's tick; long enough that a few lost probes on a lossy LTE link do not take
	// it out (the suspect state, at three intervals, copies its traffic meanwhile).
	// Links whose RTT is long get more time (see tunnel's checkHealth).
	defaultDownAfter = 600 * time.Millisecond
	// defaultStandbyProbeInterval: an idle standby link probed by both sides every 2 s
	// (and answering) carries about 0.35 GB in 30 days, against 15.6 GB when it was
	// probed like the others and carried FEEDBACK copies (TestIdleStandbyLinksCostLittle);
	// its death is then known after 6-12 s, while failover to it (the primaries dying)
	// is as quick as before.
	defaultStandbyProbeInterval = 2 * time.Second
	// maxStandbyProbeInterval: the CPE's probes are what keeps an idle link's mapping
	// in a carrier's NAT, and LTE carriers' NATs forget idle UDP after 30 s or so.
	maxStandbyProbeInterval = 20 * time.Second
	defaultAQMTarget        = 10 * time.Millisecond
	// defaultAQMMaxTarget: 30 ms above the slowest link is what issue #6 allows latency
	// under load to grow by. In the lab's SOHO scenario, two runs with it met that and
	// kept 0.89-0.94 of the links' sum, with the 0.2 Mbit/s ADSL upstream still
	// carrying its 5 %; at 100 ms the RTT rose 32-50 ms (BENCHMARKS.md). 25 ms was
	// tried: over five runs of it, the VPN scenarios' RTT was no better (their links
	// hardly queue; the wait is in the resequencer) and SOHO's upstream CUBIC goodput
	// came out lower on average (0.886-0.927 against 0.900-0.940).
	defaultAQMMaxTarget = 30 * time.Millisecond
	minAQMTarget        = time.Millisecond
	maxAQMTarget        = time.Second
)

func defaultAQM() AQM {
	return AQM{Target: defaultAQMTarget, MaxTarget: defaultAQMMaxTarget, ECN: true}
}

func defaultReorder() Reorder {
	return Reorder{MaxHold: defaultMaxHold, MaxBuffer: defaultMaxBuffer, LossRepair: true, SparseFlows: true}
}
func defaultProbe() Probe {
	return Probe{Interval: defaultProbeInterval, DownAfter: defaultDownAfter, StandbyInterval: defaultStandbyProbeInterval}
}
func defaultMetrics() Metrics {
	return Metrics{Enabled: true, Listen: netip.MustParseAddrPort(DefaultMetricsListen)}
}
func defaultLog() Log { return Log{Level: LogInfo, Format: LogText} }
func defaultBPF() BPF { return BPF{Enabled: true, PinDir: DefaultPinDir} }

// DefaultPinDir is bpf.pin_dir's default: aggd's directory on the BPF filesystem
// systemd mounts at boot.
const DefaultPinDir = "/sys/fs/bpf/aggd"

// Bounds of the numbers the checks enforce. They catch slips (a unit off by 1000), not
// taste: anything inside is accepted.
const (
	minMTU, maxMTU   = 576, 9000 // 576: the IPv4 minimum; 9000: jumbo frames
	MinMTUIPv6       = 1280      // IPv6 refuses links below this
	minMaxHold       = time.Millisecond
	maxMaxHold       = 5 * time.Second
	minMaxBuffer     = 64 << 10
	maxMaxBuffer     = 1 << 30
	minProbeInterval = 10 * time.Millisecond
	maxProbeInterval = 10 * time.Second
	maxDownAfter     = time.Minute
	maxWeight        = 1000
)

func (c *collector) checkReorder(r Reorder) {
	if r.MaxHold < minMaxHold || r.MaxHold > maxMaxHold {
		c.add("reorder.max_hold", "%s is out of range %s..%s", r.MaxHold, minMaxHold, maxMaxHold)
	}
	if r.MaxBuffer < minMaxBuffer || r.MaxBuffer > maxMaxBuffer {
		c.add("reorder.max_buffer", "%s is out of range %s..%s", r.MaxBuffer, Size(minMaxBuffer), Size(maxMaxBuffer))
	}
}

func (c *collector) checkAQM(a AQM) {
	if a.Target < minAQMTarget || a.Target > maxAQMTarget {
		c.add("aqm.target", "%s is out of range %s..%s", a.Target, minAQMTarget, maxAQMTarget)
		return
	}
	if a.MaxTarget < a.Target || a.MaxTarget > maxAQMTarget {
		c.add("aqm.max_target", "%s is out of range %s (aqm.target)..%s", a.MaxTarget, a.Target, maxAQMTarget)
	}
}

func (c *collector) checkBPF(b BPF) {
	if b.FastPath && !b.Enabled {
		c.add("bpf.fast_path", "needs bpf.enabled: true (the fast path runs behind the XDP shield); enable both or drop fast_path")
	}
	if !filepath.IsAbs(b.PinDir) {
		c.add("bpf.pin_dir", "%q is not an absolute path (a directory on a BPF filesystem, e.g. %s)", b.PinDir, DefaultPinDir)
	}
}

// checkBPFInterfaces checks the headend's bpf.interfaces. An interface missing now is
// not an error (the shield goes on it when it appears), but its name must be one.
func (c *collector) checkBPFInterfaces(names []string, tunnel string) {
	seen := make(map[string]bool, len(names))
	for i, name := range names {
		path := fmt.Sprintf("bpf.interfaces[%d]", i)
		c.checkInterface(path, name, nil)
		switch {
		case name == "lo":
			c.add(path, "the loopback interface carries no traffic from the CPEs; list the interfaces their packets arrive on (see `ip route get <a CPE's address>`)")
		case name == tunnel:
			c.add(path, "%q is the tunnel interface (tunnel.interface), which carries the CPEs' inner traffic; list the interfaces their tunnel packets arrive on", name)
		case seen[name]:
			c.add(path, "%q is listed twice", name)
		}
		seen[name] = true
	}
}

func (c *collector) checkProbe(p Probe) {
	if p.Interval < minProbeInterval || p.Interval > maxProbeInterval {
		c.add("probe.interval", "%s is out of range %s..%s", p.Interval, minProbeInterval, maxProbeInterval)
		return
	}
	// One lost probe must not take a link down: allow at least two to go missing.
	if p.DownAfter < 2*p.Interval || p.DownAfter > maxDownAfter {
		c.add("probe.down_after", "%s is out of range %s (two probe intervals)..%s", p.DownAfter, 2*p.Interval, maxDownAfter)
	}
	if p.StandbyInterval < p.Interval || p.StandbyInterval > maxStandbyProbeInterval {
		c.add("probe.standby_interval", "%s is out of range %s (probe.interval)..%s", p.StandbyInterval, p.Interval, maxStandbyProbeInterval)
	}
}

// checkMTU accepts 0 (automatic) or minMTU..maxMTU; minimum is raised to 1280 where the
// link carries IPv6.
func (c *collector) checkMTU(path string, mtu int, carriesIPv6 bool) {
	if mtu == 0 {
		return
	}
	if mtu < minMTU || mtu > maxMTU {
		c.add(path, "%d is out of range %d..%d; write 0 to size it from the uplinks", mtu, minMTU, maxMTU)
		return
	}
	if carriesIPv6 && mtu < MinMTUIPv6 {
		c.add(path, "%d is below %d, the least IPv6 works with, and the tunnel has an IPv6 address", mtu, MinMTUIPv6)
	}
}

// ifNameRE is what Linux accepts as an interface name: up to 15 bytes, no '/', ':' or
// white space.
var ifNameRE = regexp.MustCompile(`^[^/:\s]{1,15}$`)

// checkInterface checks an interface name's syntax and, unless offline, that it exists.
func (c *collector) checkInterface(path, name string, exists func(string) bool) {
	switch {
	case !ifNameRE.MatchString(name) || name == "." || name == "..":
		c.add(path, "%q is not a valid interface name (at most 15 characters, no '/', ':' or spaces)", name)
	case exists != nil && !exists(name):
		c.add(path, "there is no interface %q on this machine; see `ip link`, or check with --offline if the file is for another machine", name)
	}
}

func (c *collector) checkName(path, name string) {
	if name == "" {
		c.add(path, "missing; give it a short name such as \"dsl\"")
	} else if !wire.ValidName(name) { // uplink names travel in LINK_NAMES: the wire's rule
		c.add(path, "%q is not a valid name; use up to 32 letters, digits, '-', '_' or '.', e.g. \"dsl\"", name)
	}
}

// checkKeyFile catches the private key pasted where its file name belongs.
func (c *collector) checkKeyFile(path, file string) {
	if file == "" {
		c.add(path, "missing; write the path of this machine's private key file, e.g. /etc/aggd/private.key")
		return
	}
	if _, err := ParseKey(file); err == nil {
		c.add(path, "this looks like a key, not a file name; put the key in a file readable only by root and write its path here")
	}
}

// checkRoutes checks a list of routed prefixes: no host bits set (usually a typo for a
// network address) and no repeats.
func (c *collector) checkRoutes(path string, routes []netip.Prefix) {
	seen := map[netip.Prefix]int{}
	for i, p := range routes {
		ip := fmt.Sprintf("%s[%d]", path, i)
		if p != p.Masked() {
			c.add(ip, "%s has host bits set; did you mean %s?", p, p.Masked())
			continue
		}
		if j, dup := seen[p]; dup {
			c.add(ip, "%s is already listed at %s[%d]", p, path, j)
			continue
		}
		seen[p] = i
	}
}

// checkUnicast refuses addresses that cannot be an interface's own or a next hop.
func (c *collector) checkUnicast(path string, a netip.Addr) {
	if a.IsValid() && (a.IsUnspecified() || a.IsMulticast() || a.IsLoopback()) {
		c.add(path, "%s cannot be used here (unspecified, multicast or loopback)", a)
	}
}

// hasIPv6 reports whether any of the prefixes is IPv6.
func hasIPv6(ps []netip.Prefix) bool {
	for _, p := range ps {
		if p.Addr().Is6() {
			return true
		}
	}
	return false
}
