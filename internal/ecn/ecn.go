// Package ecn reads and marks the ECN field of the inner IPv4 and IPv6 packets the
// bond carries (RFC 3168).
//
// Why the bond marks: its AQM (internal/aqm) tells senders that a link's standing queue
// has grown. A dropped packet tells them too, but it costs the retransmission of a
// packet the links already carried and, for a sender with few packets in flight, a
// timeout now and then. A sender that negotiated ECN gets the same signal from a packet
// marked Congestion Experienced, which still arrives: so for ECN-capable packets the
// bond marks where it would drop, as fq_codel does by default.
//
// The outer header stays Not-ECT (RFC 6040's compatibility mode): a queue on a WAN link
// cannot mark the tunnel's packets, and decapsulation never has to carry a mark inwards.
package ecn

// The ECN codepoints: the two low bits of the IPv4 TOS byte and of the IPv6 traffic
// class.
const (
	NotECT = 0b00
	ECT1   = 0b01
	ECT0   = 0b10
	CE     = 0b11
)

// Of returns the ECN codepoint of an IPv4 or IPv6 packet, and false when pkt does not
// start with a whole IPv4 or IPv6 header.
func Of(pkt []byte) (uint8, bool) {
	shift, ok := fieldShift(pkt)
	if !ok {
		return 0, false
	}
	return pkt[1] >> shift & CE, true
}

// Mark sets Congestion Experienced on an ECN-capable packet, in place, keeping an IPv4
// header's checksum right (RFC 1624's incremental update). It reports whether the
// packet now carries CE: true for ECT(0), ECT(1) and CE (left as it is); false for a
// Not-ECT packet and for anything that is not a whole IPv4 or IPv6 header, which are
// not changed. A caller that wanted to signal congestion drops those.
// bpf/include/aggd_ecn.h is the same rule for the kernel fast path.
func Mark(pkt []byte) bool {
	shift, ok := fieldShift(pkt)
	if !ok {
		return false
	}
	switch pkt[1] >> shift & CE {
	case NotECT:
		return false
	case CE:
		return true
	}
	old := uint16(pkt[0])<<8 | uint16(pkt[1])
	pkt[1] |= CE << shift
	if shift == 0 { // IPv4: the header checksum covers the TOS byte
		sum := onesAdd(onesAdd(^(uint16(pkt[10])<<8|uint16(pkt[11])), ^old), uint16(pkt[0])<<8|uint16(pkt[1]))
		pkt[10], pkt[11] = byte(^sum>>8), byte(^sum)
	}
	return true
}

// fieldShift is where the ECN field sits in byte 1 of pkt: bits 0-1 of an IPv4
// header's TOS byte (shift 0), or bits 4-5 of byte 1 of an IPv6 header, the low end of
// its traffic class (shift 4). false when pkt does not start with a whole IPv4 or IPv6
// header.
func fieldShift(pkt []byte) (uint8, bool) {
	if len(pkt) == 0 {
		return 0, false
	}
	switch v := pkt[0] >> 4; {
	case v == 4 && len(pkt) >= 20:
		return 0, true
	case v == 6 && len(pkt) >= 40:
		return 4, true
	}
	return 0, false
}

// onesAdd is 16-bit one's complement addition.
func onesAdd(a, b uint16) uint16 {
	s := uint32(a) + uint32(b)
	return uint16(s + s>>16)
}
