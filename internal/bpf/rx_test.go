package bpf

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/aggd/aggd/internal/auth"
	"github.com/aggd/aggd/internal/handover"
	"github.com/aggd/aggd/internal/reseq"
	"github.com/aggd/aggd/internal/wire"
)

// tc verdicts (TC_ACT_*).
const (
	tcOK       = 0
	tcShot     = 2
	tcRedirect = 7
)

var tcNames = map[uint32]string{0: "TC_ACT_OK", 2: "TC_ACT_SHOT", 7: "TC_ACT_REDIRECT"}

// testAgg0 is the ifindex the tests configure as agg0. Under
// BPF_PROG_TEST_RUN a redirect is only a return value, so any index works.
const testAgg0 = 4242

// skbMD mirrors struct __sk_buff (192 bytes), the context of a tc test run.
// Only the fields BPF_PROG_TEST_RUN lets a test set are named.
type skbMD struct {
	_        [9]uint32 // len .. priority
	Ingress  uint32    // ingress_ifindex
	Ifindex  uint32
	_        uint32 // tc_index
	CB       [5]uint32
	_        [19]uint32 // hash .. data_meta
	_        uint64     // flow_keys
	Tstamp   uint64
	WireLen  uint32
	GSOSegs  uint32
	_        uint64 // sk
	GSOSize  uint32
	_        uint32 // tstamp_type
	HWTstamp uint64
}

func loadRxT(t *testing.T) *Rx {
	t.Helper()
	needRoot(t)
	r, err := LoadRx(DefaultTunnelPort)
	if err != nil {
		t.Fatalf("LoadRx: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	if err := r.SetAgg0(testAgg0); err != nil {
		t.Fatal(err)
	}
	return r
}

// runTC runs the receive program on one frame and returns its verdict and
// the frame as the program left it (from the MAC header on).
func runTC(t *testing.T, prog *ebpf.Program, frame []byte, ctx *skbMD) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(frame)+256)
	opts := &ebpf.RunOptions{Data: frame, DataOut: out, Repeat: 1}
	if ctx != nil {
		opts.Context = *ctx
	}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret, opts.DataOut
}

