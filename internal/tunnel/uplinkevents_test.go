package tunnel

import (
	"bytes"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/sched"
)

// Carrier lost: the link is down at once, before any probe could go unanswered, and
// stays down while its socket still works (stray replies do not bring it back);
// traffic moves to the other link. Carrier back: probes bring it up again.
func TestCarrierLostTakesLinkDownAtOnce(t *testing.T) {
	p := newPeer(t, "cpe1", "100.64.0.2")
	b := newBed(t, p)
	n := b.startCPE(p, 2, deadline)
	b.waitReady(n)
	b.up(n, 100)

	n.c.UplinkCarrier(1, false)
	if linkUp(n, 1) != 0 {
		t.Fatal("link up1 still up right after its carrier was lost")
	}
	m := b.mappings(n)[1]
	before, _ := m.data()
	b.up(n, 200) // a loopback socket still works, but no data may use it
	if after, _ := m.data(); after != before {
		t.Errorf("up1 sent %d data packets while without carrier", after-before)
	}
	if linkUp(n, 1) != 0 {
		t.Fatal("link up1 came back up without carrier")
	}

	n.c.UplinkCarrier(1, true)
	waitFor(t, "up1 up again after carrier is back", func() bool { return linkUp(n, 1) == 1 })
	b.up(n, 100)
}

// A link whose carrier comes back is probed at once, not at the tick's next turn for
// it. The link here is a backup, and a backup that is down is probed every standby
// interval, here an hour: only that first probe can bring it up while the test waits.
func TestCarrierBackProbesTheLinkAtOnce(t *testing.T) {
	p := newPeer(t, "cpe1", "100.64.0.2")
	b := newBed(t, p)
	n := b.startCPEWith(p, 2, deadline, func(c *CPEConfig) {
		c.Session.StandbyProbe = time.Hour
		c.Uplinks[1].Spec.Class = sched.ClassBackup
	})
	b.waitReady(n)
	waitFor(t, "the backup up1 up", func() bool { return linkUp(n, 1) == 1 })

	n.c.UplinkCarrier(1, false)
	if linkUp(n, 1) != 0 {
		t.Fatal("link up1 still up right after its carrier was lost")
	}
	n.c.UplinkCarrier(1, true)
	waitFor(t, "up1 up again after carrier is back", func() bool { return linkUp(n, 1) == 1 })
}

// The headend is told when a CPE's uplink goes offline (LINK_PARAMS) and takes its
// side of the link down at once: its downstream traffic moves off it, though the
// bed's loopback socket would still carry it and the CPE still answers the headend's
// probes there (the headend alone would never find it dead). When the uplink is back,
// the headend's side comes up too, without waiting an hour-long standby interval.
func TestTheHeadendFollowsACPEsUplinkOffline(t *testing.T) {
	p := newPeer(t, "cpe1", "100.64.0.2")
	b := newBedWith(t, func(c *HeadendConfig) { c.Session.StandbyProbe = time.Hour }, p)
	n := b.startCPEWith(p, 2, deadline, func(c *CPEConfig) {
		c.Session.StandbyProbe = time.Hour
		c.Uplinks[1].Spec.Class = sched.ClassOverflow
	})
	b.waitReady(n)
	heLink := b.session("cpe1").link(1)
	waitFor(t, "up1 up on both sides", func() bool { return linkUp(n, 1) == 1 && heLink.isUp() })

	n.c.UplinkCarrier(1, false)
	waitFor(t, "the headend's side of up1 down after the CPE's carrier loss", func() bool { return !heLink.isUp() })
	m := b.mappings(n)[1]
	_, before := m.data()
	b.both(n, 200)
	if _, after := m.data(); after != before {
		t.Errorf("the headend sent %d data packets on up1 while the CPE's uplink was offline", after-before)
	}

	n.c.UplinkCarrier(1, true)
	waitFor(t, "up1 up again on both sides after the carrier is back", func() bool { return linkUp(n, 1) == 1 && heLink.isUp() })
	b.both(n, 100)
}

