package tunnel

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/aggd/aggd/internal/auth"
	"github.com/aggd/aggd/internal/clock"
	"github.com/aggd/aggd/internal/cookie"
	"github.com/aggd/aggd/internal/handshake"
	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/wire"
)

// Uplink is one of the CPE's access links.
type Uplink struct {
	Spec      LinkSpec
	Interface string
	Source    netip.Addr
	// Endpoint is the headend's address and port as this uplink reaches it, of the
	// same IP version as Source.
	Endpoint netip.AddrPort
	// Waiting, when set, says why the uplink cannot be used yet (its interface is
	// missing, or has no address): it starts offline, and the daemon re-binds it when
	// its interface and address appear (RebindUplink). Source is then only its IP
	// version.
	Waiting string
	// MTU is the largest inner packet the uplink carries (its MTU less the outer
	// headers, and no more than the tunnel's MTU), 0 while unknown. The headend is told
	// (LINK_PARAMS), so that it sends no packet the uplink cannot take (SetUplinkMTU
	// changes it).
	MTU int
}

// CPEConfig is the CPE role's runtime configuration, already validated and resolved.
type CPEConfig struct {
	Local      handshake.PrivateKey
	HeadendKey handshake.PublicKey
	Uplinks    []Uplink
	Session    SessionConfig
	Rekey      time.Duration
	// LocalPort is the UDP port every uplink socket binds (each on its own interface and
	// address). The XDP shield recognises tunnel traffic by destination port, so with
	// the shield this is the tunnel port; 0 picks an ephemeral port per uplink.
	LocalPort uint16
}

// Packet is the tunnel interface: each Read and Write moves one inner IP packet. The
// datapath closes it when it stops, which is what unblocks a pending Read.
type Packet interface {
	Read([]byte) (int, error)
	Write([]byte) (int, error)
	Close() error
}

// CPE runs the router side: one session to the headend over all uplinks.
type CPE struct {
	cfg  CPEConfig
	tun  Packet
	m    *metrics.Set
	log  *slog.Logger
	macH auth.Key // tags our handshake messages (the headend's mac key)
	macL auth.Key // verifies the headend's replies (our own mac key)

	conns []*uplinkConn // one per uplink, index = link id (uplinkevents.go)
	// announced counts announceLinks calls: LINK_NAMES, and LINK_PARAMS that say
	// nothing new, go out on one uplink at a time, each in turn.
	announced atomic.Uint32
	// lastParams is what the last LINK_PARAMS said (announceLinks). Under announceMu,
	// which also keeps two announcements (the run loop's, a new session's) apart.
	announceMu sync.Mutex
	lastParams []wire.LinkParam
	// announceNow asks for LINK_PARAMS before the next second's (SetUplinkMTU).
	announceNow chan struct{}

	localIndex uint32
	session    atomic.Pointer[Session]
	lastHeard  atomic.Int64 // clock.Nanos of the last authenticated packet from the headend
	started    int64        // clock.Nanos when the CPE was created

	hsSlot   chan struct{} // at most one handshake response in progress
	hsMu     sync.Mutex
	rebindMu sync.Mutex // one RebindUplink at a time
	// tuning is each uplink's class, rate priors and weight as they are now: a reload
	// changes them (RetuneUplinks), so they are read from here, not cfg.Uplinks.
	tuningMu sync.Mutex
	tuning   []LinkTuning
	// capReached marks the uplinks whose data cap is used up (SetCapReached): they
	// run as backups until the next period. Under tuningMu.
	capReached []bool

	pending   *handshake.Initiator
	pendingID uint8
	keyID     uint8
	hsSent    time.Time
	lastHS    time.Time

	// The headend's cookie replies (package cookie), handled on the uplinks' read
	// loops: under cookieMu, not hsMu, which a handshake's Finish holds for long.
	opener   *cookie.Opener
	cookieMu sync.Mutex
	lastInit sentInit
	cookies  []heldCookie // by uplink index
}

// sentInit is the INIT of the handshake in progress, for sending it again with a mac2.
type sentInit struct {
	keyID  uint8
	body   wire.HandshakeBody // Mac2 nil: sendInit adds one per uplink
	resent []bool             // by uplink index: sent again with a cookie already
}

// heldCookie is the last cookie the headend sent for an uplink's address.
type heldCookie struct {
	cookie cookie.Cookie
	at     time.Time
}