func rxVerdicts(t *testing.T, r *Rx) map[string]uint64 {
	t.Helper()
	v, err := r.Verdicts()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func readOrder(t *testing.T, r *Rx, index uint32) Order {
	t.Helper()
	o, err := r.ReadOrder(index)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func diverted(t *testing.T, r *Rx, index uint32) uint64 {
	t.Helper()
	n, err := r.Diverted(index)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// setOrder enables the session and puts the kernel in charge at next.
func bpfOwns(t *testing.T, r *Rx, index, next uint32) {
	t.Helper()
	if err := r.EnableSession(index); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteOrder(index, Order{Owner: OwnerBPF, Next: next}); err != nil {
		t.Fatal(err)
	}
}

// innerIPv4 is an IPv4 packet of n bytes (n >= 20) whose payload names id.
func innerIPv4(id uint32, n int) []byte {
	p := make([]byte, n)
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(n))
	p[8] = 64
	p[9] = protoUDP
	copy(p[12:], []byte{10, 0, 0, 1})
	copy(p[16:], []byte{10, 0, 0, 2})
	binary.BigEndian.PutUint16(p[10:], ipChecksum(p[:20]))
	for i := 20; i+4 <= n; i += 4 {
		binary.BigEndian.PutUint32(p[i:], id)
	}
	return p
}

// innerIPv6 is an IPv6 packet of n bytes (n >= 40) whose payload names id.
func innerIPv6(id uint32, n int) []byte {
	p := make([]byte, n)
	p[0] = 0x60
	binary.BigEndian.PutUint16(p[4:], uint16(n-40))
	p[6] = 59 // no next header
	p[7] = 64
	p[8], p[9], p[23] = 0x20, 0x01, 1
	p[24], p[25], p[39] = 0x20, 0x01, 2
	for i := 40; i+4 <= n; i += 4 {
		binary.BigEndian.PutUint32(p[i:], id)
	}
	return p
}

// dataDatagram is a sealed DATA datagram of the given session.
func dataDatagram(session, seq uint32, link uint8, linkSeq uint32, body []byte) []byte {
	return sealedDataFlags(0, session, seq, link, linkSeq, body)
}

// copyDatagram is dataDatagram for a redundant copy (wire.FlagDuplicate).
func copyDatagram(session, seq uint32, link uint8, linkSeq uint32, body []byte) []byte {
	return sealedDataFlags(wire.FlagDuplicate, session, seq, link, linkSeq, body)
}

func sealedDataFlags(flags uint8, session, seq uint32, link uint8, linkSeq uint32, body []byte) []byte {
	h := wire.Header{Type: wire.TypeData, Flags: flags, LinkID: link, KeyID: testKeyID, Session: session,
		Seq: seq, LinkSeq: linkSeq, Timestamp: 777}
	d := make([]byte, wire.HeaderLen+len(body))
	h.Put(d)
	copy(d[wire.HeaderLen:], body)
	auth.Seal(testKey, d)
	return d
}

func dataFrame(session, seq uint32, body []byte) []byte {
	return frameSpec{payload: dataDatagram(session, seq, testLinkID, seq, body)}.build()
}

func TestRxLoads(t *testing.T) {
	r := loadRxT(t)
	info, err := r.Program().Info()
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != ebpf.SchedCLS {
		t.Errorf("program type %v, want SchedCLS", info.Type)
	}
	v := rxVerdicts(t, r)
	if len(v) != len(RxVerdicts) {
		t.Errorf("Verdicts has %d counters, want %d", len(v), len(RxVerdicts))
	}
	for name, n := range v {
		if n != 0 {
			t.Errorf("fresh counter %s = %d", name, n)
		}
	}
}

func TestLoadRxRejectsPortZero(t *testing.T) {
	if r, err := LoadRx(0); err == nil {
		_ = r.Close()
		t.Fatal("LoadRx(0) succeeded")
	}
}

// Both objects carry the verdict enum, with the names Go counts under;
// and the check notices a difference.
func TestRxVerdictEnumMatches(t *testing.T) {
	spec, err := loadFprx()
	if err != nil {
		t.Fatal(err)
	}
	if err := checkRxVerdictEnum(spec); err != nil {
		t.Fatal(err)
	}
	var enum *btf.Enum
	if err := spec.Types.TypeByName("aggd_fp_rx_verdict", &enum); err != nil {
		t.Fatal(err)
	}
	enum.Values[3].Name = "AGGD_FP_RX_SOMETHING_ELSE"
	if err := checkRxVerdictEnum(spec); err == nil {
		t.Error("checkRxVerdictEnum accepted a renamed verdict")
	}
}

type vector struct {
	Name   string `json:"name"`
	Packet string `json:"packet"`
}

// Every golden vector meets the verdict the daemon's own checks imply, and
// the DATA vectors decapsulate to exactly their inner packet (IPv4 and
// IPv6), with the MAC header kept in front (the redirect into agg0 drops it).
func TestRxGoldenVectors(t *testing.T) {
	r := loadRxT(t)
	raw, err := os.ReadFile(filepath.Join("..", "..", "testdata", "wire", "vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var vs []vector
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatal(err)
	}
	var fast, v6 int
	for _, v := range vs {
		pkt, err := hex.DecodeString(v.Packet)
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		want, wantRet := "malformed", uint32(tcOK)
		h, herr := wire.ParseHeader(pkt)
		switch {
		case herr != nil:
		case h.Type != wire.TypeData:
			want = "not_data"
		case wire.CheckData(pkt[wire.HeaderLen:]) != nil:
		default:
			want, wantRet = "fast", tcRedirect
			bpfOwns(t, r, h.Session, h.Seq)
		}
		for _, outer6 := range []bool{false, true} {
			name := v.Name
			if outer6 {
				name += " (outer IPv6)"
				if want == "fast" {
					bpfOwns(t, r, h.Session, h.Seq)
				}
			}
			before := rxVerdicts(t, r)
			ret, out := runTC(t, r.Program(), frameSpec{ipv6: outer6, payload: pkt}.build(), nil)
			delta := statsDelta(before, rxVerdicts(t, r))
			if ret != wantRet || !sameCounts(delta, map[string]uint64{want: 1}) {
				t.Errorf("%s: %s, counted %v; want %s, %s", name, tcNames[ret], delta, tcNames[wantRet], want)
				continue
			}
			if want != "fast" {
				continue
			}
			fast++
			inner := pkt[wire.HeaderLen:]
			if inner[0]>>4 == 6 {
				v6++
			}
			if !bytes.Equal(out[:12], append(append([]byte{}, testDstMAC...), testSrcMAC...)) || !bytes.Equal(out[14:], inner) {
				t.Errorf("%s: decapsulated to\n% x\nwant MAC header +\n% x", name, out, inner)
			}
			if o := readOrder(t, r, h.Session); o.Owner != OwnerBPF || o.Next != h.Seq+1 {
				t.Errorf("%s: after delivery the order is %+v, want owner bpf, next %d", name, o, h.Seq+1)
			}
		}
	}
	if fast < 8 || v6 < 2 {
		t.Errorf("only %d DATA vectors delivered (%d IPv6): the vectors file changed?", fast, v6)
	}
}

// Inner packets of many sizes and both families, behind IPv4 options or an
// outer IPv6 header (options -1): the outer headers go, whatever their length.
func TestRxDecapLayouts(t *testing.T) {
	r := loadRxT(t)
	const idx = 0x01020304
	bpfOwns(t, r, idx, 0)
	seq := uint32(0)
	for _, opts := range []int{-1, 0, 1, 10} {
		for _, n := range []int{20, 21, 40, 41, 100, 1400} {
			for _, v6 := range []bool{false, true} {
				if v6 && n < 40 {
					continue
				}
				body := innerIPv4(seq, n)
				if v6 {
					body = innerIPv6(seq, n)
				}
				f := frameSpec{ipOptions: opts, payload: dataDatagram(idx, seq, 1, seq, body)}
				if opts < 0 {
					f = frameSpec{ipv6: true, payload: f.payload}
				}
				frame := f.build()
				ret, out := runTC(t, r.Program(), frame, nil)
				if ret != tcRedirect || !bytes.Equal(out[14:], body) {
					t.Errorf("options %d, inner %d bytes, v6 %v: %s, output % x", opts, n, v6, tcNames[ret], out)
				}
				seq++
			}
		}
	}
}

// checkRx runs one frame and checks the verdict and which counter moved.
func checkRx(t *testing.T, r *Rx, name string, frame []byte, ctx *skbMD, wantRet uint32, counted string) {
	t.Helper()
	before := rxVerdicts(t, r)
	ret, _ := runTC(t, r.Program(), frame, ctx)
	delta := statsDelta(before, rxVerdicts(t, r))
	want := map[string]uint64{}
	if counted != "" {
		want[counted] = 1
	}
	if ret != wantRet || !sameCounts(delta, want) {
		t.Errorf("%s: %s, counted %v; want %s, %v", name, tcNames[ret], delta, tcNames[wantRet], want)
	}
}

func TestRxVerdicts(t *testing.T) {
	r := loadRxT(t)
	const idx = 0x0a0b0c0d
	body := innerIPv4(1, 60)
	data := func(seq uint32) []byte { return dataDatagram(idx, seq, 2, seq, body) }
	garbage := bytes.Repeat([]byte{0x11}, 60)

	// Not ours: untouched and not counted.
	checkRx(t, r, "arp", frameSpec{etherType: etherTypeARP, payload: garbage}.build(), nil, tcOK, "")
	checkRx(t, r, "ipv6", frameSpec{etherType: etherTypeIPv6, payload: garbage}.build(), nil, tcOK, "")
	checkRx(t, r, "tcp", frameSpec{proto: protoTCP, payload: data(0)}.build(), nil, tcOK, "")
	checkRx(t, r, "other port", frameSpec{dport: 53, payload: data(0)}.build(), nil, tcOK, "")
	checkRx(t, r, "later fragment", frameSpec{fragOff: 10, payload: data(0)}.build(), nil, tcOK, "")
	checkRx(t, r, "IPv6 later fragment", frameSpec{ipv6: true, frag6: 0x00b9, payload: data(0)}.build(), nil, tcOK, "")

	// Not a whole, valid header, or a body the daemon rejects.
	checkRx(t, r, "header cut", frameSpec{payload: data(0)[:27]}.build(), nil, tcOK, "malformed")
	checkRx(t, r, "udp length short", frameSpec{payload: data(0), udpLenDelta: -70}.build(), nil, tcOK, "malformed")
	v2 := data(0)
	v2[0] = 0x21
	checkRx(t, r, "version 2", frameSpec{payload: v2}.build(), nil, tcOK, "malformed")
	checkRx(t, r, "empty body", frameSpec{payload: dataDatagram(idx, 0, 2, 0, nil)}.build(), nil, tcOK, "malformed")
	bad := innerIPv4(1, 60)
	bad[0] = 0x55
	checkRx(t, r, "inner version 5", frameSpec{payload: dataDatagram(idx, 0, 2, 0, bad)}.build(), nil, tcOK, "malformed")
	short := innerIPv4(1, 60)
	binary.BigEndian.PutUint16(short[2:], 59)
	checkRx(t, r, "inner length", frameSpec{payload: dataDatagram(idx, 0, 2, 0, short)}.build(), nil, tcOK, "malformed")

	// Control messages.
	probe := aggdDatagram(0x14, 0, wire.ProbeBody{Counter: 1}.Marshal())
	checkRx(t, r, "probe", frameSpec{payload: probe}.build(), nil, tcOK, "not_data")

	// No session.
	checkRx(t, r, "no session", frameSpec{payload: data(0)}.build(), nil, tcOK, "no_session")
	if err := r.EnableSession(idx); err != nil {
		t.Fatal(err)
	}

	// Owner daemon (as EnableSession leaves it): passed up and counted.
	checkRx(t, r, "daemon owns", frameSpec{payload: data(0)}.build(), nil, tcOK, "daemon_owns")
	if n := diverted(t, r, idx); n != 1 {
		t.Errorf("diverted %d, want 1", n)
	}

	// Owner BPF: in order, behind, ahead.
	if err := r.WriteOrder(idx, Order{Owner: OwnerBPF, Next: 100, Epoch: 7}); err != nil {
		t.Fatal(err)
	}
	checkRx(t, r, "in order", frameSpec{payload: data(100)}.build(), nil, tcRedirect, "fast")
	checkRx(t, r, "duplicate", frameSpec{payload: data(100)}.build(), nil, tcShot, "drop_old")
	checkRx(t, r, "far behind", frameSpec{payload: data(100 + 1<<31 + 1)}.build(), nil, tcShot, "drop_old")
	checkRx(t, r, "gap", frameSpec{payload: data(103)}.build(), nil, tcOK, "gap")
	if o := readOrder(t, r, idx); o != (Order{Owner: OwnerDaemon, Next: 101, Epoch: 8,
		LastDiverted: handover.PacketID{Link: 2, LinkSeq: 103}, DivertedBefore: 1}) {
		t.Errorf("after the gap: %+v, want owner daemon, next 101 (the handover point), epoch 8, the packet noted after 1 diverted", o)
	}
	checkRx(t, r, "daemon owns after gap", frameSpec{payload: data(101)}.build(), nil, tcOK, "daemon_owns")
	if n := diverted(t, r, idx); n != 3 {
		t.Errorf("diverted %d, want 3", n)
	}

	// Wrap: 0xffffffff, then 0; 0xfffffffe is behind 0.
	if err := r.WriteOrder(idx, Order{Owner: OwnerBPF, Next: 0xffffffff}); err != nil {
		t.Fatal(err)
	}
	checkRx(t, r, "seq 0xffffffff", frameSpec{payload: data(0xffffffff)}.build(), nil, tcRedirect, "fast")
	checkRx(t, r, "seq 0 after wrap", frameSpec{payload: data(0)}.build(), nil, tcRedirect, "fast")
	checkRx(t, r, "seq 0xfffffffe after wrap", frameSpec{payload: data(0xfffffffe)}.build(), nil, tcShot, "drop_old")
	checkRx(t, r, "gap across nothing", frameSpec{payload: data(2)}.build(), nil, tcOK, "gap")
	if o := readOrder(t, r, idx); o.Owner != OwnerDaemon || o.Next != 1 {
		t.Errorf("after the wrap and gap: %+v, want owner daemon at 1", o)
	}
}

// What the program cannot deliver makes it hand over at next, without
// advancing it; what it cannot judge (a GRO aggregate) too, whatever its
// sequence number. The divert count follows what the daemon will consume.
func TestRxUndeliverable(t *testing.T) {
	r := loadRxT(t)
	const idx = 0x0a0b0c0e
	body := innerIPv4(1, 60)
	cases := []struct {
		name    string
		frame   []byte
		ctx     *skbMD
		seq     uint32
		counted string
		segs    uint64
	}{
		{"vlan tag in the packet", frameSpec{vlans: []uint16{etherTypeVLAN}, payload: dataDatagram(idx, 50, 1, 1, body)}.build(), nil, 50, "decap_failed", 1},
		{"first fragment", frameSpec{fragOff: 0x2000, payload: dataDatagram(idx, 50, 1, 1, body)}.build(), nil, 50, "decap_failed", 1},
		{"IPv6 first fragment", frameSpec{ipv6: true, frag6: 0x0001, payload: dataDatagram(idx, 50, 1, 1, body)}.build(), nil, 50, "decap_failed", 1},
		{"trailing bytes in the frame", frameSpec{payload: dataDatagram(idx, 50, 1, 1, body), pad: 4}.build(), nil, 50, "decap_failed", 1},
		{"gro aggregate behind next", dataFrame(idx, 10, body), &skbMD{GSOSegs: 3, GSOSize: 100}, 10, "decap_failed", 3},
		{"gro aggregate at next", dataFrame(idx, 50, body), &skbMD{GSOSegs: 2, GSOSize: 100}, 50, "decap_failed", 2},
	}
	for _, c := range cases {
		bpfOwns(t, r, idx, 50)
		checkRx(t, r, c.name, c.frame, c.ctx, tcOK, c.counted)
		if o := readOrder(t, r, idx); !handedOverAt50(o) {
			t.Errorf("%s: order %+v, want handed over at 50 in epoch 1, the packet noted first", c.name, o)
		}
		if n := diverted(t, r, idx); n != c.segs {
			t.Errorf("%s: diverted %d, want %d", c.name, n, c.segs)
		}
	}

	// No agg0: the daemon delivers everything.
	bpfOwns(t, r, idx, 50)
	if err := r.SetAgg0(0); err != nil {
		t.Fatal(err)
	}
	checkRx(t, r, "no agg0", dataFrame(idx, 50, body), nil, tcOK, "daemon_owns")
	if o := readOrder(t, r, idx); !handedOverAt50(o) {
		t.Errorf("no agg0: order %+v, want handed over at 50 in epoch 1, the packet noted first", o)
	}
}

// handedOverAt50 reports whether the program handed a fresh session over at 50, noting
// the packet as the first it counted (which one TestRxNotesTheLastDiverted checks).
func handedOverAt50(o Order) bool {
	o.LastDiverted = handover.PacketID{}
	return o == Order{Owner: OwnerDaemon, Next: 50, Epoch: 1, DivertedBefore: 0}
}

// enabledSession loads the receive program with session idx enabled (owned by the
// daemon) and returns run, which feeds it one DATA packet and returns its verdict.
func enabledSession(t *testing.T, idx uint32) (*Rx, func(seq uint32) uint32) {
	t.Helper()
	r := loadRxT(t)
	if err := r.EnableSession(idx); err != nil {
		t.Fatal(err)
	}
	body := innerIPv4(1, 60)
	return r, func(seq uint32) uint32 {
		ret, _ := runTC(t, r.Program(), dataFrame(idx, seq, body), nil)
		return ret
	}
}

// A handback is accepted only with the stamp equal to the divert count; a
// stale one never later; one posted while BPF owns is ignored.
func TestRxHandback(t *testing.T) {
	const idx = 0x0a0b0c0f
	r, run := enabledSession(t, idx)
	for seq := uint32(0); seq < 3; seq++ {
		if ret := run(seq); ret != tcOK {
			t.Fatalf("seq %d under owner daemon: %s", seq, tcNames[ret])
		}
	}
	// The daemon consumed 2 of the 3 when it posted: stale.
	o := readOrder(t, r, idx)
	o.ReqValid, o.ReqStamp, o.ReqNext = true, 2, 3
	if err := r.WriteOrder(idx, o); err != nil {
		t.Fatal(err)
	}
	if ret := run(3); ret != tcOK {
		t.Errorf("stale handback: seq 3 %s, want passed up", tcNames[ret])
	}
	// Stale for good: the count only grows past it.
	for seq := uint32(4); seq < 8; seq++ {
		if ret := run(seq); ret != tcOK {
			t.Errorf("stale handback, seq %d: %s, want passed up", seq, tcNames[ret])
		}
	}
	if o := readOrder(t, r, idx); o.Owner != OwnerDaemon || !o.ReqValid {
		t.Errorf("after a stale handback: %+v, want the daemon still owning", o)
	}
	// Matching: 8 passed up, 8 consumed.
	if n := diverted(t, r, idx); n != 8 {
		t.Fatalf("diverted %d, want 8", n)
	}
	o = readOrder(t, r, idx)
	o.ReqValid, o.ReqStamp, o.ReqNext = true, 8, 8
	if err := r.WriteOrder(idx, o); err != nil {
		t.Fatal(err)
	}
	if ret := run(8); ret != tcRedirect {
		t.Errorf("matching handback: seq 8 %s, want delivered", tcNames[ret])
	}
	if o := readOrder(t, r, idx); o.Owner != OwnerBPF || o.Next != 9 || o.Epoch != 0 || o.ReqValid {
		t.Errorf("after accepting: %+v, want owner bpf at 9 in epoch 0, request cleared", o)
	}
	// A request while BPF owns is not the daemon's to make: ignored.
	if err := r.WriteOrder(idx, Order{Owner: OwnerBPF, Next: 9, ReqValid: true, ReqStamp: 8, ReqNext: 2}); err != nil {
		t.Fatal(err)
	}
	if ret := run(9); ret != tcRedirect {
		t.Errorf("bogus request under owner bpf: seq 9 %s, want delivered", tcNames[ret])
	}
	if o := readOrder(t, r, idx); o.Owner != OwnerBPF || o.Next != 10 || o.ReqValid {
		t.Errorf("after a bogus request: %+v, want owner bpf at 10, request cleared", o)
	}
}

// The real program and the daemon's handover code, with a passed-up packet
// lost on the host: the handbacks stay stale until Resync adopts the
// program's count, and then the program takes the ordering back.
func TestRxResyncAfterALostPassUp(t *testing.T) {
	const idx = 0x0a0b0c11
	r, run := enabledSession(t, idx)
	d := handover.New(r, idx)
	for seq := uint32(0); seq < 2; seq++ {
		if ret := run(seq); ret != tcOK {
			t.Fatalf("seq %d under owner daemon: %s", seq, tcNames[ret])
		}
	}
	if _, _, err := d.OnData(handover.PacketID{}, time.Time{}); err != nil { // seq 0 reaches the daemon, seq 1 is lost
		t.Fatal(err)
	}
	next := uint32(2) // the hold timer skipped seq 1
	for range 3 {
		if err := d.Idle(next, 0, true); err != nil {
			t.Fatal(err)
		}
		if ret := run(next); ret != tcOK {
			t.Fatalf("stale handback: seq %d %s, want passed up", next, tcNames[ret])
		}
		if _, _, err := d.OnData(handover.PacketID{}, time.Time{}); err != nil {
			t.Fatal(err)
		}
		next++
	}
	if err := d.Idle(next, 0, true); err != nil {
		t.Fatal(err)
	}
	// As the session's tick does after a quiet period: the first call notes the
	// program's count, the next, a quiet period later, adopts it.
	t0 := time.Unix(1000, 0)
	for _, at := range []time.Time{t0, t0.Add(time.Second)} {
		if reset, _, err := d.Resync(at, time.Second); reset || err != nil {
			t.Fatalf("Resync: reset %v, %v", reset, err)
		}
	}
	if n := diverted(t, r, idx); d.Consumed() != n {
		t.Fatalf("after Resync the daemon counts %d, the program %d", d.Consumed(), n)
	}
	if err := d.Idle(next, 0, true); err != nil {
		t.Fatal(err)
	}
	if ret := run(next); ret != tcRedirect {
		t.Errorf("after the resync: seq %d %s, want the handback accepted and the packet delivered", next, tcNames[ret])
	}
	if o := readOrder(t, r, idx); o.Owner != OwnerBPF || o.Next != next+1 {
		t.Errorf("order %+v, want the program owning at %d", o, next+1)
	}
}

// The program notes every packet it counts, with its count before that packet, under
// the lock: what the daemon's tally compares with its own count.
func TestRxNotesTheLastDiverted(t *testing.T) {
	const idx = 0x0a0b0c12
	r := loadRxT(t)
	if err := r.EnableSession(idx); err != nil {
		t.Fatal(err)
	}
	body := innerIPv4(1, 60)
	for i, p := range []struct {
		seq     uint32
		link    uint8
		linkSeq uint32
	}{{0, 1, 100}, {1, 2, 7}, {2, 1, 101}, {3, 0, 0xfffffffe}} {
		frame := frameSpec{payload: dataDatagram(idx, p.seq, p.link, p.linkSeq, body)}.build()
		if ret, _ := runTC(t, r.Program(), frame, nil); ret != tcOK {
			t.Fatalf("seq %d under owner daemon: %s", p.seq, tcNames[ret])
		}
		o := readOrder(t, r, idx)
		want := handover.PacketID{Link: p.link, LinkSeq: p.linkSeq}
		if o.LastDiverted != want || o.DivertedBefore != uint32(i) {
			t.Errorf("after seq %d: last diverted %+v with %d before it, want %+v with %d", p.seq,
				o.LastDiverted, o.DivertedBefore, want, i)
		}
	}
	// Not counted, not noted: a packet the program delivers itself.
	bpfOwns(t, r, idx, 10)
	if ret, _ := runTC(t, r.Program(), frameSpec{payload: dataDatagram(idx, 10, 1, 102, body)}.build(), nil); ret != tcRedirect {
		t.Fatalf("seq 10 under owner bpf: %s", tcNames[ret])
	}
	if o := readOrder(t, r, idx); o.LastDiverted.LinkSeq == 102 {
		t.Errorf("a delivered packet was noted: %+v", o)
	}
}

// The real program, the daemon's handover code and its resequencer: the daemon gives a
// number up (a dead link's packet, named by a loss notice) and hands the ordering back;
// the copy that comes after is delivered by the program, once, as the resequencer's
// PushCopy delivers it while the daemon owns. A copy of a delivered number, an original
// behind next and a second copy are dropped as old.
func TestRxDeliversLateCopiesOfGivenUpNumbers(t *testing.T) {
	const idx = 0x0a0b0c14
	r := loadRxT(t)
	if err := r.EnableSession(idx); err != nil {
		t.Fatal(err)
	}
	d := handover.New(r, idx)
	rs := reseq.New(reseq.Config{MaxHold: 1 << 40}, 0)
	rs.SetLinks([]uint8{1, 2})
	var delivered []uint32
	deliver := func(p []byte) { delivered = append(delivered, seqOfInner(p)) }
	defer func() {
		if !slices.Equal(delivered, []uint32{0, 2}) {
			t.Errorf("the resequencer delivered %v, want 0 and 2", delivered)
		}
	}()
	bodies := make([][]byte, 8)
	for i := range bodies {
		bodies[i] = innerIPv4(uint32(i), 60)
	}
	send := func(datagram []byte) (uint32, []byte) {
		t.Helper()
		return runTC(t, r.Program(), frameSpec{payload: datagram}.build(), nil)
	}
	// Owner daemon: 0 and 2 come up (1 was on a link that died), the loss notice
	// gives 1 up, the resequencer delivers 0 and 2 and hands back at 3.
	for _, seq := range []uint32{0, 2} {
		if ret, _ := send(dataDatagram(idx, seq, 1, seq, bodies[seq])); ret != tcOK {
			t.Fatalf("seq %d under owner daemon: %s", seq, tcNames[ret])
		}
		if _, _, err := d.OnData(handover.PacketID{Link: 1, LinkSeq: seq}, time.Time{}); err != nil {
			t.Fatal(err)
		}
		rs.Push(1, seq, 1, bodies[seq], deliver)
	}
	rs.Skip(1, 1, deliver)
	if rs.Next() != 3 || rs.Skipped() != 1<<1 {
		t.Fatalf("resequencer at %d with skipped bits %#x, want 3 and 1 given up (bit 1)", rs.Next(), rs.Skipped())
	}
	if err := d.Idle(rs.Next(), rs.Skipped(), rs.Empty()); err != nil {
		t.Fatal(err)
	}
	if ret, _ := send(dataDatagram(idx, 3, 2, 1, bodies[3])); ret != tcRedirect {
		t.Fatalf("seq 3 after the handback: %s, want accepted and delivered", tcNames[ret])
	}
	if o := readOrder(t, r, idx); o.Owner != OwnerBPF || o.Next != 4 || o.Skipped != 1<<1 || o.SkippedEnd != 3 {
		t.Fatalf("order %+v, want the program owning at 4 with 1 given up below 3", o)
	}

	before := rxVerdicts(t, r)
	ret, out := send(copyDatagram(idx, 1, 2, 2, bodies[1]))
	if ret != tcRedirect || !bytes.Equal(out[14:], bodies[1]) {
		t.Errorf("copy of the given-up 1: %s, inner %x; want delivered, inner %x", tcNames[ret], out, bodies[1])
	}
	if delta := statsDelta(before, rxVerdicts(t, r)); !sameCounts(delta, map[string]uint64{"late_copy": 1}) {
		t.Errorf("copy of the given-up 1 counted %v, want late_copy", delta)
	}
	if o := readOrder(t, r, idx); o.Next != 4 || o.Skipped != 0 {
		t.Errorf("after the late copy: %+v, want next unmoved at 4 and nothing left given up", o)
	}
	checkRx(t, r, "a second copy of 1", frameSpec{payload: copyDatagram(idx, 1, 1, 3, bodies[1])}.build(), nil, tcShot, "drop_old")
	checkRx(t, r, "a copy of the delivered 2", frameSpec{payload: copyDatagram(idx, 2, 2, 3, bodies[2])}.build(), nil, tcShot, "drop_old")
	if diverted(t, r, idx) != 2 {
		t.Errorf("diverted %d, want 2: a late copy is delivered by the program, not passed up", diverted(t, r, idx))
	}
}

// An original (not a copy) behind next is late, as the resequencer's Push drops it,
// even of a number the daemon gave up.
func TestRxDropsALateOriginalOfAGivenUpNumber(t *testing.T) {
	const idx = 0x0a0b0c15
	r := loadRxT(t)
	if err := r.EnableSession(idx); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteOrder(idx, Order{Owner: OwnerBPF, Next: 10, Skipped: 1, SkippedEnd: 10}); err != nil {
		t.Fatal(err)
	}
	body := innerIPv4(9, 60)
	checkRx(t, r, "original of the given-up 9", frameSpec{payload: dataDatagram(idx, 9, 1, 9, body)}.build(), nil, tcShot, "drop_old")
	checkRx(t, r, "copy of 9", frameSpec{payload: copyDatagram(idx, 9, 2, 1, body)}.build(), nil, tcRedirect, "late_copy")
	checkRx(t, r, "copy of 8, delivered", frameSpec{payload: copyDatagram(idx, 8, 2, 2, body)}.build(), nil, tcShot, "drop_old")
	checkRx(t, r, "copy of 9 again", frameSpec{payload: copyDatagram(idx, 9, 2, 3, body)}.build(), nil, tcShot, "drop_old")
}

// The real program and the daemon's handover code, with a passed-up packet lost on the
// host while packets keep coming, a millisecond apart: no quiet period for Resync, but
// the daemon's tally finds the loss within its window and the program takes the
// ordering back.
func TestRxTallyAfterALostPassUpWhileTrafficFlows(t *testing.T) {
	const idx = 0x0a0b0c13
	r := loadRxT(t)
	if err := r.EnableSession(idx); err != nil {
		t.Fatal(err)
	}
	d := handover.New(r, idx)
	body := innerIPv4(1, 60)
	now := time.Unix(1000, 0)
	linkSeq := [2]uint32{}
	kernelFrom := -1
	for seq := uint32(0); seq < 600; seq++ {
		link := uint8(seq % 2)
		linkSeq[link]++
		frame := frameSpec{payload: dataDatagram(idx, seq, link, linkSeq[link], body)}.build()
		ret, _ := runTC(t, r.Program(), frame, nil)
		now = now.Add(time.Millisecond)
		switch {
		case ret == tcRedirect:
			if kernelFrom < 0 {
				kernelFrom = int(seq)
			}
			continue
		case ret != tcOK:
			t.Fatalf("seq %d: %s", seq, tcNames[ret])
		case kernelFrom >= 0:
			t.Fatalf("seq %d passed up after the program took the ordering back at %d", seq, kernelFrom)
		case seq == 1:
			continue // lost on the host (the daemon's hold timer skips it)
		}
		reset, _, err := d.OnData(handover.PacketID{Link: link, LinkSeq: linkSeq[link]}, now)
		if err != nil || reset {
			t.Fatalf("seq %d: OnData: reset %v, %v", seq, reset, err)
		}
		if seq == 0 {
			continue // still holding it when seq 1 came
		}
		if err := d.Idle(seq+1, 0, true); err != nil {
			t.Fatal(err)
		}
	}
	st := d.Stats()
	if kernelFrom < 0 || st.Tallies != 1 || st.TallyLost != 1 {
		t.Fatalf("the program never took the ordering back (first delivered %d); handbacks %+v", kernelFrom, st)
	}
	if n := diverted(t, r, idx); d.Consumed() != n {
		t.Errorf("the daemon counts %d, the program %d", d.Consumed(), n)
	}
	t.Logf("the program took the ordering back at seq %d (%d ms after the loss); handbacks %+v", kernelFrom, kernelFrom-1, st)
}

func TestRxLinkStats(t *testing.T) {
	r := loadRxT(t)
	const idx = 0x0a0b0c10
	bpfOwns(t, r, idx, 0)
	sizes := map[uint8]uint64{}
	for seq := uint32(0); seq < 10; seq++ {
		link := uint8(seq % 3)
		body := innerIPv4(seq, 40+int(seq))
		ret, _ := runTC(t, r.Program(), frameSpec{payload: dataDatagram(idx, seq, link, 100+seq, body)}.build(), nil)
		if ret != tcRedirect {
			t.Fatalf("seq %d: %s", seq, tcNames[ret])
		}
		sizes[link] += uint64(len(body))
	}
	// A late twin: seq 4 again, as the copy of a suspect link's packet on link 2 that
	// lost the race. Dropped, but it did cross link 2, and link 2's stats count it.
	twin := innerIPv4(4, 44)
	if ret, _ := runTC(t, r.Program(), frameSpec{payload: dataDatagram(idx, 4, 2, 110, twin)}.build(), nil); ret != tcShot {
		t.Fatalf("late twin: %s, want shot", tcNames[ret])
	}
	sizes[2] += uint64(len(twin))
	st, err := r.LinkStats(idx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint8]struct {
		n   uint64
		max uint32
	}{0: {4, 109}, 1: {3, 107}, 2: {4, 110}}
	if len(st) != len(want) {
		t.Errorf("links %v, want 0, 1, 2", st)
	}
	for id, w := range want {
		s := st[id]
		if s.Packets != w.n || s.Bytes != sizes[id] || s.MaxLinkSeq != w.max || s.LastTstamp != 777 || s.LastArrivalNs == 0 {
			t.Errorf("link %d: %+v, want %d packets, %d bytes, max link seq %d", id, s, w.n, sizes[id], w.max)
		}
	}
	if err := r.DisableSession(idx); err != nil {
		t.Fatal(err)
	}
	if st, err := r.LinkStats(idx); err != nil || len(st) != 0 {
		t.Errorf("after DisableSession: %v, %v", st, err)
	}
	if _, err := r.ReadOrder(idx); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("ReadOrder after DisableSession: %v", err)
	}
}

// ---- the differential test --------------------------------------------------

// event is one datagram arriving on an uplink.
type event struct {
	frame []byte
	seq   uint32 // for the log
}

// seqSpec describes a generated sequence.
type seqSpec struct {
	name    string
	start   uint32
	n       int
	links   int
	jitter  int     // max extra delay per packet, in ticks (0: in order)
	loss    float64 // per packet
	dup     float64 // per packet: a copy on another link
	bad     float64 // per packet: a malformed datagram among them
	v6      float64 // share of IPv6 inner packets
	shuffle bool    // ignore FIFO per link: arbitrary order
	// lag: the daemon reads its socket late (a random part of the queue
	// after each packet), so handbacks race with packets on their way up.
	// Hold timers then run only at the end, on both paths: a timer firing
	// while the filler of a gap sits in the socket would be a difference
	// of timing, not of ordering.
	lag bool
}

// generate sends n packets from start over the links (each FIFO, with its
// own delay) and returns them in arrival order.
func generate(spec seqSpec, rng *rand.Rand, session uint32) []event {
	type arrival struct {
		at int
		ev event
	}
	var arr []arrival
	linkLast := make([]int, spec.links)
	linkSeq := make([]uint32, spec.links)
	send := func(t int, link int, seq uint32, body []byte) {
		at := t + rng.IntN(spec.jitter+1)
		if !spec.shuffle {
			at = max(at, linkLast[link]) // FIFO
		}
		linkLast[link] = at
		linkSeq[link]++
		arr = append(arr, arrival{at, event{frame: frameSpec{payload: dataDatagram(session, seq, uint8(link), linkSeq[link], body)}.build(), seq: seq}})
	}
	for i := range spec.n {
		seq := spec.start + uint32(i)
		var body []byte
		if rng.Float64() < spec.v6 {
			body = innerIPv6(seq, 44+rng.IntN(200))
		} else {
			body = innerIPv4(seq, 24+rng.IntN(200))
		}
		link := rng.IntN(spec.links)
		if rng.Float64() < spec.bad {
			bad := slices.Clone(body)
			bad[0] = 0x55
			send(2*i, link, seq, bad)
			continue
		}
		if rng.Float64() >= spec.loss {
			send(2*i, link, seq, body)
		}
		if spec.links > 1 && rng.Float64() < spec.dup {
			send(2*i, (link+1+rng.IntN(spec.links-1))%spec.links, seq, body)
		}
	}
	sort.SliceStable(arr, func(i, j int) bool { return arr[i].at < arr[j].at })
	out := make([]event, len(arr))
	for i, a := range arr {
		out[i] = a.ev
	}
	return out
}

// outcome is what one implementation did with a sequence.
type outcome struct {
	delivered [][]byte
	drops     uint64 // duplicates, late, stale, bogus
	lost      uint64
	// fast path only
	fast, daemon uint64
	ho           handover.Stats
}

const diffHold = 40 // ticks a held packet waits

func newReseq(start uint32, links int) *reseq.Resequencer {
	rs := reseq.New(reseq.Config{MaxHold: diffHold, MaxPackets: 256}, start)
	ids := make([]uint8, links)
	for i := range ids {
		ids[i] = uint8(i)
	}
	rs.SetLinks(ids)
	return rs
}

// daemonParse is what the daemon's socket does before a datagram reaches
// the session (tunnel.parseDatagram): header and DATA body checks.
func daemonParse(datagram []byte) (wire.Header, bool) {
	h, err := wire.ParseHeader(datagram)
	if err != nil || h.Type != wire.TypeData || wire.CheckData(datagram[wire.HeaderLen:]) != nil {
		return h, false
	}
	return h, true
}

// datagramOf strips Ethernet, IPv4 (no options in generated frames) and UDP.
func datagramOf(frame []byte) []byte { return frame[14+20+8:] }

// runReference feeds the events to a resequencer alone: the slow path.
func runReference(spec seqSpec, events []event) outcome {
	var o outcome
	deliver := func(p []byte) { o.delivered = append(o.delivered, slices.Clone(p)) }
	rs := newReseq(spec.start, spec.links)
	now := int64(0)
	for _, ev := range events {
		now++
		d := datagramOf(ev.frame)
		if h, ok := daemonParse(d); ok {
			rs.Push(now, h.Seq, h.LinkID, d[wire.HeaderLen:], deliver)
		}
		if !spec.lag {
			rs.Expire(now, deliver)
		}
	}
	rs.Expire(now+10*diffHold, deliver)
	st := rs.Stats()
	o.drops = st.Duplicates + st.Late + st.Stale + st.Bogus
	o.lost = st.Lost
	return o
}

// runFastPath feeds the events through the real program; what it passes up
// goes to a simulated daemon (handover.Daemon + a resequencer).
func runFastPath(t *testing.T, r *Rx, session uint32, spec seqSpec, events []event, lagRng *rand.Rand) outcome {
	t.Helper()
	var o outcome
	deliver := func(p []byte) {
		o.delivered = append(o.delivered, slices.Clone(p))
		o.daemon++
	}
	if err := r.EnableSession(session); err != nil {
		t.Fatal(err)
	}
	before := rxVerdicts(t, r)
	d := handover.New(r, session)
	rs := newReseq(spec.start, spec.links)
	idle := func() {
		if err := d.Idle(rs.Next(), rs.Skipped(), rs.Empty()); err != nil {
			t.Fatalf("Idle: %v", err)
		}
	}
	var queue [][]byte // the daemon's socket
	consume := func(now int64, dg []byte) {
		h, ok := daemonParse(dg)
		if !ok {
			return
		}
		reset, next, err := d.OnData(handover.PacketID{Link: h.LinkID, LinkSeq: h.LinkSeq}, time.Unix(0, now))
		if err != nil {
			t.Fatalf("seq %d: OnData: %v", h.Seq, err)
		}
		if reset {
			rs.Restart(next)
		}
		rs.Push(now, h.Seq, h.LinkID, dg[wire.HeaderLen:], deliver)
		idle()
	}
	now := int64(0)
	for _, ev := range events {
		now++
		ret, out := runTC(t, r.Program(), ev.frame, nil)
		switch ret {
		case tcRedirect:
			o.delivered = append(o.delivered, slices.Clone(out[14:]))
			o.fast++
		case tcShot:
		case tcOK:
			queue = append(queue, slices.Clone(datagramOf(out)))
		default:
			t.Fatalf("seq %d: verdict %d", ev.seq, ret)
		}
		k := len(queue)
		if spec.lag {
			k = lagRng.IntN(k + 1)
		}
		for _, dg := range queue[:k] {
			consume(now, dg)
		}
		queue = queue[k:]
		idle()
		if !spec.lag {
			rs.Expire(now, deliver)
			idle()
		}
	}
	for _, dg := range queue {
		consume(now, dg)
	}
	rs.Expire(now+10*diffHold, deliver)
	idle()
	st := rs.Stats()
	v := statsDelta(before, rxVerdicts(t, r))
	o.drops = st.Duplicates + st.Late + st.Stale + st.Bogus + v["drop_old"]
	o.lost = st.Lost
	o.ho = d.Stats()
	if v["fast"] != o.fast {
		t.Errorf("fast counter %d, redirects %d", v["fast"], o.fast)
	}
	return o
}

func seqOfInner(p []byte) uint32 {
	if p[0]>>4 == 6 {
		return binary.BigEndian.Uint32(p[40:])
	}
	return binary.BigEndian.Uint32(p[20:])
}

func describe(ps [][]byte) string {
	s := make([]uint32, len(ps))
	for i, p := range ps {
		s[i] = seqOfInner(p)
	}
	return fmt.Sprint(s)
}

// TestRxDiff is the differential test: the same packet sequences through
// the slow path alone and through the fast path with the daemon behind it
// must deliver the same inner packets in the same order, never one twice,
// and drop and lose the same number.
func TestRxDiff(t *testing.T) {
	r := loadRxT(t)
	specs := []seqSpec{
		{name: "in order", n: 300, links: 1},
		{name: "in order, 3 links", n: 300, links: 3},
		{name: "reordered", n: 300, links: 3, jitter: 8},
		{name: "reordered heavily", n: 300, links: 3, jitter: 60},
		{name: "duplicated", n: 300, links: 3, jitter: 4, dup: 0.3},
		{name: "lossy", n: 300, links: 3, jitter: 6, loss: 0.1},
		{name: "lossy in order", n: 300, links: 1, loss: 0.1},
		{name: "wrapping", start: 0xffffff80, n: 300, links: 2, jitter: 5, loss: 0.03, dup: 0.1},
		{name: "malformed", n: 300, links: 3, jitter: 3, bad: 0.1},
		{name: "ipv6", n: 200, links: 2, jitter: 3, v6: 1},
		{name: "everything", start: 0xfffffff0, n: 400, links: 4, jitter: 10, loss: 0.05, dup: 0.15, bad: 0.05, v6: 0.4},
		{name: "no fifo", n: 300, links: 3, jitter: 20, dup: 0.1, loss: 0.05, shuffle: true},
		{name: "far jump", start: 7, n: 100, links: 2, jitter: 2},
		{name: "lagging daemon", n: 300, links: 3, jitter: 6, lag: true},
		{name: "lagging daemon, everything", start: 0xffffff00, n: 400, links: 3, jitter: 10, loss: 0.05, dup: 0.2, bad: 0.05, v6: 0.3, lag: true},
	}
	var total outcome
	for i, spec := range specs {
		for seed := range uint64(4) {
			name := fmt.Sprintf("%s/seed%d", spec.name, seed)
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			session := uint32(0x5e000000 + i*16 + int(seed))
			events := generate(spec, rng, session)
			if spec.name == "far jump" {
				// A sender far ahead (bogus for the resequencer).
				events = append(events[:50:50], append([]event{{frame: dataFrame(session, spec.start+reseq.Window+5, innerIPv4(1, 40)), seq: spec.start + reseq.Window + 5}}, events[50:]...)...)
			}
			a := runReference(spec, events)
			b := runFastPath(t, r, session, spec, events, rand.New(rand.NewPCG(seed, 99)))
			if len(a.delivered) != len(b.delivered) || !slices.EqualFunc(a.delivered, b.delivered, bytes.Equal) {
				t.Errorf("%s: delivered differ\nslow: %s\nfast: %s", name, describe(a.delivered), describe(b.delivered))
			}
			seen := map[uint32]bool{}
			for _, p := range b.delivered {
				s := seqOfInner(p)
				if seen[s] {
					t.Errorf("%s: seq %d delivered twice", name, s)
				}
				seen[s] = true
			}
			if a.drops != b.drops || a.lost != b.lost {
				t.Errorf("%s: slow path dropped %d and lost %d, fast path %d and %d", name, a.drops, a.lost, b.drops, b.lost)
			}
			if spec.loss == 0 && spec.bad == 0 && spec.name != "far jump" && len(b.delivered) != spec.n {
				t.Errorf("%s: %d delivered, want all %d", name, len(b.delivered), spec.n)
			}
			total.fast += b.fast
			total.daemon += b.daemon
			total.ho.Posted += b.ho.Posted
			total.ho.Accepted += b.ho.Accepted
			total.ho.Died += b.ho.Died
		}
	}
	// The comparison means something only if both paths took part.
	t.Logf("delivered by BPF %d, by the daemon %d; handbacks posted %d, accepted %d, died %d",
		total.fast, total.daemon, total.ho.Posted, total.ho.Accepted, total.ho.Died)
	if total.fast == 0 || total.daemon == 0 || total.ho.Accepted == 0 || total.ho.Died == 0 {
		t.Error("the sequences did not exercise both paths and the handover")
	}
}

// ---- the real path ------------------------------------------------------------

// udpInner is an inner UDP packet from src to dst (both IPv4 or both IPv6),
// port 5555, with a correct UDP checksum (IPv6 requires one).
func udpInner(src, dst netip.Addr, payload []byte) []byte {
	udp := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], 4444)
	binary.BigEndian.PutUint16(udp[2:], 5555)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], payload)
	// Pseudo-header checksum.
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	s, d := src.AsSlice(), dst.AsSlice()
	add(s)
	add(d)
	sum += protoUDP + uint32(len(udp))
	add(udp)
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	ck := ^uint16(sum)
	if ck == 0 {
		ck = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:], ck)

	if src.Is4() {
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(udp)))
		ip[8] = 64
		ip[9] = protoUDP
		copy(ip[12:], s)
		copy(ip[16:], d)
		binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
		return append(ip, udp...)
	}
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(udp)))
	ip[6] = protoUDP
	ip[7] = 64
	copy(ip[8:], s)
	copy(ip[24:], d)
	return append(ip, udp...)
}

