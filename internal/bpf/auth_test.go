package bpf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/aggd/aggd/internal/auth"
	"github.com/aggd/aggd/internal/wire"
)

// datagramFor is aggdDatagram with the header's session, link and key id set
// and the tag of key.
func datagramFor(verType byte, session uint32, linkID, keyID uint8, key auth.Key, body []byte) []byte {
	d := aggdDatagram(verType, 0, body)
	d[2] = linkID
	d[3] = keyID
	binary.BigEndian.PutUint32(d[4:], session)
	return reseal(key, d)
}

func testKeyN(n byte) auth.Key {
	var k auth.Key
	for i := range k {
		k[i] = n*16 + byte(i)
	}
	return k
}

func setSession(t *testing.T, s *Shield, index uint32, gens ...SessionKey) {
	t.Helper()
	if err := s.SetSession(index, gens); err != nil {
		t.Fatalf("SetSession(%#x, %v): %v", index, gens, err)
	}
}

func TestShieldAuthData(t *testing.T) {
	s := loadShieldT(t, DefaultTunnelPort)
	const idx = 0x01020304
	k1, k2, k3 := testKeyN(1), testKeyN(2), testKeyN(3)
	data := func(keyID uint8, key auth.Key) []byte {
		return frameSpec{payload: datagramFor(0x11, idx, 0, keyID, key, []byte("inner"))}.build()
	}

	checkFrame(t, s, "no session yet", data(1, k1), xdpDrop, "unknown_session")
	checkFrame(t, s, "handshake init, no session", frameSpec{payload: datagramFor(0x12, 0, 0, 0, k1, make([]byte, 112))}.build(), xdpPass, "pass")
	checkFrame(t, s, "handshake resp, no session", frameSpec{payload: datagramFor(0x13, idx, 0, 0, k1, make([]byte, 52))}.build(), xdpPass, "pass")
	checkFrame(t, s, "handshake resp, bad tag", frameSpec{payload: badTag(datagramFor(0x13, idx, 0, 0, k1, make([]byte, 52)))}.build(), xdpPass, "pass")

	setSession(t, s, idx, SessionKey{ID: 1, Key: k1})
	checkFrame(t, s, "right key", data(1, k1), xdpPass, "pass")
	checkFrame(t, s, "right key, tag bit flipped", frameSpec{payload: badTag(datagramFor(0x11, idx, 0, 1, k1, []byte("inner")))}.build(), xdpDrop, "bad_tag")
	checkFrame(t, s, "wrong key", data(1, k2), xdpDrop, "bad_tag")
	checkFrame(t, s, "unknown key id", data(2, k2), xdpDrop, "stale_key")
	checkFrame(t, s, "other session", frameSpec{payload: datagramFor(0x11, idx+1, 0, 1, k1, []byte("inner"))}.build(), xdpDrop, "unknown_session")
	checkFrame(t, s, "byte-swapped session", frameSpec{payload: datagramFor(0x11, 0x04030201, 0, 1, k1, []byte("inner"))}.build(), xdpDrop, "unknown_session")
	checkFrame(t, s, "session 0", frameSpec{payload: datagramFor(0x11, 0, 0, 1, k1, []byte("inner"))}.build(), xdpDrop, "unknown_session")
	// The tag covers header bytes 0..19: a changed sequence number breaks it,
	// a changed body does not (DATA bodies are not tagged).
	d := datagramFor(0x11, idx, 0, 1, k1, []byte("inner"))
	d[11] ^= 1
	checkFrame(t, s, "sequence changed after sealing", frameSpec{payload: d}.build(), xdpDrop, "bad_tag")
	d = datagramFor(0x11, idx, 0, 1, k1, []byte("inner"))
	d[len(d)-1] ^= 1
	checkFrame(t, s, "data body changed after sealing", frameSpec{payload: d}.build(), xdpPass, "pass")

	// Rekey: current generation 2, previous 1. Both verify, each only under
	// its own key.
	setSession(t, s, idx, SessionKey{ID: 2, Key: k2}, SessionKey{ID: 1, Key: k1})
	checkFrame(t, s, "current generation", data(2, k2), xdpPass, "pass")
	checkFrame(t, s, "previous generation", data(1, k1), xdpPass, "pass")
	checkFrame(t, s, "previous id, current key", data(1, k2), xdpDrop, "bad_tag")
	checkFrame(t, s, "current id, previous key", data(2, k1), xdpDrop, "bad_tag")
	checkFrame(t, s, "next id", data(3, k3), xdpDrop, "stale_key")

	// Next rekey, generations in the other slot order: 1 is now stale.
	setSession(t, s, idx, SessionKey{ID: 2, Key: k2}, SessionKey{ID: 3, Key: k3})
	checkFrame(t, s, "after second rekey, id 3", data(3, k3), xdpPass, "pass")
	checkFrame(t, s, "after second rekey, id 2", data(2, k2), xdpPass, "pass")
	checkFrame(t, s, "after second rekey, id 1", data(1, k1), xdpDrop, "stale_key")

	// Key ids wrap: 255 then 0.
	setSession(t, s, idx, SessionKey{ID: 0, Key: k1}, SessionKey{ID: 255, Key: k2})
	checkFrame(t, s, "key id 0", data(0, k1), xdpPass, "pass")
	checkFrame(t, s, "key id 255", data(255, k2), xdpPass, "pass")
	checkFrame(t, s, "key id 1", data(1, k1), xdpDrop, "stale_key")

	// A first fragment of DATA holds the whole header: verified.
	frag := frameSpec{fragOff: 0x2000, udpLenDelta: 1000, payload: datagramFor(0x11, idx, 0, 0, k1, []byte("inner"))}
	checkFrame(t, s, "data first fragment", frag.build(), xdpPass, "pass")
	frag.payload = badTag(frag.payload)
	checkFrame(t, s, "data first fragment, bad tag", frag.build(), xdpDrop, "bad_tag")

	if err := s.DeleteSession(idx); err != nil {
		t.Fatal(err)
	}
	checkFrame(t, s, "deleted session", data(0, k1), xdpDrop, "unknown_session")
	if err := s.DeleteSession(idx); err != nil {
		t.Errorf("deleting an absent session: %v", err)
	}

	// The header checks still come first: a bad version with a known
	// session is bad_version, a bad type is bad_type.
	setSession(t, s, idx, SessionKey{ID: 1, Key: k1})
	checkFrame(t, s, "bad version before session", frameSpec{payload: datagramFor(0x21, idx, 0, 1, k1, nil)}.build(), xdpDrop, "bad_version")
	checkFrame(t, s, "bad flags before tag", frameSpec{payload: badTag(aggdDatagram(0x11, 0x02, nil))}.build(), xdpDrop, "bad_flags")
}

