package handshake

import (
	"crypto/ecdh"
	"crypto/rand"
	"encoding/base64"
	"fmt"

	"golang.org/x/crypto/blake2s"
	"golang.org/x/crypto/curve25519"
)

// KeyLen is the size of an X25519 key in bytes.
const KeyLen = 32

// keyBase64Len is the length of a key in standard base64 (with padding), the
// form WireGuard users already know.
const keyBase64Len = 44

// PrivateKey is a static X25519 private key: a CPE's or a headend's identity.
type PrivateKey [KeyLen]byte

// PublicKey is a static X25519 public key.
type PublicKey [KeyLen]byte

// GenerateKey returns a new random private key, clamped as RFC 7748
// prescribes so that the stored form is the one actually used.
func GenerateKey() (PrivateKey, error) {
	var k PrivateKey
	if _, err := rand.Read(k[:]); err != nil {
		return PrivateKey{}, fmt.Errorf("generating private key: reading random bytes: %w", err)
	}
	k[0] &= 248
	k[31] = (k[31] & 127) | 64
	return k, nil
}

// Public returns the public key belonging to k.
func (k PrivateKey) Public() PublicKey {
	priv, err := ecdh.X25519().NewPrivateKey(k[:])
	if err != nil {
		// NewPrivateKey only rejects a wrong length, which the array type
		// rules out.
		panic("handshake: X25519 private key of 32 bytes rejected: " + err.Error())
	}
	var p PublicKey
	copy(p[:], priv.PublicKey().Bytes())
	return p
}

// Base64 returns k in standard base64, the form of the key file. It is
// deliberately not String: a private key must never end up in a log by way of
// %v or a structured logger.
func (k PrivateKey) Base64() string { return base64.StdEncoding.EncodeToString(k[:]) }

// String names the key by its public half and never shows the secret.
func (k PrivateKey) String() string { return "(private key for " + k.Public().String() + ")" }

// GoString keeps %#v from printing the secret bytes.
func (k PrivateKey) GoString() string { return "handshake.PrivateKey" + k.String() }

// String returns p in standard base64.
func (p PublicKey) String() string { return base64.StdEncoding.EncodeToString(p[:]) }

// ParsePrivateKey parses a private key in standard base64. The error never
// repeats the input, which is a secret.
func ParsePrivateKey(s string) (PrivateKey, error) {
	b, err := decodeKey("private key", s)
	if err != nil {
		return PrivateKey{}, err
	}
	return PrivateKey(b), nil
}

// ParsePublicKey parses a public key in standard base64 and rejects the
// handful of low-order points, with which no handshake could succeed.
func ParsePublicKey(s string) (PublicKey, error) {
	b, err := decodeKey("public key", s)
	if err != nil {
		return PublicKey{}, err
	}
	p := PublicKey(b)
	if !p.valid() {
		return PublicKey{}, fmt.Errorf("public key %s is not a usable X25519 key (a low-order point); copy the key again from the peer", s)
	}
	return p, nil
}

// lowOrderProbe is any private scalar: after clamping every scalar is a
// multiple of the cofactor, so X25519 yields all zeros for exactly the
// low-order points whatever scalar is used.
var lowOrderProbe = [KeyLen]byte{9}

// valid reports whether p is a point a Diffie-Hellman with p can succeed on.
func (p PublicKey) valid() bool {
	_, err := curve25519.X25519(lowOrderProbe[:], p[:])
	return err == nil
}

// decodeKey decodes one base64 key of KeyLen bytes; what names the key in
// errors.
func decodeKey(what, s string) ([KeyLen]byte, error) {
	var k [KeyLen]byte
	if len(s) != keyBase64Len {
		return k, fmt.Errorf("%s must be %d characters of base64 (%d bytes); got %d characters", what, keyBase64Len, KeyLen, len(s))
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return k, fmt.Errorf("%s is not valid standard base64 (%v); expected %d characters of A-Z a-z 0-9 + / ending in '='", what, err, keyBase64Len)
	}
	if len(b) != KeyLen {
		return k, fmt.Errorf("%s decodes to %d bytes, want %d", what, len(b), KeyLen)
	}
	copy(k[:], b)
	return k, nil
}

// macLabel domain-separates the handshake mac key (docs/wire-format.md).
const macLabel = "aggd-mac1-v1"

// MacKey returns the key of the auth tag on handshake packets sent to the
// holder of p: the first 16 bytes of BLAKE2s-256("aggd-mac1-v1" || p). Anyone
// who knows p can compute it; it keeps strangers from costing the receiver
// any Curve25519 work.
func (p PublicKey) MacKey() [16]byte {
	sum := blake2s.Sum256(append([]byte(macLabel), p[:]...))
	var k [16]byte
	copy(k[:], sum[:16])
	return k
}
