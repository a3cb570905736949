package handshake

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// pair is a CPE and a headend that know each other.
type pair struct {
	cpe, headend PrivateKey
	initiator    *Initiator
	responder    *Responder
}

func newPair(t testing.TB) *pair {
	t.Helper()
	p := &pair{cpe: mustGenerate(t), headend: mustGenerate(t)}
	p.initiator = NewInitiator(p.cpe, p.headend.Public())
	p.responder = NewResponder(p.headend, []PublicKey{p.cpe.Public()})
	return p
}

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func mustInit(t testing.TB, i *Initiator, now time.Time) []byte {
	t.Helper()
	msg1, err := i.Init(now)
	if err != nil {
		t.Fatal(err)
	}
	return msg1
}

func mustRespond(t testing.TB, r *Responder, msg1 []byte) ([]byte, Keys) {
	t.Helper()
	_, msg2, keys, err := r.Respond(msg1)
	if err != nil {
		t.Fatal(err)
	}
	return msg2, keys
}

// handshake runs a whole exchange and returns both sides' keys.
func (p *pair) handshake(t testing.TB, now time.Time) (cpe, headend Keys) {
	t.Helper()
	msg2, headend := mustRespond(t, p.responder, mustInit(t, p.initiator, now))
	cpe, err := p.initiator.Finish(msg2)
	if err != nil {
		t.Fatal(err)
	}
	return cpe, headend
}

func TestHandshakeAgreesOnKeys(t *testing.T) {
	p := newPair(t)
	msg1 := mustInit(t, p.initiator, t0)
	if len(msg1) != InitMessageLen {
		t.Fatalf("INIT is %d bytes, InitMessageLen is %d", len(msg1), InitMessageLen)
	}
	peer, msg2, headend, err := p.responder.Respond(msg1)
	if err != nil {
		t.Fatal(err)
	}
	if peer != p.cpe.Public() {
		t.Fatalf("responder saw peer %v, want the CPE's key %v", peer, p.cpe.Public())
	}
	if len(msg2) != RespMessageLen {
		t.Fatalf("RESP is %d bytes, RespMessageLen is %d", len(msg2), RespMessageLen)
	}
	cpe, err := p.initiator.Finish(msg2)
	if err != nil {
		t.Fatal(err)
	}

	if cpe.Send != headend.Recv || cpe.Recv != headend.Send {
		t.Fatal("directional keys do not pair up: CPE Send/Recv must be headend Recv/Send")
	}
	if cpe.Send == cpe.Recv {
		t.Fatal("Send and Recv keys are equal; the directions must differ")
	}
	if cpe.Hash != headend.Hash {
		t.Fatal("handshake hashes differ")
	}
	var zero [16]byte
	if cpe.Send == zero || cpe.Recv == zero {
		t.Fatal("a derived key is all zeros")
	}
}

func TestRekeyGivesNewKeys(t *testing.T) {
	p := newPair(t)
	first, _ := p.handshake(t, t0)
	second, headend := p.handshake(t, t0.Add(120*time.Second))
	if first.Send == second.Send || first.Recv == second.Recv || first.Hash == second.Hash {
		t.Fatal("a second handshake repeated keys or hash of the first")
	}
	if second.Send != headend.Recv {
		t.Fatal("second handshake's keys do not pair up")
	}
}

func TestUnknownInitiatorRejected(t *testing.T) {
	p := newPair(t)
	stranger := mustGenerate(t)
	msg1 := mustInit(t, NewInitiator(stranger, p.headend.Public()), t0)

	peer, msg2, _, err := p.responder.Respond(msg1)
	if !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("error = %v; want ErrUnknownPeer", err)
	}
	if msg2 != nil {
		t.Fatal("a RESP was produced for an unknown initiator")
	}
	if peer != stranger.Public() || !strings.Contains(err.Error(), stranger.Public().String()) {
		t.Fatalf("peer %v / error %q should name the stranger's key %v so an admin can allow it", peer, err, stranger.Public())
	}
}

func TestSetAllowedTakesEffect(t *testing.T) {
	p := newPair(t)
	p.responder.SetAllowed(nil)
	if _, _, _, err := p.responder.Respond(mustInit(t, p.initiator, t0)); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("after removing the CPE: error = %v; want ErrUnknownPeer", err)
	}
	p.responder.SetAllowed([]PublicKey{p.cpe.Public()})
	p.handshake(t, t0.Add(time.Second))
}

