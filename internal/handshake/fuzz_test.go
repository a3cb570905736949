package handshake

import (
	"errors"
	"testing"
	"time"
)

// FuzzRespond feeds arbitrary INIT bodies to a responder: it must never panic,
// must classify every rejection with one of the sentinel errors, and may
// only accept an allowed initiator.
func FuzzRespond(f *testing.F) {
	p := newPair(f)
	valid := mustInit(f, p.initiator, t0)
	f.Add(valid)
	f.Add([]byte{})
	f.Add(make([]byte, InitMessageLen))
	f.Add(valid[:InitMessageLen-1])

	f.Fuzz(func(t *testing.T, msg1 []byte) {
		peer, msg2, keys, err := p.responder.Respond(msg1)
		if err != nil {
			if !isSentinel(err) {
				t.Fatalf("error %v wraps none of the sentinel errors", err)
			}
			if msg2 != nil {
				t.Fatal("RESP returned with an error")
			}
			return
		}
		if peer != p.cpe.Public() || len(msg2) != RespMessageLen || keys.Send == keys.Recv {
			t.Fatalf("accepted INIT gave peer %v, %d-byte RESP", peer, len(msg2))
		}
	})
}

// FuzzFinish does the same for RESP bodies on an initiator with a pending
// handshake.
func FuzzFinish(f *testing.F) {
	p := newPair(f)
	f.Add(make([]byte, RespMessageLen))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, msg2 []byte) {
		if _, err := p.initiator.Init(time.Now()); err != nil {
			t.Fatal(err)
		}
		if _, err := p.initiator.Finish(msg2); err == nil || !isSentinel(err) {
			t.Fatalf("Finish(random) = %v; want a sentinel error", err)
		}
	})
}

func isSentinel(err error) bool {
	for _, s := range []error{ErrMalformed, ErrAuthFailed, ErrUnknownPeer, ErrReplayedInit, ErrNoPendingHandshake} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}
