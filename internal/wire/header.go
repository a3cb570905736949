package wire

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// Sizes and defaults of the format. Overhead is what a packet grows by when it enters
// the tunnel over an IPv4 uplink, OverheadIPv6 over an IPv6 one, so agg0's MTU is the
// smallest of the uplinks' MTUs minus their overheads.
const (
	Version      = 1
	HeaderLen    = 28
	Overhead     = 20 + 8 + HeaderLen // outer IPv4 + UDP + aggd header
	OverheadIPv6 = 40 + 8 + HeaderLen // outer IPv6 + UDP + aggd header
	DefaultPort  = 4242
	// MaxPacket is the largest datagram (header + body) a parser accepts; anything
	// larger cannot have come from a UDP socket and is rejected as oversize.
	MaxPacket = 65535
)

// OverheadFor is what a packet grows by on an uplink whose outer addresses are of
// outer's IP version.
func OverheadFor(outer netip.Addr) int {
	if outer.Unmap().Is4() {
		return Overhead
	}
	return OverheadIPv6
}

// Byte offsets of the header fields. The tag is computed over the bytes before
// offTag, which is why the tag sits last.
const (
	offVersionType = 0
	offFlags       = 1
	offLinkID      = 2
	offKeyID       = 3
	offSession     = 4
	offSeq         = 8
	offLinkSeq     = 12
	offTimestamp   = 16
	offTag         = 20

	// TagOffset and TaggedHeaderLen name the same boundary for package auth: the
	// tag covers header bytes [0, TaggedHeaderLen) and is stored at
	// [TagOffset, HeaderLen).
	TagOffset       = offTag
	TaggedHeaderLen = offTag
)

// Type is the message type, the low nibble of header byte 0.
type Type uint8

// Message types. Only DATA takes the fast path; the rest are control messages
// handled by the daemon.
const (
	TypeData          Type = 1
	TypeHandshakeInit Type = 2
	TypeHandshakeResp Type = 3
	TypeProbe         Type = 4
	TypeProbeReply    Type = 5
	TypeFeedback      Type = 6
	TypeLossNotice    Type = 7
	TypeLinkParams    Type = 8
	TypeLinkNames     Type = 9
	TypeRepairRequest Type = 10
	TypeCookieReply   Type = 11
)

var typeNames = [...]string{
	TypeData:          "data",
	TypeHandshakeInit: "handshake_init",
	TypeHandshakeResp: "handshake_resp",
	TypeProbe:         "probe",
	TypeProbeReply:    "probe_reply",
	TypeFeedback:      "feedback",
	TypeLossNotice:    "loss_notice",
	TypeLinkParams:    "link_params",
	TypeLinkNames:     "link_names",
	TypeRepairRequest: "repair_request",
	TypeCookieReply:   "cookie_reply",
}

// Valid reports whether t is a type version 1 defines.
func (t Type) Valid() bool { return t >= TypeData && t <= TypeCookieReply }

