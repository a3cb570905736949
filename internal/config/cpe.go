package config

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"time"
)

// CPE is the config of `aggd cpe`: the router that bonds its uplinks towards a headend.
type CPE struct {
	// PrivateKeyFile is the path of this CPE's X25519 private key (base64, one line).
	// Required.
	PrivateKeyFile string `yaml:"private_key_file"`
	// Headend says where the bond ends. Required.
	Headend HeadendRef `yaml:"headend"`
	// Tunnel configures the agg0 interface that LAN traffic is routed into.
	Tunnel CPETunnel `yaml:"tunnel"`
	// Uplinks are the access links to bond. At least one, with class primary.
	Uplinks []Uplink `yaml:"uplinks"`
	// Reorder bounds the resequencing of downstream traffic.
	Reorder Reorder `yaml:"reorder"`
	// Probe sets link probing and failure detection.
	Probe Probe `yaml:"probe"`
	// AQM bounds the standing queue of upstream traffic.
	AQM AQM `yaml:"aqm"`
	// RekeyInterval is how often the CPE runs a new handshake for fresh session keys.
	RekeyInterval time.Duration `yaml:"rekey_interval"`
	// Metrics configures the Prometheus endpoint.
	Metrics Metrics `yaml:"metrics"`
	// Log configures logging.
	Log Log `yaml:"log"`
	// BPF configures the kernel fast path.
	BPF BPF `yaml:"bpf"`
	// Fallback routes LAN traffic directly out of an uplink while the headend is
	// unreachable.
	Fallback Fallback `yaml:"fallback"`
	// StateDir is where the daemon keeps what must outlive it: the uplinks' data use in
	// the current billing period (data_cap).
	StateDir string `yaml:"state_dir"`
}

// Fallback configures direct routing while the headend does not answer.
type Fallback struct {
	// Enabled turns the fallback on. Off by default: traffic that leaves directly
	// comes from the uplink's own address, not the headend's, which some users bond
	// precisely to avoid.
	Enabled bool `yaml:"enabled"`
	// DirectAfter is how long the headend must be silent before new LAN connections
	// leave directly (NAT) out of the best uplink. When it answers again, new
	// connections use the bond; the direct ones stay direct until they end.
	DirectAfter time.Duration `yaml:"direct_after"`
}

// HeadendRef is the headend a CPE connects to.
type HeadendRef struct {
	// Endpoint is the headend's public host:port; a host name is resolved at connect
	// time, not here. Required.
	Endpoint Endpoint `yaml:"endpoint"`
	// PublicKey is the headend's static public key. Required.
	PublicKey Key `yaml:"public_key"`
}

// CPETunnel configures the CPE's side of the tunnel.
type CPETunnel struct {
	// Interface is the TUN device aggd creates.
	Interface string `yaml:"interface"`
	// Address lists the tunnel addresses the headend assigned to this CPE: an IPv4 /32
	// and/or an IPv6 prefix. They must match this CPE's peer entry on the headend.
	// Required.
	Address []netip.Prefix `yaml:"address"`
	// MTU of the tunnel interface; 0 sizes it from the smallest uplink MTU minus the
	// encapsulation overhead, following the uplinks as they change.
	MTU int `yaml:"mtu"`
	// MTURaiseAfter is how long an automatic MTU (MTU 0) waits before it goes back up
	// once the uplinks allow more (the small one left, or its MTU grew). It goes down at
	// once. The wait keeps it from following every reconnect of a PPPoE line, whose
	// interface goes away and comes back each time.
	MTURaiseAfter time.Duration `yaml:"mtu_raise_after"`
	// Routes are the destinations routed into the tunnel. An explicit empty list routes
	// nothing (you add routes yourself).
	Routes []netip.Prefix `yaml:"routes"`
	// RouteMetric is the metric of those routes, so that they can sit next to the
	// uplinks' own default routes; lower wins.
	RouteMetric uint32 `yaml:"route_metric"`
	// NAT masquerades LAN traffic to the tunnel address. Turn it off if the headend
	// routes the LAN prefix back to this CPE.
	NAT bool `yaml:"nat"`
}

