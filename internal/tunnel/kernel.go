package tunnel

import (
	"fmt"
	"slices"
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
func (s *Session) kernelMayCarry() bool { return s.kernelBarred() == "" }
