// Package flow names the flow an inner IP packet belongs to, as a hash: its addresses,
// its protocol and, for the transports that have them, its ports (an ICMP echo's
// identifier). The tunnel uses it to find sparse flows, whose packets may be delivered
// ahead of the bond's reordering (wire.FlagSparse): the sender to tell how long ago a
// flow last sent, the receiver to see whether it holds a packet of the same flow.
//
// Two flows may share a hash; both users only ever err towards ordering then.
package flow

import "encoding/binary"

// IP protocol numbers whose first four transport bytes are a source and a
// destination port.
const (
	protoTCP     = 6
	protoUDP     = 17
	protoDCCP    = 33
	protoSCTP    = 132
	protoUDPLite = 136
	protoICMP    = 1
	protoICMPv6  = 58
)

// Hash returns the flow hash of the IPv4 or IPv6 packet pkt, and false for what it
// cannot name: not IP, too short, or a fragment (whose later parts carry no ports,
// and which the receiver reassembles in any order anyway). An IPv6 packet with
// extension headers is named by its addresses and first next-header value only.
func Hash(pkt []byte) (uint32, bool) {
	if len(pkt) < 20 {
		return 0, false
	}
	switch pkt[0] >> 4 {
	case 4:
		ihl := int(pkt[0]&0x0f) * 4
		if ihl < 20 || len(pkt) < ihl {
			return 0, false
		}
		if frag := binary.BigEndian.Uint16(pkt[6:8]); frag&0x3fff != 0 { // MF or an offset
			return 0, false
		}
		proto := pkt[9]
		return sum(pkt[12:20], proto, transport(pkt[ihl:], proto)), true
	case 6:
		if len(pkt) < 40 {
			return 0, false
		}
		next := pkt[6]
		if next == 44 { // a fragment header
			return 0, false
		}
		return sum(pkt[8:40], next, transport(pkt[40:], next)), true
	}
	return 0, false
}

// transport returns the four bytes that tell a protocol's flows apart: the ports, or
// an ICMP echo's identifier; zero for other protocols or a truncated header.
func transport(l4 []byte, proto uint8) uint32 {
	switch proto {
	case protoTCP, protoUDP, protoDCCP, protoSCTP, protoUDPLite:
		if len(l4) >= 4 {
			return binary.BigEndian.Uint32(l4)
		}
	case protoICMP, protoICMPv6:
		if len(l4) >= 6 {
			return uint32(binary.BigEndian.Uint16(l4[4:6]))
		}
	}
	return 0
}

// sum is FNV-1a over the addresses, the protocol and the transport bytes: cheap, and
// spread well enough for a small table.
func sum(addrs []byte, proto uint8, ports uint32) uint32 {
	const prime = 16777619
	h := uint32(2166136261)
	for _, b := range addrs {
		h = (h ^ uint32(b)) * prime
	}
	h = (h ^ uint32(proto)) * prime
	for i := 24; i >= 0; i -= 8 {
		h = (h ^ (ports >> i & 0xff)) * prime
	}
	return h
}