// Uplink is one access link of a CPE.
type Uplink struct {
	// Name identifies the link in logs and metrics, e.g. "dsl". Required, unique.
	Name string `yaml:"name"`
	// Interface is the network interface the link leaves by. Required, unique, and it
	// must exist when the daemon starts, unless Hotplug is set.
	Interface string `yaml:"interface"`
	// Hotplug says the interface may be missing when the daemon starts (an LTE modem
	// or USB tethering not plugged in yet, a PPP session not up yet): the CPE starts
	// without the link and adds it when the interface appears with an address. An
	// interface that exists but has no address yet, or is deleted and created again
	// later, is waited for whatever this says.
	Hotplug bool `yaml:"hotplug"`
	// Source is the address packets leave with; unset means the interface's first
	// address, followed as it changes (LTE, DHCP): IPv4 if the interface has a global
	// one, else IPv6 (an IPv6-only line: DS-Lite, many LTE networks).
	Source netip.Addr `yaml:"source"`
	// Endpoint is the headend's host:port as this uplink reaches it, when that is not
	// headend.endpoint: typically the headend's IPv6 address for an IPv6-only uplink
	// while headend.endpoint is its IPv4 one. Same port as headend.endpoint. Unset: the
	// uplink uses headend.endpoint (a host name resolves to the uplink's IP version).
	Endpoint Endpoint `yaml:"endpoint"`
	// Gateway is the next hop on Ethernet-like links; unset means the interface's
	// default route, and none is needed on point-to-point links (PPPoE, raw-IP WWAN).
	Gateway netip.Addr `yaml:"gateway"`
	// Class says when the link carries traffic: primary (always), overflow (only when
	// the primaries are full) or backup (only when no primary is up).
	Class Class `yaml:"class"`
	// RateUp is the expected upload rate, a starting point and cap for the measured
	// capacity; 0 (unset) means measure from nothing.
	RateUp Rate `yaml:"rate_up"`
	// RateDown is the expected download rate, as RateUp.
	RateDown Rate `yaml:"rate_down"`
	// Weight pins the link's share of traffic against the others' weights. 0 (the
	// default) lets aggd measure it; pin only if you know better than the measurement.
	Weight int `yaml:"weight"`
	// MTU of the path over this link; 0 takes the interface's MTU.
	MTU int `yaml:"mtu"`
	// DataCap limits what the link carries per billing period (a metered LTE line):
	// once reached, the link is used only as a backup until the next period.
	DataCap DataCap `yaml:"data_cap"`
}

func (u *Uplink) setDefaults() { u.Class = ClassPrimary }

// Defaults that only the CPE has.
const (
	defaultRouteMetric   = 10
	defaultRekeyInterval = 120 * time.Second
	minRekeyInterval     = 10 * time.Second
	maxRekeyInterval     = 24 * time.Hour
)

// DefaultCPE returns the CPE config with every default filled in and the required
// fields empty. Parsing starts from it, so a key left out keeps its default.
func DefaultCPE() *CPE {
	return &CPE{
		Tunnel: CPETunnel{
			Interface:     defaultTunnelInterface,
			Routes:        []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")},
			RouteMetric:   defaultRouteMetric,
			NAT:           true,
			MTURaiseAfter: defaultMTURaiseAfter,
		},
		Reorder:       defaultReorder(),
		Probe:         defaultProbe(),
		AQM:           defaultAQM(),
		RekeyInterval: defaultRekeyInterval,
		Metrics:       defaultMetrics(),
		Log:           defaultLog(),
		BPF:           defaultBPF(),
		Fallback:      Fallback{DirectAfter: defaultDirectAfter},
		StateDir:      DefaultStateDir,
	}
}

// LoadCPE reads and checks a CPE config file, checking interfaces against this machine.
func LoadCPE(path string) (*CPE, error) {
	return LoadCPEWith(path, Options{})
}

// LoadCPEWith is LoadCPE with options; opts.File is set to path.
func LoadCPEWith(path string, opts Options) (*CPE, error) {
	data, err := readFile(path, "configs/cpe.example.yaml")
	if err != nil {
		return nil, err
	}
	opts.File = path
	return ParseCPE(data, opts)
}

