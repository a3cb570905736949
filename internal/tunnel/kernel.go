package tunnel

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/aggd/aggd/internal/clock"
)

// Which sessions the kernel fast path may carry.
//
// The kernel's programs send and receive over IPv4 and IPv6 alike, but they must know
// every link of the session: a packet on a link the transmit side was not given never
// leaves by the kernel, and were the kernel to own the session's receive ordering while
// a link is unknown, its packets could reach a daemon that cannot tell them from ones
// the kernel delivered (SessionPath.OnData), and the kernel would wait for their
// sequence numbers in vain. So a session whose links are not all known yet (the headend
// learns them from the CPE's LINK_PARAMS and their first packets) stays in userspace
// both ways: the daemon does not offer the kernel the ordering (which it starts
// without), and the transmit side is not programmed, or is switched off if it was.

// The receive program sees only what arrives on the interfaces it is attached to. A
// link whose packets arrive elsewhere (a headend whose bpf.interfaces, or whose default
// routes when that is unset, leave out the interface a CPE's line comes in on) brings
// DATA packets the kernel neither delivers nor counts: were the kernel to own the
// ordering, they would reach the daemon as strays and be dropped, and the kernel would
// wait for their numbers in vain. So while a link's packets arrive where the program is
// not, the daemon keeps the receive ordering (it offers the kernel none) and says why;
// the transmit side is not concerned.

// barLinksUnknown is why the kernel waits at a session's start.
const barLinksUnknown = "the peer's links are not known yet"

// setLinkIDs records every link the session has (ids in any order).
func (s *Session) setLinkIDs(ids []uint8) {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	if old := s.linkIDs.Load(); old != nil && slices.Equal(*old, ids) {
		return
	}
	s.linkIDs.Store(&ids)
	s.checkKernel()
}

// checkKernel recomputes whether the kernel may carry the session, after its link set
// or a link's peer address changed, and logs a change of verdict.
func (s *Session) checkKernel() {
	bar := s.kernelBarReason()
	old := s.kernelBar.Swap(&bar)
	if s.fp == nil || (old != nil && *old == bar) {
		return
	}
	if bar != "" { // waiting to learn the links, as every session does at its start
		s.log.Debug("fast path: not for this session yet", "why", bar)
		return
	}
	s.log.Debug("fast path: the kernel may carry this session")
}

// kernelBarReason says why the kernel may not carry the session ("" if it may).
func (s *Session) kernelBarReason() string {
	ids := s.linkIDs.Load()
	if ids == nil {
		return barLinksUnknown
	}
	for _, id := range *ids {
		l := s.link(id)
		if l == nil {
			return fmt.Sprintf("link %d not heard from yet", id)
		}
		if l.remote.Load() == nil {
			return fmt.Sprintf("link %s has no peer address yet", l.spec.Name)
		}
	}
	return ""
}

// kernelBarred returns why the kernel may not carry the session, "" if it may.
func (s *Session) kernelBarred() string {
	if b := s.kernelBar.Load(); b != nil {
		return *b
	}
	return barLinksUnknown
}

// kernelMayCarry reports whether the kernel may own the session's receive ordering.
func (s *Session) kernelMayCarry() bool {
	if s.kernelBarred() != "" {
		return false
	}
	b := s.receiveBar.Load()
	return b == nil || *b == ""
}

// noteArrival records the interface a packet of link l arrived on (0: the kernel did
// not say), and looks again at the receive side if it changed. Per packet: it only
// reads unless the interface changed. A link taken offline because the interface its
// packets arrived on lost its carrier is back once they arrive on another one.
func (s *Session) noteArrival(l *link, ifindex int) {
	if ifindex == 0 || l.rxIfindex.Load() == int32(ifindex) {
		return
	}
	l.rxIfindex.Store(int32(ifindex))
	if l.offline.Load()&uint32(offlineOurInterface) != 0 {
		s.setLinkOffline(l.spec.ID, offlineOurInterface, false, "its packets arrive on "+interfaceName(ifindex))
	}
	s.checkReceive()
}

// checkReceive recomputes whether the kernel may own the receive ordering as far as
// where the links' packets arrive goes, and logs a change. Called when a link's
// interface changes and every tick (the receive program may have come to or gone
// from an interface, or a link gone).
func (s *Session) checkReceive() {
	if s.fp == nil {
		return
	}
	bar := ""
	for _, l := range s.allLinks() {
		if i := int(l.rxIfindex.Load()); i != 0 && !s.fp.ReceivesOn(i) {
			bar = fmt.Sprintf("link %s's packets arrive on %s, where the receive program is not attached "+
				"(list that interface in bpf.interfaces)", l.spec.Name, interfaceName(i))
			break
		}
	}
	old := s.receiveBar.Swap(&bar)
	if (old == nil && bar == "") || (old != nil && *old == bar) || !s.mayLogReceive() {
		return
	}
	if bar != "" {
		s.log.Warn("fast path: the daemon keeps this session's receive ordering", "why", bar)
	} else {
		s.log.Info("fast path: the kernel may receive for this session again")
	}
}

// receiveSayEvery bounds how often checkReceive logs.
const receiveSayEvery = 10 * time.Second

// mayLogReceive reports whether checkReceive may log now, and if so notes that it did.
func (s *Session) mayLogReceive() bool {
	now, said := clock.Nanos(), s.receiveSaid.Load()
	return (said == 0 || now-said >= int64(receiveSayEvery)) && s.receiveSaid.CompareAndSwap(said, now)
}

// interfaceName names interface index i for a log line.
func interfaceName(i int) string {
	if ifc, err := net.InterfaceByIndex(i); err == nil {
		return ifc.Name
	}
	return "interface " + strconv.Itoa(i)
}
