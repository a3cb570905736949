package tunnel

import (
	"sync"
	"time"

	"github.com/aggd/aggd/internal/wire"
)

// initCopies remembers the handshake INITs a headend has let through its rate limit
// lately, by their ephemeral key (the first 32 bytes of Noise message 1, new for every
// INIT). A CPE sends each INIT on every uplink, so that one working link is enough; the
// copies after the first would each take a token of the rate limit and the responder's
// Curve25519 work, only to be rejected as replays, counted as rejected handshakes (which
// an alert watches: a healthy three-link CPE's rekeys alone set it off) and, after a
// headend restart, crowd out other CPEs' first INITs. A copy of an INIT let through is
// dropped before any of that. A copy of one the rate limit refused is not: it gets its
// own chance.
type initCopies struct {
	mu   sync.Mutex
	seen map[[initKeyLen]byte]time.Time
}

const (
	initKeyLen = wire.EphemeralKeyLen
	// initCopiesFor is how long an INIT's copies are recognised: far longer than the
	// uplinks' delay spread, and than a CPE's retry (1 s), which is a new INIT.
	initCopiesFor = 5 * time.Second
	// initCopiesPrune is the size above which admit forgets expired INITs. The rate
	// limit bounds what is admitted (100 a second, 500 in initCopiesFor).
	initCopiesPrune = 1024
)

// copyOfAdmitted reports whether noise (a Noise message 1) is a copy of an INIT admitted
// within initCopiesFor.
func (c *initCopies) copyOfAdmitted(noise []byte, now time.Time) bool {
	if len(noise) < initKeyLen {
		return false // malformed: the responder says why
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.seen[[initKeyLen]byte(noise[:initKeyLen])]
	return ok && now.Sub(at) < initCopiesFor
}

// admit records an INIT let through the rate limit.
func (c *initCopies) admit(noise []byte, now time.Time) {
	if len(noise) < initKeyLen {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen = make(map[[initKeyLen]byte]time.Time)
	}
	if len(c.seen) >= initCopiesPrune {
		for k, at := range c.seen {
			if now.Sub(at) >= initCopiesFor {
				delete(c.seen, k)
			}
		}
	}
	c.seen[[initKeyLen]byte(noise[:initKeyLen])] = now
}
