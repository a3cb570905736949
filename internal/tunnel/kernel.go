package tunnel

import (
	"fmt"
	"slices"
)

// Which sessions the kernel fast path may carry.
//
// The kernel's programs read and write outer IPv4 headers only. A link with IPv6
// addresses is the daemon's: the transmit program cannot send on it, and its packets
// reach the daemon's socket past the receive program. Were the kernel to own the
// session's receive ordering then, such a packet would arrive at a daemon that must
// drop it (it cannot tell it from one the kernel delivered: SessionPath.OnData), and
// the kernel would wait for its sequence number in vain. So a session with an IPv6
// link, or whose links are not all known yet (the headend learns them from the CPE's
// LINK_PARAMS and their first packets), stays in userspace both ways: the daemon never
// offers the kernel the ordering (which it starts without), and the transmit side is
// not programmed, or is switched off if it was.

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
	bar, ipv6 := s.kernelBarReason()
	old := s.kernelBar.Swap(&bar)
	if s.fp == nil || (old != nil && *old == bar) {
		return
	}
	switch {
	case ipv6: // for as long as the session lasts: worth telling the user
		s.log.Info("fast path: this session forwards in userspace", "why", bar)
	case bar != "": // waiting to learn the links, as every session does at its start
		s.log.Debug("fast path: not for this session yet", "why", bar)
	default:
		s.log.Debug("fast path: the kernel may carry this session")
	}
}

// kernelBarReason says why the kernel may not carry the session ("" if it may);
// ipv6 is true when the reason is an IPv6 link.
func (s *Session) kernelBarReason() (reason string, ipv6 bool) {
	ids := s.linkIDs.Load()
	if ids == nil {
		return barLinksUnknown, false
	}
	for _, id := range *ids {
		l := s.link(id)
		if l == nil {
			return fmt.Sprintf("link %d not heard from yet", id), false
		}
		r := l.remote.Load()
		if r == nil {
			return fmt.Sprintf("link %s has no peer address yet", l.spec.Name), false
		}
		if !r.Addr().Unmap().Is4() {
			return fmt.Sprintf("link %s runs over IPv6 (%s), which the kernel fast path does not send or receive", l.spec.Name, r.Addr()), true
		}
	}
	return "", false
}

// kernelBarred returns why the kernel may not carry the session, "" if it may.
func (s *Session) kernelBarred() string {
	if b := s.kernelBar.Load(); b != nil {
		return *b
	}
	return barLinksUnknown
}

// kernelMayCarry reports whether the kernel may own the session's receive ordering.
func (s *Session) kernelMayCarry() bool { return s.kernelBarred() == "" }
