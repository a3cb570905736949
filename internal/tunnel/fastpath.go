package tunnel

import (
	"net/netip"
	"time"
)

// FastPath is the kernel datapath a session can hand its per-packet work to: the tc
// programs that stripe and encapsulate what is routed into agg0, and deliver in-order
// packets from the uplinks into agg0 (internal/daemon implements it with internal/bpf).
// The session keeps doing everything the kernel hands up (docs/fastpath-ordering.md).
type FastPath interface {
	// OpenSession gives a new session its share of the fast path: the kernel sends for
	// the inner destinations in routes and receives for localIndex. nil: the session
	// stays in userspace (no room, or the fast path cannot serve it).
	OpenSession(localIndex uint32, routes []netip.Prefix) SessionPath
}

// SessionPath is one session's share of the fast path.
type SessionPath interface {
	// TakeSeq and TakeLinkSeq take the next global and per-link sequence numbers from
	// the series the kernel takes from too, so both paths send one series; PeekSeq and
	// PeekLinkSeq read the next numbers without taking them (probe watermarks).
	TakeSeq() uint32
	TakeLinkSeq(id uint8) uint32
	PeekSeq() uint32
	PeekLinkSeq(id uint8) uint32

	// Program hands the kernel what it needs to send for the session now. Called when
	// keys, links, rates or states change (at most every probe interval otherwise).
	Program(TxState)

	// OnData is told of every DATA packet of the session the daemon receives, before
	// anything else is done with it: its link, its link sequence number and the time of
	// its arrival. restart: the kernel owned the ordering and handed
	// it over at next; the resequencer (empty then) must continue from there. drop: the
	// kernel owns the ordering and did not pass this packet up (it came another way):
	// delivering it could deliver it twice.
	OnData(link uint8, linkSeq uint32, now time.Time) (restart bool, next uint32, drop bool)
	// Idle is told the resequencer's state after each change: when it is empty, the
	// ordering can go back to the kernel, which then continues at next, and delivers a
	// late copy of any number in skipped (bit i: next-1-i, given up and not delivered:
	// reseq.Skipped), as the resequencer would have (PushCopy).
	Idle(next uint32, skipped uint64, empty bool)
	// HandbackPending reports whether the daemon has offered the ordering back to the
	// kernel and not yet learnt the outcome: the kernel may own the ordering and be
	// delivering the very numbers a probe's watermark or a loss notice would make the
	// resequencer resolve. Called under the session's receive lock, like OnData.
	HandbackPending() bool
	// ReceivesOn reports whether the kernel's receive program is attached to the
	// interface with index ifindex: only what arrives there is delivered or counted
	// by the kernel (kernel.go).
	ReceivesOn(ifindex int) bool
	// Resync is called while the resequencer is empty and no DATA packet of the session
	// has reached the daemon for fastResyncQuiet: a packet the kernel passed up but the
	// host lost (socket buffer full) would otherwise keep the ordering in userspace for
	// good. It resynchronises only once the kernel's count of what it passed up has
	// stood still for quiet too (now: the time of the call): a packet passed up at the
	// end of a quiet period is still on its way. restart as for OnData.
	Resync(now time.Time, quiet time.Duration) (restart bool, next uint32)

	// SentOn returns what the kernel logged of the packets it sent on link id without
	// a copy, for the link sequence numbers after after through through, in link order
	// (for the loss notice when the link goes down). complete is false if the span is
	// longer than the kernel's log.
	SentOn(id uint8, after, through uint32) (sent []SentEntry, complete bool)
	// Kept returns the inner packets the kernel sent with the global sequence numbers
	// seqs, nil where it no longer keeps one (it keeps the latest few hundred), for a
	// rescue to send again (rescue.go).
	Kept(seqs []uint32) [][]byte

	// RxDelta returns, per link, what the kernel delivered since the last call;
	// TxDelta what it sent.
	RxDelta() map[uint8]RxDelta
	TxDelta() map[uint8]TxDelta
	// AQMDelta returns what the kernel did on the bond's AQM schedule (TxState.AQMGap)
	// to the session's packets since the last call.
	AQMDelta() AQMDelta

	Close()
}

// TxState is a session's transmit side as the kernel needs it.
type TxState struct {
	PeerIndex uint32
	KeyID     uint8
	Key       [16]byte
	Links     []TxLink
	// AQMGap is the spacing between the bond's AQM drops while it drops, 0 otherwise
	// (aqm.Codel.Spacing).
	AQMGap time.Duration
	// AQMECN: the AQM marks ECN-capable packets Congestion Experienced instead of
	// dropping them (internal/ecn).
	AQMECN bool
	// Userspace, when not "", says why the kernel must not send for the session (its
	// links not all known yet): the daemon sends everything.
	Userspace string
}

// TxLink is one link of a session's transmit side.
type TxLink struct {
	ID            uint8
	Local, Remote netip.AddrPort
	Interface     string // the CPE's uplink interface; "" on the headend (found by route)
	Usable        bool
	Suspect       bool
	Class         uint8
	RateBps       float64
	BaseOWD       time.Duration
}

// TxDelta is what the kernel sent on one link since the last look.
type TxDelta struct {
	Packets uint64 // datagrams, redundant copies included
	Bytes   uint64 // inner bytes
	Copies  uint64 // redundant copies of a suspect link's packets
}

// AQMDelta is what the kernel's share of the bond's AQM did since the last look.
type AQMDelta struct {
	Drops    uint64
	ECTDrops uint64 // of Drops, the ECN-capable packets
	Marks    uint64 // marked Congestion Experienced instead
}

// RxDelta is what the kernel delivered on one link since the last look.
type RxDelta struct {
	Packets    uint64
	Bytes      uint64
	MaxLinkSeq uint32
	// A one-way-delay sample from the latest packet, µs (with the clocks' offset),
	// when HaveOWD.
	OWD     int32
	HaveOWD bool
}
