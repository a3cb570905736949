// Package handshake sets up aggd sessions: static X25519 keys, their files,
// and the Noise IK handshake between a CPE (initiator) and a headend
// (responder) that yields the per-session SipHash tag keys.
//
// # Framing
//
// This package produces and consumes only the Noise messages. The body of a
// HANDSHAKE_INIT or HANDSHAKE_RESP packet (docs/wire-format.md) is
//
//	sender index (u32, big-endian) || Noise message
//
// and the caller (internal/wire and the session code) puts the index and the
// 28-byte header with its mac tag around what Initiator.Init and
// Responder.Respond return, and strips them before calling Responder.Respond
// and Initiator.Finish. Keeping the index out of this package keeps index
// allocation and session tables in one place.
//
// Message sizes are fixed: InitMessageLen and RespMessageLen. Anything else
// is rejected with ErrMalformed before any Curve25519 work.
//
// # Keys that come out
//
// Both sides derive Keys: a Send and a Recv SipHash key (the initiator's Send
// is the responder's Recv and vice versa) and the Noise handshake hash. The tag
// keys come from the Noise split keys through keyed BLAKE2s with the label
// "aggd-tag-v1", so they are secret to the two peers and separate from any
// ChaCha20-Poly1305 use of the split keys.
package handshake