// NewCPE opens one socket per uplink, bound to its interface and source address.
func NewCPE(cfg CPEConfig, tun Packet, m *metrics.Set, log *slog.Logger) (*CPE, error) {
	c := &CPE{
		cfg: cfg, tun: tun, m: m, log: log.With("role", "cpe"),
		macH: auth.MacKey(cfg.HeadendKey), macL: auth.MacKey(cfg.Local.Public()),
		localIndex: randomIndex(), started: clock.Nanos(),
		hsSlot: make(chan struct{}, 1), announceNow: make(chan struct{}, 1),
		opener: cookie.NewOpener(cfg.HeadendKey),
	}
	for _, u := range cfg.Uplinks {
		uc, err := c.openUplink(u)
		if err != nil {
			c.closeConns()
			return nil, fmt.Errorf("uplink %s: %w", u.Spec.Name, err)
		}
		uc.mtu.Store(uint32(u.MTU))
		c.conns = append(c.conns, uc)
		c.tuning = append(c.tuning, tuning(u.Spec))
		c.capReached = append(c.capReached, false)
	}
	c.cookies = make([]heldCookie, len(c.conns))
	m.PeerSession.WithLabelValues(cfg.Session.Peer).Set(0)
	return c, nil
}

// errStandIn is what sending on an uplink that still has its stand-in socket returns.
var errStandIn = errors.New("uplink not bound to its interface yet")

// openUplink binds an uplink's socket to its interface and source address. An uplink
// that cannot have one yet (Waiting, or its interface or address vanished since the
// daemon looked) gets a stand-in socket and starts offline: the CPE runs on the other
// uplinks meanwhile. Other failures (the port taken, no permission) are errors.
func (c *CPE) openUplink(u Uplink) (*uplinkConn, error) {
	why := u.Waiting
	if why == "" {
		conn, err := listenUDP(netip.AddrPortFrom(u.Source, c.cfg.LocalPort), u.Interface)
		switch {
		case err == nil:
			return newUplinkConn(conn), nil
		case errors.Is(err, unix.ENODEV):
			why = "interface " + u.Interface + " not found"
		case errors.Is(err, unix.EADDRNOTAVAIL):
			why = "source " + u.Source.String() + " not on " + u.Interface
		default:
			return nil, err
		}
	}
	conn, err := standInSocket(u.Source.Is6())
	if err != nil {
		return nil, err
	}
	c.log.Warn("uplink not usable yet: it joins the bond when its interface has its address "+
		"(check uplinks[].interface and source if it never does)", "link", u.Spec.Name, "why", why)
	uc := newUplinkConn(conn)
	uc.standIn.Store(true)
	uc.noSource.Store(true)
	return uc, nil
}

// Run moves packets until ctx ends.
func (c *CPE) Run(ctx context.Context) error {
	defer c.closeConns()
	var wg sync.WaitGroup
	for i := range c.conns {
		wg.Add(1)
		go func() { defer wg.Done(); c.readUplink(ctx, i) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); readTun(ctx, c.tun, c.m, func(buf []byte) bool { return c.route(buf) }) }()

	ticker := time.NewTicker(c.cfg.Session.Probe)
	defer ticker.Stop()
	lag := newLoopLag(c.cfg.Session.Probe, c.m.ControlLoopLate, c.log)
	announce := time.NewTicker(time.Second)
	defer announce.Stop()
	c.maybeHandshake(time.Now())
	for {
		select {
		case <-ctx.Done():
			c.closeConns()
			c.tun.Close()
			if s := c.session.Load(); s != nil {
				s.close()
			}
			wg.Wait()
			return nil
		case now := <-ticker.C:
			lag.observe(time.Now())
			c.maybeHandshake(now)
			if s := c.session.Load(); s != nil {
				s.tick(now)
			}
		case <-announce.C:
			if s := c.session.Load(); s != nil {
				c.announceLinks(s, false)
			}
		case <-c.announceNow:
			if s := c.session.Load(); s != nil {
				c.announceLinks(s, true)
			}
		}
	}
}

func (c *CPE) route(buf []byte) bool {
	s := c.session.Load()
	return s != nil && s.SendData(buf)
}

func (c *CPE) closeConns() {
	for _, u := range c.conns {
		u.get().Close()
	}
}

// Silence is how long the headend has not been heard from: since its last authenticated
// packet, or since the CPE started if it never answered.
func (c *CPE) Silence() time.Duration {
	last := c.lastHeard.Load()
	if last == 0 {
		last = c.started
	}
	return time.Duration(clock.Nanos() - last)
}

