package auth

import (
	"bytes"
	"encoding/hex"
	"testing"

	"github.com/aggd/aggd/internal/wire"
)

var paperKey = Key{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}

// The test vector from the SipHash paper (Aumasson, Bernstein: "SipHash: a fast
// short-input PRF", appendix A): key 00..0f, message 00..0e, result
// 0xa129ca6149be45e5. Checked through both of sipHash's paths (one piece, and a header
// part followed by a body part), which is what Tag runs.
func TestSipHashPaperVector(t *testing.T) {
	msg := []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}
	const want uint64 = 0xa129ca6149be45e5
	if got := sipHash(paperKey, msg, nil); got != want {
		t.Errorf("one piece: %#x, want %#x", got, want)
	}
	for split := 1; split < len(msg); split++ {
		if got := sipHash(paperKey, msg[:split], msg[split:]); got != want {
			t.Errorf("split at %d: %#x, want %#x", split, got, want)
		}
	}
}

// dataHeader is the header of golden vector data_ipv4; its tag under paperKey was
// computed outside Go (see internal/wire's TestGoldenHandChecked).
func dataHeader(t *testing.T) []byte {
	b, err := hex.DecodeString("1100020111223344000003e8000001f4075bcd15" + "0000000000000000")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestTagIndependentValue(t *testing.T) {
	if got := Tag(paperKey, dataHeader(t), nil); got != 0x67af8f028c3d8474 {
		t.Fatalf("tag %#x, want 0x67af8f028c3d8474", got)
	}
}

func TestSealWritesBigEndianAndVerifies(t *testing.T) {
	pkt := dataHeader(t)
	Seal(paperKey, pkt)
	if want := []byte{0x67, 0xaf, 0x8f, 0x02, 0x8c, 0x3d, 0x84, 0x74}; !bytes.Equal(pkt[20:28], want) {
		t.Fatalf("tag bytes % x, want % x", pkt[20:28], want)
	}
	if !Verify(paperKey, pkt) {
		t.Fatal("sealed packet does not verify")
	}
}

// For DATA the tag covers header bytes 0-19 only; for every other type, the body too.
func TestTagCoverage(t *testing.T) {
	build := func(typ wire.Type) []byte {
		h := wire.Header{Type: typ, Session: 1, Seq: 2}
		pkt := append(h.Append(nil), 1, 2, 3, 4, 5, 6, 7, 8)
		Seal(paperKey, pkt)
		return pkt
	}
	for _, typ := range []wire.Type{wire.TypeData, wire.TypeProbe, wire.TypeHandshakeInit, wire.Type(12)} {
		for i := range len(build(typ)) {
			pkt := build(typ)
			pkt[i] ^= 0x10
			covered := i < wire.TaggedHeaderLen || (i >= wire.HeaderLen && typ != wire.TypeData)
			inTag := i >= wire.TagOffset && i < wire.HeaderLen
			wantOK := !covered && !inTag
			if got := Verify(paperKey, pkt); got != wantOK {
				t.Errorf("%s: byte %d flipped: Verify = %v, want %v", typ, i, got, wantOK)
			}
		}
	}
}

func TestVerifyRejects(t *testing.T) {
	pkt := dataHeader(t)
	Seal(paperKey, pkt)
	other := paperKey
	other[15] ^= 1
	if Verify(other, pkt) {
		t.Error("verifies under a different key")
	}
	if Verify(paperKey, pkt[:wire.HeaderLen-1]) || Verify(paperKey, nil) {
		t.Error("a datagram shorter than the header verifies")
	}
}

// Expected value from Python: hashlib.blake2s(b"aggd-mac1-v1" + bytes(range(0x40, 0x60))).
func TestMacKey(t *testing.T) {
	var pub [32]byte
	for i := range pub {
		pub[i] = 0x40 + byte(i)
	}
	got := MacKey(pub)
	if hex.EncodeToString(got[:]) != "3558933eebee6581b5269f67f58af3b9" {
		t.Fatalf("mac key %x", got)
	}
	pub[31] ^= 1
	if MacKey(pub) == got {
		t.Fatal("mac key does not depend on the whole public key")
	}
}