// Control tags cover the body: every body length from 0 to 64 bytes (all
// the tail sizes of SipHash's last block, and the short bodies that end in
// the third message word) and a spread up to the largest the shield
// verifies, random bytes, each as sealed by package auth and with one bit
// flipped (in the body, in the tagged header bytes, in the tag).
func TestShieldAuthControl(t *testing.T) {
	s := loadShieldT(t, DefaultTunnelPort)
	addTestSession(t, s)
	rng := rand.New(rand.NewPCG(3, 4))
	lengths := []int{}
	for n := 0; n <= 64; n++ {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 100, 255, 256, 257, 511, 1000, 1417, 1436, 1437, 1438, 1439, 1440, 1441, 1442, 1443, 1444)
	types := []byte{0x14, 0x15, 0x16, 0x17, 0x18}
	for i, n := range lengths {
		body := make([]byte, n)
		for j := range body {
			body[j] = byte(rng.Uint32())
		}
		typ := types[i%len(types)]
		good := aggdDatagram(typ, 0, body)
		if !auth.Verify(testKey, good) {
			t.Fatalf("test datagram does not verify in Go")
		}
		checkFrame(t, s, fmt.Sprintf("control %#x, %d-byte body", typ, n), frameSpec{payload: good}.build(), xdpPass, "pass")
		// Ethernet padding behind the datagram is not part of the message.
		checkFrame(t, s, fmt.Sprintf("control %#x, %d-byte body, padded", typ, n), frameSpec{payload: good, pad: 7}.build(), xdpPass, "pass")

		flip := func(what string, at int) {
			t.Helper()
			bad := bytes.Clone(good)
			bad[at] ^= 1 << (rng.Uint32() % 8)
			checkFrame(t, s, fmt.Sprintf("control %#x, %d-byte body, %s byte %d flipped", typ, n, what, at), frameSpec{payload: bad}.build(), xdpDrop, "bad_tag")
		}
		if n > 0 {
			flip("body", wire.HeaderLen+rng.IntN(n))
			flip("last body", len(good)-1)
			flip("first body", wire.HeaderLen)
		}
		flip("header", 8+rng.IntN(12))
		flip("tag", 20+rng.IntN(8))
	}

	// Longer bodies, and bodies cut by fragmentation, are not verified
	// here: passed to the daemon, even with a bad tag.
	for _, n := range []int{1445, 1500, 2000} {
		bad := badTag(aggdDatagram(0x16, 0, make([]byte, n)))
		checkFrame(t, s, fmt.Sprintf("control, %d-byte body, bad tag", n), frameSpec{payload: bad}.build(), xdpPass, "pass")
	}
	frag := frameSpec{fragOff: 0x2000, udpLenDelta: 1000, payload: badTag(aggdDatagram(0x14, 0, make([]byte, 8)))}
	checkFrame(t, s, "control first fragment, bad tag", frag.build(), xdpPass, "pass")

	// Session and key checks apply to control messages too.
	d := aggdDatagram(0x14, 0, make([]byte, 8))
	d[3] = testKeyID + 1
	checkFrame(t, s, "control, unknown key id", frameSpec{payload: reseal(testKey, d)}.build(), xdpDrop, "stale_key")
	binary.BigEndian.PutUint32(d[4:], testSession+1)
	checkFrame(t, s, "control, unknown session", frameSpec{payload: reseal(testKey, d)}.build(), xdpDrop, "unknown_session")
}

