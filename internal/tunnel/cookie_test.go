package tunnel

import (
	"context"
	"crypto/rand"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/auth"
	"github.com/aggd/aggd/internal/cookie"
	"github.com/aggd/aggd/internal/handshake"
	"github.com/aggd/aggd/internal/wire"
)

// flooder sends HANDSHAKE_INITs that pass the headend's mac check (it knows the
// headend's public key, as every CPE's config does) but carry random bytes for a Noise
// message: each costs the responder its Curve25519 work before it is refused, and costs
// the flooder nothing. It sends from 127.0.0.2, an address of its own: the bed's CPEs
// reach the headend from 127.0.0.1.
type flooder struct {
	t       *testing.T
	conn    *net.UDPConn
	headend handshake.PublicKey
}

func newFlooder(t *testing.T, b *bed) *flooder {
	t.Helper()
	conn, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)}, net.UDPAddrFromAddrPort(b.listen))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &flooder{t: t, conn: conn, headend: b.key.Public()}
}

// init makes an INIT with a fresh random Noise message, with a mac2 if c is not nil.
func (f *flooder) init(c *cookie.Cookie) []byte {
	noise := make([]byte, wire.HandshakeInitNoiseMin)
	rand.Read(noise)
	body := wire.HandshakeBody{SenderIndex: 0xf100d, Noise: noise}
	h := wire.Header{Type: wire.TypeHandshakeInit, KeyID: 1}
	if c != nil {
		h.Flags = wire.FlagMac2
		body.Mac2 = make([]byte, wire.Mac2Len)
	}
	pkt := append(h.Append(nil), body.Marshal()...)
	if c != nil {
		cookie.PutMac2(*c, pkt)
	}
	auth.Seal(auth.MacKey(f.headend), pkt)
	return pkt
}

func (f *flooder) send(pkt []byte) {
	if _, err := f.conn.Write(pkt); err != nil {
		f.t.Errorf("flood: %v", err)
	}
}

// run floods at about rate INITs a second until ctx ends.
func (f *flooder) run(ctx context.Context, rate int, c *cookie.Cookie) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			for range rate / 100 {
				f.send(f.init(c))
			}
		}
	}
}

// cookieFor sends INITs until the headend answers one with a cookie reply, and opens it.
func (f *flooder) cookieFor() cookie.Cookie {
	f.t.Helper()
	buf := make([]byte, 2048)
	for range 100 {
		pkt := f.init(nil)
		f.send(pkt)
		if err := f.conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
			f.t.Fatal(err)
		}
		n, err := f.conn.Read(buf)
		if err != nil {
			continue // answered, or refused, without a cookie: the limit was not spent yet
		}
		msg, err := wire.Parse(buf[:n])
		if err != nil || msg.Header.Type != wire.TypeCookieReply {
			continue
		}
		if !auth.Verify(auth.MacKey(f.headend), buf[:n]) {
			f.t.Fatal("the cookie reply does not carry the headend's mac key's tag")
		}
		ephemeral := pkt[wire.HeaderLen+wire.SenderIndexLen:][:wire.EphemeralKeyLen]
		c, err := cookie.NewOpener(f.headend).Open(msg.Body.(wire.CookieReplyBody), ephemeral)
		if err != nil {
			f.t.Fatalf("the cookie reply does not open: %v", err)
		}
		return c
	}
	f.t.Fatal("no cookie reply to 100 INITs")
	return cookie.Cookie{}
}

// A flood of INITs from a forged (or merely other) address spends the headend's
// handshake rate limit. Before cookies, a CPE's INIT then had rate/flood odds of
// getting through, a few in a thousand here, every second. With them, the headend
// answers it with a cookie, and the CPE's INIT sent again with the mac2 is answered on
// its own source's limit: the CPE connects, while the flood goes on.
func TestCookiesLetACPEInDuringAFlood(t *testing.T) {
	cpe := newPeer(t, "cpe1", "10.100.0.2")
	b := newBedWith(t, func(c *HeadendConfig) { c.HandshakesPerSecond = 2 }, cpe)
	f := newFlooder(t, b)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); f.run(ctx, 2000, nil) }()
	defer func() { stop(); wg.Wait() }()
	time.Sleep(100 * time.Millisecond) // the flood has spent the limit

	node := b.startCPE(cpe, 2, time.Hour)
	waitFor(t, "the CPE's session during the flood", func() bool { return b.session("cpe1") != nil && node.c.session.Load() != nil })
	if got := gauge(node.m.CookieReplies.WithLabelValues("received")); got < 1 {
		t.Errorf("the CPE connected without a cookie reply (%v): the flood did not spend the limit, and the test shows nothing", got)
	}
	if got := gauge(b.heM.CookieReplies.WithLabelValues("sent")); got < 100 {
		t.Errorf("the headend sent %v cookie replies to a flood of 2000 INITs a second", got)
	}
	b.waitReady(node)
	b.up(node, 50)
}