// maybeHandshake starts a handshake when there is no session, when the current keys are
// due for rotation, or when the headend has been silent long enough that it may have lost
// our session; and retries one that got no answer.
func (c *CPE) maybeHandshake(now time.Time) {
	c.hsMu.Lock()
	defer c.hsMu.Unlock()
	s := c.session.Load()
	silent := time.Duration(clock.Nanos() - c.lastHeard.Load())
	due := s == nil ||
		now.Sub(c.lastHS) > c.cfg.Rekey ||
		silent > 3*c.cfg.Session.DownAfter
	if !due || (c.pending != nil && now.Sub(c.hsSent) < time.Second) {
		return
	}
	init := handshake.NewInitiator(c.cfg.Local, c.cfg.HeadendKey)
	msg, err := init.Init(now)
	if err != nil {
		c.log.Error("handshake: cannot create init", "err", err)
		return
	}
	c.pending, c.pendingID, c.hsSent = init, c.keyID+1, now
	body := wire.HandshakeBody{SenderIndex: c.localIndex, Noise: msg}
	c.cookieMu.Lock()
	defer c.cookieMu.Unlock()
	c.lastInit = sentInit{keyID: c.pendingID, body: body, resent: make([]bool, len(c.conns))}
	// The same INIT goes out on every uplink: whichever reaches the headend first wins
	// (it drops the others as copies), so one working link suffices.
	for i := range c.conns {
		c.sendInit(i, now)
	}
	c.log.Debug("handshake init sent", "key_id", c.pendingID)
}

// sendInit sends lastInit on uplink i, with a mac2 if the uplink holds a cookie young
// enough. Under cookieMu.
func (c *CPE) sendInit(i int, now time.Time) {
	u := c.conns[i]
	if u.standIn.Load() {
		return // not bound to its uplink yet: nothing it sends could arrive
	}
	body, held := c.lastInit.body, c.cookies[i]
	h := wire.Header{Type: wire.TypeHandshakeInit, LinkID: c.cfg.Uplinks[i].Spec.ID, KeyID: c.lastInit.keyID, Timestamp: clock.Micros32(clock.Nanos())}
	withMac2 := !held.at.IsZero() && now.Sub(held.at) < cookie.Lifetime
	if withMac2 {
		h.Flags |= wire.FlagMac2
		body.Mac2 = make([]byte, wire.Mac2Len) // room: PutMac2 fills it
	}
	pkt := body.Append(h.Append(nil))
	if withMac2 {
		cookie.PutMac2(held.cookie, pkt) // before the tag, which covers it
	}
	auth.Seal(c.macH, pkt)
	if _, err := u.get().WriteToUDPAddrPort(pkt, c.cfg.Uplinks[i].Endpoint); err != nil {
		c.log.Debug("handshake init not sent", "link", c.cfg.Uplinks[i].Spec.Name, "err", err)
	}
}

// onCookieReply takes the cookie a headend under load sent for an uplink's address
// instead of answering its INIT, and sends that INIT again on the uplink with a mac2,
// once: the headend answers those on the uplink's own limit.
func (c *CPE) onCookieReply(h *wire.Header, pkt []byte) {
	msg, r := openSessionless(c.macH, pkt) // the headend tags it with its own mac key
	if r != wire.ReasonNone {
		c.drop(r)
		return
	}
	i := c.uplinkIndex(h.LinkID)
	c.cookieMu.Lock()
	defer c.cookieMu.Unlock()
	sent := &c.lastInit
	if i < 0 || sent.body.Noise == nil || h.Session != c.localIndex || h.KeyID != sent.keyID {
		c.drop(wire.ReasonUnknownSession) // not for the handshake in progress
		return
	}
	ck, err := c.opener.Open(msg.Body.(wire.CookieReplyBody), sent.body.Ephemeral())
	if err != nil {
		c.drop(wire.ReasonBadTag)
		return
	}
	now := time.Now()
	c.cookies[i] = heldCookie{cookie: ck, at: now}
	c.m.CookieReplies.WithLabelValues("received").Inc()
	if sent.resent[i] {
		return // the headend refused the INIT with the cookie too: the next retry has it
	}
	sent.resent[i] = true
	c.log.Info("headend under handshake load: sending the INIT again with its cookie", "link", c.cfg.Uplinks[i].Spec.Name)
	c.sendInit(i, now)
}

