package config

import (
	"fmt"
	"net/netip"
)

// Headend is the config of `aggd headend`: the server that terminates the tunnels of
// many CPEs and forwards their traffic.
type Headend struct {
	// PrivateKeyFile is the path of the headend's X25519 private key. Required.
	PrivateKeyFile string `yaml:"private_key_file"`
	// Listen is the local ip:port for the tunnel's UDP traffic.
	Listen netip.AddrPort `yaml:"listen"`
	// Tunnel configures the headend's agg0 interface.
	Tunnel HeadendTunnel `yaml:"tunnel"`
	// NAT configures masquerading of CPE traffic towards the internet.
	NAT NAT `yaml:"nat"`
	// Peers are the CPEs allowed to connect. May be empty (nobody can connect yet).
	Peers []Peer `yaml:"peers"`
	// Reorder bounds the resequencing of upstream traffic.
	Reorder Reorder `yaml:"reorder"`
	// Probe sets link probing and failure detection.
	Probe Probe `yaml:"probe"`
	// AQM bounds the standing queue of downstream traffic.
	AQM AQM `yaml:"aqm"`
	// Metrics configures the Prometheus endpoint.
	Metrics Metrics `yaml:"metrics"`
	// Log configures logging.
	Log Log `yaml:"log"`
	// BPF configures the kernel fast path, and where it goes.
	BPF HeadendBPF `yaml:"bpf"`
}

// HeadendBPF is BPF with the headend's choice of interfaces (a CPE's are its uplinks).
type HeadendBPF struct {
	Enabled  bool   `yaml:"enabled"`
	FastPath bool   `yaml:"fast_path"`
	PinDir   string `yaml:"pin_dir"`
	// Interfaces lists where the CPEs' tunnel traffic arrives: the XDP shield, and with
	// the fast path its receive program, go there. Empty: the interfaces of the default
	// routes and of the listen address.
	Interfaces []string `yaml:"interfaces"`
}

// Common is the part of b both modes have.
func (b HeadendBPF) Common() BPF {
	return BPF{Enabled: b.Enabled, FastPath: b.FastPath, PinDir: b.PinDir}
}

// HeadendTunnel configures the headend's side of the tunnels.
type HeadendTunnel struct {
	// Interface is the TUN device aggd creates.
	Interface string `yaml:"interface"`
	// Address lists the headend's own addresses in the tunnel subnets, with the subnet
	// length, e.g. 100.64.0.1/24. Required.
	Address []netip.Prefix `yaml:"address"`
	// MTU of the tunnel interface; 0 means automatic.
	MTU int `yaml:"mtu"`
}

// NAT configures masquerading on the headend.
type NAT struct {
	// Enabled masquerades traffic from the tunnel to the internet.
	Enabled bool `yaml:"enabled"`
	// OutInterface limits masquerading to traffic leaving by this interface; unset
	// means the interface of the default route.
	OutInterface string `yaml:"out_interface"`
}

// Peer is one CPE the headend accepts.
type Peer struct {
	// Name identifies the CPE in logs and metrics. Required, unique.
	Name string `yaml:"name"`
	// PublicKey is the CPE's static public key. Required, unique.
	PublicKey Key `yaml:"public_key"`
	// TunnelAddress lists the CPE's tunnel addresses; traffic to them goes to this CPE.
	// They must match the CPE's tunnel.address. Required.
	TunnelAddress []netip.Prefix `yaml:"tunnel_address"`
	// Routes are extra prefixes (e.g. the CPE's routed LAN) sent to this CPE.
	Routes []netip.Prefix `yaml:"routes"`
}

const defaultListen = "0.0.0.0:4242"

// DefaultHeadend returns the headend config with every default filled in and the
// required fields empty. Parsing starts from it, so a key left out keeps its default.
func DefaultHeadend() *Headend {
	return &Headend{
		Listen:  netip.MustParseAddrPort(defaultListen),
		Tunnel:  HeadendTunnel{Interface: defaultTunnelInterface},
		NAT:     NAT{Enabled: true},
		Reorder: defaultReorder(),
		Probe:   defaultProbe(),
		AQM:     defaultAQM(),
		Metrics: defaultMetrics(),
		Log:     defaultLog(),
		BPF:     HeadendBPF{Enabled: defaultBPF().Enabled, PinDir: defaultBPF().PinDir},
	}
}

// LoadHeadend reads and checks a headend config file, checking interfaces against this
// machine.
func LoadHeadend(path string) (*Headend, error) {
	return LoadHeadendWith(path, Options{})
}

// LoadHeadendWith is LoadHeadend with options; opts.File is set to path.
func LoadHeadendWith(path string, opts Options) (*Headend, error) {
	data, err := readFile(path, "configs/headend.example.yaml")
	if err != nil {
		return nil, err
	}
	opts.File = path
	return ParseHeadend(data, opts)
}