// A flooder that does use its cookies proves its address, and is then held to that
// address's limit (sourceBurst, then sourceRate a second): its INITs do not reach the
// responder in number, and a CPE elsewhere still connects. It sends them about a
// millisecond apart, slower than the responder refuses them, so that the responder's
// queue (HandshakesPerSecond long) is not what stops them.
func TestCookieFlooderIsHeldToItsSourceLimit(t *testing.T) {
	cpe := newPeer(t, "cpe1", "10.100.0.2")
	b := newBedWith(t, func(c *HeadendConfig) { c.HandshakesPerSecond = 2 }, cpe)
	f := newFlooder(t, b)
	c := f.cookieFor()
	refusedBefore := drops(b.heM, wire.ReasonHandshakeFailed)
	start := time.Now()
	for range 500 {
		f.send(f.init(&c))
		time.Sleep(time.Millisecond)
	}
	// Every INIT let through reaches the responder, which refuses it (random Noise).
	var refused float64
	waitFor(t, "the headend to read the 500 INITs", func() bool {
		refused = drops(b.heM, wire.ReasonHandshakeFailed) - refusedBefore
		limited := drops(b.heM, wire.ReasonRateLimited)
		return refused+limited >= 500
	})
	// The source's burst, its refill over the time the 500 took, and the shared
	// limit's tokens (2 a second) for a mac2 that did not check: far below 500.
	allowed := sourceBurst + 1 + time.Since(start).Seconds()*(sourceRate+2)
	if refused > allowed {
		t.Errorf("%v of 500 INITs with a good mac2 from one source reached the responder, want at most %.0f", refused, allowed)
	}
	node := b.startCPE(cpe, 1, time.Hour)
	waitFor(t, "the CPE's session", func() bool { return b.session("cpe1") != nil && node.c.session.Load() != nil })
}

// A cookie reply the CPE cannot use is dropped and counted: one for another INIT (a
// stale or forged one), and one not tagged by the headend.
func TestCPEDropsCookieRepliesNotForItsInit(t *testing.T) {
	cpe := newPeer(t, "cpe1", "10.100.0.2")
	b := newBed(t, cpe)
	node := b.startCPE(cpe, 1, time.Hour)
	waitFor(t, "the CPE's session", func() bool { return node.c.session.Load() != nil })
	m := cookie.NewMinter(b.key.Public())
	reply := func(key auth.Key, session uint32) []byte {
		body := m.Reply(netip.MustParseAddrPort("127.0.0.1:1"), make([]byte, wire.EphemeralKeyLen), time.Now())
		h := wire.Header{Type: wire.TypeCookieReply, KeyID: 1, Session: session}
		pkt := body.Append(h.Append(nil))
		auth.Seal(key, pkt)
		return pkt
	}
	badTag, unknown := drops(node.m, wire.ReasonBadTag), drops(node.m, wire.ReasonUnknownSession)
	node.c.onDatagram(reply(auth.MacKey(cpe.key.Public()), node.c.localIndex), b.listen, arrival{}) // not the headend's tag
	node.c.onDatagram(reply(auth.MacKey(b.key.Public()), node.c.localIndex), b.listen, arrival{})   // no handshake in progress
	if got := drops(node.m, wire.ReasonBadTag) - badTag; got != 1 {
		t.Errorf("a cookie reply with another key's tag: %v bad_tag drops, want 1", got)
	}
	if got := drops(node.m, wire.ReasonUnknownSession) - unknown; got != 1 {
		t.Errorf("a cookie reply with no handshake in progress: %v unknown_session drops, want 1", got)
	}
	if got := gauge(node.m.CookieReplies.WithLabelValues("received")); got != 0 {
		t.Errorf("%v cookie replies accepted, want none", got)
	}
}