// uplinkIndex is the index of the uplink with link id id, or -1.
func (c *CPE) uplinkIndex(id uint8) int {
	for i, u := range c.cfg.Uplinks {
		if u.Spec.ID == id {
			return i
		}
	}
	return -1
}

func (c *CPE) onDatagram(pkt []byte, from netip.AddrPort, arr arrival) {
	h, err := parseDatagram(pkt)
	if err != nil {
		c.drop(wire.ReasonOf(err))
		return
	}
	if h.Type == wire.TypeCookieReply {
		c.onCookieReply(&h, pkt)
		return
	}
	if h.Type == wire.TypeHandshakeResp {
		// Finishing a handshake costs several Curve25519 operations (tens of ms on a
		// small router CPU). Done on this uplink's read loop it would stall the link's
		// data behind it and make the resequencer give up on it; so it runs on its own,
		// one at a time (a flood of responses cannot pile up goroutines).
		select {
		case c.hsSlot <- struct{}{}:
			resp := append([]byte(nil), pkt...)
			go func() {
				defer func() { <-c.hsSlot }()
				c.onResponse(&h, resp)
			}()
		default:
			c.drop(wire.ReasonRateLimited)
		}
		return
	}
	s := c.session.Load()
	if s == nil || h.Session != c.localIndex {
		c.drop(wire.ReasonUnknownSession)
		return
	}
	if reason, ok := s.receive(&h, pkt, netip.AddrPort{}, time.Now(), arr); !ok {
		c.drop(reason)
		return
	}
	c.lastHeard.Store(clock.Nanos())
}

func (c *CPE) onResponse(h *wire.Header, pkt []byte) {
	msg, r := openSessionless(c.macL, pkt)
	if r != wire.ReasonNone {
		c.drop(r)
		return
	}
	body := msg.Body.(wire.HandshakeBody)
	c.hsMu.Lock()
	defer c.hsMu.Unlock()
	if c.pending == nil || h.Session != c.localIndex || h.KeyID != c.pendingID {
		c.drop(wire.ReasonUnknownSession)
		return
	}
	keys, err := c.pending.Finish(body.Noise)
	if err != nil {
		c.log.Warn("handshake response rejected", "err", err)
		c.m.Handshakes.WithLabelValues("headend", "rejected").Inc()
		return
	}
	c.pending = nil
	c.cookieMu.Lock()
	c.lastInit = sentInit{} // a late cookie reply has nothing to send again
	c.cookieMu.Unlock()
	c.keyID = c.pendingID
	c.lastHS = time.Now()
	c.lastHeard.Store(clock.Nanos())
	gen := &keyGen{id: c.keyID, send: auth.Key(keys.Send), recv: auth.Key(keys.Recv), created: time.Now()}

	s := c.session.Load()
	if s == nil || s.peerIndex.Load() != body.SenderIndex {
		// A new session at the headend (first contact, or it restarted): start both
		// directions' sequence spaces afresh.
		if s != nil {
			s.close()
		}
		s = c.newSession(body.SenderIndex)
		s.installKeys(gen, true)
		c.session.Store(s)
		c.m.Sessions.Set(1)
		c.m.PeerSession.WithLabelValues(c.cfg.Session.Peer).Set(1)
		c.log.Info("session established", "headend_index", body.SenderIndex)
		c.announceLinks(s, true) // a new session: on every link
	} else {
		s.installKeys(gen, true)
		c.log.Debug("rekeyed", "key_id", c.keyID)
	}
	c.m.Handshakes.WithLabelValues("headend", "ok").Inc()
}

func (c *CPE) newSession(peerIndex uint32) *Session {
	s := newSession(c.cfg.Session, c.m, c.log, c.localIndex, c.deliver)
	s.peerIndex.Store(peerIndex)
	ids := make([]uint8, 0, len(c.cfg.Uplinks))
	specs := c.uplinkSpecs()
	for i, u := range c.cfg.Uplinks {
		conn := c.conns[i]
		ep := u.Endpoint
		spec := specs[i]
		spec.Local, spec.Interface = localAddrPort(conn.get()), u.Interface
		l := s.addLink(spec, func(_ *link, b []byte) error {
			if conn.standIn.Load() {
				return errStandIn
			}
			_, err := conn.get().WriteToUDPAddrPort(b, ep)
			return err
		})
		l.remote.Store(&ep)
		if offline, cause := conn.offline(); offline {
			s.setLinkOffline(spec.ID, offlineUplink, true, cause)
		}
		ids = append(ids, spec.ID)
	}
	s.setLinkIDs(ids)
	return s
}

