package cookie

import (
	"crypto/cipher"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/crypto/blake2s"
	"golang.org/x/crypto/chacha20poly1305"

	"github.com/aggd/aggd/internal/wire"
)

// Cookie proves that its holder receives packets at one address and port.
type Cookie [16]byte

const (
	// SecretLifetime is how long the headend mints cookies with one secret. It checks
	// mac2s against the current and the previous secret, so a cookie is good for
	// SecretLifetime at least.
	SecretLifetime = 2 * time.Minute
	// Lifetime is how long a CPE uses a cookie it got.
	Lifetime = SecretLifetime

	sealLabel = "aggd-cookie-v1"
)

// ErrReply is a cookie reply that does not open: forged, damaged, or an answer to
// another INIT.
var ErrReply = errors.New("cookie reply does not open: not from the headend, or not for this INIT")

// Minter is the headend's side: it mints cookies for source addresses and checks mac2s.
// Safe for concurrent use.
type Minter struct {
	seal sealer
	mu   sync.Mutex
	cur  [32]byte // the secret cookies are minted with
	prev [32]byte // the one before, still accepted
	at   time.Time
}

// NewMinter returns the minter of the headend whose static public key is headendPub.
func NewMinter(headendPub [32]byte) *Minter {
	return &Minter{seal: newSealer(headendPub)}
}

// secrets returns the current and the previous secret, replacing them when the current
// one is SecretLifetime old (or was never made).
func (m *Minter) secrets(now time.Time) (cur, prev [32]byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.at.IsZero() || now.Sub(m.at) >= SecretLifetime || now.Before(m.at) {
		m.prev = m.cur
		if _, err := rand.Read(m.cur[:]); err != nil {
			panic("cookie: no randomness: " + err.Error()) // crypto/rand does not fail on Linux
		}
		m.at = now
	}
	return m.cur, m.prev
}

// Reply makes the body of the COOKIE_REPLY for an INIT with ephemeral key ephemeral that
// came from from.
func (m *Minter) Reply(from netip.AddrPort, ephemeral []byte, now time.Time) wire.CookieReplyBody {
	cur, _ := m.secrets(now)
	c := mint(cur, from)
	var body wire.CookieReplyBody
	if _, err := rand.Read(body.Nonce[:]); err != nil {
		panic("cookie: no randomness: " + err.Error())
	}
	m.seal.aead.Seal(body.Sealed[:0], body.Nonce[:], c[:], ephemeral)
	return body
}

// CheckMac2 reports whether the INIT datagram pkt (with FlagMac2, parsed) carries a mac2
// made with a cookie minted for from with the current or the previous secret.
func (m *Minter) CheckMac2(from netip.AddrPort, pkt []byte, now time.Time) bool {
	if len(pkt) < wire.HeaderLen+wire.Mac2Len {
		return false
	}
	got := pkt[len(pkt)-wire.Mac2Len:]
	cur, prev := m.secrets(now)
	for _, secret := range [...][32]byte{cur, prev} {
		want := Mac2(mint(secret, from), pkt)
		if subtle.ConstantTimeCompare(got, want[:]) == 1 {
			return true
		}
	}
	return false
}

// mint computes the cookie for from under secret.
func mint(secret [32]byte, from netip.AddrPort) Cookie {
	h, _ := blake2s.New128(secret[:]) // a 32-byte key is always accepted
	a := from.Addr().As16()           // IPv4 as v4-mapped: one address, one cookie
	h.Write(a[:])
	h.Write([]byte{byte(from.Port() >> 8), byte(from.Port())})
	var c Cookie
	h.Sum(c[:0])
	return c
}

// Mac2 computes the mac2 of the INIT datagram pkt (header, body, and room for the mac2
// at its end) with cookie c.
func Mac2(c Cookie, pkt []byte) [wire.Mac2Len]byte {
	h, _ := blake2s.New128(c[:]) // a 16-byte key is always accepted
	wire.Mac2Covered(pkt, func(header, body []byte) {
		h.Write(header)
		h.Write(body)
	})
	var out [wire.Mac2Len]byte
	h.Sum(out[:0])
	return out
}

// PutMac2 writes the mac2 of pkt with cookie c into its last wire.Mac2Len bytes. The
// header's tag must be sealed after it: it covers the mac2.
func PutMac2(c Cookie, pkt []byte) {
	mac := Mac2(c, pkt)
	copy(pkt[len(pkt)-wire.Mac2Len:], mac[:])
}

// Opener is the CPE's side: it opens the cookie replies of one headend.
type Opener struct{ seal sealer }

// NewOpener returns the opener for replies from the headend with public key headendPub.
func NewOpener(headendPub [32]byte) *Opener { return &Opener{seal: newSealer(headendPub)} }

// Open returns the cookie in a reply to the INIT with ephemeral key ephemeral.
func (o *Opener) Open(body wire.CookieReplyBody, ephemeral []byte) (Cookie, error) {
	var c Cookie
	if _, err := o.seal.aead.Open(c[:0], body.Nonce[:], body.Sealed[:], ephemeral); err != nil {
		return Cookie{}, ErrReply
	}
	return c, nil
}

// sealer holds the reply's AEAD, keyed from the headend's public key.
type sealer struct{ aead cipher.AEAD }

func newSealer(headendPub [32]byte) sealer {
	key := blake2s.Sum256(append([]byte(sealLabel), headendPub[:]...))
	aead, err := chacha20poly1305.NewX(key[:])
	if err != nil {
		panic("cookie: " + err.Error()) // a 32-byte key is always accepted
	}
	return sealer{aead: aead}
}