// ParseCPE decodes and checks a CPE config. On any problem it returns nil and a
// *Problems listing all of them.
func ParseCPE(data []byte, opts Options) (*CPE, error) {
	c := newCollector()
	cfg := DefaultCPE()
	if c.decodeDocument(data, cfg) {
		c.checkCPE(cfg, opts)
	}
	if err := c.err(opts.File); err != nil {
		return nil, err
	}
	return cfg, nil
}

func (c *collector) checkCPE(cfg *CPE, opts Options) {
	c.checkKeyFile("private_key_file", cfg.PrivateKeyFile)
	if cfg.Headend.Endpoint.IsZero() {
		c.add("headend.endpoint", "missing; write the headend's host:port, e.g. \"headend.example.net:4242\"")
	}
	if cfg.Headend.PublicKey.IsZero() {
		c.add("headend.public_key", "missing; write the headend's public key (44 characters of base64)")
	}
	c.checkCPETunnel(cfg.Tunnel)
	c.checkUplinks(cfg.Uplinks, cfg.Tunnel, cfg.Headend.Endpoint, opts.interfaceExists())
	c.checkReorder(cfg.Reorder)
	c.checkProbe(cfg.Probe)
	c.checkAQM(cfg.AQM)
	c.checkBPF(cfg.BPF)
	c.checkFallback(cfg.Fallback, cfg.Probe)
	if !filepath.IsAbs(cfg.StateDir) {
		c.add("state_dir", "%q is not an absolute path; write e.g. %s", cfg.StateDir, DefaultStateDir)
	}
	if cfg.RekeyInterval < minRekeyInterval || cfg.RekeyInterval > maxRekeyInterval {
		c.add("rekey_interval", "%s is out of range %s..%s", cfg.RekeyInterval, minRekeyInterval, maxRekeyInterval)
	}
}

// checkUplinkEndpoint checks that an uplink's way to the headend fits its addresses:
// one tunnel port, and the IP version of any literal endpoint the same as the uplink's
// source and gateway (a socket of one version cannot reach an address of the other).
func (c *collector) checkUplinkEndpoint(p string, u Uplink, headend Endpoint) {
	ep, path := headend, "headend.endpoint"
	if !u.Endpoint.IsZero() {
		ep, path = u.Endpoint, p+".endpoint"
		if !headend.IsZero() && u.Endpoint.Port != headend.Port {
			c.add(p+".endpoint", "port %d differs from headend.endpoint's %d; the headend listens on one port, write %s",
				u.Endpoint.Port, headend.Port, Endpoint{Host: u.Endpoint.Host, Port: headend.Port})
		}
	}
	a, err := netip.ParseAddr(ep.Host)
	if err != nil {
		return // a host name: resolved to the uplink's IP version at start
	}
	a = a.Unmap()
	for _, own := range []struct {
		key  string
		addr netip.Addr
	}{{"source", u.Source}, {"gateway", u.Gateway}} {
		if own.addr.IsValid() && own.addr.Unmap().Is4() != a.Is4() {
			hint := "set " + p + ".endpoint to the headend's address of that version"
			if !u.Endpoint.IsZero() {
				hint = "write the headend's address of that version"
			}
			c.add(p+"."+own.key, "%s is %s but %s (%s) is %s: %s", own.addr, ipVersion(own.addr), path, ep, ipVersion(a), hint)
			return
		}
	}
}

