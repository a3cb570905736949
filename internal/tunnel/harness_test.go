package tunnel

// Test harness for the in-process datapath tests: a channel-backed TUN, a UDP relay
// that plays the NAT between the CPE's uplinks and the headend (and lets tests drop,
// count, capture and mangle datagrams), and a bed that wires a headend and CPEs
// together over 127.0.0.1.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/aggd/aggd/internal/handshake"
	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/reseq"
	"github.com/aggd/aggd/internal/wire"
)

// deadline bounds every wait for an asynchronous outcome. It is generous on purpose:
// it only decides when a test gives up, never whether something was fast enough.
const deadline = 30 * time.Second

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------------
// Fake TUN

// fakeTun is a Packet backed by channels: the test writes inner packets into in (the
// datapath Reads them) and reads what the datapath Writes from out.
type fakeTun struct {
	in   chan []byte
	out  chan []byte
	done chan struct{}
	once sync.Once
	// overflow counts writes refused because out was full; a test that sees loss
	// checks it to tell a datapath loss from a harness one.
	overflow atomic.Int64
}

func newFakeTun() *fakeTun {
	return &fakeTun{in: make(chan []byte), out: make(chan []byte, 1<<16), done: make(chan struct{})}
}

func (f *fakeTun) Read(b []byte) (int, error) {
	select {
	case p := <-f.in:
		return copy(b, p), nil
	case <-f.done:
		return 0, os.ErrClosed
	}
}

func (f *fakeTun) Write(b []byte) (int, error) {
	select {
	case <-f.done:
		return 0, os.ErrClosed
	default:
	}
	select {
	case f.out <- append([]byte(nil), b...):
		return len(b), nil
	default:
		f.overflow.Add(1)
		return 0, errors.New("fake tun: output queue full")
	}
}

func (f *fakeTun) Close() error {
	f.once.Do(func() { close(f.done) })
	return nil
}

// inject hands one packet to the datapath's tunnel reader.
func (f *fakeTun) inject(t testing.TB, p []byte) {
	t.Helper()
	select {
	case f.in <- p:
	case <-f.done:
		t.Fatalf("inject: tunnel closed")
	case <-time.After(deadline):
		t.Fatalf("inject: the datapath does not read its tunnel")
	}
}

// pending returns what the datapath has written so far without waiting.
func (f *fakeTun) pending() [][]byte {
	var got [][]byte
	for {
		select {
		case p := <-f.out:
			got = append(got, p)
		default:
			return got
		}
	}
}

// ---------------------------------------------------------------------------------
// Inner packets

// ipv4Packet builds an IPv4/UDP packet of size bytes whose payload starts with id.
func ipv4Packet(src, dst netip.Addr, id uint32, size int) []byte {
	size = max(size, 20+8+4)
	p := make([]byte, size)
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(size))
	binary.BigEndian.PutUint16(p[4:], uint16(id))
	p[8] = 64
	p[9] = 17
	s, d := src.As4(), dst.As4()
	copy(p[12:16], s[:])
	copy(p[16:20], d[:])
	binary.BigEndian.PutUint16(p[10:], ipv4Checksum(p[:20]))
	binary.BigEndian.PutUint16(p[20:], 40000)
	binary.BigEndian.PutUint16(p[22:], 9)
	binary.BigEndian.PutUint16(p[24:], uint16(size-20))
	fillPayload(p[28:], id)
	return p
}

// ipv4Checksum computes an IPv4 header's checksum, its checksum field read as zero.
func ipv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		if i != 10 {
			sum += uint32(binary.BigEndian.Uint16(h[i:]))
		}
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// ipv6Packet builds an IPv6/UDP packet of size bytes whose payload starts with id.
func ipv6Packet(src, dst netip.Addr, id uint32, size int) []byte {
	size = max(size, 40+8+4)
	p := make([]byte, size)
	p[0] = 0x60
	binary.BigEndian.PutUint16(p[4:], uint16(size-40))
	p[6] = 17
	p[7] = 64
	s, d := src.As16(), dst.As16()
	copy(p[8:24], s[:])
	copy(p[24:40], d[:])
	binary.BigEndian.PutUint16(p[40:], 40000)
	binary.BigEndian.PutUint16(p[42:], 9)
	binary.BigEndian.PutUint16(p[44:], uint16(size-40))
	fillPayload(p[48:], id)
	return p
}

