package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aggd/aggd/internal/auth"
	"github.com/aggd/aggd/internal/clock"
	"github.com/aggd/aggd/internal/cookie"
	"github.com/aggd/aggd/internal/handshake"
	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/wire"
)

// Peer is a CPE the headend accepts: its static key and the inner prefixes routed to it.
type Peer struct {
	Name     string
	Key      handshake.PublicKey
	Prefixes []netip.Prefix
}

// HeadendConfig is the headend role's runtime configuration.
type HeadendConfig struct {
	Local   handshake.PrivateKey
	Listen  netip.AddrPort
	Peers   []Peer
	Session SessionConfig
	// HandshakesPerSecond caps the rate of handshake messages given Curve25519 work.
	HandshakesPerSecond float64
}

// Headend serves many CPEs on one UDP socket.
type Headend struct {
	cfg  HeadendConfig
	tun  Packet
	m    *metrics.Set
	log  *slog.Logger
	conn *net.UDPConn
	resp *handshake.Responder
	mac  auth.Key
	hsRL tokenBucket
	// cookies and bySource take over from hsRL when it is spent (a flood, or a restart's
	// herd): an INIT then gets a cookie reply, and one with a mac2 from that cookie is
	// limited by its source alone.
	cookies  *cookie.Minter
	bySource sourceLimits
	// inits recognises the copies of an INIT that the CPE sent on its other uplinks.
	inits initCopies
	// hsLog logs the handshake load in summaries, not a line per INIT.
	hsLog hsLoadLog
	// hsQueue holds the INITs let through, for answerInits: a second of them at the
	// rate limit.
	hsQueue chan pendingInit

	// peers is who may connect and where their prefixes are: replaced whole by
	// SetPeers (a config reload) while the read loops use it.
	peers atomic.Pointer[peerSet]

	mu      sync.RWMutex
	byIndex map[uint32]*Session
	byPeer  map[string]*Session // peer name -> current session
}

// NewHeadend binds the listening socket.
func NewHeadend(cfg HeadendConfig, tun Packet, m *metrics.Set, log *slog.Logger) (*Headend, error) {
	conn, err := listenUDP(cfg.Listen, "")
	if err != nil {
		return nil, err
	}
	log = log.With("role", "headend")
	h := &Headend{
		cfg: cfg, tun: tun, m: m, log: log, conn: conn, hsLog: hsLoadLog{log: log},
		mac:     auth.MacKey(cfg.Local.Public()),
		cookies: cookie.NewMinter(cfg.Local.Public()),
		byIndex: make(map[uint32]*Session),
		byPeer:  make(map[string]*Session),
	}
	ps := newPeerSet(cfg.Peers)
	h.peers.Store(ps)
	for name := range ps.byName {
		m.PeerSession.WithLabelValues(name).Set(0)
	}
	h.resp = handshake.NewResponder(cfg.Local, ps.keys())
	rate := cfg.HandshakesPerSecond
	if rate <= 0 {
		rate = 100
	}
	h.hsRL = tokenBucket{rate: rate, burst: rate}
	h.hsQueue = make(chan pendingInit, int(rate))
	return h, nil
}

// Run moves packets until ctx ends.
func (h *Headend) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); h.readSocket(ctx) }()
	go func() { defer wg.Done(); readTun(ctx, h.tun, h.m, h.route) }()
	go func() { defer wg.Done(); h.answerInits(ctx) }()
	ticker := time.NewTicker(h.cfg.Session.Probe)
	defer ticker.Stop()
	lag := newLoopLag(h.cfg.Session.Probe, h.m.ControlLoopLate, h.log)
	for {
		select {
		case <-ctx.Done():
			h.conn.Close()
			h.tun.Close()
			h.mu.Lock()
			for _, s := range h.byIndex {
				s.close()
			}
			h.mu.Unlock()
			wg.Wait()
			return nil
		case now := <-ticker.C:
			lag.observe(time.Now())
			h.hsLog.tick(now)
			for _, s := range h.currentSessions() {
				s.tick(now)
			}
		}
	}
}

// route sends an inner packet to the session that owns its destination.
func (h *Headend) route(buf []byte) bool {
	dst, ok := innerDestination(buf[wire.HeaderLen:])
	if !ok {
		return false
	}
	name, ok := h.peers.Load().routes.lookup(dst)
	if !ok {
		return false
	}
	h.mu.RLock()
	s := h.byPeer[name]
	h.mu.RUnlock()
	return s != nil && s.SendData(buf)
}

func (h *Headend) readSocket(ctx context.Context) {
	readLoop(ctx, h.conn, h.log, h.m.SocketDrops.WithLabelValues("listen"), h.m.SocketWait.WithLabelValues("listen"), h.onDatagram)
}

