// Package bpf loads and attaches aggd's BPF fast path.
//
// The C sources live in bpf/ at the repository root; bpf2go compiles them for
// both byte orders into objects embedded here (see gen.go). Loading needs a
// kernel with BTF and root or CAP_BPF+CAP_NET_ADMIN.
package bpf

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/aggd/aggd/internal/wire"
)

// DefaultTunnelPort is the UDP port of the tunnel unless configured otherwise.
const DefaultTunnelPort = 4242

// Reasons names the shield's counters, indexed like enum aggd_reason in
// bpf/include/aggd_wire.h and wire.Reason: "pass" for accepted datagrams
// (wire.ReasonNone), then the reject reasons by their wire names. LoadShield
// checks this list against the enum compiled into the object, so C and Go
// cannot drift apart silently.
var Reasons = reasonNames()

func reasonNames() []string {
	names := make([]string, wire.NumReasons)
	names[wire.ReasonNone] = "pass"
	for _, r := range wire.AllReasons() {
		names[r] = r.String()
	}
	return names
}

// XDPMode is how an XDP program ended up attached.
type XDPMode string

const (
	// XDPNative runs in the driver, before any skb is allocated.
	XDPNative XDPMode = "native"
	// XDPGeneric runs after skb allocation: correct, but without the speed.
	XDPGeneric XDPMode = "generic"
)

// Shield is the loaded XDP shield (aggd_xdp_shield) and its counters.
type Shield struct {
	objs shieldObjects
}

// LoadShield loads the XDP shield for the given tunnel UDP port into the
// kernel. The caller must Close it.
func LoadShield(tunnelPort uint16) (*Shield, error) {
	if tunnelPort == 0 {
		return nil, errors.New("load shield: tunnel port must not be 0")
	}
	spec, err := loadShield()
	if err != nil {
		return nil, fmt.Errorf("load shield: %w", err)
	}
	if err := checkReasonEnum(spec); err != nil {
		return nil, fmt.Errorf("load shield: %w", err)
	}
	port, ok := spec.Variables["tunnel_port"]
	if !ok {
		return nil, errors.New("load shield: object has no tunnel_port variable")
	}
	if err := port.Set(tunnelPort); err != nil {
		return nil, fmt.Errorf("load shield: set tunnel port: %w", err)
	}

	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; later ones
	// use memcg and this is a no-op.
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("load shield: %w", permErr(err))
	}

	s := &Shield{}
	if err := spec.LoadAndAssign(&s.objs, nil); err != nil {
		return nil, fmt.Errorf("load shield: %w", loadErr(err))
	}
	return s, nil
}

// Program returns the loaded XDP program (for tests and pinning). It stays
// owned by the Shield.
func (s *Shield) Program() *ebpf.Program { return s.objs.AggdXdpShield }

// StatsMap returns the per-CPU counter map (for pinning). It stays owned by
// the Shield.
func (s *Shield) StatsMap() *ebpf.Map { return s.objs.ShieldStats }

// Attach attaches the shield to the interface with the given index, in
// native (driver) mode if the driver supports it, else in generic mode. The
// returned mode says which. Closing the link detaches the program; the
// Shield stays loaded and can be attached elsewhere.
func (s *Shield) Attach(ifindex int) (link.Link, XDPMode, error) {
	l, nerr := link.AttachXDP(link.XDPOptions{
		Program:   s.objs.AggdXdpShield,
		Interface: ifindex,
		Flags:     link.XDPDriverMode,
	})
	if nerr == nil {
		return l, XDPNative, nil
	}
	l, gerr := link.AttachXDP(link.XDPOptions{
		Program:   s.objs.AggdXdpShield,
		Interface: ifindex,
		Flags:     link.XDPGenericMode,
	})
	if gerr == nil {
		return l, XDPGeneric, nil
	}
	return nil, "", fmt.Errorf("attach shield to ifindex %d: native: %w; generic: %w",
		ifindex, permErr(nerr), permErr(gerr))
}

// Stats returns the shield's counters summed over all CPUs, keyed by the
// names in Reasons. Every name is present, also with a zero count.
func (s *Shield) Stats() (map[string]uint64, error) {
	out := make(map[string]uint64, len(Reasons))
	var perCPU []uint64
	for i, name := range Reasons {
		if err := s.objs.ShieldStats.Lookup(uint32(i), &perCPU); err != nil {
			return nil, fmt.Errorf("shield stats %s: %w", name, err)
		}
		var sum uint64
		for _, v := range perCPU {
			sum += v
		}
		out[name] = sum
	}
	return out, nil
}

// Close unloads the program and its maps (an attached link keeps the
// program alive until the link is closed too).
func (s *Shield) Close() error {
	return s.objs.Close()
}

// checkReasonEnum compares Reasons with enum aggd_reason as compiled into
// the object (the C header is the definition the BPF side counts with).
func checkReasonEnum(spec *ebpf.CollectionSpec) error {
	var enum *btf.Enum
	if err := spec.Types.TypeByName("aggd_reason", &enum); err != nil {
		return fmt.Errorf("object lacks enum aggd_reason in BTF: %w", err)
	}
	var got []string
	for _, v := range enum.Values {
		name := strings.TrimPrefix(v.Name, "AGGD_REASON_")
		switch name {
		case "_COUNT":
			if v.Value != uint64(len(Reasons)) {
				return fmt.Errorf("enum aggd_reason has %d values, Go knows %d", v.Value, len(Reasons))
			}
			continue
		case "NONE":
			name = "pass"
		}
		if v.Value >= uint64(len(Reasons)) || Reasons[v.Value] != strings.ToLower(name) {
			return fmt.Errorf("enum aggd_reason value %s = %d does not match Go's reason list", v.Name, v.Value)
		}
		got = append(got, name)
	}
	if len(got) != len(Reasons) {
		return fmt.Errorf("enum aggd_reason has %d reasons, Go knows %d", len(got), len(Reasons))
	}
	return nil
}

// permErr turns a permission error into one that says what is missing.
func permErr(err error) error {
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		return fmt.Errorf("loading BPF needs root or CAP_BPF+CAP_NET_ADMIN: %w", err)
	}
	return err
}

// loadErr adds the full verifier log to a rejected program's error (the
// default message keeps only its last lines).
func loadErr(err error) error {
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		return fmt.Errorf("verifier rejected the program: %+v", ve)
	}
	return permErr(err)
}