// The headend's own interface losing its carrier takes its side of the links whose
// packets arrive there down at once; its carrier back brings them back, except a link
// the CPE still says is offline. (The bed's packets all arrive on loopback, so every
// link of the session is on the interface.)
func TestTheHeadendFollowsItsOwnInterfacesCarrier(t *testing.T) {
	p := newPeer(t, "cpe1", "100.64.0.2")
	b := newBedWith(t, func(c *HeadendConfig) { c.Session.StandbyProbe = time.Hour }, p)
	n := b.startCPEWith(p, 2, deadline, func(c *CPEConfig) { c.Session.StandbyProbe = time.Hour })
	b.waitReady(n)
	he := b.session("cpe1")
	he0, he1 := he.link(0), he.link(1)
	waitFor(t, "both links up on both sides", func() bool {
		return linkUp(n, 0) == 1 && linkUp(n, 1) == 1 && he0.isUp() && he1.isUp()
	})
	lo := int(he1.rxIfindex.Load())
	if lo == 0 {
		t.Fatal("the headend does not know which interface up1's packets arrive on")
	}

	b.he.InterfaceCarrier(lo, false)
	if he0.isUp() || he1.isUp() {
		t.Fatal("the headend's side of a link is still up right after its interface lost its carrier")
	}
	b.he.InterfaceCarrier(lo, true)
	waitFor(t, "both links up again after the interface's carrier is back", func() bool { return he0.isUp() && he1.isUp() })

	// The CPE's uplink offline too: the interface's return brings only the other link back.
	n.c.UplinkCarrier(1, false)
	waitFor(t, "the headend's side of up1 down after the CPE's carrier loss", func() bool { return !he1.isUp() })
	b.he.InterfaceCarrier(lo, false)
	b.he.InterfaceCarrier(lo, true)
	waitFor(t, "up0 up again after the interface's carrier is back", func() bool { return he0.isUp() })
	b.both(n, 100)
	if he1.isUp() || !he1.isOffline() {
		t.Error("the headend brought up1 back while the CPE still says its uplink is offline")
	}
	n.c.UplinkCarrier(1, true)
	waitFor(t, "up1 up again on both sides after the CPE's carrier is back", func() bool { return linkUp(n, 1) == 1 && he1.isUp() })
	b.both(n, 100)
}

// A link taken offline because the interface its packets arrived on lost its carrier
// is back as soon as its packets arrive on another interface: it is alive there.
// (Indexes no interface of the host has, so that the log names them by number.)
func TestALinkArrivingElsewhereIsNoLongerOffline(t *testing.T) {
	var log bytes.Buffer
	s := newSession(testSession(), metrics.New(), slog.New(slog.NewTextHandler(&log, nil)), 1, func([]byte) {})
	t.Cleanup(s.close)
	l := s.addLink(LinkSpec{ID: 0, Name: "link0"}, func(*link, []byte) error { return nil })
	other := s.addLink(LinkSpec{ID: 1, Name: "link1"}, func(*link, []byte) error { return nil })
	s.noteArrival(l, 90007)
	s.noteArrival(other, 90008)

	s.interfaceCarrier(90007, false)
	if !l.isOffline() || other.isOffline() {
		t.Fatalf("interface 90007 lost its carrier: link0 offline %v (want true), link1 offline %v (want false)", l.isOffline(), other.isOffline())
	}
	s.noteArrival(l, 90007)
	if !l.isOffline() {
		t.Fatal("a packet on the interface that lost its carrier brought the link back")
	}
	s.noteArrival(l, 90008)
	if l.isOffline() {
		t.Fatal("link0 still offline after its packets arrived on another interface")
	}
	if want := `msg="link back: probing it" peer="" session=1 link=link0 cause="its packets arrive on interface 90008"`; !strings.Contains(log.String(), want) {
		t.Errorf("want %s in the log:\n%s", want, log.String())
	}
}

