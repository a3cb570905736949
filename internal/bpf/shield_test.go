package bpf

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"

	"github.com/aggd/aggd/internal/wire"
)

// XDP verdicts (enum xdp_action).
const (
	xdpDrop = 1
	xdpPass = 2
)

var verdictNames = map[uint32]string{0: "XDP_ABORTED", 1: "XDP_DROP", 2: "XDP_PASS", 3: "XDP_TX", 4: "XDP_REDIRECT"}

// xdpMD mirrors struct xdp_md, the context of an XDP test run.
type xdpMD struct {
	Data           uint32
	DataEnd        uint32
	DataMeta       uint32
	IngressIfindex uint32
	RxQueueIndex   uint32
	EgressIfindex  uint32
}

// needRoot skips under -short without privileges (make test-unit); a full
// run must load the programs, so there it fails instead.
func needRoot(t testing.TB) {
	t.Helper()
	if testing.Short() && os.Geteuid() != 0 {
		t.Skip("BPF tests need root; skipped in -short mode")
	}
}

func loadShieldT(t *testing.T, port uint16) *Shield {
	t.Helper()
	needRoot(t)
	s, err := LoadShield(port)
	if err != nil {
		t.Fatalf("LoadShield(%d): %v", port, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// runXDP runs the shield on one frame. The context's data_end is set to the
// frame length (ARCHITECTURE §9: otherwise a test run may see an empty packet
// and pass it, which would make every "pass" case here meaningless).
func runXDP(t *testing.T, prog *ebpf.Program, frame []byte) uint32 {
	t.Helper()
	ctx := xdpMD{DataEnd: uint32(len(frame))}
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame, Context: ctx, Repeat: 1})
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret
}

func stats(t *testing.T, s *Shield) map[string]uint64 {
	t.Helper()
	st, err := s.Stats()
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	return st
}

// statsDelta is after-before, leaving out the counters that did not move.
func statsDelta(before, after map[string]uint64) map[string]uint64 {
	d := map[string]uint64{}
	for k, v := range after {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

func sameCounts(a, b map[string]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// checkFrame runs one frame and checks the verdict and which counter moved:
// counted == "" means no counter may move (traffic that is not ours).
func checkFrame(t *testing.T, s *Shield, name string, frame []byte, wantVerdict uint32, counted string) {
	t.Helper()
	before := stats(t, s)
	got := runXDP(t, s.Program(), frame)
	delta := statsDelta(before, stats(t, s))
	want := map[string]uint64{}
	if counted != "" {
		want[counted] = 1
	}
	if got != wantVerdict || !sameCounts(delta, want) {
		t.Errorf("%s: verdict %s, counters moved %v; want %s, %v\nframe % x",
			name, verdictNames[got], delta, verdictNames[wantVerdict], want, frame)
	}
}

func TestShieldLoads(t *testing.T) {
	s := loadShieldT(t, DefaultTunnelPort)
	info, err := s.Program().Info()
	if err != nil {
		t.Fatalf("program info: %v", err)
	}
	if info.Type != ebpf.XDP {
		t.Errorf("program type %v, want XDP", info.Type)
	}
	st := stats(t, s)
	if len(st) != wire.NumReasons {
		t.Errorf("Stats has %d counters, want %d (one per wire.Reason)", len(st), wire.NumReasons)
	}
	for name, v := range st {
		if v != 0 {
			t.Errorf("fresh counter %s = %d, want 0", name, v)
		}
	}
	if got := s.StatsMap().MaxEntries(); got != uint32(wire.NumReasons) {
		t.Errorf("shield_stats has %d entries, want %d", got, wire.NumReasons)
	}
}

func TestLoadShieldRejectsPortZero(t *testing.T) {
	if s, err := LoadShield(0); err == nil {
		s.Close()
		t.Fatal("LoadShield(0) succeeded")
	}
}

// Both objects (bpfel and bpfeb) must carry the reason enum the Go side
// checks against, with wire.Reason's values, and the header's byte layout.
func TestReasonEnumMatchesWire(t *testing.T) {
	spec, err := loadShield()
	if err != nil {
		t.Fatal(err)
	}
	if err := checkReasonEnum(spec); err != nil {
		t.Fatal(err)
	}
	var enum *btf.Enum
	if err := spec.Types.TypeByName("aggd_reason", &enum); err != nil {
		t.Fatal(err)
	}
	for _, v := range enum.Values {
		if v.Name == "AGGD_REASON__COUNT" {
			continue
		}
		want := "AGGD_REASON_" + strings.ToUpper(wire.Reason(v.Value).String())
		if v.Name != want {
			t.Errorf("C enum %s = %d, but wire.Reason(%d) is %s", v.Name, v.Value, v.Value, want)
		}
	}

	// checkReasonEnum must notice a mismatch, or the check above proves nothing.
	enum.Values[2].Name = "AGGD_REASON_SOMETHING_ELSE"
	if err := checkReasonEnum(spec); err == nil {
		t.Error("checkReasonEnum accepted a renamed reason")
	}
}

func TestShieldVerdicts(t *testing.T) {
	s := loadShieldT(t, DefaultTunnelPort)
	addTestSession(t, s)

	bad := func(verType, flags byte) []byte { return aggdDatagram(verType, flags, []byte("body")) }
	garbage := bytes.Repeat([]byte{0xff}, 40) // would be bad_version if judged

	cases := []struct {
		name    string
		f       frameSpec
		verdict uint32
		counted string
	}{
		// Not ours: passed and not counted.
		{"arp", frameSpec{etherType: etherTypeARP, payload: garbage}, xdpPass, ""},
		{"ipv6 ethertype, not an ipv6 header", frameSpec{etherType: etherTypeIPv6, payload: garbage}, xdpPass, ""},
		{"ipv6 udp to other port", frameSpec{ipv6: true, dport: 53, payload: garbage}, xdpPass, ""},
		{"ipv6 behind an extension header", frameSpec{ipv6: true, proto: 44, payload: bad(0x21, 0)}, xdpPass, ""},
		{"ipv6 frame ends inside udp header", frameSpec{ipv6: true, payload: nil, cut: 4}, xdpPass, ""},
		{"tcp to tunnel port", frameSpec{proto: protoTCP, payload: garbage}, xdpPass, ""},
		{"udp to other port", frameSpec{dport: 53, payload: garbage}, xdpPass, ""},
		{"udp to other port, short", frameSpec{dport: 53, payload: []byte{1}}, xdpPass, ""},
		{"later fragment", frameSpec{fragOff: 185, payload: garbage}, xdpPass, ""},
		{"frame ends inside udp header", frameSpec{payload: nil, cut: 4}, xdpPass, ""},

		// Valid: passed and counted as pass.
		{"data", frameSpec{payload: validData()}, xdpPass, "pass"},
		{"data duplicate", frameSpec{payload: aggdDatagram(0x11, 0x01, []byte("x"))}, xdpPass, "pass"},
		{"header only", frameSpec{payload: aggdDatagram(0x11, 0, nil)}, xdpPass, "pass"},
		{"handshake init", frameSpec{payload: bad(0x12, 0)}, xdpPass, "pass"},
		{"loss notice", frameSpec{payload: bad(0x17, 0)}, xdpPass, "pass"},
		{"link params", frameSpec{payload: bad(0x18, 0)}, xdpPass, "pass"},
		{"802.1Q", frameSpec{vlans: []uint16{etherTypeVLAN}, payload: validData()}, xdpPass, "pass"},
		{"QinQ", frameSpec{vlans: []uint16{etherTypeQinQ, etherTypeVLAN}, payload: validData()}, xdpPass, "pass"},
		{"ip options", frameSpec{ipOptions: 3, payload: validData()}, xdpPass, "pass"},
		{"ethernet padding", frameSpec{payload: validData(), pad: 6}, xdpPass, "pass"},
		{"first fragment", frameSpec{fragOff: 0x2000, payload: validData(), udpLenDelta: 1000}, xdpPass, "pass"},
		{"ipv6 data", frameSpec{ipv6: true, payload: validData()}, xdpPass, "pass"},
		{"ipv6 802.1Q", frameSpec{ipv6: true, vlans: []uint16{etherTypeVLAN}, payload: validData()}, xdpPass, "pass"},
		{"ipv6 ethernet padding", frameSpec{ipv6: true, payload: validData(), pad: 6}, xdpPass, "pass"},
		{"ipv6 link params", frameSpec{ipv6: true, payload: bad(0x18, 0)}, xdpPass, "pass"},

		// Malformed: dropped and counted by reason.
		{"empty", frameSpec{payload: nil}, xdpDrop, "truncated"},
		{"27 bytes", frameSpec{payload: validData()[:27]}, xdpDrop, "truncated"},
		// 10 aggd bytes + Ethernet padding: the frame holds 28 bytes behind
		// UDP, but the datagram is 10 long.
		{"short, padded", frameSpec{payload: validData()[:10], pad: 30}, xdpDrop, "truncated"},
		{"udp length beyond ip", frameSpec{payload: validData(), udpLenDelta: 1}, xdpDrop, "truncated"},
		{"udp length below 8", frameSpec{payload: validData(), udpLenDelta: -len(validData()) - 1}, xdpDrop, "truncated"},
		{"udp length cuts header", frameSpec{payload: validData(), udpLenDelta: -len(validData()) + 27}, xdpDrop, "truncated"},
		{"ip length beyond frame", frameSpec{payload: validData(), cut: 1}, xdpDrop, "truncated"},
		{"ip length below headers", frameSpec{payload: validData(), ipLenDelta: -len(validData()) - 9}, xdpDrop, "truncated"},
		{"first fragment, header cut", frameSpec{fragOff: 0x2000, payload: validData()[:20], udpLenDelta: 1000}, xdpDrop, "truncated"},
		{"version 0", frameSpec{payload: bad(0x01, 0)}, xdpDrop, "bad_version"},
		{"version 2", frameSpec{payload: bad(0x21, 0)}, xdpDrop, "bad_version"},
		{"version 15", frameSpec{payload: bad(0xf1, 0)}, xdpDrop, "bad_version"},
		{"type 0", frameSpec{payload: bad(0x10, 0)}, xdpDrop, "bad_type"},
		{"type 12", frameSpec{payload: bad(0x1c, 0)}, xdpDrop, "bad_type"},
		{"type 15", frameSpec{payload: bad(0x1f, 0)}, xdpDrop, "bad_type"},
		{"flags 0x02 (mac2) on data", frameSpec{payload: bad(0x11, 0x02)}, xdpDrop, "bad_flags"},
		{"flags 0x80", frameSpec{payload: bad(0x11, 0x80)}, xdpDrop, "bad_flags"},
		{"flags 0xff", frameSpec{payload: bad(0x11, 0xff)}, xdpDrop, "bad_flags"},
		{"version checked first", frameSpec{payload: bad(0x20, 0xfe)}, xdpDrop, "bad_version"},
		{"type before flags", frameSpec{payload: bad(0x10, 0xfe)}, xdpDrop, "bad_type"},
		{"802.1Q bad version", frameSpec{vlans: []uint16{etherTypeVLAN}, payload: bad(0x21, 0)}, xdpDrop, "bad_version"},
		{"QinQ bad flags", frameSpec{vlans: []uint16{etherTypeQinQ, etherTypeVLAN}, payload: bad(0x11, 2)}, xdpDrop, "bad_flags"},
		{"ip options bad type", frameSpec{ipOptions: 10, payload: bad(0x1c, 0)}, xdpDrop, "bad_type"},
		{"first fragment bad version", frameSpec{fragOff: 0x2000, payload: bad(0x31, 0), udpLenDelta: 1000}, xdpDrop, "bad_version"},
		{"ipv6 empty", frameSpec{ipv6: true, payload: nil}, xdpDrop, "truncated"},
		{"ipv6 27 bytes", frameSpec{ipv6: true, payload: validData()[:27]}, xdpDrop, "truncated"},
		{"ipv6 udp length beyond payload", frameSpec{ipv6: true, payload: validData(), udpLenDelta: 1}, xdpDrop, "truncated"},
		{"ipv6 udp length cuts header", frameSpec{ipv6: true, payload: validData(), udpLenDelta: -len(validData()) + 27}, xdpDrop, "truncated"},
		{"ipv6 payload length beyond frame", frameSpec{ipv6: true, payload: validData(), cut: 1}, xdpDrop, "truncated"},
		{"ipv6 payload length below udp", frameSpec{ipv6: true, payload: validData(), ipLenDelta: -len(validData()) - 1}, xdpDrop, "truncated"},
		{"ipv6 version 2", frameSpec{ipv6: true, payload: bad(0x21, 0)}, xdpDrop, "bad_version"},
		{"ipv6 type 12", frameSpec{ipv6: true, payload: bad(0x1c, 0)}, xdpDrop, "bad_type"},
		{"ipv6 flags 0x80", frameSpec{ipv6: true, payload: bad(0x11, 0x80)}, xdpDrop, "bad_flags"},
		{"ipv6 QinQ bad version", frameSpec{ipv6: true, vlans: []uint16{etherTypeQinQ, etherTypeVLAN}, payload: bad(0x21, 0)}, xdpDrop, "bad_version"},
	}
	for _, c := range cases {
		checkFrame(t, s, c.name, c.f.build(), c.verdict, c.counted)
	}
}

// The port is a load-time constant: the same frames are judged or ignored
// depending on it.
func TestShieldTunnelPort(t *testing.T) {
	s := loadShieldT(t, 5555)
	addTestSession(t, s)
	bad := aggdDatagram(0x21, 0, nil)
	checkFrame(t, s, "default port, not configured", frameSpec{payload: bad}.build(), xdpPass, "")
	checkFrame(t, s, "configured port, bad", frameSpec{dport: 5555, payload: bad}.build(), xdpDrop, "bad_version")
	checkFrame(t, s, "configured port, good", frameSpec{dport: 5555, payload: validData()}.build(), xdpPass, "pass")
}

// With an INIT limit, INITs without a mac2 beyond it are dropped as
// rate_limited: at one per 1000 s with 2500 s of burst, three back to back
// pass and the rest do not, whatever the test's own timing. INITs with a mac2
// (the daemon checks and limits those by source) and other types are not
// limited; without a limit (LoadShield) every INIT passes.
func TestShieldLimitsInits(t *testing.T) {
	needRoot(t)
	s, err := LoadShieldPinned(DefaultTunnelPort, InitLimit{PerSecond: 0.001, Burst: 2500 * time.Second}, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	addTestSession(t, s)
	initFrame := func(flags byte, bodyLen int) []byte {
		d := aggdDatagram(0x12, flags, make([]byte, bodyLen))
		binary.BigEndian.PutUint32(d[4:], 0) // an INIT names no session yet
		return frameSpec{payload: d}.build()
	}
	plain, mac2 := initFrame(0, 4+108), initFrame(0x02, 4+108+16)
	for i := 1; i <= 6; i++ {
		verdict, counted := uint32(xdpPass), "pass"
		if i > 3 {
			verdict, counted = xdpDrop, "rate_limited"
		}
		checkFrame(t, s, fmt.Sprintf("INIT %d", i), plain, verdict, counted)
	}
	for i := 1; i <= 6; i++ {
		checkFrame(t, s, fmt.Sprintf("INIT with a mac2 %d, the limit spent", i), mac2, xdpPass, "pass")
	}
	checkFrame(t, s, "data, the limit spent", frameSpec{payload: validData()}.build(), xdpPass, "pass")

	open := loadShieldT(t, DefaultTunnelPort)
	for i := 1; i <= 6; i++ {
		checkFrame(t, open, fmt.Sprintf("INIT %d, no limit", i), plain, xdpPass, "pass")
	}
	if _, err := LoadShieldPinned(DefaultTunnelPort, InitLimit{PerSecond: -1}, ""); err == nil {
		t.Error("a negative INIT limit was taken")
	}
}

// Counters are per CPU and Stats sums them: runs pinned to different CPUs,
// many runs each, exact totals.
func TestShieldStatsSum(t *testing.T) {
	s := loadShieldT(t, DefaultTunnelPort)
	addTestSession(t, s)
	good := frameSpec{payload: validData()}.build()
	bad := frameSpec{payload: aggdDatagram(0x11, 0x40, nil)}.build()
	const n = 100
	var online unix.CPUSet
	if err := unix.SchedGetaffinity(0, &online); err != nil {
		t.Fatal(err)
	}
	cpus := 0
	for cpu := 0; cpu < 1024 && cpus < 8; cpu++ {
		if !online.IsSet(cpu) {
			continue
		}
		cpus++
		done := make(chan error)
		go func() {
			// The thread keeps its pinning: let it die with the goroutine.
			runtime.LockOSThread()
			var one unix.CPUSet
			one.Set(cpu)
			if err := unix.SchedSetaffinity(0, &one); err != nil {
				done <- err
				return
			}
			// One run per call: a Repeat > 1 run that a signal (Go's
			// preemption SIGURG) interrupts is restarted from the beginning
			// by cilium/ebpf, after the kernel already ran (and counted)
			// part of it, so the totals would come out too high.
			for _, f := range [][]byte{good, bad} {
				ctx := xdpMD{DataEnd: uint32(len(f))}
				for range n {
					if _, err := s.Program().Run(&ebpf.RunOptions{Data: f, Context: ctx, Repeat: 1}); err != nil {
						done <- err
						return
					}
				}
			}
			done <- nil
		}()
		if err := <-done; err != nil {
			t.Fatalf("cpu %d: %v", cpu, err)
		}
	}
	st := stats(t, s)
	if st["pass"] != uint64(cpus*n) || st["bad_flags"] != uint64(cpus*n) {
		t.Errorf("after %d good and %d bad_flags runs on each of %d CPUs: %v", n, n, cpus, st)
	}
	var perCPU []uint64
	if err := s.StatsMap().Lookup(uint32(0), &perCPU); err != nil {
		t.Fatal(err)
	}
	used := 0
	for _, v := range perCPU {
		if v != 0 {
			used++
		}
	}
	if used != cpus {
		t.Errorf("pass counted on %d CPUs, ran on %d: %v", used, cpus, perCPU)
	}
}

// golden is the part of a testdata/wire/vectors.json entry the shield needs.
type golden struct {
	Name   string `json:"name"`
	Key    string `json:"key"`
	Packet string `json:"packet"`
	Valid  bool   `json:"valid"`
	Reason string `json:"reason"`
	TagOK  bool   `json:"tag_ok"`
	Header *struct {
		Type    uint8  `json:"type"`
		KeyID   uint8  `json:"key_id"`
		Session uint32 `json:"session"`
	} `json:"header"`
}

// headerReasons are the reasons the shield decides from the header bytes
// alone, before any session state.
var headerReasons = map[string]bool{"truncated": true, "bad_version": true, "bad_type": true, "bad_flags": true}

func loadGolden(t *testing.T) []golden {
	t.Helper()
	path := filepath.Join("..", "..", "testdata", "wire", "vectors.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden vectors: %v", err)
	}
	var vectors []golden
	if err := json.Unmarshal(raw, &vectors); err != nil {
		t.Fatalf("golden vectors %s: %v", path, err)
	}
	if len(vectors) == 0 {
		t.Fatalf("golden vectors %s: empty", path)
	}
	return vectors
}

// isSessionless: the handshake messages and the cookie reply, which no session key tags.
func isSessionless(typ uint8) bool {
	return typ == uint8(wire.TypeHandshakeInit) || typ == uint8(wire.TypeHandshakeResp) || typ == uint8(wire.TypeCookieReply)
}

// TestShieldGoldenVectors runs every golden vector through the shield, as a
// UDP datagram to the tunnel port, twice: with the vector's key installed at
// its session index and Key ID, and with no session. A missing vector file is
// a failure: the vectors are what ties this program to the Go parser and to
// package auth (which computed tag_ok).
//
// With the session, the shield must drop exactly the header faults and, for
// DATA and control messages, the vectors whose tag_ok is false (as bad_tag);
// body faults pass (the daemon counts them). Without it, every DATA or
// control message with a sound header is unknown_session; handshakes and cookie
// replies pass.
func TestShieldGoldenVectors(t *testing.T) {
	vectors := loadGolden(t)
	s := loadShieldT(t, DefaultTunnelPort)
	seen := map[string]int{}
	for _, v := range vectors {
		pkt, err := hex.DecodeString(v.Packet)
		if err != nil {
			t.Errorf("%s: packet: %v", v.Name, err)
			continue
		}
		rawKey, err := hex.DecodeString(v.Key)
		if err != nil || len(rawKey) != 16 {
			t.Errorf("%s: key %q", v.Name, v.Key)
			continue
		}
		if v.Valid != (v.Reason == "") {
			t.Errorf("%s: valid=%v but reason %q", v.Name, v.Valid, v.Reason)
			continue
		}
		if v.Reason != "" {
			if _, ok := wire.ParseReason(v.Reason); !ok {
				t.Errorf("%s: unknown reason %q", v.Name, v.Reason)
				continue
			}
		}
		// Every vector over IPv4 and over IPv6: the shield judges both alike.
		frames := []struct {
			name  string
			frame []byte
		}{{"", frameSpec{payload: pkt}.build()}, {" over ipv6", frameSpec{ipv6: true, payload: pkt}.build()}}
		check := func(what string, verdict uint32, counted string) {
			t.Helper()
			for _, f := range frames {
				checkFrame(t, s, "vector "+v.Name+f.name+what, f.frame, verdict, counted)
			}
		}

		if headerReasons[v.Reason] {
			seen[v.Reason]++
			check("", xdpDrop, v.Reason)
			continue
		}
		if v.Header == nil {
			t.Errorf("%s: header parses (reason %q) but the vector has no header fields", v.Name, v.Reason)
			continue
		}
		if isSessionless(v.Header.Type) {
			seen["handshake"]++
			check("", xdpPass, "pass")
			continue
		}

		var key [16]byte
		copy(key[:], rawKey)
		if err := s.SetSession(v.Header.Session, []SessionKey{{ID: v.Header.KeyID, Key: key}}); err != nil {
			t.Fatalf("%s: SetSession: %v", v.Name, err)
		}
		verdict, counted := uint32(xdpPass), "pass"
		if !v.TagOK {
			verdict, counted = xdpDrop, "bad_tag"
		}
		kind := "control"
		if v.Header.Type == uint8(wire.TypeData) {
			kind = "data"
		}
		seen[fmt.Sprintf("%s tag_ok=%v", kind, v.TagOK)]++
		check(", session installed", verdict, counted)

		if err := s.DeleteSession(v.Header.Session); err != nil {
			t.Fatalf("%s: DeleteSession: %v", v.Name, err)
		}
		check(", no session", xdpDrop, "unknown_session")
	}
	// Without these the vectors would not exercise the shield's checks.
	for _, r := range []string{"truncated", "bad_version", "bad_type", "bad_flags", "handshake",
		"data tag_ok=true", "data tag_ok=false", "control tag_ok=true", "control tag_ok=false"} {
		if seen[r] == 0 {
			t.Errorf("golden vectors have no %s case", r)
		}
	}
}

// The big-endian objects (for MIPS routers) cannot run here, but they must
// be built, be big-endian, and carry the same programs, variables and reason
// enum as the little-endian ones.
func TestBigEndianObjects(t *testing.T) {
	spec, err := ebpf.LoadCollectionSpec("shield_bpfeb.o")
	if err != nil {
		t.Fatalf("big-endian shield object: %v", err)
	}
	if spec.ByteOrder != binary.BigEndian {
		t.Errorf("shield_bpfeb.o byte order %v", spec.ByteOrder)
	}
	if err := checkReasonEnum(spec); err != nil {
		t.Error(err)
	}
	if spec.Programs["aggd_xdp_shield"] == nil || spec.Maps["shield_stats"] == nil || spec.Variables["tunnel_port"] == nil {
		t.Errorf("shield_bpfeb.o lacks the program, map or variable: %v %v %v", spec.Programs, spec.Maps, spec.Variables)
	}

	test, err := ebpf.LoadCollectionSpec("siphashtest_bpfeb_test.o")
	if err != nil {
		t.Fatalf("big-endian siphash test object: %v", err)
	}
	if test.ByteOrder != binary.BigEndian || test.Programs["aggd_test_siphash"] == nil {
		t.Errorf("siphashtest_bpfeb_test.o: byte order %v, programs %v", test.ByteOrder, test.Programs)
	}
}

// MIPS has no efficient unaligned access, so there the verifier enforces
// alignment of packet loads. BPF_F_STRICT_ALIGNMENT makes it do the same
// here: the shield must pass that too, with its rejects still working.
func TestShieldStrictAlignment(t *testing.T) {
	needRoot(t)
	spec, err := loadShield()
	if err != nil {
		t.Fatal(err)
	}
	ps := spec.Programs["aggd_xdp_shield"]
	ps.Flags |= unix.BPF_F_STRICT_ALIGNMENT
	if err := spec.Variables["tunnel_port"].Set(uint16(DefaultTunnelPort)); err != nil {
		t.Fatal(err)
	}
	var objs shieldObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatalf("load with strict alignment: %v", loadErr(err))
	}
	defer objs.Close()
	s := &Shield{objs: objs}
	addTestSession(t, s)
	checkFrame(t, s, "strict: vlan + options, bad type", frameSpec{vlans: []uint16{etherTypeVLAN}, ipOptions: 1, payload: aggdDatagram(0x1c, 0, nil)}.build(), xdpDrop, "bad_type")
	checkFrame(t, s, "strict: data", frameSpec{payload: validData()}.build(), xdpPass, "pass")
	checkFrame(t, s, "strict: data, bad tag", frameSpec{payload: badTag(validData())}.build(), xdpDrop, "bad_tag")
	for _, n := range []int{0, 3, 8, 13, 1444} {
		body := bytes.Repeat([]byte{0xa5}, n)
		checkFrame(t, s, fmt.Sprintf("strict: feedback, %d-byte body", n), frameSpec{vlans: []uint16{etherTypeVLAN}, payload: aggdDatagram(0x16, 0, body)}.build(), xdpPass, "pass")
		checkFrame(t, s, fmt.Sprintf("strict: feedback, %d-byte body, bad tag", n), frameSpec{ipOptions: 1, payload: badTag(aggdDatagram(0x16, 0, body))}.build(), xdpDrop, "bad_tag")
	}
}