func fillPayload(b []byte, id uint32) {
	binary.BigEndian.PutUint32(b, id)
	x := id*2654435761 + 1
	for i := 4; i < len(b); i++ {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
}

// packetID reads the id ipv4Packet or ipv6Packet put into a packet.
func packetID(p []byte) uint32 {
	switch {
	case len(p) >= 32 && p[0]>>4 == 4:
		return binary.BigEndian.Uint32(p[28:])
	case len(p) >= 52 && p[0]>>4 == 6:
		return binary.BigEndian.Uint32(p[48:])
	}
	return ^uint32(0)
}

var idCounter atomic.Uint32

// packets builds n IPv4 packets from src to dst with fresh ids and varied sizes.
func packets(src, dst netip.Addr, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		id := idCounter.Add(1)
		out[i] = ipv4Packet(src, dst, id, 100+int(id*37%1100))
	}
	return out
}

// ---------------------------------------------------------------------------------
// Transfers

// transfer writes pkts into from, one at a time, and checks that each comes out of the
// tunnel dest(i) chooses unchanged, and that every destination yields its packets in
// the order they were written. At most window packets are in flight, so that the
// loopback sockets' buffers are never the reason for a loss.
func transfer(from *fakeTun, pkts [][]byte, dest func(i int) *fakeTun, window int) error {
	// Every destination's queue, read directly (no forwarding goroutine that could
	// take a packet meant for the next transfer).
	queues := map[*fakeTun][]int{}
	var tuns []*fakeTun
	cases := []reflect.SelectCase{{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(time.After(deadline))}}
	for i := range pkts {
		if d := dest(i); queues[d] == nil {
			queues[d] = []int{}
			tuns = append(tuns, d)
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(d.out)})
		}
	}
	received := 0
	receive := func() error {
		cases[0].Chan = reflect.ValueOf(time.After(deadline))
		chosen, v, _ := reflect.Select(cases)
		if chosen == 0 {
			lost := 0
			for _, q := range queues {
				lost += len(q)
			}
			return fmt.Errorf("%d of %d packets never arrived", lost, len(pkts))
		}
		d, pkt := tuns[chosen-1], v.Bytes()
		q := queues[d]
		if len(q) == 0 {
			return fmt.Errorf("unexpected packet id %d (%d bytes) after %d of %d received", packetID(pkt), len(pkt), received, len(pkts))
		}
		want := pkts[q[0]]
		if string(pkt) != string(want) {
			return fmt.Errorf("packet %d: got id %d (%d bytes), want id %d (%d bytes): lost, reordered, duplicated or altered",
				q[0], packetID(pkt), len(pkt), packetID(want), len(want))
		}
		queues[d] = q[1:]
		received++
		return nil
	}
	for i, p := range pkts {
		for i-received >= window {
			if err := receive(); err != nil {
				return err
			}
		}
		select {
		case from.in <- p:
		case <-time.After(deadline):
			return errors.New("the datapath does not read its tunnel")
		}
		queues[dest(i)] = append(queues[dest(i)], i)
	}
	for received < len(pkts) {
		if err := receive(); err != nil {
			return err
		}
	}
	return nil
}

func to(t *fakeTun) func(int) *fakeTun { return func(int) *fakeTun { return t } }

// mustTransfer is transfer for the test goroutine.
func mustTransfer(t testing.TB, from, dst *fakeTun, pkts [][]byte) {
	t.Helper()
	if err := transfer(from, pkts, to(dst), 16); err != nil {
		t.Fatal(err)
	}
}

// ---------------------------------------------------------------------------------
// Relay: a NAT between the CPE's uplinks and the headend

// relay forwards datagrams between clients (CPE uplink sockets) and one server (the
// headend), giving each client its own external socket like a NAT mapping.
type relay struct {
	front  *net.UDPConn
	server netip.AddrPort
	hook   atomic.Pointer[hookFunc]

	mu     sync.Mutex
	maps   map[netip.AddrPort]*mapping
	closed bool
	wg     sync.WaitGroup
}

// hookFunc sees every datagram the relay forwards (up: client to server) and returns
// what to forward instead; nil drops it.
type hookFunc func(m *mapping, up bool, pkt []byte) []byte

