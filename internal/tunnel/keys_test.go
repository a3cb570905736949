package tunnel

import (
	"testing"
	"time"
)

// A handshake retried with the same key id replaces the current generation instead of
// pushing it to prev: two generations with one id are ambiguous (the XDP shield refuses
// them, and lookup could pick the wrong keys).
func TestKeyRingRetriedHandshakeReplacesCurrent(t *testing.T) {
	var r keyRing
	now := time.Now()
	g1 := &keyGen{id: 1, created: now}
	r.install(g1, true)
	a := &keyGen{id: 2, created: now}
	r.install(a, false)
	b := &keyGen{id: 2, created: now}
	r.install(b, false)
	if r.cur != b || r.prev != g1 {
		t.Fatalf("after two installs of key id 2: cur %p prev %p, want the retry (%p) and id 1 (%p)", r.cur, r.prev, b, g1)
	}
	if got := r.lookup(2, now); got != b {
		t.Errorf("lookup(2) = %p, want the retried generation %p", got, b)
	}
	if r.tx != g1 {
		t.Errorf("the responder switched sending before the peer confirmed the new keys")
	}
	r.install(&keyGen{id: 3, created: now}, true)
	if r.prev != b {
		t.Errorf("a new id must push the current generation to prev")
	}
}
