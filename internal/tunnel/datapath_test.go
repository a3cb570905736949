package tunnel

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/auth"
	"github.com/aggd/aggd/internal/clock"
	"github.com/aggd/aggd/internal/handshake"
	"github.com/aggd/aggd/internal/wire"
)

// mappings returns the relay mapping of each of the CPE's uplinks.
func (b *bed) mappings(n *cpeNode) []*mapping {
	b.t.Helper()
	var ms []*mapping
	for i := range n.c.conns {
		ms = append(ms, b.relay.existing(b.t, n.uplinkAddr(i)))
	}
	return ms
}

type dataCount struct{ up, down int }

func snapshot(ms []*mapping) []dataCount {
	out := make([]dataCount, len(ms))
	for i, m := range ms {
		out[i].up, out[i].down = m.data()
	}
	return out
}

// both runs an upstream and a downstream transfer at the same time.
func (b *bed) both(n *cpeNode, count int) {
	b.t.Helper()
	up := packets(n.peer.addr, internet, count)
	down := packets(internet, n.peer.addr, count)
	var wg sync.WaitGroup
	var errUp, errDown error
	wg.Add(2)
	go func() { defer wg.Done(); errUp = transfer(n.tun, up, to(b.heTun), 16) }()
	go func() { defer wg.Done(); errDown = transfer(b.heTun, down, to(n.tun), 16) }()
	wg.Wait()
	if errUp != nil {
		b.t.Fatalf("upstream: %v%s", errUp, b.diag())
	}
	if errDown != nil {
		b.t.Fatalf("downstream: %v%s", errDown, b.diag())
	}
}