type mapping struct {
	client netip.AddrPort

	mu        sync.Mutex
	ext       *net.UDPConn
	blackhole bool // drop everything in both directions
	dataUp    int  // DATA datagrams from the client, including dropped ones
	dataDown  int  // DATA datagrams from the server, including dropped ones
}

func newRelay(t testing.TB, server netip.AddrPort) *relay {
	front, err := listenUDP(netip.MustParseAddrPort("127.0.0.1:0"), "")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{front: front, server: server, maps: map[netip.AddrPort]*mapping{}}
	r.wg.Add(1)
	go r.readFront()
	t.Cleanup(r.close)
	return r
}

func (r *relay) addr() netip.AddrPort { return r.front.LocalAddr().(*net.UDPAddr).AddrPort() }

func (r *relay) setHook(h hookFunc) {
	if h == nil {
		r.hook.Store(nil)
		return
	}
	r.hook.Store(&h)
}

func (r *relay) close() {
	r.mu.Lock()
	r.closed = true
	r.front.Close()
	for _, m := range r.maps {
		m.mu.Lock()
		m.ext.Close()
		m.mu.Unlock()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func isData(pkt []byte) bool {
	return len(pkt) >= wire.HeaderLen && pkt[0] == wire.Version<<4|uint8(wire.TypeData)
}

func (r *relay) readFront() {
	defer r.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, from, err := r.front.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		m := r.mappingFor(from)
		if m == nil {
			return
		}
		pkt := append([]byte(nil), buf[:n]...)
		m.mu.Lock()
		if isData(pkt) {
			m.dataUp++
		}
		bh, ext := m.blackhole, m.ext
		m.mu.Unlock()
		if bh {
			continue
		}
		if h := r.hook.Load(); h != nil {
			if pkt = (*h)(m, true, pkt); pkt == nil {
				continue
			}
		}
		_, _ = ext.WriteToUDPAddrPort(pkt, r.server)
	}
}

// mappingFor returns the client's mapping, creating it on its first datagram.
func (r *relay) mappingFor(client netip.AddrPort) *mapping {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	if m := r.maps[client]; m != nil {
		return m
	}
	ext, err := listenUDP(netip.MustParseAddrPort("127.0.0.1:0"), "")
	if err != nil {
		panic(err)
	}
	m := &mapping{client: client, ext: ext}
	r.maps[client] = m
	r.wg.Add(1)
	go r.readExt(m, ext)
	return m
}

func (r *relay) readExt(m *mapping, ext *net.UDPConn) {
	defer r.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, _, err := ext.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		pkt := append([]byte(nil), buf[:n]...)
		m.mu.Lock()
		if isData(pkt) {
			m.dataDown++
		}
		bh := m.blackhole
		m.mu.Unlock()
		if bh {
			continue
		}
		if h := r.hook.Load(); h != nil {
			if pkt = (*h)(m, false, pkt); pkt == nil {
				continue
			}
		}
		_, _ = r.front.WriteToUDPAddrPort(pkt, m.client)
	}
}

// existing returns the client's mapping, waiting for its first datagram.
func (r *relay) existing(t testing.TB, client netip.AddrPort) *mapping {
	t.Helper()
	var m *mapping
	waitFor(t, "a relay mapping for "+client.String(), func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		m = r.maps[client]
		return m != nil
	})
	return m
}

// rebind moves the mapping to a new external port, as a NAT that lost its state does.
func (r *relay) rebind(t testing.TB, m *mapping) netip.AddrPort {
	t.Helper()
	ext, err := listenUDP(netip.MustParseAddrPort("127.0.0.1:0"), "")
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m.mu.Lock()
	old := m.ext
	m.ext = ext
	m.mu.Unlock()
	old.Close()
	r.wg.Add(1)
	go r.readExt(m, ext)
	return ext.LocalAddr().(*net.UDPAddr).AddrPort()
}

func (m *mapping) external() netip.AddrPort {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ext.LocalAddr().(*net.UDPAddr).AddrPort()
}

func (m *mapping) setBlackhole(on bool) {
	m.mu.Lock()
	m.blackhole = on
	m.mu.Unlock()
}

func (m *mapping) data() (up, down int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dataUp, m.dataDown
}

