// Package bpf loads and attaches aggd's BPF fast path.
//
// The C sources live in bpf/ at the repository root; bpf2go compiles them for
// both byte orders into objects embedded here (see gen.go). Loading needs a
// kernel with BTF and root or CAP_BPF+CAP_NET_ADMIN.
package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/cilium/ebpf"
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
	// XDPAdopted: a link an earlier daemon attached (and pinned) was switched
	// to the new program and kept its mode.
	XDPAdopted XDPMode = "adopted"
)

// MaxKeyGenerations is how many receive key generations a session holds in
// the shield: the current and the previous (docs/wire-format.md, Key ID).
const MaxKeyGenerations = 2

// SessionKey is one generation of a session's receive key: the Key ID the
// peer puts in the header and the 16-byte SipHash key (auth.Key's layout).
type SessionKey struct {
	ID  uint8
	Key [16]byte
}

// Shield is the loaded XDP shield (aggd_xdp_shield), its session keys and its
// counters.
//
// For DATA and control messages the shield looks up the header's Session
// index in its sessions map and drops the datagram as unknown_session if it
// is absent, as stale_key if the Key ID matches none of the session's
// generations, and as bad_tag if the tag does not verify. Control tags (which
// cover the body) are verified for bodies up to 1444 bytes; longer bodies and
// IPv4 first fragments of control messages pass unverified, as do handshake
// messages, but for INITs without a mac2 beyond the loader's InitLimit
// (rate_limited): the daemon verifies everything it receives again.
type Shield struct {
	objs shieldObjects
}

// LoadShield loads the XDP shield for the given tunnel UDP port into the
// kernel, with no limit on INITs. The caller must Close it.
func LoadShield(tunnelPort uint16) (*Shield, error) {
	return LoadShieldPinned(tunnelPort, InitLimit{}, "")
}

// InitLimit is the shield's limit on the INITs that carry no mac2: PerSecond
// of them (0: no limit), with bursts of up to Burst's worth ahead of that rate.
type InitLimit struct {
	PerSecond float64
	Burst     time.Duration
}

// LoadShieldPinned is LoadShield with INITs limited by inits, and the maps
// pinned in dir (see loadCollection): the session keys, counters and INIT
// schedule an earlier daemon pinned there are adopted.
func LoadShieldPinned(tunnelPort uint16, inits InitLimit, dir string) (*Shield, error) {
	if tunnelPort == 0 {
		return nil, errors.New("load shield: tunnel port must not be 0")
	}
	if !(inits.PerSecond >= 0) || inits.Burst < 0 {
		return nil, fmt.Errorf("load shield: INIT limit %v per second, burst %v: want neither negative", inits.PerSecond, inits.Burst)
	}
	spec, err := loadShield()
	if err != nil {
		return nil, fmt.Errorf("load shield: %w", err)
	}
	if err := checkReasonEnum(spec); err != nil {
		return nil, fmt.Errorf("load shield: %w", err)
	}
	if err := setTunnelPort(spec, tunnelPort); err != nil {
		return nil, fmt.Errorf("load shield: %w", err)
	}
	if inits.PerSecond > 0 {
		interval := uint64(min(math.MaxInt64, max(1, float64(time.Second)/inits.PerSecond)))
		if err := setVariable(spec, "init_interval_ns", interval); err != nil {
			return nil, fmt.Errorf("load shield: %w", err)
		}
		if err := setVariable(spec, "init_burst_ns", uint64(inits.Burst)); err != nil {
			return nil, fmt.Errorf("load shield: %w", err)
		}
	}

	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; later ones
	// use memcg and this is a no-op.
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("load shield: %w", permErr(err))
	}

	s := &Shield{}
	if err := loadCollection(spec, &s.objs, dir); err != nil {
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

// SessionsMap returns the map of receive keys by session index (for
// pinning). It stays owned by the Shield.
func (s *Shield) SessionsMap() *ebpf.Map { return s.objs.Sessions }

// LinkStatsMap returns the per-CPU per-link counter map (for pinning). It
// stays owned by the Shield.
func (s *Shield) LinkStatsMap() *ebpf.Map { return s.objs.ShieldLinkStats }

// SetSession installs or replaces the receive keys of the session with the
// given index (the receiver's index, as in the header's Session field): one
// or two generations with distinct IDs, typically the current and the
// previous. Index 0 is never a session's (only HANDSHAKE_INIT carries it).
// A replacement is one map update: the shield sees the old generations or
// the new ones.
func (s *Shield) SetSession(index uint32, gens []SessionKey) error {
	if index == 0 {
		return errors.New("set session: index 0 is not a session index")
	}
	if len(gens) == 0 || len(gens) > MaxKeyGenerations {
		return fmt.Errorf("set session %#x: %d key generations, want 1 to %d", index, len(gens), MaxKeyGenerations)
	}
	if len(gens) == 2 && gens[0].ID == gens[1].ID {
		return fmt.Errorf("set session %#x: both key generations have ID %d", index, gens[0].ID)
	}
	var v shieldAggdSession
	for i, g := range gens {
		v.Gen[i].Id = g.ID
		v.Gen[i].Valid = 1
		v.Gen[i].Key = g.Key
	}
	if err := s.objs.Sessions.Update(sessionMapKey(index), &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("set session %#x: %w", index, err)
	}
	return nil
}

// DeleteSession removes a session's keys; from then on its packets are
// dropped as unknown_session. Deleting an absent session is not an error.
func (s *Shield) DeleteSession(index uint32) error {
	err := s.objs.Sessions.Delete(sessionMapKey(index))
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete session %#x: %w", index, err)
	}
	return nil
}