// announceLinks tells the headend each uplink's class and downstream rate prior, so its
// scheduler starts from the user's numbers rather than a guess, its MTU, so that the
// headend sends nothing larger, and whether it is offline, so that the headend stops
// sending on it at once rather than when its own probes and reports find it dead.
// all: on every link, whatever changed (a new session, an uplink's MTU or tuning that
// moved).
func (c *CPE) announceLinks(s *Session, all bool) {
	links := make([]wire.LinkParam, 0, len(c.cfg.Uplinks))
	specs := c.uplinkSpecs()
	for i, spec := range specs {
		mtu := min(c.conns[i].mtu.Load(), math.MaxUint16)
		offline, _ := c.conns[i].offline()
		links = append(links, wire.LinkParam{LinkID: spec.ID, Class: uint8(spec.Class), Offline: offline,
			MTU: uint16(mtu), RateBps: uint64(spec.RxRate)})
		if l := s.link(spec.ID); l != nil {
			l.m.mtu.Set(float64(mtu))
		}
	}
	c.announceMu.Lock()
	defer c.announceMu.Unlock()
	changed := !slices.Equal(links, c.lastParams)
	c.lastParams = links
	nth := c.announced.Add(1) - 1
	sessionLinks := s.allLinks()
	for _, l := range linkParamsRoutes(sessionLinks, all || changed, nth) {
		// Each copy takes its own control counter, or the peer's replay window would
		// reject all but the first.
		body := wire.LinkParamsBody{Counter: s.txCtrl.Add(1), Links: links}
		s.sendControl(l, wire.TypeLinkParams, 0, 0, body.Append(nil))
	}
	// The names only tell the headend's operator which link is which: one copy a
	// second, on each uplink in turn, gets through within as many seconds as there are
	// dead uplinks. Standby links carry none while a primary is up, unless all.
	names := make([]wire.LinkName, 0, len(c.cfg.Uplinks))
	for _, u := range c.cfg.Uplinks {
		names = append(names, wire.LinkName{LinkID: u.Spec.ID, Name: u.Spec.Name})
	}
	spareStandby := !all && slices.ContainsFunc(sessionLinks, upPrimary)
	k := int(nth) % len(c.cfg.Uplinks)
	if l := s.link(c.cfg.Uplinks[k].Spec.ID); l != nil && !(spareStandby && l.isStandby()) {
		s.sendLinkNames(l, names)
	}
}

// linkParamsRoutes picks the links the nth LINK_PARAMS goes on.
//
// A message that says something new (news) goes on every link: at session start none is
// known to be up yet, and a change (an MTU that shrank, a line made a backup) must not
// wait for one link to deliver it. A message that says what the last one said only
// makes up for a lost copy, once a second: one primary link that is up carries it, each
// in turn. (On every link it took 287 B/s of the lab's 4.3 Mbit/s homogeneous bond,
// 0.05 %, where the goodput sits within a percent of the wire format's ceiling.)
// Standby links (overflow, backup), which a metered line bills, get every
// standbyAnnounceEvery-th copy besides, so that the headend learns the classes from
// them too if the primaries die. With no primary up, every link carries each one, as
// at the start.
func linkParamsRoutes(links []*link, news bool, nth uint32) []*link {
	up := slices.DeleteFunc(slices.Clone(links), func(l *link) bool { return !upPrimary(l) })
	if news || len(up) == 0 {
		return links
	}
	routes := []*link{up[int(nth)%len(up)]}
	if nth%standbyAnnounceEvery == 0 {
		for _, l := range links {
			if l.isStandby() {
				routes = append(routes, l)
			}
		}
	}
	return routes
}

// standbyAnnounceEvery: a standby link carries one LINK_PARAMS in this many while a
// primary is up (the primaries carry every one), so that a headend that lost the CPE's
// state still learns the classes from it within half a minute if the primaries die.
const standbyAnnounceEvery = 30

func (c *CPE) deliver(pkt []byte) {
	if _, err := c.tun.Write(pkt); err != nil {
		c.log.Debug("tunnel write failed", "err", err)
	}
}

func (c *CPE) drop(r wire.Reason) { c.m.Drops.WithLabelValues(r.String()).Inc() }

// randomIndex returns a random non-zero session index.
func randomIndex() uint32 {
	var b [4]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			panic("crypto/rand failed: " + err.Error())
		}
		if v := binary.BigEndian.Uint32(b[:]); v != 0 {
			return v
		}
	}
}
