package cookie

import (
	"encoding/hex"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/wire"
)

var (
	headendPub = [32]byte{1, 2, 3, 4, 5, 6, 7, 8}
	cpeAddr    = netip.MustParseAddrPort("192.0.2.7:4242")
	t0         = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
)

// initPacket is a HANDSHAKE_INIT datagram with FlagMac2 and a zero mac2, its ephemeral
// key first in the Noise message.
func initPacket(t *testing.T) []byte {
	t.Helper()
	noise := make([]byte, wire.HandshakeInitNoiseMin)
	for i := range noise {
		noise[i] = byte(i * 3)
	}
	body := wire.HandshakeBody{SenderIndex: 0x01020304, Noise: noise, Mac2: make([]byte, wire.Mac2Len)}.Marshal()
	h := wire.Header{Type: wire.TypeHandshakeInit, Flags: wire.FlagMac2, LinkID: 2, KeyID: 1, Timestamp: 77}
	return append(h.Append(nil), body...)
}

func ephemeralOf(pkt []byte) []byte {
	return pkt[wire.HeaderLen+wire.SenderIndexLen:][:wire.EphemeralKeyLen]
}

// cookieFor runs the exchange: the headend's reply to an INIT from from, opened by the CPE.
func cookieFor(t *testing.T, m *Minter, from netip.AddrPort, pkt []byte, now time.Time) Cookie {
	t.Helper()
	c, err := NewOpener(headendPub).Open(m.Reply(from, ephemeralOf(pkt), now), ephemeralOf(pkt))
	if err != nil {
		t.Fatalf("the CPE cannot open the headend's reply: %v", err)
	}
	return c
}

func TestMac2ProvesTheSourceAddress(t *testing.T) {
	m := NewMinter(headendPub)
	pkt := initPacket(t)
	PutMac2(cookieFor(t, m, cpeAddr, pkt, t0), pkt)
	if !m.CheckMac2(cpeAddr, pkt, t0) {
		t.Fatal("the mac2 made with the cookie from the reply does not check")
	}
	// The header's tag (mac1) is sealed after the mac2 and is not covered by it.
	tagged := append([]byte(nil), pkt...)
	tagged[wire.TagOffset] ^= 0xff
	if !m.CheckMac2(cpeAddr, tagged, t0) {
		t.Error("changing the header's tag spoils the mac2: it must not cover it")
	}
	for name, from := range map[string]netip.AddrPort{
		"another port":    netip.MustParseAddrPort("192.0.2.7:4243"),
		"another address": netip.MustParseAddrPort("192.0.2.8:4242"),
		"IPv6":            netip.MustParseAddrPort("[2001:db8::7]:4242"),
	} {
		if m.CheckMac2(from, pkt, t0) {
			t.Errorf("the mac2 checks for %s (%s): a cookie must prove one address and port", name, from)
		}
	}
	for _, i := range []int{1, wire.HeaderLen - 9, wire.HeaderLen, len(pkt) - wire.Mac2Len - 1, len(pkt) - 1} {
		bad := append([]byte(nil), pkt...)
		bad[i] ^= 0x01
		if m.CheckMac2(cpeAddr, bad, t0) {
			t.Errorf("byte %d changed: the mac2 still checks", i)
		}
	}
	if m.CheckMac2(cpeAddr, pkt[:wire.HeaderLen+wire.Mac2Len-1], t0) {
		t.Error("a datagram too short to hold a mac2 checks")
	}
}

func TestACookieOutlivesOneSecret(t *testing.T) {
	m := NewMinter(headendPub)
	pkt := initPacket(t)
	PutMac2(cookieFor(t, m, cpeAddr, pkt, t0), pkt)
	if !m.CheckMac2(cpeAddr, pkt, t0.Add(SecretLifetime+time.Second)) {
		t.Error("a cookie minted just before the secret changed is refused")
	}
	if m.CheckMac2(cpeAddr, pkt, t0.Add(2*SecretLifetime+2*time.Second)) {
		t.Error("a cookie two secrets old still checks")
	}
	// A new minter (a restarted headend) has new secrets.
	if NewMinter(headendPub).CheckMac2(cpeAddr, pkt, t0) {
		t.Error("another minter accepts this minter's cookie")
	}
}

func TestAReplyOpensOnlyForItsInit(t *testing.T) {
	m := NewMinter(headendPub)
	pkt := initPacket(t)
	reply := m.Reply(cpeAddr, ephemeralOf(pkt), t0)
	other := make([]byte, wire.EphemeralKeyLen)
	if _, err := NewOpener(headendPub).Open(reply, other); !errors.Is(err, ErrReply) {
		t.Errorf("a reply opens for another INIT's ephemeral key: %v", err)
	}
	if _, err := NewOpener([32]byte{9}).Open(reply, ephemeralOf(pkt)); !errors.Is(err, ErrReply) {
		t.Errorf("a reply opens under another headend's key: %v", err)
	}
	reply.Sealed[3] ^= 1
	if _, err := NewOpener(headendPub).Open(reply, ephemeralOf(pkt)); !errors.Is(err, ErrReply) {
		t.Errorf("a damaged reply opens: %v", err)
	}
	if a, b := m.Reply(cpeAddr, ephemeralOf(pkt), t0), m.Reply(cpeAddr, ephemeralOf(pkt), t0); a.Nonce == b.Nonce {
		t.Error("two replies have the same nonce")
	}
}

// TestKnownAnswers checks the cookie and the mac2 against values computed outside Go
// (Python's hashlib.blake2s with key= and digest_size=16), so the definitions in doc.go
// are what the code does:
//
//	secret = bytes(range(32)); addr = bytes(10) + b'\xff\xff' + bytes([192,0,2,7])
//	cookie = blake2s(addr + (4242).to_bytes(2,'big'), key=secret, digest_size=16)
//	header = bytes(range(28)); body = bytes((i*7) & 0xff for i in range(112))
//	mac2   = blake2s(header[:20] + body, key=cookie, digest_size=16)
func TestKnownAnswers(t *testing.T) {
	var secret [32]byte
	for i := range secret {
		secret[i] = byte(i)
	}
	c := mint(secret, cpeAddr)
	if got := hex.EncodeToString(c[:]); got != "a39f8a04170d4a889b2845f238562a0d" {
		t.Errorf("cookie %s, want a39f8a04170d4a889b2845f238562a0d", got)
	}
	pkt := make([]byte, wire.HeaderLen+112+wire.Mac2Len)
	for i := range wire.HeaderLen {
		pkt[i] = byte(i)
	}
	for i := range 112 {
		pkt[wire.HeaderLen+i] = byte(i * 7)
	}
	mac := Mac2(c, pkt)
	if got := hex.EncodeToString(mac[:]); got != "e7ff7c0fc80c72d13f238d04eb2d6e22" {
		t.Errorf("mac2 %s, want e7ff7c0fc80c72d13f238d04eb2d6e22", got)
	}
}

func BenchmarkReply(b *testing.B) {
	m := NewMinter(headendPub)
	eph := make([]byte, wire.EphemeralKeyLen)
	for b.Loop() {
		m.Reply(cpeAddr, eph, t0)
	}
}

func BenchmarkCheckMac2(b *testing.B) {
	m := NewMinter(headendPub)
	pkt := make([]byte, wire.HeaderLen+wire.SenderIndexLen+wire.HandshakeInitNoiseMin+wire.Mac2Len)
	for b.Loop() {
		m.CheckMac2(cpeAddr, pkt, t0)
	}
}
