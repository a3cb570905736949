package handshake

import (
	"encoding/hex"
	"io"

	"github.com/flynn/noise"
	"golang.org/x/crypto/blake2s"
)

// prologue binds the handshake to this protocol and version: a peer speaking
// anything else fails authentication.
const prologue = "aggd v1"

// suite is Noise_IK_25519_ChaChaPoly_BLAKE2s (docs/wire-format.md).
var suite = noise.NewCipherSuite(noise.DH25519, noise.CipherChaChaPoly, noise.HashBLAKE2s)

// Sizes of the two Noise messages. IK message 1 is the initiator's ephemeral
// key, its encrypted static key and the encrypted timestamp; message 2 is the
// responder's ephemeral key and an empty encrypted payload.
const (
	aeadTagLen     = 16
	InitMessageLen = KeyLen + (KeyLen + aeadTagLen) + (timestampLen + aeadTagLen) // 108
	RespMessageLen = KeyLen + aeadTagLen                                          // 48
)

// staticKeypair is local in the form flynn/noise wants, computed once per
// Initiator or Responder rather than per handshake.
func staticKeypair(local PrivateKey) noise.DHKey {
	pub := local.Public()
	return noise.DHKey{Private: append([]byte(nil), local[:]...), Public: pub[:]}
}

// newNoise starts one side of an IK handshake. remote is nil on the
// responder, which learns the initiator's key from message 1. random is the
// source of the ephemeral key (nil: crypto/rand).
func newNoise(initiator bool, static noise.DHKey, remote []byte, random io.Reader) (*noise.HandshakeState, error) {
	return noise.NewHandshakeState(noise.Config{
		CipherSuite:   suite,
		Random:        random,
		Pattern:       noise.HandshakeIK,
		Initiator:     initiator,
		Prologue:      []byte(prologue),
		StaticKeypair: static,
		PeerStatic:    remote,
	})
}

// Keys are what a finished handshake gives one side.
type Keys struct {
	// Send keys the SipHash tag of packets this side sends; Recv checks the
	// tag of packets it receives. The initiator's Send is the responder's
	// Recv and vice versa.
	Send, Recv [16]byte
	// Hash is the Noise handshake hash: the same on both sides and different
	// for every handshake. It is computed from public transcript data, so it
	// names a session (logs, debugging) but is no secret.
	Hash [32]byte
}

// String shows the handshake hash only: Keys must not leak into logs.
func (k Keys) String() string {
	return "handshake.Keys{hash " + hex.EncodeToString(k.Hash[:8]) + "…, keys redacted}"
}

// GoString keeps %#v from printing the secret keys.
func (k Keys) GoString() string { return k.String() }

// tagLabel separates the SipHash keys from the ChaCha20-Poly1305 keys Noise
// derives from the same split output (an encrypted mode may use those).
const tagLabel = "aggd-tag-v1"

// Direction labels; each split key already serves one direction, the label
// makes the derivation say so.
const (
	labelInitiatorToResponder = "initiator->responder"
	labelResponderToInitiator = "responder->initiator"
)

// deriveKeys turns the Noise split into tag keys. i2r and r2i are the two
// cipher states Split returns, in order (the same order on both sides):
// the first encrypts initiator-to-responder traffic.
func deriveKeys(initiator bool, i2r, r2i *noise.CipherState, hash []byte) Keys {
	toResponder := tagKey(i2r.UnsafeKey(), labelInitiatorToResponder)
	toInitiator := tagKey(r2i.UnsafeKey(), labelResponderToInitiator)
	k := Keys{Send: toResponder, Recv: toInitiator}
	if !initiator {
		k.Send, k.Recv = toInitiator, toResponder
	}
	copy(k.Hash[:], hash)
	return k
}

// tagKey is the first 16 bytes of BLAKE2s-256 keyed with the split key over
// the label and direction: a PRF, so the result is as secret as the split key.
func tagKey(splitKey [32]byte, direction string) [16]byte {
	mac, err := blake2s.New256(splitKey[:])
	if err != nil {
		// Only a key longer than 32 bytes is refused.
		panic("handshake: BLAKE2s refused a 32-byte key: " + err.Error())
	}
	mac.Write([]byte(tagLabel))
	mac.Write([]byte{0})
	mac.Write([]byte(direction))
	var k [16]byte
	copy(k[:], mac.Sum(nil))
	return k
}
