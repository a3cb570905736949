package tunnel

import (
	"sync"
	"time"

	"github.com/aggd/aggd/internal/auth"
)

// keyGen is one generation of a session's tag keys, made by one handshake, with the
// replay windows that belong to it (a new generation starts new windows, so a rekey never
// makes the receiver reject fresh sequence numbers).
type keyGen struct {
	id      uint8
	send    auth.Key
	recv    auth.Key
	created time.Time

	mu      sync.Mutex
	dataWin auth.ReplayWindow
	ctrlWin auth.Window64
}

// acceptData reports whether seq is new under this key (replay protection).
func (k *keyGen) acceptData(seq uint32) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.dataWin.Accept(seq)
}

// acceptControl reports whether a control counter is new under this key.
func (k *keyGen) acceptControl(counter uint64) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.ctrlWin.Accept(counter)
}

// keyRing holds the current and previous generations. Packets under either verify, so
// packets in flight during a rekey are not lost; the previous one expires after
// keyGrace.
type keyRing struct {
	mu   sync.RWMutex
	cur  *keyGen
	prev *keyGen
	// tx is the generation we send with. The responder keeps sending with the old
	// generation until a packet under the new one proves the initiator has it.
	tx *keyGen
}

const keyGrace = 30 * time.Second

// install adds a new generation. sendNow says whether to switch sending to it at once
// (initiator: yes, it has just completed the handshake; responder: no, see keyRing.tx).
func (r *keyRing) install(g *keyGen, sendNow bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil && r.cur.id == g.id {
		// The same key id again: the peer retried its handshake (it re-sends while we do
		// not answer, and a headend that was frozen answers each retry in turn). Only the
		// last one counts; keeping both would leave two generations with one id.
		if r.tx == r.cur {
			r.tx = g
		}
		r.cur = g
	} else {
		r.prev, r.cur = r.cur, g
	}
	if sendNow || r.tx == nil {
		r.tx = g
	}
}

// lookup finds the generation for a received packet's key id.
func (r *keyRing) lookup(id uint8, now time.Time) *keyGen {
	r.mu.RLock()
	cur, prev := r.cur, r.prev
	r.mu.RUnlock()
	switch {
	case cur != nil && cur.id == id:
		return cur
	case prev != nil && prev.id == id && now.Sub(cur.created) < keyGrace:
		return prev
	}
	return nil
}

// confirm is called when a packet verified under g: if g is the newest generation, the
// peer has it, so we send with it from now on. It reports whether that switched.
func (r *keyRing) confirm(g *keyGen) bool {
	r.mu.RLock()
	ok := r.tx != g && r.cur == g
	r.mu.RUnlock()
	if !ok {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != g || r.tx == g {
		return false
	}
	r.tx = g
	return true
}

func (r *keyRing) sending() *keyGen {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.tx
}
