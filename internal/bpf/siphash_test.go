package bpf

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/aggd/aggd/internal/auth"
	"github.com/aggd/aggd/internal/wire"
)

func loadSiphashTest(t *testing.T) *siphashtestObjects {
	t.Helper()
	needRoot(t)
	var objs siphashtestObjects
	if err := loadSiphashtestObjects(&objs, nil); err != nil {
		t.Fatalf("load siphash test programs: %v", loadErr(err))
	}
	t.Cleanup(func() { objs.Close() })
	return &objs
}

func runData(t *testing.T, prog *ebpf.Program, in []byte) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(in))
	ret, err := prog.Run(&ebpf.RunOptions{
		Data:    in,
		DataOut: out,
		Context: xdpMD{DataEnd: uint32(len(in))},
	})
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret, out
}

// bpfSipHash computes SipHash-2-4(key, msg) for a 20-byte msg in the kernel.
func bpfSipHash(t *testing.T, prog *ebpf.Program, key auth.Key, msg []byte) uint64 {
	t.Helper()
	in := append(append(append([]byte{}, key[:]...), msg...), make([]byte, 8)...)
	ret, out := runData(t, prog, in)
	if ret != xdpPass {
		t.Fatalf("siphash program returned %s", verdictNames[ret])
	}
	if !bytes.Equal(out[:36], in[:36]) {
		t.Fatalf("siphash program changed its input: % x", out[:36])
	}
	return binary.BigEndian.Uint64(out[36:])
}

// The BPF SipHash agrees with package auth (the slow path's tag) on random
// keys and headers, and on edge values.
func TestSipHashMatchesAuth(t *testing.T) {
	objs := loadSiphashTest(t)
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(key auth.Key, msg []byte) {
		t.Helper()
		want := auth.Tag(key, msg, nil)
		if got := bpfSipHash(t, objs.AggdTestSiphash, key, msg); got != want {
			t.Errorf("key %x msg %x: BPF %016x, auth %016x", key, msg, got, want)
		}
	}
	var zeroKey, onesKey auth.Key
	for i := range onesKey {
		onesKey[i] = 0xff
	}
	check(zeroKey, make([]byte, 20))
	check(onesKey, bytes.Repeat([]byte{0xff}, 20))
	for range 500 {
		var key auth.Key
		msg := make([]byte, 20)
		for i := range key {
			key[i] = byte(rng.Uint32())
		}
		for i := range msg {
			msg[i] = byte(rng.Uint32())
		}
		check(key, msg)
	}
	// Each key and message byte must matter (catches a byte loaded twice
	// or not at all).
	var key auth.Key
	msg := make([]byte, 20)
	base := bpfSipHash(t, objs.AggdTestSiphash, key, msg)
	for i := range 16 {
		k := key
		k[i] = 1
		if bpfSipHash(t, objs.AggdTestSiphash, k, msg) == base {
			t.Errorf("key byte %d does not affect the hash", i)
		}
	}
	for i := range 20 {
		m := bytes.Clone(msg)
		m[i] = 1
		if bpfSipHash(t, objs.AggdTestSiphash, key, m) == base {
			t.Errorf("message byte %d does not affect the hash", i)
		}
	}
}

// Every DATA golden vector with a whole header: the BPF tag check agrees with
// the vector's tag_ok (DATA tags cover the header only, so BPF can check them).
func TestTagVerifyGoldenVectors(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "testdata", "wire", "vectors.json"))
	if err != nil {
		t.Fatalf("golden vectors: %v", err)
	}
	var vectors []struct {
		Name   string `json:"name"`
		Key    string `json:"key"`
		Packet string `json:"packet"`
		TagOK  bool   `json:"tag_ok"`
	}
	if err := json.Unmarshal(raw, &vectors); err != nil {
		t.Fatal(err)
	}
	objs := loadSiphashTest(t)
	var ok, bad int
	for _, v := range vectors {
		pkt, err1 := hex.DecodeString(v.Packet)
		key, err2 := hex.DecodeString(v.Key)
		if err1 != nil || err2 != nil || len(key) != 16 {
			t.Errorf("%s: bad hex or key length", v.Name)
			continue
		}
		if len(pkt) < wire.HeaderLen || pkt[0] != wire.Version<<4|byte(wire.TypeData) {
			continue
		}
		ret, _ := runData(t, objs.AggdTestTagVerify, append(key, pkt[:wire.HeaderLen]...))
		if got := ret == xdpPass; got != v.TagOK || (ret != xdpPass && ret != xdpDrop) {
			t.Errorf("%s: BPF verdict %s, vector tag_ok=%v", v.Name, verdictNames[ret], v.TagOK)
		}
		if v.TagOK {
			ok++
		} else {
			bad++
		}
	}
	if ok == 0 || bad == 0 {
		t.Errorf("golden vectors gave %d DATA headers with a good tag and %d with a bad one; want both", ok, bad)
	}
}