// ParseHeadend decodes and checks a headend config. On any problem it returns nil and
// a *Problems listing all of them.
func ParseHeadend(data []byte, opts Options) (*Headend, error) {
	c := newCollector()
	cfg := DefaultHeadend()
	if c.decodeDocument(data, cfg) {
		c.checkHeadend(cfg, opts)
	}
	if err := c.err(opts.File); err != nil {
		return nil, err
	}
	return cfg, nil
}

func (c *collector) checkHeadend(cfg *Headend, opts Options) {
	c.checkKeyFile("private_key_file", cfg.PrivateKeyFile)
	c.checkInterface("tunnel.interface", cfg.Tunnel.Interface, nil) // aggd creates it
	if len(cfg.Tunnel.Address) == 0 {
		c.add("tunnel.address", "missing or empty; write the headend's address in the tunnel subnet, e.g. [100.64.0.1/24]")
	}
	for i, p := range cfg.Tunnel.Address {
		c.checkUnicast(fmt.Sprintf("tunnel.address[%d]", i), p.Addr())
	}
	c.checkMTU("tunnel.mtu", cfg.Tunnel.MTU, hasIPv6(cfg.Tunnel.Address))
	if cfg.NAT.OutInterface != "" {
		c.checkInterface("nat.out_interface", cfg.NAT.OutInterface, opts.interfaceExists())
	}
	c.checkPeers(cfg.Peers, cfg.Tunnel.Address)
	c.checkReorder(cfg.Reorder)
	c.checkProbe(cfg.Probe)
	c.checkAQM(cfg.AQM)
	c.checkBPF(cfg.BPF.Common())
	c.checkBPFInterfaces(cfg.BPF.Interfaces, cfg.Tunnel.Interface)
}

// claim is a prefix a peer asks the headend to route to it.
type claim struct {
	peer   int
	path   string
	prefix netip.Prefix
}

func (c *collector) checkPeers(peers []Peer, own []netip.Prefix) {
	names := map[string]int{}
	keys := map[Key]int{}
	var claims []claim
	for i, pr := range peers {
		p := fmt.Sprintf("peers[%d]", i)
		c.checkName(p+".name", pr.Name)
		if j, dup := names[pr.Name]; dup && pr.Name != "" {
			c.add(p+".name", "%q is already the name of peers[%d]; names must be unique", pr.Name, j)
		} else {
			names[pr.Name] = i
		}
		if pr.PublicKey.IsZero() {
			c.add(p+".public_key", "missing; write the CPE's public key (44 characters of base64)")
		} else if j, dup := keys[pr.PublicKey]; dup {
			c.add(p+".public_key", "same key as peers[%d] (%s); each CPE needs its own key", j, peers[j].Name)
		} else {
			keys[pr.PublicKey] = i
		}
		if len(pr.TunnelAddress) == 0 {
			c.add(p+".tunnel_address", "missing or empty; write the CPE's tunnel addresses, e.g. [100.64.0.2/32]")
		}
		for k, a := range pr.TunnelAddress {
			ap := fmt.Sprintf("%s.tunnel_address[%d]", p, k)
			c.checkUnicast(ap, a.Addr())
			c.checkNotOwn(ap, a, own)
			claims = append(claims, claim{i, ap, a})
		}
		c.checkRoutes(p+".routes", pr.Routes)
		for k, r := range pr.Routes {
			claims = append(claims, claim{i, fmt.Sprintf("%s.routes[%d]", p, k), r})
		}
	}
	c.checkOverlaps(claims, peers)
}

// checkNotOwn refuses a peer prefix that contains one of the headend's own addresses.
func (c *collector) checkNotOwn(path string, p netip.Prefix, own []netip.Prefix) {
	for _, o := range own {
		if p.Contains(o.Addr()) {
			c.add(path, "%s contains the headend's own tunnel address %s", p, o.Addr())
			return
		}
	}
}

// checkOverlaps refuses prefixes that two peers both claim: the headend routes each
// destination to one CPE, so an overlap would silently send one CPE's traffic to the
// other. The later claim is reported. Quadratic, which is fine for a config file.
func (c *collector) checkOverlaps(claims []claim, peers []Peer) {
	for i, b := range claims {
		for _, a := range claims[:i] {
			if a.peer != b.peer && a.prefix.Overlaps(b.prefix) {
				c.add(b.path, "%s overlaps %s of %s (%s); each address can lead to one CPE only",
					b.prefix, a.prefix, peerLabel(a.peer, peers), a.path)
				break
			}
		}
	}
}

func peerLabel(i int, peers []Peer) string {
	if peers[i].Name != "" {
		return fmt.Sprintf("%q", peers[i].Name)
	}
	return fmt.Sprintf("peers[%d]", i)
}