func linkStats(t *testing.T, s *Shield) map[uint8]map[string]uint64 {
	t.Helper()
	st, err := s.LinkStats()
	if err != nil {
		t.Fatalf("LinkStats: %v", err)
	}
	return st
}

// Per-link counters: each verdict lands under its header's Link ID and
// reason; datagrams without a sound version-1 header only in the totals.
func TestShieldLinkStats(t *testing.T) {
	s := loadShieldT(t, DefaultTunnelPort)
	addTestSession(t, s)
	if st := linkStats(t, s); len(st) != 0 {
		t.Fatalf("fresh LinkStats: %v", st)
	}
	other := testKeyN(9)
	frames := [][]byte{
		datagramFor(0x11, testSession, 0, testKeyID, testKey, []byte("a")),     // link 0 pass
		datagramFor(0x11, testSession, 7, testKeyID, testKey, []byte("a")),     // link 7 pass
		datagramFor(0x11, testSession, 7, testKeyID, testKey, []byte("b")),     // link 7 pass
		datagramFor(0x11, testSession, 7, testKeyID, other, []byte("a")),       // link 7 bad_tag
		datagramFor(0x11, testSession+1, 7, testKeyID, testKey, []byte("a")),   // link 7 unknown_session
		datagramFor(0x14, testSession, 254, testKeyID+1, testKey, []byte("a")), // link 254 stale_key
		datagramFor(0x12, 0, 255, 0, other, make([]byte, 112)),                 // link 255 pass
		datagramFor(0x1c, testSession, 9, testKeyID, testKey, nil),             // link 9 bad_type
		datagramFor(0x21, testSession, 9, testKeyID, testKey, nil),             // totals only: bad_version
		datagramFor(0x11, testSession, 9, testKeyID, testKey, nil)[:27],        // totals only: truncated
	}
	want := map[uint8]map[string]uint64{
		0:   {"pass": 1},
		7:   {"pass": 2, "bad_tag": 1, "unknown_session": 1},
		9:   {"bad_type": 1},
		254: {"stale_key": 1},
		255: {"pass": 1},
	}
	before := stats(t, s)
	for _, f := range frames {
		runXDP(t, s.Program(), frameSpec{payload: f}.build())
	}
	totals := statsDelta(before, stats(t, s))
	wantTotals := map[string]uint64{"pass": 4, "bad_tag": 1, "unknown_session": 1, "stale_key": 1, "bad_type": 1, "bad_version": 1, "truncated": 1}
	if !sameCounts(totals, wantTotals) {
		t.Errorf("totals moved %v, want %v", totals, wantTotals)
	}
	got := linkStats(t, s)
	if len(got) != len(want) {
		t.Errorf("LinkStats has links %v, want %v", got, want)
	}
	for id, w := range want {
		row, ok := got[id]
		if !ok {
			t.Errorf("link %d missing from LinkStats", id)
			continue
		}
		if len(row) != len(Reasons) {
			t.Errorf("link %d has %d counters, want %d", id, len(row), len(Reasons))
		}
		nonzero := map[string]uint64{}
		for k, v := range row {
			if v != 0 {
				nonzero[k] = v
			}
		}
		if !sameCounts(nonzero, w) {
			t.Errorf("link %d: %v, want %v", id, nonzero, w)
		}
	}
}