func (h *Headend) onDatagram(pkt []byte, from netip.AddrPort, arr arrival) {
	hdr, err := parseDatagram(pkt)
	if err != nil {
		h.drop(wire.ReasonOf(err))
		return
	}
	if hdr.Type == wire.TypeHandshakeInit {
		h.onInit(&hdr, pkt, from)
		return
	}
	h.mu.RLock()
	s := h.byIndex[hdr.Session]
	h.mu.RUnlock()
	if s == nil {
		h.drop(wire.ReasonUnknownSession)
		return
	}
	if reason, ok := s.receive(&hdr, pkt, from, time.Now(), arr); !ok {
		h.drop(reason)
	}
}

// onInit answers a CPE's handshake: a new session, or new keys for the existing one.
func (h *Headend) onInit(hdr *wire.Header, pkt []byte, from netip.AddrPort) {
	msg, r := openSessionless(h.mac, pkt)
	if r != wire.ReasonNone {
		h.drop(r)
		return
	}
	body := msg.Body.(wire.HandshakeBody)
	now := time.Now()
	if h.inits.copyOfAdmitted(body.Noise, now) {
		h.log.Debug("handshake init: a copy, from another uplink, of one already answered", "from", from)
		return
	}
	switch {
	case hdr.HasMac2() && h.cookies.CheckMac2(from, pkt, now):
		// The sender proved it receives at its address: it is limited by that alone,
		// not by the shared limit a flood from forged addresses may have spent.
		if !h.bySource.allow(from.Addr(), now) {
			h.drop(wire.ReasonRateLimited)
			return
		}
	case !h.hsRL.allow(now):
		// Under load: no Curve25519 work for an unproven sender, a cookie instead.
		h.sendCookie(hdr, body, from, now)
		h.drop(wire.ReasonRateLimited)
		return
	}
	h.inits.admit(body.Noise, now)
	// The responder's Curve25519 work (about 0.3 ms here, BenchmarkRespond) runs on its
	// own goroutine: on this one, every CPE's data would wait behind it, for 30 ms
	// after a burst of a hundred INITs (a headend restart).
	body.Noise = append([]byte(nil), body.Noise...) // pkt is the read loop's buffer
	select {
	case h.hsQueue <- pendingInit{hdr: *hdr, body: body, from: from}:
	default:
		h.drop(wire.ReasonRateLimited)
	}
}

// sendCookie answers an INIT the rate limit refused with a COOKIE_REPLY, for the CPE to
// send it again with a mac2. The reply is smaller than the INIT: a flood from forged
// addresses cannot use the headend to amplify.
func (h *Headend) sendCookie(hdr *wire.Header, body wire.HandshakeBody, from netip.AddrPort, now time.Time) {
	reply := h.cookies.Reply(from, body.Ephemeral(), now)
	out := make([]byte, wire.HeaderLen+wire.CookieReplyLen)
	rh := wire.Header{Type: wire.TypeCookieReply, LinkID: hdr.LinkID, KeyID: hdr.KeyID, Session: body.SenderIndex, Timestamp: clock.Micros32(clock.Nanos())}
	rh.Put(out)
	reply.Append(out[:wire.HeaderLen])
	// Tagged with our own mac key: the CPE's static key is inside the INIT, behind
	// the Curve25519 work this reply is there to avoid.
	auth.Seal(h.mac, out)
	if _, err := h.conn.WriteToUDPAddrPort(out, from); err != nil {
		h.log.Debug("cookie reply not sent", "to", from, "err", err)
		return
	}
	h.m.CookieReplies.WithLabelValues("sent").Inc()
	h.hsLog.cookieSent(now)
}

// pendingInit is an INIT waiting for the responder.
type pendingInit struct {
	hdr  wire.Header
	body wire.HandshakeBody
	from netip.AddrPort
}

// answerInits answers the INITs onInit let through, one at a time, until ctx ends.
func (h *Headend) answerInits(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-h.hsQueue:
			h.answer(&p.hdr, p.body, p.from)
		}
	}
}

