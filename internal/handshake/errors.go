package handshake

import "errors"

// Sentinel errors. Every rejected handshake message yields an error wrapping
// exactly one of them (test with errors.Is), so callers can count rejects by
// reason; the wrapping text says what happened and what to do. Only local
// failures (no randomness, internal bugs) return other errors.
var (
	// ErrMalformed: a message of the wrong size or with an invalid payload.
	// Counted as bad_length; usually a bug or a non-aggd sender.
	ErrMalformed = errors.New("malformed handshake message")

	// ErrAuthFailed: the Noise message did not decrypt. The packet was
	// corrupted or forged, or the CPE holds the wrong headend public key.
	ErrAuthFailed = errors.New("handshake message failed authentication")

	// ErrUnknownPeer: the initiator proved its key, but the headend does not
	// list it.
	ErrUnknownPeer = errors.New("initiator key is not allowed")

	// ErrReplayedInit: the INIT's timestamp is not newer than the last one
	// accepted from the same initiator: a replay, or the CPE's clock went
	// backwards.
	ErrReplayedInit = errors.New("replayed handshake init")

	// ErrNoPendingHandshake: Finish was called without a preceding Init, or
	// after the handshake already finished (a duplicated RESP, for example).
	ErrNoPendingHandshake = errors.New("no handshake in progress")
)