// TestRxIntoAgg0 sends tunnel frames into a veth whose peer runs the
// program, with a TUN device as agg0, and receives the inner IPv4 and IPv6
// datagrams on sockets bound to local addresses: the redirect really
// lands in agg0's ingress, with the right skb->protocol for each family
// (an IPv6 packet marked ETH_P_IP would be dropped by ip_rcv).
func TestRxIntoAgg0(t *testing.T) {
	r := loadRxT(t)
	const idx = 0x00c0ffee
	inFreshNetns(t, func(netns.NsHandle) {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "aggd-up"}, PeerName: "aggd-peer"}
		if err := netlink.LinkAdd(veth); err != nil {
			t.Fatalf("add veth: %v", err)
		}
		tun := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "agg0t"}, Mode: netlink.TUNTAP_MODE_TUN,
			Flags: netlink.TUNTAP_NO_PI | netlink.TUNTAP_ONE_QUEUE}
		if err := netlink.LinkAdd(tun); err != nil {
			t.Fatalf("add tun: %v (needs /dev/net/tun: modprobe tun)", err)
		}
		up, _ := netlink.LinkByName("aggd-up")
		peer, _ := netlink.LinkByName("aggd-peer")
		agg0, _ := netlink.LinkByName("agg0t")
		if up == nil || peer == nil || agg0 == nil {
			t.Fatal("interfaces missing after creation")
		}
		for _, l := range []netlink.Link{up, peer, agg0} {
			if err := netlink.LinkSetUp(l); err != nil {
				t.Fatalf("set %s up: %v", l.Attrs().Name, err)
			}
		}
		local4, remote4 := netip.MustParseAddr("10.99.0.1"), netip.MustParseAddr("10.99.0.2")
		local6, remote6 := netip.MustParseAddr("2001:db8:99::1"), netip.MustParseAddr("2001:db8:99::2")
		// The inner destinations are local addresses on lo: a TUN without a
		// reader has no carrier, and IPv6 does not use addresses on a link
		// that is not running (they would stay tentative for a while).
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			t.Fatalf("set lo up: %v", err)
		}
		for _, a := range []netip.Addr{local4, local6} {
			bits := a.BitLen()
			addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, bits)}, Flags: unix.IFA_F_NODAD}
			if err := netlink.AddrAdd(lo, addr); err != nil {
				t.Fatalf("address %s on lo: %v", a, err)
			}
		}
		// IPv6 installs an address's local route from a work queue, even
		// without DAD: wait for it (a deadline only against hanging).
		for _, a := range []netip.Addr{local4, local6} {
			waitLocal(t, a)
		}
		for _, a := range []netip.Addr{remote4, remote6} {
			bits := a.BitLen()
			rt := &netlink.Route{LinkIndex: agg0.Attrs().Index, Dst: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, bits)}}
			if err := netlink.RouteAdd(rt); err != nil {
				t.Fatalf("route to %s via agg0: %v", a, err)
			}
		}
		if err := r.SetAgg0(agg0.Attrs().Index); err != nil {
			t.Fatal(err)
		}
		att, mode, err := AttachTC(r.Program(), up.Attrs().Index, false)
		if err != nil {
			t.Fatalf("attach: %v", err)
		}
		defer func() { _ = att.Close() }()
		t.Logf("attached with %s", mode)

		conns := map[string]*net.UDPConn{}
		for name, a := range map[string]netip.Addr{"ipv4": local4, "ipv6": local6} {
			c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 5555)))
			if err != nil {
				t.Fatalf("listen on %s: %v", a, err)
			}
			defer c.Close()
			conns[name] = c
		}
		bpfOwns(t, r, idx, 0)
		before := rxVerdicts(t, r)
		inner := map[string][]byte{
			"ipv4": udpInner(remote4, local4, []byte("through agg0, v4")),
			"ipv6": udpInner(remote6, local6, []byte("through agg0, v6")),
		}
		mac := up.Attrs().HardwareAddr
		sendFrames(t, peer.Attrs().Index,
			withDst(frameSpec{payload: dataDatagram(idx, 0, 1, 1, inner["ipv4"])}.build(), mac),
			withDst(frameSpec{payload: dataDatagram(idx, 1, 1, 2, inner["ipv6"])}.build(), mac))
		for _, name := range []string{"ipv4", "ipv6"} {
			c := conns[name]
			buf := make([]byte, 100)
			// A deadline only so a lost packet fails the test instead of hanging it.
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				snmp6, _ := os.ReadFile("/proc/thread-self/net/snmp6")
				snmp, _ := os.ReadFile("/proc/thread-self/net/snmp")
				t.Errorf("%s: inner datagram not received: %v (verdicts %v)\n%s\n%s",
					name, err, statsDelta(before, rxVerdicts(t, r)), nonZero(snmp6), snmp)
				continue
			}
			want := "through agg0, " + name[2:]
			if string(buf[:n]) != want || from.Port() != 4444 {
				t.Errorf("%s: received %q from %v, want %q from port 4444", name, buf[:n], from, want)
			}
		}
		if d := statsDelta(before, rxVerdicts(t, r)); d["fast"] != 2 {
			t.Errorf("verdicts %v, want 2 fast", d)
		}
	})
}

func nonZero(b []byte) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[1] != "0" {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// waitLocal waits until the kernel routes a to this host.
func waitLocal(t *testing.T, a netip.Addr) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		rs, err := netlink.RouteGet(a.AsSlice())
		if err == nil && len(rs) > 0 && rs[0].Type == unix.RTN_LOCAL {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never became a local address: %v %v", a, rs, err)
		}
	}
}
