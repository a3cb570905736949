package tunnel

// What the CPE does when its uplinks change under it (docs/architecture.md §6). The
// daemon watches the uplinks with netlink (internal/netwatch) and tells the CPE:
//
//   - carrier lost, or the uplink's source address removed: the link is offline. It
//     goes down at once, without waiting for probes to go unanswered, and the headend
//     is sent a loss notice for what was in flight on it (lossnotice.go) and told
//     the link is offline (LINK_PARAMS), so that it takes its side of the link down
//     too, with its own loss notice, instead of sending into it until its probes and
//     reports find it dead;
//   - carrier back, source address back: the link is probed at once, and the
//     probes' replies bring it up; the headend is told, and probes it at once too;
//   - a new address on an uplink whose source follows the interface: the uplink's
//     socket is re-bound to it (same port). The session goes on; the headend follows
//     the link's new address after the first authenticated packet from it.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/aggd/aggd/internal/wire"
)

// uplinkConn is one uplink's UDP socket. Re-binding swaps the socket while the send
// path and the uplink's read loop keep going.
type uplinkConn struct {
	conn atomic.Pointer[net.UDPConn]

	mu       sync.Mutex
	replaced chan struct{} // closed when conn is swapped

	// Why the uplink cannot carry traffic, if it cannot.
	noCarrier atomic.Bool
	noSource  atomic.Bool

	// standIn: conn is standInSocket's, not yet bound to the uplink (set before the
	// CPE runs, cleared by RebindUplink).
	standIn atomic.Bool

	// mtu is Uplink.MTU as it is now, announced to the headend.
	mtu atomic.Uint32
}

func newUplinkConn(c *net.UDPConn) *uplinkConn {
	u := &uplinkConn{replaced: make(chan struct{})}
	u.conn.Store(c)
	return u
}

// get is the uplink's current socket.
func (u *uplinkConn) get() *net.UDPConn { return u.conn.Load() }

// LocalAddr is the current socket's address.
func (u *uplinkConn) LocalAddr() net.Addr { return u.get().LocalAddr() }

// current returns the socket and a channel closed when it is replaced.
func (u *uplinkConn) current() (*net.UDPConn, <-chan struct{}) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.get(), u.replaced
}

// swap installs a new socket and returns the old one, which the caller closes.
func (u *uplinkConn) swap(c *net.UDPConn) *net.UDPConn {
	u.mu.Lock()
	defer u.mu.Unlock()
	old := u.conn.Swap(c)
	close(u.replaced)
	u.replaced = make(chan struct{})
	return old
}

// offline reports whether the uplink cannot carry traffic, and why.
func (u *uplinkConn) offline() (bool, string) {
	switch {
	case u.noCarrier.Load():
		return true, "carrier lost"
	case u.noSource.Load():
		return true, "no source address on the interface"
	}
	return false, ""
}

// readUplink reads uplink id's socket until ctx ends, moving to the new socket when
// the uplink is re-bound.
func (c *CPE) readUplink(ctx context.Context, id int) {
	name := c.cfg.Uplinks[id].Spec.Name
	log := c.log.With("link", name)
	drops, waited := c.m.SocketDrops.WithLabelValues(name), c.m.SocketWait.WithLabelValues(name)
	for {
		conn, replaced := c.conns[id].current()
		readLoop(ctx, conn, log, drops, waited, c.onDatagram)
		select {
		case <-ctx.Done():
			return
		case <-replaced:
		}
	}
}

// UplinkCarrier tells the CPE that uplink id (its index in CPEConfig.Uplinks) lost
// its carrier (up false) or has it again.
func (c *CPE) UplinkCarrier(id int, up bool) {
	c.conns[id].noCarrier.Store(!up)
	c.applyUplinkState(id)
}

// UplinkSourcePresent tells the CPE whether uplink id's source address (UplinkSource)
// is on its interface.
func (c *CPE) UplinkSourcePresent(id int, present bool) {
	c.conns[id].noSource.Store(!present)
	c.applyUplinkState(id)
}