// String gives the snake_case name (suitable as a metric label).
func (t Type) String() string {
	if t.Valid() {
		return typeNames[t]
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// FlagDuplicate marks a redundant copy of a packet that was also sent on another link.
const FlagDuplicate uint8 = 0x01

// FlagMac2 marks a HANDSHAKE_INIT whose body ends with a mac2: proof, from a cookie the
// headend sent to this source address, that the sender really is there (package cookie).
// On any other type it is bad_flags.
const FlagMac2 uint8 = 0x02

// FlagSparse marks a DATA packet of a sparse flow: the sender sent the flow's previous
// packet at least the links' largest RTT before this one, so that packet has arrived
// (or is lost) by now, and the receiver may deliver this one as soon as it comes, ahead
// of any gap before it, unless it still holds a packet of the same flow. A ping or a
// DNS query during a bulk transfer then does not wait for the bulk's reordering
// (docs/architecture.md, Resequencing). On any other type it is bad_flags.
const FlagSparse uint8 = 0x04

// knownFlags are the flag bits version 1 defines; any other bit set is bad_flags.
const knownFlags = FlagDuplicate | FlagMac2 | FlagSparse

// Header is the fixed 28-byte aggd header. Tag is carried as is: Put writes it and
// ParseHeader reads it, but computing and checking it is package auth's job.
type Header struct {
	Type      Type
	Flags     uint8
	LinkID    uint8
	KeyID     uint8
	Session   uint32
	Seq       uint32
	LinkSeq   uint32
	Timestamp uint32
	Tag       uint64
}

// Put writes the header into b[:HeaderLen]. A b shorter than HeaderLen is a
// programmer error and panics. Type must fit the 4-bit field; only its low nibble is
// written.
func (h *Header) Put(b []byte) {
	_ = b[HeaderLen-1] // one bounds check, and the panic for a short buffer
	b[offVersionType] = Version<<4 | uint8(h.Type)&0x0f
	b[offFlags] = h.Flags
	b[offLinkID] = h.LinkID
	b[offKeyID] = h.KeyID
	binary.BigEndian.PutUint32(b[offSession:], h.Session)
	binary.BigEndian.PutUint32(b[offSeq:], h.Seq)
	binary.BigEndian.PutUint32(b[offLinkSeq:], h.LinkSeq)
	binary.BigEndian.PutUint32(b[offTimestamp:], h.Timestamp)
	binary.BigEndian.PutUint64(b[offTag:], h.Tag)
}

// Append appends the encoded header to dst.
func (h *Header) Append(dst []byte) []byte {
	var b [HeaderLen]byte
	h.Put(b[:])
	return append(dst, b[:]...)
}

// ParseHeader decodes the header at the start of datagram b, the whole aggd datagram
// (header and body). It checks, in this order: oversize, truncated, bad_version,
// bad_type, bad_flags (the order docs/wire-format.md fixes, so that every
// implementation gives a datagram with several faults the same reason). It does not
// look at the body: Parse does.
func ParseHeader(b []byte) (Header, error) {
	if len(b) > MaxPacket {
		return Header{}, errorf(ReasonOversize, "datagram is %d bytes, the maximum is %d", len(b), MaxPacket)
	}
	if len(b) < HeaderLen {
		return Header{}, errorf(ReasonTruncated, "datagram is %d bytes, shorter than the %d-byte header", len(b), HeaderLen)
	}
	if v := b[offVersionType] >> 4; v != Version {
		return Header{}, errorf(ReasonBadVersion, "version %d, want %d", v, Version)
	}
	t := Type(b[offVersionType] & 0x0f)
	if !t.Valid() {
		return Header{}, errorf(ReasonBadType, "message type %d is not defined", uint8(t))
	}
	flags := b[offFlags]
	if flags&^knownFlags != 0 {
		return Header{}, errorf(ReasonBadFlags, "flags %#02x have undefined bits set", flags)
	}
	if flags&FlagMac2 != 0 && t != TypeHandshakeInit {
		return Header{}, errorf(ReasonBadFlags, "the mac2 flag is set on a %s (only a handshake_init carries a mac2)", t)
	}
	if flags&FlagSparse != 0 && t != TypeData {
		return Header{}, errorf(ReasonBadFlags, "the sparse flag is set on a %s (only data carries it)", t)
	}
	return Header{
		Type:      t,
		Flags:     flags,
		LinkID:    b[offLinkID],
		KeyID:     b[offKeyID],
		Session:   binary.BigEndian.Uint32(b[offSession:]),
		Seq:       binary.BigEndian.Uint32(b[offSeq:]),
		LinkSeq:   binary.BigEndian.Uint32(b[offLinkSeq:]),
		Timestamp: binary.BigEndian.Uint32(b[offTimestamp:]),
		Tag:       binary.BigEndian.Uint64(b[offTag:]),
	}, nil
}

// Duplicate reports whether the header carries FlagDuplicate.
func (h *Header) Duplicate() bool { return h.Flags&FlagDuplicate != 0 }

// Sparse reports whether the header carries FlagSparse.
func (h *Header) Sparse() bool { return h.Flags&FlagSparse != 0 }

// HasMac2 reports whether the header carries FlagMac2.
func (h *Header) HasMac2() bool { return h.Flags&FlagMac2 != 0 }
