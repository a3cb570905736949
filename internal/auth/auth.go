// Package auth computes and checks the aggd header tag and guards against replays.
//
// The tag is SipHash-2-4 with a 128-bit key (docs/wire-format.md, "Auth tag"). It
// covers header bytes 0–19 for DATA (so the fast path hashes a fixed 20 bytes) and
// header bytes 0–19 followed by the whole body for every other type. The 64-bit
// result is stored big-endian in header bytes 20–27, like every other integer in the
// header. (The SipHash reference code emits its result little-endian; aggd stores the
// number, not those bytes, so the bytes on the wire are the reverse of the reference
// code's output.)
package auth

import (
	"crypto/subtle"
	"encoding/binary"

	"github.com/dchest/siphash"
	"golang.org/x/crypto/blake2s"

	"github.com/aggd/aggd/internal/wire"
)

// Key is a 128-bit SipHash key, in the byte order of the SipHash reference: the two
// 64-bit key words k0 and k1 are the little-endian readings of Key[0:8] and
// Key[8:16]. The C side must load it the same way (as the reference does).
type Key [16]byte

// words splits the key into SipHash's k0 and k1.
func (k *Key) words() (k0, k1 uint64) {
	return binary.LittleEndian.Uint64(k[0:8]), binary.LittleEndian.Uint64(k[8:16])
}

// Tag computes SipHash-2-4 over header[0:20] || body. header must be at least 20
// bytes (a programmer error otherwise). For DATA, pass a nil body.
func Tag(k Key, header []byte, body []byte) uint64 {
	return sipHash(k, header[:wire.TaggedHeaderLen], body)
}

// sipHash is SipHash-2-4 keyed with k over the concatenation first || rest.
func sipHash(k Key, first, rest []byte) uint64 {
	if len(rest) == 0 {
		k0, k1 := k.words()
		return siphash.Hash(k0, k1, first) // no allocation: the per-packet DATA case
	}
	h := siphash.New(k[:])
	h.Write(first)
	h.Write(rest)
	return h.Sum64()
}

// tagOf computes the tag pkt should carry, by the rule for its type: DATA covers the
// header only, every other type (including undefined ones, so that a tag can be
// computed for any bytes) covers the body too.
func tagOf(k Key, pkt []byte) uint64 {
	var body []byte
	if wire.Type(pkt[0]&0x0f) != wire.TypeData {
		body = pkt[wire.HeaderLen:]
	}
	return Tag(k, pkt, body)
}

// Seal computes pkt's tag and writes it into header bytes 20–27. pkt is a whole
// datagram with every other header field and the body already in place. A pkt shorter
// than the header is a programmer error and panics.
func Seal(k Key, pkt []byte) {
	_ = pkt[wire.HeaderLen-1]
	binary.BigEndian.PutUint64(pkt[wire.TagOffset:], tagOf(k, pkt))
}

// Verify reports whether pkt carries the right tag for key k, comparing in constant
// time. A pkt shorter than the header does not verify.
func Verify(k Key, pkt []byte) bool {
	if len(pkt) < wire.HeaderLen {
		return false
	}
	var want [8]byte
	binary.BigEndian.PutUint64(want[:], tagOf(k, pkt))
	return subtle.ConstantTimeCompare(want[:], pkt[wire.TagOffset:wire.HeaderLen]) == 1
}

// macKeyLabel separates the mac key derivation from any other use of BLAKE2s on a
// public key.
const macKeyLabel = "aggd-mac1-v1"

// MacKey derives the tag key for handshake messages sent to the holder of
// staticPublic: the first 16 bytes of BLAKE2s-256("aggd-mac1-v1" || staticPublic).
// Only someone who knows the receiver's public key can make a handshake it will spend
// Curve25519 work on.
func MacKey(staticPublic [32]byte) Key {
	in := make([]byte, 0, len(macKeyLabel)+len(staticPublic))
	in = append(in, macKeyLabel...)
	in = append(in, staticPublic[:]...)
	sum := blake2s.Sum256(in)
	var k Key
	copy(k[:], sum[:])
	return k
}