// UplinkWaiting reports whether uplink id is still on the stand-in socket it started
// with, not yet bound to its interface (Uplink.Waiting).
func (c *CPE) UplinkWaiting(id int) bool { return c.conns[id].standIn.Load() }

// SetUplinkMTU changes what the headend is told of the largest inner packet uplink id
// carries (Uplink.MTU; 0: unknown, the headend goes by the other uplinks): an uplink
// that joined late, or came back as a new interface, may carry less than the start
// assumed, and the tunnel's MTU may have moved. A change is announced at once, so that
// the headend sizes its packets before it uses a link that came back.
func (c *CPE) SetUplinkMTU(id, mtu int) {
	if c.conns[id].mtu.Swap(uint32(mtu)) != uint32(mtu) {
		c.requestAnnouncement()
	}
}

// requestAnnouncement has LINK_PARAMS sent now rather than at the next second's.
func (c *CPE) requestAnnouncement() {
	select {
	case c.announceNow <- struct{}{}:
	default: // one is due already
	}
}

// UplinkMTU is what the headend is told of uplink id (SetUplinkMTU).
func (c *CPE) UplinkMTU(id int) int { return int(c.conns[id].mtu.Load()) }

// UplinkSource is the address uplink id's socket is bound to.
func (c *CPE) UplinkSource(id int) netip.Addr {
	return localAddrPort(c.conns[id].get()).Addr()
}

// RebindUplink moves uplink id's socket to addr, keeping its port, and probes the link
// at once so that the headend learns the new address. The session is kept.
func (c *CPE) RebindUplink(id int, addr netip.Addr) error {
	u := c.cfg.Uplinks[id]
	c.rebindMu.Lock()
	defer c.rebindMu.Unlock()
	old := c.conns[id].get()
	from := localAddrPort(old)
	port := from.Port()
	if c.conns[id].standIn.Load() {
		port = c.cfg.LocalPort // the stand-in's port is not the uplink's
	}
	conn, err := listenUDP(netip.AddrPortFrom(addr, port), u.Interface)
	if err != nil {
		return fmt.Errorf("uplink %s: re-bind from %s to %s: %w (the link stays offline until its address changes again)",
			u.Spec.Name, from.Addr(), addr, err)
	}
	c.conns[id].swap(conn)
	c.conns[id].standIn.Store(false)
	old.Close() // its read loop moves to the new socket
	local := localAddrPort(conn)
	c.log.Info("uplink re-bound", "link", u.Spec.Name, "from", from, "to", local)
	if s := c.session.Load(); s != nil {
		if l := s.link(u.Spec.ID); l != nil {
			l.rebound.Store(&local)
			s.schedDue.Store(true) // a fast path must send from the new address
		}
	}
	c.conns[id].noSource.Store(false)
	if !c.applyUplinkState(id) { // an address that changed under a working link
		if s := c.session.Load(); s != nil {
			if l := s.link(u.Spec.ID); l != nil {
				s.probeAtOnce(l)
			}
		}
	}
	return nil
}

// applyUplinkState brings the session's link in line with its uplink's state, has the
// headend told (announceLinks: a change goes at once, on every link), and reports
// whether that brought the link back (and so probed it).
func (c *CPE) applyUplinkState(id int) (back bool) {
	if s := c.session.Load(); s != nil {
		offline, cause := c.conns[id].offline()
		if !offline {
			cause = "uplink usable again"
		}
		back = s.setLinkOffline(c.cfg.Uplinks[id].Spec.ID, offlineUplink, offline, cause)
	}
	c.requestAnnouncement()
	return back
}

// causePeerOffline is why a headend's link is offline: the CPE's LINK_PARAMS say its
// uplink cannot carry traffic; causePeerOnline why it is back.
const (
	causePeerOffline = "the CPE's uplink is offline"
	causePeerOnline  = "the CPE's uplink is usable again"
)

// offlineReason is one reason a link cannot carry traffic now. A link is offline while
// it has any: on a headend whose own interface and the CPE's uplink both lost their
// carrier (one cable between them), the interface's return must not bring the link
// back while the CPE still says its uplink is offline.
type offlineReason uint32

