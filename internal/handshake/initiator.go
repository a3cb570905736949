package handshake

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/flynn/noise"
)

// Initiator runs the CPE's side of the handshake with one headend. It is
// long-lived: every Init starts a new handshake (the first one and each
// rekey), replacing any unfinished one. Safe for concurrent use, so a timer
// may call Init while the receive loop calls Finish.
type Initiator struct {
	static noise.DHKey
	remote PublicKey

	mu sync.Mutex
	// last is the newest timestamp sent. INITs never repeat or go back in
	// time while this process runs, even if the clock stalls or steps back,
	// because the headend would reject them.
	last    timestamp
	pending *pendingInit
}

// pendingInit is what it takes to rebuild the initiator's handshake state
// after message 1.
type pendingInit struct {
	ephemeral [KeyLen]byte
	payload   []byte
	msg1      []byte
}

// NewInitiator returns an initiator that proves local to the headend whose
// static public key is remote.
func NewInitiator(local PrivateKey, remote PublicKey) *Initiator {
	return &Initiator{static: staticKeypair(local), remote: remote}
}

// Init starts a handshake and returns Noise message 1 (InitMessageLen bytes),
// the part of the HANDSHAKE_INIT body after the sender index. now is the
// wall-clock time; the headend uses it to reject replays.
func (i *Initiator) Init(now time.Time) ([]byte, error) {
	if !i.remote.valid() {
		return nil, fmt.Errorf("handshake: headend public key %s is not a usable X25519 key; check the CPE configuration", i.remote)
	}
	ts, err := timestampOf(now)
	if err != nil {
		return nil, err
	}

	i.mu.Lock()
	defer i.mu.Unlock()
	if !ts.after(i.last) {
		ts = i.last.next()
	}
	p := &pendingInit{payload: ts.encode()}
	if _, err := rand.Read(p.ephemeral[:]); err != nil {
		return nil, fmt.Errorf("handshake: reading random bytes for the ephemeral key: %w", err)
	}
	_, msg1, err := i.start(p)
	if err != nil {
		return nil, err
	}
	p.msg1 = msg1
	i.last = ts
	i.pending = p
	return append([]byte(nil), msg1...), nil
}

// Finish completes the pending handshake with Noise message 2 (the
// HANDSHAKE_RESP body after the sender index) and returns the session keys.
// A message that fails leaves the pending handshake as it was, so a forged
// or corrupted RESP cannot keep the genuine one from completing it.
func (i *Initiator) Finish(msg2 []byte) (Keys, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.pending == nil {
		return Keys{}, fmt.Errorf("handshake: got a RESP with no INIT outstanding (late or duplicated; drop it): %w", ErrNoPendingHandshake)
	}
	if len(msg2) != RespMessageLen {
		return Keys{}, fmt.Errorf("%w: RESP is %d bytes, want %d", ErrMalformed, len(msg2), RespMessageLen)
	}
	hs, _, err := i.start(i.pending)
	if err != nil {
		return Keys{}, err
	}
	_, i2r, r2i, err := hs.ReadMessage(nil, msg2)
	if err != nil {
		return Keys{}, fmt.Errorf("%w: RESP from headend %s did not decrypt (corrupted or forged): %v", ErrAuthFailed, i.remote, err)
	}
	i.pending = nil
	return deriveKeys(true, i2r, r2i, hs.ChannelBinding()), nil
}

// start builds the initiator's handshake state up to and including message
// 1 from p.
//
// Why rebuild instead of keeping the state from Init: flynn/noise's
// ReadMessage does not restore the state on every failure (a low-order
// ephemeral key fails after the state was changed), so reading a bad RESP
// into the kept state could spoil it. Rebuilding is deterministic: the
// ephemeral key is the only randomness (fed from p.ephemeral) and the
// encryption has fixed nonces. The comparison with the message sent in Init
// guards that assumption.
func (i *Initiator) start(p *pendingInit) (*noise.HandshakeState, []byte, error) {
	hs, err := newNoise(true, i.static, i.remote[:], bytes.NewReader(p.ephemeral[:]))
	if err != nil {
		return nil, nil, fmt.Errorf("handshake: setting up Noise: %w", err)
	}
	msg1, _, _, err := hs.WriteMessage(nil, p.payload)
	if err != nil {
		return nil, nil, fmt.Errorf("handshake: writing INIT: %w", err)
	}
	if p.msg1 != nil && !bytes.Equal(msg1, p.msg1) {
		return nil, nil, errors.New("handshake: internal error: rebuilding the INIT gave different bytes (has the flynn/noise version changed?); please report this bug")
	}
	return hs, msg1, nil
}