// ---------------------------------------------------------------------------------
// The bed: one headend, CPEs behind the relay

var discard = slog.New(slog.DiscardHandler)

// quietLink gives a link made outside a session (addLink) a logger that discards.
func quietLink(l *link) *link {
	l.logged.Store(discard)
	return l
}

// failureLog is the log of a bed's daemons, kept only when AGGD_TEST_LOG is set (to
// debug or info): in memory, and written to a file if the test fails, so a rare failure
// of a looped test (go test -count=1000 -failfast) comes with the daemons' own account
// of it. The headend and the CPEs write to the one log, each line naming its side.
type failureLog struct {
	level slog.Level
	mu    sync.Mutex
	buf   bytes.Buffer
}

// newFailureLog returns the test's log, or nil when AGGD_TEST_LOG asks for none.
func newFailureLog(t *testing.T) *failureLog {
	level, ok := map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo}[os.Getenv("AGGD_TEST_LOG")]
	if !ok {
		return nil
	}
	l := &failureLog{level: level}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		f, err := os.CreateTemp("", "aggd-"+strings.ReplaceAll(t.Name(), "/", "_")+"-*.log")
		if err != nil {
			t.Logf("the daemons' log was not written: %v", err)
			return
		}
		defer f.Close()
		l.mu.Lock()
		defer l.mu.Unlock()
		if _, err := f.Write(l.buf.Bytes()); err != nil {
			t.Logf("the daemons' log was not written: %v", err)
			return
		}
		t.Logf("the daemons' log: %s", f.Name())
	})
	return l
}

// debugLog is a logger that writes every line, debug ones included, to buf: for tests
// that read what was logged.
func debugLog(buf *bytes.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// logger is one daemon's view of the log: discard when there is none.
func (l *failureLog) logger(side string) *slog.Logger {
	if l == nil {
		return discard
	}
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: l.level})).With("side", side)
}

func (l *failureLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// linkRate is the rate prior every test uplink announces in both directions. It is
// low on purpose: the scheduler then sees a few packets as a backlog and spreads even
// light test traffic over every link.
const linkRate = 200e3

func testSession() SessionConfig {
	return SessionConfig{
		MaxHold:   time.Second,
		MaxBuffer: 4 << 20,
		Probe:     20 * time.Millisecond,
		DownAfter: 500 * time.Millisecond,
	}
}

type testPeer struct {
	name     string
	key      handshake.PrivateKey
	prefixes []netip.Prefix
	addr     netip.Addr // the CPE's tunnel address, the destination of downstream packets
}

func newPeer(t testing.TB, name, addr string, more ...string) testPeer {
	t.Helper()
	key, err := handshake.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr(addr)
	p := testPeer{name: name, key: key, addr: a, prefixes: []netip.Prefix{netip.PrefixFrom(a, a.BitLen())}}
	for _, s := range more {
		p.prefixes = append(p.prefixes, netip.MustParsePrefix(s))
	}
	return p
}

type bed struct {
	t      *testing.T
	key    handshake.PrivateKey
	he     *Headend
	heTun  *fakeTun
	heM    *metrics.Set
	relay  *relay
	listen netip.AddrPort
	cpes   []*cpeNode
	log    *failureLog // the daemons' log, nil unless AGGD_TEST_LOG is set
}

// bedHoldMargin is the hold margin (holdMargin) in a bed. The bed's links are
// loopback sockets and the relay's goroutines: their delays spread by how the host
// schedules those, which the links' one-way delays, sampled now and then, do not show.
// On a busy host a link's packets can come 10 ms behind the others' (four busy loops
// beside `go test -count=400 -run TestLinkDownAndUp`: 3 packets given up by the hold
// timer, then delivered late, in one run), and the bed's tests check that every packet
// comes through in order. Gaps the tests make on purpose are closed by the links'
// evidence or by loss notices, so a wide margin makes no test wait on it.
const bedHoldMargin = 500 * time.Millisecond

// widenMargin sets a margin the daemons read (holdMargin, repairMargin) to a bed's for
// the test. Called before the bed starts, it is restored last: cleanups run in
// reverse, so the bed's daemons have stopped by then.
func widenMargin(t *testing.T, margin *time.Duration, bed time.Duration) {
	saved := *margin
	*margin = bed
	t.Cleanup(func() { *margin = saved })
}

// internet is where upstream test packets go.
var internet = netip.MustParseAddr("198.51.100.7")

func newBed(t *testing.T, peers ...testPeer) *bed {
	t.Helper()
	return newBedWith(t, nil, peers...)
}

// newBedWith is newBed with the headend's config changed by tweak (if not nil) first.
func newBedWith(t *testing.T, tweak func(*HeadendConfig), peers ...testPeer) *bed {
	t.Helper()
	widenMargin(t, &holdMargin, bedHoldMargin)
	key, err := handshake.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	cfg := HeadendConfig{Local: key, Listen: netip.MustParseAddrPort("127.0.0.1:0"), Session: testSession()}
	for _, p := range peers {
		cfg.Peers = append(cfg.Peers, Peer{Name: p.name, Key: p.key.Public(), Prefixes: p.prefixes})
	}
	if tweak != nil {
		tweak(&cfg)
	}
	b := &bed{t: t, key: key, heTun: newFakeTun(), heM: metrics.New(), log: newFailureLog(t)}
	b.he, err = NewHeadend(cfg, b.heTun, b.heM, b.log.logger("headend"))
	if err != nil {
		t.Fatal(err)
	}
	b.listen = b.he.conn.LocalAddr().(*net.UDPAddr).AddrPort()
	b.relay = newRelay(t, b.listen)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = b.he.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(deadline):
			t.Error("headend Run did not return after cancel")
		}
	})
	return b
}