const (
	// offlineUplink: the CPE's uplink lost its carrier or its address (on the headend:
	// the CPE's LINK_PARAMS say so).
	offlineUplink offlineReason = 1 << iota
	// offlineOurInterface: the headend's interface the link's packets arrive on lost
	// its carrier.
	offlineOurInterface
)

// isOffline reports whether the link cannot carry traffic now, for any reason.
func (l *link) isOffline() bool { return l.offline.Load() != 0 }

// markOffline sets or clears one reason the link is offline and reports whether the
// link was offline before and is after.
func (l *link) markOffline(why offlineReason, on bool) (was, is bool) {
	for {
		old := l.offline.Load()
		next := old &^ uint32(why)
		if on {
			next |= uint32(why)
		}
		if l.offline.CompareAndSwap(old, next) {
			return old != 0, next != 0
		}
	}
}

// setLinkOffline takes link id down at once (offline), sending the peer a loss notice
// for what was in flight on it, or brings it back when its last reason is gone: it is
// probed at once, and the reply brings it up. cause is logged either way. Waiting for
// the tick's next probe cost up to a probe interval, and up to a standby interval (2 s)
// for a standby link, whose probes a link that is down gets on that scale. It reports
// whether the link came back.
func (s *Session) setLinkOffline(id uint8, why offlineReason, offline bool, cause string) (back bool) {
	l := s.link(id)
	if l == nil {
		return false
	}
	if was, is := l.markOffline(why, offline); was == is {
		return false
	}
	if !offline {
		l.mu.Lock()
		if l.state == stateDown {
			l.setState(stateProbing)
		}
		l.mu.Unlock()
		l.logger().Info("link back: probing it", "cause", cause)
		s.probeAtOnce(l)
		return true
	}
	l.mu.Lock()
	was := l.state
	if was.inSchedule() {
		l.setState(stateDown)
	}
	l.mu.Unlock()
	if !was.inSchedule() {
		l.logger().Info("link offline", "cause", cause, "was", was)
		return false
	}
	noticed := s.linkDown(l)
	l.logger().Warn("link down", "cause", cause, "loss_notice_seqs", noticed)
	return false
}

// interfaceCarrier takes offline the links whose packets last arrived on interface
// ifindex when it loses its carrier (up false), and brings them back, probed at once,
// when it has it again. For a headend with an interface per access network (its DSL
// lines on one, its LTE on another): the links on the dead one go down at once, with
// their loss notices and rescue copies, instead of after their silence, and come back
// without waiting for the tick's probe. The interface a link's packets arrive on is
// taken for the one its packets leave by: the usual symmetric routing.
func (s *Session) interfaceCarrier(ifindex int, up bool) {
	cause := ""
	for _, l := range s.allLinks() {
		if int(l.rxIfindex.Load()) != ifindex {
			continue
		}
		if cause == "" { // named only when a link is on it: every interface's changes come here
			what := " lost its carrier"
			if up {
				what = " has its carrier again"
			}
			cause = "our interface " + interfaceName(ifindex) + what
		}
		s.setLinkOffline(l.spec.ID, offlineOurInterface, !up, cause)
	}
}

// local is the address the link's packets leave from.
func (l *link) local() netip.AddrPort {
	if p := l.rebound.Load(); p != nil {
		return *p
	}
	return l.spec.Local
}

// outerLen is the outer IP and UDP header around each of the link's datagrams: 28
// bytes over IPv4, 48 over IPv6, by the peer's address (our own until the peer's is
// known). Every byte count and rate of a link is of what its wire carries; an IPv6
// link counted as IPv4 had its rates 1.3 % low at full-size packets, below what its
// probe trains measured and what a configured cap meant.
func (l *link) outerLen() int {
	a := l.local().Addr()
	if r := l.remote.Load(); r != nil {
		a = r.Addr()
	}
	if !a.IsValid() {
		return wire.Overhead - wire.HeaderLen
	}
	return wire.OverheadFor(a) - wire.HeaderLen
}