// ipVersion names an address's IP version for messages.
func ipVersion(a netip.Addr) string {
	if a.Unmap().Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// Fallback bounds: below twice the time a silent link takes to be declared down, a
// short outage of every link would already send traffic out directly.
const (
	defaultDirectAfter = 10 * time.Second
	maxDirectAfter     = time.Hour

	defaultMTURaiseAfter = 10 * time.Minute
	maxMTURaiseAfter     = 24 * time.Hour
)

func (c *collector) checkFallback(f Fallback, p Probe) {
	if lo := 2 * p.DownAfter; f.DirectAfter < lo || f.DirectAfter > maxDirectAfter {
		c.add("fallback.direct_after", "%s is out of range %s (twice probe.down_after)..%s", f.DirectAfter, lo, maxDirectAfter)
	}
}

func (c *collector) checkCPETunnel(t CPETunnel) {
	c.checkInterface("tunnel.interface", t.Interface, nil) // aggd creates it: no existence check
	if len(t.Address) == 0 {
		c.add("tunnel.address", "missing or empty; list the tunnel addresses the headend gives this CPE, e.g. [100.64.0.2/32]")
	}
	for i, p := range t.Address {
		path := fmt.Sprintf("tunnel.address[%d]", i)
		c.checkUnicast(path, p.Addr())
		// The CPE's IPv4 tunnel address is one address, NATed to; a wider prefix would
		// claim addresses that belong to other CPEs.
		if p.Addr().Is4() && p.Bits() != 32 {
			c.add(path, "%s: a CPE's IPv4 tunnel address is a single address; write %s/32", p, p.Addr())
		}
	}
	c.checkMTU("tunnel.mtu", t.MTU, hasIPv6(t.Address))
	if t.MTURaiseAfter < 0 || t.MTURaiseAfter > maxMTURaiseAfter {
		c.add("tunnel.mtu_raise_after", "%s is out of range 0s..%s (to keep one MTU, set tunnel.mtu instead)", t.MTURaiseAfter, maxMTURaiseAfter)
	}
	c.checkRoutes("tunnel.routes", t.Routes)
}

func (c *collector) checkUplinks(ups []Uplink, t CPETunnel, headend Endpoint, exists func(string) bool) {
	if len(ups) == 0 {
		c.add("uplinks", "no uplinks; list at least one (see configs/cpe.example.yaml)")
		return
	}
	names := map[string]int{}
	ifaces := map[string]int{}
	primaries := 0
	for i, u := range ups {
		p := fmt.Sprintf("uplinks[%d]", i)
		c.checkName(p+".name", u.Name)
		if j, dup := names[u.Name]; dup && u.Name != "" {
			c.add(p+".name", "%q is already the name of uplinks[%d]; names must be unique", u.Name, j)
		} else {
			names[u.Name] = i
		}
		ex := exists
		if u.Hotplug {
			ex = nil // may be missing now
		}
		c.checkUplinkInterface(p+".interface", u.Interface, t.Interface, ex)
		if j, dup := ifaces[u.Interface]; dup && u.Interface != "" {
			c.add(p+".interface", "%q is already used by uplinks[%d] (%s); each uplink needs its own interface", u.Interface, j, ups[j].Name)
		} else {
			ifaces[u.Interface] = i
		}
		c.checkUnicast(p+".source", u.Source)
		c.checkUnicast(p+".gateway", u.Gateway)
		if u.Source.IsValid() && u.Gateway.IsValid() && u.Source.Is4() != u.Gateway.Is4() {
			c.add(p+".gateway", "%s and source %s are of different IP versions", u.Gateway, u.Source)
		}
		c.checkUplinkEndpoint(p, u, headend)
		if u.Weight < 0 || u.Weight > maxWeight {
			c.add(p+".weight", "%d is out of range 0..%d; 0 lets aggd measure the split", u.Weight, maxWeight)
		}
		c.checkMTU(p+".mtu", u.MTU, false)
		c.checkDataCap(p+".data_cap", u.DataCap)
		if u.Class == ClassPrimary {
			primaries++
		}
	}
	if primaries == 0 {
		c.add("uplinks", "no uplink has class primary; overflow and backup links only stand in for primaries, so make at least one primary")
	}
}

func (c *collector) checkUplinkInterface(path, name, tunnel string, exists func(string) bool) {
	switch {
	case name == "":
		c.add(path, "missing; write the interface this link leaves by, e.g. \"eth1\"")
	case name == tunnel:
		c.add(path, "%q is the tunnel interface; an uplink must be a real access link", name)
	case exists != nil && ifNameRE.MatchString(name) && !exists(name):
		c.add(path, "there is no interface %q on this machine; see `ip link`; if it appears later (an LTE modem, "+
			"a PPP session), set %s.hotplug: true; or check with --offline if the file is for another machine",
			name, strings.TrimSuffix(path, ".interface"))
	default:
		c.checkInterface(path, name, exists)
	}
}