// Sessions lists the indexes of the sessions the shield has keys for.
func (s *Shield) Sessions() ([]uint32, error) {
	ids, err := sessionIndexes(s.objs.Sessions)
	if err != nil {
		return nil, fmt.Errorf("shield: listing sessions: %w", err)
	}
	return ids, nil
}

// sessionMapKey is the sessions map's key: the index as its 4 bytes appear
// on the wire (big-endian), which the BPF side uses without conversion.
func sessionMapKey(index uint32) [4]byte {
	var k [4]byte
	binary.BigEndian.PutUint32(k[:], index)
	return k
}

// LinkStats returns the shield's per-link counters summed over all CPUs:
// for every link ID with a non-zero counter, the counts keyed by the names
// in Reasons (every name present). A datagram is counted under the Link ID
// of its header once the header is whole and has version 1; earlier rejects
// (truncated, bad_version) appear only in Stats.
func (s *Shield) LinkStats() (map[uint8]map[string]uint64, error) {
	out := map[uint8]map[string]uint64{}
	var perCPU []shieldAggdLinkCounts
	for id := range uint32(s.objs.ShieldLinkStats.MaxEntries()) {
		if err := s.objs.ShieldLinkStats.Lookup(id, &perCPU); err != nil {
			return nil, fmt.Errorf("shield link stats %d: %w", id, err)
		}
		var sum [len(shieldAggdLinkCounts{}.Count)]uint64
		var moved bool
		for _, c := range perCPU {
			for r, v := range c.Count {
				sum[r] += v
				moved = moved || v != 0
			}
		}
		if !moved {
			continue
		}
		row := make(map[string]uint64, len(Reasons))
		for r, name := range Reasons {
			row[name] = sum[r]
		}
		out[uint8(id)] = row
	}
	return out, nil
}

// Attach attaches the shield to the interface with the given index, in
// native (driver) mode if the driver supports it, else in generic mode. The
// returned mode says which. Closing the link detaches the program; the
// Shield stays loaded and can be attached elsewhere.
func (s *Shield) Attach(ifindex int) (link.Link, XDPMode, error) {
	return s.AttachPinned(ifindex, "")
}

// AttachPinned is Attach with the link pinned at pin (see LinkPin); a link an
// earlier daemon pinned there is switched to this Shield's program instead
// (mode XDPAdopted: it keeps the mode it was attached in).
func (s *Shield) AttachPinned(ifindex int, pin string) (link.Link, XDPMode, error) {
	mode := XDPAdopted
	l, _, err := attachPinned(s.objs.AggdXdpShield, pin, func() (l link.Link, err error) {
		l, mode, err = s.attach(ifindex)
		return l, err
	})
	if err != nil {
		return nil, "", err
	}
	return l, mode, nil
}

func (s *Shield) attach(ifindex int) (link.Link, XDPMode, error) {
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
	return sumPerCPU(s.objs.ShieldStats, Reasons, "shield stats")
}

// Close unloads the program and its maps (an attached link keeps the
// program alive until the link is closed too).
func (s *Shield) Close() error {
	return s.objs.Close()
}

// checkReasonEnum compares Reasons with enum aggd_reason as compiled into
// the object (the C header is the definition the BPF side counts with).
func checkReasonEnum(spec *ebpf.CollectionSpec) error {
	// AGGD_REASON_NONE counts accepted datagrams: Go calls it "pass".
	return checkEnum(spec, "aggd_reason", "AGGD_REASON_", Reasons, map[string]string{"none": "pass"})
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