func TestReplayedInitRejected(t *testing.T) {
	p := newPair(t)
	msg1 := mustInit(t, p.initiator, t0)
	mustRespond(t, p.responder, msg1)

	_, msg2, _, err := p.responder.Respond(msg1)
	if !errors.Is(err, ErrReplayedInit) {
		t.Fatalf("second Respond to the same INIT: error = %v; want ErrReplayedInit", err)
	}
	if msg2 != nil {
		t.Fatal("a RESP was produced for a replayed INIT")
	}
}

func TestOlderOrEqualTimestampRejected(t *testing.T) {
	p := newPair(t)
	p.handshake(t, t0)
	// A fresh Initiator is a restarted CPE: it no longer remembers its last
	// timestamp, so only the headend's check stands between it and a replay.
	for name, when := range map[string]time.Time{
		"older": t0.Add(-time.Second),
		"equal": t0,
	} {
		t.Run(name, func(t *testing.T) {
			restarted := NewInitiator(p.cpe, p.headend.Public())
			_, _, _, err := p.responder.Respond(mustInit(t, restarted, when))
			if !errors.Is(err, ErrReplayedInit) {
				t.Fatalf("error = %v; want ErrReplayedInit", err)
			}
			if !strings.Contains(err.Error(), "clock") {
				t.Fatalf("error %q should mention the clock as a possible cause", err)
			}
		})
	}
	// A newer one still gets through: the rejections did not advance the
	// accepted timestamp.
	restarted := NewInitiator(p.cpe, p.headend.Public())
	mustRespond(t, p.responder, mustInit(t, restarted, t0.Add(time.Nanosecond)))
}

func TestReplayStateIsPerInitiatorKey(t *testing.T) {
	p := newPair(t)
	other := mustGenerate(t)
	p.responder.SetAllowed([]PublicKey{p.cpe.Public(), other.Public()})
	p.handshake(t, t0)
	mustRespond(t, p.responder, mustInit(t, NewInitiator(other, p.headend.Public()), t0.Add(-time.Hour)))
}

func TestInitiatorNeverRepeatsTimestamps(t *testing.T) {
	p := newPair(t)
	// The clock stalls, then steps back: every INIT must still be accepted.
	for _, now := range []time.Time{t0, t0, t0.Add(-time.Hour)} {
		p.handshake(t, now)
	}
}

func TestInitBeforeEpochRefused(t *testing.T) {
	p := newPair(t)
	_, err := p.initiator.Init(time.Unix(-5, 0))
	if err == nil || !strings.Contains(err.Error(), "set the system clock") {
		t.Fatalf("error = %v; want advice to set the clock", err)
	}
}

func TestTamperedInitRejected(t *testing.T) {
	p := newPair(t)
	msg1 := mustInit(t, p.initiator, t0)
	for i := range msg1 {
		for _, bit := range []byte{0x01, 0x80} {
			bad := append([]byte(nil), msg1...)
			bad[i] ^= bit
			if _, _, _, err := p.responder.Respond(bad); !errors.Is(err, ErrAuthFailed) {
				t.Fatalf("INIT with byte %d ^ %#x: error = %v; want ErrAuthFailed", i, bit, err)
			}
		}
	}
	// The forgeries did not use up the genuine INIT.
	mustRespond(t, p.responder, msg1)
}

func TestTamperedRespRejectedAndGenuineStillCompletes(t *testing.T) {
	p := newPair(t)
	msg2, headend := mustRespond(t, p.responder, mustInit(t, p.initiator, t0))

	forgeries := [][]byte{make([]byte, RespMessageLen)} // all-zero: a low-order ephemeral key
	for i := range msg2 {
		bad := append([]byte(nil), msg2...)
		bad[i] ^= 0x01
		forgeries = append(forgeries, bad)
	}
	for n, bad := range forgeries {
		if _, err := p.initiator.Finish(bad); !errors.Is(err, ErrAuthFailed) {
			t.Fatalf("forged RESP %d: error = %v; want ErrAuthFailed", n, err)
		}
	}

	cpe, err := p.initiator.Finish(msg2)
	if err != nil {
		t.Fatalf("genuine RESP after forgeries: %v", err)
	}
	if cpe.Send != headend.Recv || cpe.Recv != headend.Send {
		t.Fatal("keys do not pair up after forged RESPs")
	}
}

func TestWrongHeadendKeyFails(t *testing.T) {
	p := newPair(t)
	impostor := mustGenerate(t)
	confused := NewInitiator(p.cpe, impostor.Public())
	_, _, _, err := p.responder.Respond(mustInit(t, confused, t0))
	if !errors.Is(err, ErrAuthFailed) {
		t.Fatalf("error = %v; want ErrAuthFailed", err)
	}
	if !strings.Contains(err.Error(), p.headend.Public().String()) {
		t.Fatalf("error %q should show the headend's real public key", err)
	}
}