type cpeNode struct {
	t      *testing.T
	peer   testPeer
	c      *CPE
	tun    *fakeTun
	m      *metrics.Set
	cancel context.CancelFunc
	done   chan struct{}
}

// startCPE runs a CPE with n uplinks on 127.0.0.1 that reaches the headend through
// the relay.
func (b *bed) startCPE(p testPeer, n int, rekey time.Duration) *cpeNode {
	b.t.Helper()
	return b.startCPEWith(p, n, rekey, nil)
}

// startCPEWith is startCPE with the config changed by tweak (if not nil) first.
func (b *bed) startCPEWith(p testPeer, n int, rekey time.Duration, tweak func(*CPEConfig)) *cpeNode {
	b.t.Helper()
	cfg := CPEConfig{
		Local: p.key, HeadendKey: b.key.Public(),
		Session: testSession(), Rekey: rekey,
	}
	cfg.Session.Peer = "headend"
	for i := range n {
		cfg.Uplinks = append(cfg.Uplinks, Uplink{
			Spec:     LinkSpec{ID: uint8(i), Name: fmt.Sprintf("up%d", i), TxRate: linkRate, RxRate: linkRate},
			Source:   netip.MustParseAddr("127.0.0.1"),
			Endpoint: b.relay.addr(),
		})
	}
	if tweak != nil {
		tweak(&cfg)
	}
	node := &cpeNode{t: b.t, peer: p, tun: newFakeTun(), m: metrics.New(), done: make(chan struct{})}
	var err error
	node.c, err = NewCPE(cfg, node.tun, node.m, b.log.logger(p.name))
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	node.cancel = cancel
	go func() { defer close(node.done); _ = node.c.Run(ctx) }()
	b.t.Cleanup(node.stop)
	b.cpes = append(b.cpes, node)
	return node
}

// stop ends the CPE and waits for Run to return.
func (n *cpeNode) stop() {
	n.cancel()
	select {
	case <-n.done:
	case <-time.After(deadline):
		n.t.Error("CPE Run did not return after cancel")
	}
}

func (n *cpeNode) uplinkAddr(i int) netip.AddrPort {
	return n.c.conns[i].LocalAddr().(*net.UDPAddr).AddrPort()
}

// session is the headend's current session for a peer (nil if none).
func (b *bed) session(peer string) *Session {
	b.he.mu.RLock()
	defer b.he.mu.RUnlock()
	return b.he.byPeer[peer]
}