// An uplink re-bound to a new address keeps its session: the headend follows the
// link's new address, both links carry traffic again, and no handshake is needed.
func TestRebindUplinkKeepsSession(t *testing.T) {
	p := newPeer(t, "cpe1", "100.64.0.2")
	b := newBed(t, p)
	n := b.startCPE(p, 2, deadline)
	b.waitReady(n)
	b.up(n, 100)
	index := n.c.session.Load().peerIndex.Load()
	heSession := b.session("cpe1")
	handshakes := gauge(n.m.Handshakes.WithLabelValues("headend", "ok"))
	oldAddr := n.uplinkAddr(1)

	// The address goes away: offline until the new one is bound.
	n.c.UplinkSourcePresent(1, false)
	if linkUp(n, 1) != 0 {
		t.Fatal("up1 still up after its source address was removed")
	}
	newAddr := netip.MustParseAddr("127.0.0.2")
	if err := n.c.RebindUplink(1, newAddr); err != nil {
		t.Fatal(err)
	}
	if got := n.uplinkAddr(1); got.Addr() != newAddr || got.Port() != oldAddr.Port() {
		t.Fatalf("up1 bound to %v after re-binding, want %v port %d", got, newAddr, oldAddr.Port())
	}
	if src := n.c.UplinkSource(1); src != newAddr {
		t.Fatalf("UplinkSource says %v, want %v", src, newAddr)
	}
	m := b.relay.existing(t, n.uplinkAddr(1)) // the relay sees a new client: a new mapping
	waitFor(t, "up1 up on its new address", func() bool { return linkUp(n, 1) == 1 })
	waitFor(t, "the headend following up1's new address", func() bool {
		r := heSession.link(1).remote.Load()
		return r != nil && *r == m.external()
	})

	before, _ := m.data()
	b.both(n, 400)
	if after, _ := m.data(); after == before {
		t.Error("up1 carried no data upstream from its new address")
	}
	if s := n.c.session.Load(); s.peerIndex.Load() != index || b.session("cpe1") != heSession {
		t.Fatal("re-binding restarted the session")
	}
	if got := gauge(n.m.Handshakes.WithLabelValues("headend", "ok")); got != handshakes {
		t.Fatalf("%v handshakes during the re-bind; want none", got-handshakes)
	}
}

// An uplink not usable at the start (Uplink.Waiting: its interface or address missing)
// has a stand-in socket that sends nothing, and is offline while the other uplink
// carries the session; bound to its address, it joins the same session.
func TestWaitingUplinkJoinsLater(t *testing.T) {
	p := newPeer(t, "cpe1", "100.64.0.2")
	b := newBed(t, p)
	n := b.startCPEWith(p, 2, deadline, func(c *CPEConfig) { c.Uplinks[1].Waiting = "interface up1 not found" })
	waitFor(t, "a session on up0", func() bool { return n.c.session.Load() != nil && linkUp(n, 0) == 1 })
	b.up(n, 100)
	if !n.c.UplinkWaiting(1) {
		t.Fatal("up1 not waiting on its stand-in socket")
	}
	if linkUp(n, 1) != 0 {
		t.Fatal("up1 up while it has only its stand-in socket")
	}
	standIn := n.uplinkAddr(1)
	b.relay.mu.Lock()
	sent := b.relay.maps[standIn] != nil
	b.relay.mu.Unlock()
	if sent {
		t.Fatalf("the stand-in socket (%v) sent to the headend", standIn)
	}
	index := n.c.session.Load().peerIndex.Load()

	if err := n.c.RebindUplink(1, netip.MustParseAddr("127.0.0.1")); err != nil {
		t.Fatal(err)
	}
	if n.c.UplinkWaiting(1) {
		t.Fatal("up1 still waiting after it was bound")
	}
	m := b.relay.existing(t, n.uplinkAddr(1)) // its first datagrams since it was bound
	waitFor(t, "up1 up once bound", func() bool { return linkUp(n, 1) == 1 })
	heSession := b.session("cpe1")
	waitFor(t, "the headend sending to up1", func() bool {
		r := heSession.link(1).remote.Load()
		return r != nil && *r == m.external()
	})
	// The CPE's view of its links (linkUp) says nothing of the headend's: the headend
	// schedules on a link only once its own probe is answered, an RTT after it first
	// hears from the link. Until then it has no usable link and drops downstream
	// packets at the entry (not sent), which the transfer (no retransmissions) would
	// wait for in vain.
	waitFor(t, "the headend's links up", func() bool {
		l0, l1 := heSession.link(0), heSession.link(1)
		return l0 != nil && l0.isUp() && l1 != nil && l1.isUp()
	})
	before, _ := m.data()
	b.both(n, 200)
	if after, _ := m.data(); after == before {
		t.Error("up1 carried no data upstream once bound")
	}
	if n.c.session.Load().peerIndex.Load() != index {
		t.Fatal("binding the late uplink restarted the session")
	}
}