func TestSetSessionErrors(t *testing.T) {
	s := loadShieldT(t, DefaultTunnelPort)
	k := SessionKey{ID: 1, Key: testKey}
	for _, c := range []struct {
		name  string
		index uint32
		gens  []SessionKey
	}{
		{"index 0", 0, []SessionKey{k}},
		{"no generations", 5, nil},
		{"three generations", 5, []SessionKey{k, {ID: 2}, {ID: 3}}},
		{"same id twice", 5, []SessionKey{k, {ID: 1, Key: testKeyN(2)}}},
	} {
		if err := s.SetSession(c.index, c.gens); err == nil {
			t.Errorf("SetSession %s: no error", c.name)
		}
	}
	// None of them may have left an entry.
	var key [4]byte
	if err := s.SessionsMap().NextKey(nil, &key); err == nil {
		t.Errorf("sessions map has entry %x after failed SetSession calls", key)
	}

	// The stored layout is what the C side reads: index big-endian as the
	// key; per generation id, valid, 2 zero bytes, key.
	setSession(t, s, 0x0a0b0c0d, SessionKey{ID: 7, Key: testKeyN(1)}, SessionKey{ID: 6, Key: testKeyN(2)})
	raw := make([]byte, s.SessionsMap().ValueSize())
	if err := s.SessionsMap().Lookup([]byte{0x0a, 0x0b, 0x0c, 0x0d}, &raw); err != nil {
		t.Fatalf("lookup by big-endian key: %v", err)
	}
	k1, k2 := testKeyN(1), testKeyN(2)
	want := append(append(append([]byte{7, 1, 0, 0}, k1[:]...), 6, 1, 0, 0), k2[:]...)
	if !bytes.Equal(raw, want) {
		t.Errorf("session value\n% x\nwant\n% x", raw, want)
	}
	// One generation leaves the second slot invalid.
	setSession(t, s, 0x0a0b0c0d, SessionKey{ID: 7, Key: k1})
	if err := s.SessionsMap().Lookup([]byte{0x0a, 0x0b, 0x0c, 0x0d}, &raw); err != nil {
		t.Fatal(err)
	}
	if raw[21] != 0 {
		t.Errorf("second generation still valid after installing one: % x", raw)
	}
}

// The shield's maps in both objects have the sizes the Go side marshals.
func TestShieldMapLayout(t *testing.T) {
	for _, obj := range []string{"shield_bpfel.o", "shield_bpfeb.o"} {
		spec, err := ebpf.LoadCollectionSpec(obj)
		if err != nil {
			t.Fatal(err)
		}
		checkMapLayout(t, obj, spec, map[string][3]uint32{
			"sessions":          {4, 40, 65536},
			"shield_link_stats": {4, uint32(8 * wire.NumReasons), 256},
			"shield_stats":      {4, 8, uint32(wire.NumReasons)},
		})
	}
}

// checkMapLayout checks that each named map of an object has the key size, value size
// and entry count the Go side marshals: {key, value, entries}.
func checkMapLayout(t *testing.T, obj string, spec *ebpf.CollectionSpec, want map[string][3]uint32) {
	t.Helper()
	for name, w := range want {
		m := spec.Maps[name]
		if m == nil {
			t.Errorf("%s: no map %s", obj, name)
			continue
		}
		if got := [3]uint32{m.KeySize, m.ValueSize, m.MaxEntries}; got != w {
			t.Errorf("%s: map %s key/value size, entries %v, want %v", obj, name, got, w)
		}
	}
}