// waitReady waits until the CPE's session is up: every uplink answers probes on both
// sides and the headend schedules with the rates the CPE announced.
func (b *bed) waitReady(n *cpeNode) {
	b.t.Helper()
	waitFor(b.t, n.peer.name+" ready", func() bool {
		if n.c.session.Load() == nil {
			return false
		}
		for i := range n.c.conns {
			if gauge(n.m.LinkUp.WithLabelValues("headend", fmt.Sprintf("up%d", i))) != 1 {
				return false
			}
		}
		s := b.session(n.peer.name)
		if s == nil || s.peerIndex.Load() != n.c.localIndex {
			return false
		}
		links := s.allLinks()
		if len(links) != len(n.c.conns) {
			return false
		}
		for _, l := range links {
			if !l.isUp() || gauge(b.heM.LinkRatePrior.WithLabelValues(n.peer.name, l.spec.Name)) != linkRate {
				return false
			}
		}
		return true
	})
}

// diag describes every session's resequencer, for failure messages.
func (b *bed) diag() string {
	var out string
	stats := func(s *Session) reseq.Stats {
		s.rxMu.Lock()
		defer s.rxMu.Unlock()
		return s.reseq.Stats()
	}
	for _, n := range b.cpes {
		if s := n.c.session.Load(); s != nil {
			out += fmt.Sprintf("\n  %s receiving: %+v", n.peer.name, stats(s))
			out += fmt.Sprintf("\n  %s links: %s", n.peer.name, linkStates(s))
		}
		out += fmt.Sprintf("\n  %s drops: %v, not sent: %v", n.peer.name, nonZero(dropCounts(n.m)),
			gauge(n.m.TunnelTxPacket.WithLabelValues("no_session_or_link")))
	}
	out += fmt.Sprintf("\n  headend drops: %v, not sent: %v", nonZero(dropCounts(b.heM)),
		gauge(b.heM.TunnelTxPacket.WithLabelValues("no_session_or_link")))
	b.he.mu.RLock()
	defer b.he.mu.RUnlock()
	for name, s := range b.he.byPeer {
		out += fmt.Sprintf("\n  headend receiving from %s: %+v", name, stats(s))
		out += fmt.Sprintf("\n  headend's links to %s: %s", name, linkStates(s))
	}
	return out
}

// linkStates lists s's links with their health states and offline reasons.
func linkStates(s *Session) string {
	var out []string
	links := s.allLinks()
	slices.SortFunc(links, func(a, b *link) int { return int(a.spec.ID) - int(b.spec.ID) })
	for _, l := range links {
		l.mu.Lock()
		st := l.state
		l.mu.Unlock()
		out = append(out, fmt.Sprintf("%s=%v(offline %#x)", l.spec.Name, st, l.offline.Load()))
	}
	return strings.Join(out, " ")
}

// up sends count packets upstream from the CPE and checks they all arrive in order.
func (b *bed) up(n *cpeNode, count int) [][]byte {
	b.t.Helper()
	pkts := packets(n.peer.addr, internet, count)
	if err := transfer(n.tun, pkts, to(b.heTun), 16); err != nil {
		b.t.Fatalf("upstream: %v%s", err, b.diag())
	}
	return pkts
}

// ---------------------------------------------------------------------------------
// Metrics

// gauge reads a counter's or gauge's value. (prometheus/testutil would do, but it
// needs a module that go.sum does not list.)
func gauge(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	switch {
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	case d.Counter != nil:
		return d.Counter.GetValue()
	}
	panic("gauge: not a counter or gauge")
}

func drops(m *metrics.Set, reason wire.Reason) float64 {
	return gauge(m.Drops.WithLabelValues(reason.String()))
}

func nonZero(c map[wire.Reason]float64) map[string]float64 {
	out := map[string]float64{}
	for r, v := range c {
		if v != 0 {
			out[r.String()] = v
		}
	}
	return out
}

// dropCounts snapshots every reason's drop counter.
func dropCounts(m *metrics.Set) map[wire.Reason]float64 {
	out := map[wire.Reason]float64{}
	for _, r := range wire.AllReasons() {
		out[r] = drops(m, r)
	}
	return out
}

// copiesSent is how many redundant copies a daemon sent, on all its links together.
func copiesSent(m *metrics.Set) float64 {
	ch := make(chan prometheus.Metric, 16)
	go func() { m.LinkDuplicate.Collect(ch); close(ch) }()
	sum := 0.0
	for c := range ch {
		sum += gauge(c)
	}
	return sum
}