// answer runs the responder on an INIT and, if it is good, sets up the session (a new
// one, or new keys for the existing one) and sends the RESP.
func (h *Headend) answer(hdr *wire.Header, body wire.HandshakeBody, from netip.AddrPort) {
	peerKey, msg2, keys, err := h.resp.Respond(body.Noise)
	if err != nil {
		// The copies of an INIT that the CPE sent on its other uplinks were recognised
		// above: a replay here is someone else's, or a copy delayed by seconds.
		h.hsLog.rejected(from, err, time.Now())
		h.m.Handshakes.WithLabelValues("unknown", "rejected").Inc()
		h.drop(wire.ReasonHandshakeFailed)
		return
	}
	peer := h.peers.Load().byKey[peerKey]
	if peer == nil { // allowed by the responder but no longer configured
		h.drop(wire.ReasonHandshakeFailed)
		return
	}
	gen := &keyGen{id: hdr.KeyID, send: auth.Key(keys.Send), recv: auth.Key(keys.Recv), created: time.Now()}
	s := h.sessionFor(peer, body.SenderIndex)
	if s == nil { // removed or changed by a reload since the lookup above
		h.drop(wire.ReasonHandshakeFailed)
		return
	}
	s.installKeys(gen, false)

	reply := wire.HandshakeBody{SenderIndex: s.localIndex, Noise: msg2}.Append(nil)
	out := make([]byte, wire.HeaderLen+len(reply))
	rh := wire.Header{Type: wire.TypeHandshakeResp, LinkID: hdr.LinkID, KeyID: hdr.KeyID, Session: body.SenderIndex, Timestamp: clock.Micros32(clock.Nanos())}
	rh.Put(out)
	copy(out[wire.HeaderLen:], reply)
	auth.Seal(auth.MacKey(peerKey), out)
	if _, err := h.conn.WriteToUDPAddrPort(out, from); err != nil {
		h.log.Warn("handshake response not sent", "peer", peer.Name, "err", err)
		return
	}
	if l := s.link(hdr.LinkID); l != nil {
		s.follow(l, from)
	}
	h.m.Handshakes.WithLabelValues(peer.Name, "ok").Inc()
}

// sessionFor returns the peer's session for the CPE's index, replacing an older one
// (the CPE restarted) or creating the first; nil if peer is no longer the configured
// one (SetPeers ran since it was looked up).
func (h *Headend) sessionFor(peer *Peer, cpeIndex uint32) *Session {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.peers.Load().byName[peer.Name] != peer {
		return nil
	}
	if s := h.byPeer[peer.Name]; s != nil && s.peerIndex.Load() == cpeIndex {
		return s
	}
	if old := h.byPeer[peer.Name]; old != nil {
		delete(h.byIndex, old.localIndex)
		old.close()
		h.log.Info("peer restarted its session", "peer", peer.Name)
	}
	var idx uint32
	for idx == 0 || h.byIndex[idx] != nil {
		idx = randomIndex()
	}
	cfg := h.cfg.Session
	cfg.Peer = peer.Name
	cfg.Routes = peer.Prefixes
	s := newSession(cfg, h.m, h.log, idx, h.deliver)
	s.peerIndex.Store(cpeIndex)
	s.onNewLink = func(id uint8) *link { return h.addPeerLink(s, id) }
	h.byIndex[idx] = s
	h.byPeer[peer.Name] = s
	h.m.Sessions.Set(float64(len(h.byPeer)))
	h.m.PeerSession.WithLabelValues(peer.Name).Set(1)
	h.log.Info("session established", "peer", peer.Name, "session", idx)
	return s
}

// addPeerLink creates the link for one of the CPE's uplinks the first time a packet
// arrives on it. Its address is filled in by Session.follow.
func (h *Headend) addPeerLink(s *Session, id uint8) *link {
	spec := LinkSpec{ID: id, Name: fmt.Sprintf("link%d", id), Local: localAddrPort(h.conn)}
	return s.addLink(spec, func(l *link, b []byte) error {
		to := l.remote.Load()
		if to == nil {
			return errors.New("no address for this link yet")
		}
		_, err := h.conn.WriteToUDPAddrPort(b, *to)
		return err
	})
}

// InterfaceCarrier tells the headend that its interface ifindex lost its carrier (up
// false) or has it again: every session takes the links whose packets arrive there
// offline, or brings them back (Session.interfaceCarrier).
func (h *Headend) InterfaceCarrier(ifindex int, up bool) {
	for _, s := range h.currentSessions() {
		s.interfaceCarrier(ifindex, up)
	}
}

// currentSessions returns each peer's current session.
func (h *Headend) currentSessions() []*Session { return valuesUnder(&h.mu, h.byPeer) }

func (h *Headend) deliver(pkt []byte) {
	if _, err := h.tun.Write(pkt); err != nil {
		h.log.Debug("tunnel write failed", "err", err)
	}
}

func (h *Headend) drop(r wire.Reason) { h.m.Drops.WithLabelValues(r.String()).Inc() }

// openSessionless checks the tag of a message sent before there is a session (a
// handshake message or a cookie reply, tagged with a mac key), then parses it: the
// message, or why it is dropped. The tag comes first: it is what stops a stranger's
// packet before any more work.
func openSessionless(mac auth.Key, pkt []byte) (wire.Message, wire.Reason) {
	if !auth.Verify(mac, pkt) {
		return wire.Message{}, wire.ReasonBadTag
	}
	msg, err := wire.Parse(pkt)
	if err != nil {
		return wire.Message{}, wire.ReasonOf(err)
	}
	return msg, wire.ReasonNone
}

// tokenBucket limits handshake processing, the one expensive thing an unauthenticated
// sender who knows our public key can make us do.
type tokenBucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func (b *tokenBucket) allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.last.IsZero() {
		b.tokens = b.burst
	} else {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