func udpSocket(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := listenUDP(netip.MustParseAddrPort("127.0.0.1:0"), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func sendTo(t *testing.T, c *net.UDPConn, to netip.AddrPort, pkt []byte) {
	t.Helper()
	if _, err := c.WriteToUDPAddrPort(pkt, to); err != nil {
		t.Fatal(err)
	}
}

func datagram(h wire.Header, body []byte) []byte {
	pkt := make([]byte, wire.HeaderLen+len(body))
	h.Put(pkt)
	copy(pkt[wire.HeaderLen:], body)
	return pkt
}

func currentKeyID(s *Session) uint8 {
	s.keys.mu.RLock()
	defer s.keys.mu.RUnlock()
	return s.keys.cur.id
}

func linkUp(n *cpeNode, i int) float64 {
	return gauge(n.m.LinkUp.WithLabelValues("headend", fmt.Sprintf("up%d", i)))
}

// linkStateChanged is the CPE's aggd_link_state_change_timestamp_seconds for uplink i.
func linkStateChanged(n *cpeNode, i int) float64 {
	return gauge(n.m.LinkStateChanged.WithLabelValues("headend", fmt.Sprintf("up%d", i)))
}

// timestamp is t as a Prometheus timestamp gauge holds it.
func timestamp(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// 1. Handshake, then data both ways over three uplinks.
func TestDataFlowsBothWaysOverEveryUplink(t *testing.T) {
	p := newPeer(t, "cpe1", "100.64.0.2", "10.1.0.0/16")
	b := newBed(t, p)
	n := b.startCPE(p, 3, time.Hour)
	b.waitReady(n)
	if got := gauge(b.heM.Sessions); got != 1 {
		t.Errorf("headend aggd_sessions = %v, want 1", got)
	}
	if got := gauge(n.m.Handshakes.WithLabelValues("headend", "ok")); got != 1 {
		t.Errorf("CPE handshakes ok = %v, want 1", got)
	}
	ms := b.mappings(n)
	before := snapshot(ms)

	b.up(n, 300)
	// Downstream to the tunnel address and into the routed LAN prefix.
	down := append(packets(internet, p.addr, 150), packets(internet, netip.MustParseAddr("10.1.2.3"), 150)...)
	mustTransfer(t, b.heTun, n.tun, down)

	after := snapshot(ms)
	for i := range ms {
		if after[i].up == before[i].up {
			t.Errorf("uplink %d carried no upstream data (counts %v -> %v)", i, before, after)
		}
		if after[i].down == before[i].down {
			t.Errorf("uplink %d carried no downstream data (counts %v -> %v)", i, before, after)
		}
	}
	// Counted after the send returns, so possibly after the packet arrived.
	waitFor(t, "300 packets counted as sent on each side", func() bool {
		return gauge(n.m.TunnelTxPacket.WithLabelValues("sent")) == 300 && gauge(b.heM.TunnelTxPacket.WithLabelValues("sent")) == 300
	})
	if got := gauge(n.m.TunnelTxPacket.WithLabelValues("no_session_or_link")) + gauge(b.heM.TunnelTxPacket.WithLabelValues("no_session_or_link")); got != 0 {
		t.Errorf("%v packets found no session or link", got)
	}
	for _, m := range []*cpeNode{n} {
		for r, v := range dropCounts(m.m) {
			if v != 0 {
				t.Errorf("CPE dropped %v packets as %v", v, r)
			}
		}
	}
}

// 2. Rekeying under load loses and duplicates nothing.
func TestRekeyUnderLoadLosesNothing(t *testing.T) {
	// The CPE completes a handshake on the reader goroutine of the uplink the response
	// came in on; under the race detector that takes about as long as the default hold
	// margin, and the gap it leaves would time out: the bed's wider margin covers it.
	p := newPeer(t, "cpe1", "100.64.0.2")
	b := newBed(t, p)
	n := b.startCPE(p, 3, 100*time.Millisecond)
	b.waitReady(n)
	s := b.session(p.name)
	cpeSession := n.c.session.Load()
	hs := func() float64 { return gauge(n.m.Handshakes.WithLabelValues("headend", "ok")) }
	heHS := func() float64 { return gauge(b.heM.Handshakes.WithLabelValues(p.name, "ok")) }
	start, heStart := hs(), heHS()

	end := time.Now().Add(deadline)
	for hs() < start+5 {
		if time.Now().After(end) {
			t.Fatalf("only %v rekeys while streaming", hs()-start)
		}
		b.both(n, 100)
	}
	// A final round proves nothing is stuck or duplicated behind the last rekey.
	b.both(n, 50)

	// The headend counts after it has sent its response.
	waitFor(t, "the headend to count the rekeys", func() bool { return heHS() >= heStart+5 })
	if b.session(p.name) != s || n.c.session.Load() != cpeSession {
		t.Errorf("a rekey replaced the session")
	}
	// A busy host can delay probe replies past the suspect threshold (33–44 ms under
	// the race detector beside two busy loops): the sender then copies the link's
	// packets onto another, and the later of each pair is dropped as a replay, by
	// design. Replays beyond the peer's copies would be the rekey's.
	heCopies, cpeCopies := copiesSent(b.heM), copiesSent(n.m)
	for r, v := range dropCounts(n.m) {
		if r == wire.ReasonReplay && v <= heCopies {
			continue
		}
		if v != 0 {
			t.Errorf("CPE dropped %v packets as %v (the headend sent %v copies)", v, r, heCopies)
		}
	}
	// The CPE sends each INIT on every uplink: the headend answers the first and drops
	// the copies unprocessed, neither a failed nor a rejected handshake (an alert
	// watches those).
	if got := gauge(b.heM.Handshakes.WithLabelValues("unknown", "rejected")); got != 0 {
		t.Errorf("the headend rejected %v handshakes of a CPE rekeying over three links", got)
	}
	for r, v := range dropCounts(b.heM) {
		if r == wire.ReasonReplay && v <= cpeCopies {
			continue
		}
		if v != 0 {
			t.Errorf("headend dropped %v packets as %v (the CPE sent %v copies)", v, r, cpeCopies)
		}
	}
	if lost := gauge(b.heM.ReorderLost.WithLabelValues(p.name)) + gauge(n.m.ReorderLost.WithLabelValues("headend")); lost != 0 {
		t.Errorf("resequencers gave up on %v sequence numbers", lost)
	}
}

// 3. The headend follows a link's new NAT mapping after an authenticated packet from
// it, and only then.
func TestHeadendFollowsNATRebinding(t *testing.T) {
	p := newPeer(t, "cpe1", "100.64.0.2")
	b := newBed(t, p)
	n := b.startCPE(p, 3, time.Hour)
	b.waitReady(n)
	s := b.session(p.name)
	l0 := s.link(0)
	m0 := b.relay.existing(t, n.uplinkAddr(0))
	remote := func() netip.AddrPort { return *l0.remote.Load() }
	if remote() != m0.external() {
		t.Fatalf("headend has link 0 at %v, the relay maps it to %v", remote(), m0.external())
	}

	// The NAT forgets the mapping and picks a new external port.
	newExt := b.relay.rebind(t, m0)
	waitFor(t, "the headend to follow link 0 to "+newExt.String(), func() bool { return remote() == newExt })
	before := snapshot([]*mapping{m0})[0]
	b.both(n, 200)
	if after := snapshot([]*mapping{m0})[0]; after.down == before.down || after.up == before.up {
		t.Errorf("link 0 carried no data after the rebinding: %v -> %v", before, after)
	}

	// Capture a genuine datagram of link 0 that the headend has processed.
	captured := make(chan []byte, 1)
	b.relay.setHook(func(m *mapping, up bool, pkt []byte) []byte {
		if m == m0 && up {
			select {
			case captured <- append([]byte(nil), pkt...):
				b.relay.setHook(nil)
			default:
			}
		}
		return pkt
	})
	genuine := <-captured
	b.up(n, 1) // the relay forwards in order: the captured datagram arrived before this one

	// From now on nothing genuine reaches the headend on link 0, so only what the
	// test sends can move it.
	m0.setBlackhole(true)
	other := udpSocket(t)
	otherAddr := other.LocalAddr().(*net.UDPAddr).AddrPort()

	forged := append([]byte(nil), genuine...)
	forged[wire.TagOffset] ^= 0x80
	badTag := drops(b.heM, wire.ReasonBadTag)
	sendTo(t, other, b.listen, forged)
	waitFor(t, "the forged datagram to be dropped", func() bool { return drops(b.heM, wire.ReasonBadTag) == badTag+1 })
	if remote() != newExt {
		t.Errorf("a datagram with a bad tag moved link 0 to %v", remote())
	}

	replay := drops(b.heM, wire.ReasonReplay)
	sendTo(t, other, b.listen, genuine)
	waitFor(t, "the replayed datagram to be dropped", func() bool { return drops(b.heM, wire.ReasonReplay) == replay+1 })
	if remote() != newExt {
		t.Errorf("a replayed datagram moved link 0 to %v", remote())
	}

	// A fresh packet sealed with the session's key does move it.
	cs := n.c.session.Load()
	k := cs.keys.sending()
	body := wire.FeedbackBody{Counter: cs.txCtrl.Add(1)}.Append(nil)
	fresh := datagram(wire.Header{Type: wire.TypeFeedback, LinkID: 0, KeyID: k.id, Session: cs.peerIndex.Load(), Timestamp: clock.Micros32(clock.Nanos())}, body)
	auth.Seal(k.send, fresh)
	sendTo(t, other, b.listen, fresh)
	waitFor(t, "the headend to follow an authenticated packet to "+otherAddr.String(), func() bool { return remote() == otherAddr })

	// And the CPE's own traffic brings it back.
	m0.setBlackhole(false)
	waitFor(t, "the headend to follow link 0 back to "+newExt.String(), func() bool { return remote() == newExt })
	b.both(n, 50)
}

// 4. A link that stops answering leaves the schedule; traffic goes on over the others;
// when it answers again it comes back.
func TestLinkDownAndUp(t *testing.T) {
	p := newPeer(t, "cpe1", "100.64.0.2")
	b := newBed(t, p)
	n := b.startCPE(p, 3, time.Hour)
	b.waitReady(n)
	ms := b.mappings(n)
	cut := time.Now()
	heUp := b.cutLink(n, ms, 1)
	if linkUp(n, 0) != 1 || linkUp(n, 2) != 1 {
		t.Fatal("the other links went down too")
	}
	wentDown := linkStateChanged(n, 1)
	if wentDown < timestamp(cut) || wentDown > timestamp(time.Now()) {
		t.Errorf("link 1's state change is stamped %.3f, not between its cut (%.3f) and now", wentDown, timestamp(cut))
	}

	before := snapshot(ms)
	b.both(n, 200)
	after := snapshot(ms)
	if after[1] != before[1] {
		t.Errorf("the dead link was given data: %v -> %v", before[1], after[1])
	}
	for _, i := range []int{0, 2} {
		if after[i].up == before[i].up || after[i].down == before[i].down {
			t.Errorf("link %d carried no data while link 1 was down: %v -> %v", i, before[i], after[i])
		}
	}

	ms[1].setBlackhole(false)
	waitFor(t, "link 1 up again on both sides", func() bool { return linkUp(n, 1) == 1 && heUp() == 1 })
	if back := linkStateChanged(n, 1); back <= wentDown || back > timestamp(time.Now()) {
		t.Errorf("link 1's return is stamped %.3f, not between its going down (%.3f) and now", back, wentDown)
	}
	before = snapshot(ms)
	b.both(n, 200)
	after = snapshot(ms)
	if after[1].up == before[1].up || after[1].down == before[1].down {
		t.Errorf("link 1 carried no data after coming back: %v -> %v", before[1], after[1])
	}
}

// cutLink blackholes uplink i of n both ways and waits until both sides find it down.
// It returns the headend's aggd_link_up gauge for the link.
func (b *bed) cutLink(n *cpeNode, ms []*mapping, i int) (heUp func() float64) {
	b.t.Helper()
	s := b.session(n.peer.name)
	heUp = func() float64 { return gauge(b.heM.LinkUp.WithLabelValues(n.peer.name, fmt.Sprintf("link%d", i))) }
	ms[i].setBlackhole(true)
	waitFor(b.t, fmt.Sprintf("link %d down on both sides", i), func() bool { return linkUp(n, i) == 0 && heUp() == 0 })
	if s.link(uint8(i)).isUp() || n.c.session.Load().link(uint8(i)).isUp() {
		b.t.Fatal("gauge says down but the link is up")
	}
	// The tick that declared it down reschedules right after; do it now so that no
	// packet can slip onto the dead link in between.
	n.c.session.Load().refreshSchedule()
	s.refreshSchedule()
	return heUp
}

// 5. Bad datagrams are dropped, counted by reason, and never reach the tunnel.
func TestDropsAreCountedAndNothingLeaks(t *testing.T) {
	p := newPeer(t, "cpe1", "100.64.0.2")
	b := newBed(t, p)
	n := b.startCPE(p, 3, time.Hour)
	b.waitReady(n)
	s := b.session(p.name)
	cs := n.c.session.Load()

	// A genuine DATA datagram, captured on its way and processed by the headend.
	captured := make(chan []byte, 1)
	b.relay.setHook(func(m *mapping, up bool, pkt []byte) []byte {
		if up && isData(pkt) {
			select {
			case captured <- append([]byte(nil), pkt...):
			default:
			}
		}
		return pkt
	})
	b.up(n, 1)
	b.relay.setHook(nil)
	genuine := <-captured

	heBase, cpeBase := dropCounts(b.heM), dropCounts(n.m)
	rejected := gauge(b.heM.Handshakes.WithLabelValues("unknown", "rejected"))
	inner := ipv4Packet(internet, p.addr, 1, 100)
	stranger, err := handshake.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	strangerInit := func(mac auth.Key) []byte {
		msg, err := handshake.NewInitiator(stranger, b.key.Public()).Init(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		pkt := datagram(wire.Header{Type: wire.TypeHandshakeInit, KeyID: 1}, wire.HandshakeBody{SenderIndex: 7, Noise: msg}.Append(nil))
		auth.Seal(mac, pkt)
		return pkt
	}
	unknownIndex := s.localIndex + 1
	for b.he.byIndex[unknownIndex] != nil || unknownIndex == 0 {
		unknownIndex++
	}

	raw := udpSocket(t)
	heCases := []struct {
		name   string
		reason wire.Reason
		pkt    []byte
	}{
		{"truncated", wire.ReasonTruncated, genuine[:wire.HeaderLen-1]},
		{"bad version", wire.ReasonBadVersion, append([]byte{0x21}, genuine[1:]...)},
		{"unknown session", wire.ReasonUnknownSession, datagram(wire.Header{Type: wire.TypeData, Session: unknownIndex, KeyID: currentKeyID(s)}, inner)},
		{"stale key", wire.ReasonStaleKey, datagram(wire.Header{Type: wire.TypeData, Session: s.localIndex, KeyID: currentKeyID(s) + 7}, inner)},
		{"bad tag", wire.ReasonBadTag, datagram(wire.Header{Type: wire.TypeData, Session: s.localIndex, KeyID: currentKeyID(s), Seq: 1 << 20}, inner)},
		{"replay", wire.ReasonReplay, genuine},
		{"handshake from an unknown key", wire.ReasonHandshakeFailed, strangerInit(auth.MacKey(b.key.Public()))},
	}
	want := heBase
	for _, c := range heCases {
		want[c.reason]++
		sendTo(t, raw, b.listen, c.pkt)
		waitFor(t, "headend drop: "+c.name, func() bool { return drops(b.heM, c.reason) == want[c.reason] })
	}
	if got := gauge(b.heM.Handshakes.WithLabelValues("unknown", "rejected")); got != rejected+1 {
		t.Errorf("rejected handshakes = %v, want %v", got, rejected+1)
	}

	// Genuine DATA whose body was damaged on the way: the tag covers only the
	// header, so the body check is what keeps it out of the tunnel.
	mangle := func(name string, reason wire.Reason, f func([]byte) []byte) {
		armed := true
		var mu sync.Mutex
		b.relay.setHook(func(m *mapping, up bool, pkt []byte) []byte {
			mu.Lock()
			defer mu.Unlock()
			if up && isData(pkt) && armed {
				armed = false
				return f(pkt)
			}
			return pkt
		})
		defer b.relay.setHook(nil)
		want[reason]++
		n.tun.inject(t, ipv4Packet(p.addr, internet, 99, 300))
		waitFor(t, "headend drop: "+name, func() bool {
			return drops(b.heM, reason) == want[reason] || len(b.heTun.out) > 0
		})
		if got := b.heTun.pending(); len(got) > 0 {
			t.Fatalf("%s: %d packet(s) reached the tunnel, first %x", name, len(got), got[0][:min(len(got[0]), 32)])
		}
	}
	mangle("empty data body", wire.ReasonBadLength, func(pkt []byte) []byte { return pkt[:wire.HeaderLen] })
	mangle("short inner packet", wire.ReasonBadLength, func(pkt []byte) []byte { return pkt[:len(pkt)-1] })
	mangle("not IP", wire.ReasonBadBody, func(pkt []byte) []byte { pkt[wire.HeaderLen] = 0x55; return pkt })

	// The CPE's uplink sockets drop the same way.
	cpeCases := []struct {
		name   string
		reason wire.Reason
		pkt    []byte
	}{
		{"truncated", wire.ReasonTruncated, []byte{0x11, 0, 0}},
		{"unknown session", wire.ReasonUnknownSession, datagram(wire.Header{Type: wire.TypeData, Session: n.c.localIndex + 1, KeyID: currentKeyID(cs)}, inner)},
		{"bad tag", wire.ReasonBadTag, datagram(wire.Header{Type: wire.TypeData, Session: n.c.localIndex, KeyID: currentKeyID(cs), Seq: 1 << 20}, inner)},
		{"handshake response with a bad mac", wire.ReasonBadTag, datagram(wire.Header{Type: wire.TypeHandshakeResp, Session: n.c.localIndex, KeyID: 1}, make([]byte, 4+48))},
	}
	cpeWant := cpeBase
	for _, c := range cpeCases {
		cpeWant[c.reason]++
		sendTo(t, raw, n.uplinkAddr(0), c.pkt)
		waitFor(t, "CPE drop: "+c.name, func() bool { return drops(n.m, c.reason) == cpeWant[c.reason] })
	}

	// Genuine traffic still flows, and it is all that reaches either tunnel: transfer
	// fails on any packet it did not send.
	b.both(n, 20)
	for r, v := range dropCounts(b.heM) {
		if v != want[r] {
			t.Errorf("headend drops %v = %v, want %v", r, v, want[r])
		}
	}
	for r, v := range dropCounts(n.m) {
		if v != cpeWant[r] {
			t.Errorf("CPE drops %v = %v, want %v", r, v, cpeWant[r])
		}
	}
}

// 6. A headend with two CPEs routes each packet to the session that owns the longest
// matching prefix.
func TestHeadendRoutesByLongestPrefix(t *testing.T) {
	a := newPeer(t, "cpeA", "100.64.0.2", "10.1.0.0/16", "2001:db8::/32")
	c := newPeer(t, "cpeB", "100.64.0.3", "10.1.5.0/24", "2001:db8:b::/48")
	b := newBed(t, a, c)
	na := b.startCPE(a, 3, time.Hour)
	nb := b.startCPE(c, 2, time.Hour)
	b.waitReady(na)
	b.waitReady(nb)
	if got := gauge(b.heM.Sessions); got != 2 {
		t.Errorf("headend aggd_sessions = %v, want 2", got)
	}

	// Nothing owns this one: it is counted and goes nowhere (transfer below would see
	// it arrive).
	noRoute := b.heM.TunnelTxPacket.WithLabelValues("no_session_or_link")
	b.heTun.inject(t, ipv4Packet(internet, netip.MustParseAddr("192.0.2.1"), 0, 100))
	waitFor(t, "the unroutable packet to be counted", func() bool { return gauge(noRoute) == 1 })

	v6src := netip.MustParseAddr("2001:db8:ffff::1")
	dests := []struct {
		dst string
		tun *fakeTun
	}{
		{"100.64.0.2", na.tun}, {"100.64.0.3", nb.tun},
		{"10.1.6.7", na.tun}, {"10.1.5.7", nb.tun}, {"10.1.4.255", na.tun}, {"10.1.5.255", nb.tun},
		{"2001:db8:1::1", na.tun}, {"2001:db8:b::1", nb.tun}, {"2001:db8:b:ffff::1", nb.tun}, {"2001:db8:c::1", na.tun},
	}
	var pkts [][]byte
	var tuns []*fakeTun
	for i := range 300 {
		d := dests[i%len(dests)]
		dst := netip.MustParseAddr(d.dst)
		id := idCounter.Add(1)
		if dst.Is4() {
			pkts = append(pkts, ipv4Packet(internet, dst, id, 200+i))
		} else {
			pkts = append(pkts, ipv6Packet(v6src, dst, id, 200+i))
		}
		tuns = append(tuns, d.tun)
	}
	if err := transfer(b.heTun, pkts, func(i int) *fakeTun { return tuns[i] }, 16); err != nil {
		t.Fatalf("%v%s", err, b.diag())
	}

	// Upstream from both CPEs at once. The headend's tunnel gets both; split what
	// comes out of it by source address so that each transfer checks its own order.
	split := map[netip.Addr]*fakeTun{a.addr: newFakeTun(), c.addr: newFakeTun()}
	stray := make(chan []byte, 1)
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case pkt := <-b.heTun.out:
				if q := split[netip.AddrFrom4([4]byte(pkt[12:16]))]; q != nil && pkt[0]>>4 == 4 {
					q.out <- pkt
				} else {
					select {
					case stray <- pkt:
					default:
					}
				}
			case <-stop:
				return
			}
		}
	}()
	var wg sync.WaitGroup
	var errA, errB error
	wg.Add(2)
	go func() { defer wg.Done(); errA = transfer(na.tun, packets(a.addr, internet, 200), to(split[a.addr]), 8) }()
	go func() { defer wg.Done(); errB = transfer(nb.tun, packets(c.addr, internet, 200), to(split[c.addr]), 8) }()
	wg.Wait()
	close(stop)
	if errA != nil || errB != nil {
		t.Fatalf("upstream: cpeA: %v; cpeB: %v%s", errA, errB, b.diag())
	}
	select {
	case pkt := <-stray:
		t.Errorf("the headend's tunnel got a packet from neither CPE: %x", pkt[:20])
	default:
	}
}

// 7. A CPE that restarts (new index, same key) replaces its old session at the
// headend, and traffic flows again.
func TestCPERestartReplacesSession(t *testing.T) {
	p := newPeer(t, "cpe1", "100.64.0.2")
	b := newBed(t, p)
	first := b.startCPE(p, 3, time.Hour)
	b.waitReady(first)
	b.both(first, 50)
	old := b.session(p.name)
	first.stop()

	second := b.startCPE(p, 3, time.Hour)
	if second.c.localIndex == first.c.localIndex {
		t.Skip("the restarted CPE drew the same random index")
	}
	b.waitReady(second)
	s := b.session(p.name)
	if s == old {
		t.Fatal("the headend kept the old session")
	}
	select {
	case <-old.closed:
	default:
		t.Error("the old session was not closed")
	}
	b.he.mu.RLock()
	_, stillThere := b.he.byIndex[old.localIndex]
	sessions := len(b.he.byIndex)
	b.he.mu.RUnlock()
	if stillThere || sessions != 1 {
		t.Errorf("headend indexes: old one still there %v, %d sessions, want only the new one", stillThere, sessions)
	}
	if got := gauge(b.heM.Sessions); got != 1 {
		t.Errorf("aggd_sessions = %v, want 1", got)
	}
	b.both(second, 100)
}