func TestRespFromAnotherHeadendRejected(t *testing.T) {
	// The CPE trusts headend A; headend B, which also lists the CPE, cannot
	// answer in A's name.
	p := newPair(t)
	b := mustGenerate(t)
	msg1ForB := mustInit(t, NewInitiator(p.cpe, b.Public()), t0)
	msg2FromB, _ := mustRespond(t, NewResponder(b, []PublicKey{p.cpe.Public()}), msg1ForB)

	mustInit(t, p.initiator, t0)
	if _, err := p.initiator.Finish(msg2FromB); !errors.Is(err, ErrAuthFailed) {
		t.Fatalf("error = %v; want ErrAuthFailed", err)
	}
}

func TestNewInitReplacesPendingOne(t *testing.T) {
	p := newPair(t)
	stale := mustInit(t, p.initiator, t0)
	current := mustInit(t, p.initiator, t0.Add(time.Second))

	staleResp, _ := mustRespond(t, p.responder, stale)
	if _, err := p.initiator.Finish(staleResp); !errors.Is(err, ErrAuthFailed) {
		t.Fatalf("RESP to a superseded INIT: error = %v; want ErrAuthFailed", err)
	}
	currentResp, _ := mustRespond(t, p.responder, current)
	if _, err := p.initiator.Finish(currentResp); err != nil {
		t.Fatal(err)
	}
}

func TestFinishWithoutPendingHandshake(t *testing.T) {
	p := newPair(t)
	if _, err := p.initiator.Finish(make([]byte, RespMessageLen)); !errors.Is(err, ErrNoPendingHandshake) {
		t.Fatalf("Finish before Init: error = %v; want ErrNoPendingHandshake", err)
	}
	msg2, _ := mustRespond(t, p.responder, mustInit(t, p.initiator, t0))
	if _, err := p.initiator.Finish(msg2); err != nil {
		t.Fatal(err)
	}
	if _, err := p.initiator.Finish(msg2); !errors.Is(err, ErrNoPendingHandshake) {
		t.Fatalf("duplicated RESP: error = %v; want ErrNoPendingHandshake", err)
	}
}

func TestWrongLengthsRejected(t *testing.T) {
	p := newPair(t)
	msg1 := mustInit(t, p.initiator, t0)
	for _, bad := range [][]byte{nil, msg1[:InitMessageLen-1], append(append([]byte(nil), msg1...), 0)} {
		if _, _, _, err := p.responder.Respond(bad); !errors.Is(err, ErrMalformed) {
			t.Fatalf("INIT of %d bytes: error = %v; want ErrMalformed", len(bad), err)
		}
	}
	msg2, _ := mustRespond(t, p.responder, msg1)
	for _, bad := range [][]byte{nil, msg2[:RespMessageLen-1], append(append([]byte(nil), msg2...), 0)} {
		if _, err := p.initiator.Finish(bad); !errors.Is(err, ErrMalformed) {
			t.Fatalf("RESP of %d bytes: error = %v; want ErrMalformed", len(bad), err)
		}
	}
}

func TestConcurrentCopiesOfOneInitAdmitOnce(t *testing.T) {
	p := newPair(t)
	msg1 := mustInit(t, p.initiator, t0)
	const copies = 16
	var wg sync.WaitGroup
	errs := make(chan error, copies)
	for range copies {
		wg.Go(func() {
			_, _, _, err := p.responder.Respond(msg1)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	accepted := 0
	for err := range errs {
		switch {
		case err == nil:
			accepted++
		case !errors.Is(err, ErrReplayedInit):
			t.Fatalf("unexpected error %v", err)
		}
	}
	if accepted != 1 {
		t.Fatalf("%d copies of one INIT accepted, want exactly 1", accepted)
	}
}

func TestKeysFormattingHidesSecrets(t *testing.T) {
	cpe, _ := newPair(t).handshake(t, t0)
	for _, format := range []string{"%v", "%+v", "%#v", "%s"} {
		out := fmt.Sprintf(format, cpe)
		for _, secret := range [][16]byte{cpe.Send, cpe.Recv} {
			// The forms fmt would print an unformatted array in.
			for _, shown := range []string{hex.EncodeToString(secret[:]), fmt.Sprint(secret), fmt.Sprintf("%#v", secret)} {
				if strings.Contains(out, shown) {
					t.Errorf("Sprintf(%q) = %q shows a key", format, out)
				}
			}
		}
	}
}
