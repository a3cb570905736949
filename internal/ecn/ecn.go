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
	switch version(pkt) {
	case 4:
		return pkt[1] & 0b11, true
	case 6:
		return pkt[1] >> 4 & 0b11, true
	}
	return 0, false
}

// Mark sets Congestion Experienced on an ECN-capable packet, in place, keeping an IPv4
// header's checksum right (RFC 1624's incremental update). It reports whether the
// packet now carries CE: true for ECT(0), ECT(1) and CE (left as it is); false for a
// Not-ECT packet and for anything that is not a whole IPv4 or IPv6 header, which are
// not changed. A caller that wanted to signal congestion drops those.
func Mark(pkt []byte) bool {
	cp, ok := Of(pkt)
	if !ok || cp == NotECT {
		return false
	}
	if cp == CE {
		return true
	}
	switch version(pkt) {
	case 4:
		old := uint16(pkt[0])<<8 | uint16(pkt[1])
		pkt[1] |= CE
		sum := ^(uint16(pkt[10])<<8 | uint16(pkt[11]))
		sum = onesAdd(onesAdd(sum, ^old), uint16(pkt[0])<<8|uint16(pkt[1]))
		sum = ^sum
		pkt[10], pkt[11] = byte(sum>>8), byte(sum)
	case 6:
		pkt[1] |= CE << 4
	}
	return true
}

// version is the IP version of pkt when it starts with a whole header of it, else 0.
func version(pkt []byte) int {
	if len(pkt) == 0 {
		return 0
	}
	switch v := int(pkt[0] >> 4); {
	case v == 4 && len(pkt) >= 20:
		return 4
	case v == 6 && len(pkt) >= 40:
		return 6
	}
	return 0
}

// onesAdd is 16-bit one's complement addition.
func onesAdd(a, b uint16) uint16 {
	s := uint32(a) + uint32(b)
	return uint16(s + s>>16)
}
