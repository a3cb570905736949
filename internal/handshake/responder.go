package handshake

import (
	"fmt"
	"sync"

	"github.com/flynn/noise"
)

// Responder runs the headend's side of the handshake for all CPEs. It holds
// the allow list and, per CPE key, the newest INIT timestamp it accepted.
// Safe for concurrent use; the Curve25519 work runs outside the lock.
type Responder struct {
	static noise.DHKey
	public PublicKey

	mu      sync.Mutex
	allowed map[PublicKey]struct{}
	// lastInit survives SetAllowed: a CPE removed and added again must not
	// become open to replays of its old INITs. It grows with the number of
	// distinct keys ever allowed (44 bytes each).
	lastInit map[PublicKey]timestamp
}

// NewResponder returns a responder with identity local that admits the
// initiators in allowed.
func NewResponder(local PrivateKey, allowed []PublicKey) *Responder {
	r := &Responder{
		static:   staticKeypair(local),
		public:   local.Public(),
		lastInit: make(map[PublicKey]timestamp),
	}
	r.SetAllowed(allowed)
	return r
}

// SetAllowed replaces the allow list, for example on a configuration
// reload. Sessions already established are the caller's to close.
func (r *Responder) SetAllowed(allowed []PublicKey) {
	set := make(map[PublicKey]struct{}, len(allowed))
	for _, k := range allowed {
		set[k] = struct{}{}
	}
	r.mu.Lock()
	r.allowed = set
	r.mu.Unlock()
}

// Respond checks Noise message 1 (the HANDSHAKE_INIT body after the sender
// index) and answers with message 2 (the HANDSHAKE_RESP body after the
// sender index) and the session keys.
//
// Errors wrap ErrMalformed, ErrAuthFailed, ErrUnknownPeer or
// ErrReplayedInit. peer is set whenever the initiator proved its key, also
// with ErrUnknownPeer and ErrReplayedInit, so callers can log who it was.
func (r *Responder) Respond(msg1 []byte) (peer PublicKey, msg2 []byte, keys Keys, err error) {
	if len(msg1) != InitMessageLen {
		return peer, nil, Keys{}, fmt.Errorf("%w: INIT is %d bytes, want %d", ErrMalformed, len(msg1), InitMessageLen)
	}
	hs, err := newNoise(false, r.static, nil, nil)
	if err != nil {
		return peer, nil, Keys{}, fmt.Errorf("handshake: setting up Noise: %w", err)
	}
	payload, _, _, err := hs.ReadMessage(nil, msg1)
	if err != nil {
		return peer, nil, Keys{}, fmt.Errorf("%w: INIT did not decrypt: corrupted or forged, or the CPE is configured with another headend public key (this headend's is %s): %v", ErrAuthFailed, r.public, err)
	}
	copy(peer[:], hs.PeerStatic())

	ts, err := decodeTimestamp(payload)
	if err != nil {
		return peer, nil, Keys{}, fmt.Errorf("INIT from %s: %w", peer, err)
	}
	if err := r.admit(peer, ts); err != nil {
		return peer, nil, Keys{}, err
	}

	msg2, i2r, r2i, err := hs.WriteMessage(nil, nil)
	if err != nil {
		return peer, nil, Keys{}, fmt.Errorf("handshake: writing RESP to %s: %w", peer, err)
	}
	return peer, msg2, deriveKeys(false, i2r, r2i, hs.ChannelBinding()), nil
}

// admit accepts an authenticated INIT from peer with timestamp ts if peer
// is allowed and ts is newer than any INIT accepted from it before. Check
// and update happen under one lock, so of two copies of the same INIT
// handled at once exactly one wins.
func (r *Responder) admit(peer PublicKey, ts timestamp) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.allowed[peer]; !ok {
		return fmt.Errorf("%w: CPE key %s is not in the headend's allowed list; add it to the configuration to admit this CPE", ErrUnknownPeer, peer)
	}
	if last, ok := r.lastInit[peer]; ok && !ts.after(last) {
		return fmt.Errorf("%w: INIT from %s has timestamp %s, not after %s accepted before: a replay, or the CPE's clock went backwards (check its NTP)", ErrReplayedInit, peer, ts, last)
	}
	r.lastInit[peer] = ts
	return nil
}
