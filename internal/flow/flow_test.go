package flow

import (
	"encoding/binary"
	"testing"
)

// ipv4 builds a 28-byte IPv4 packet from src to dst with protocol proto, whose first
// transport bytes are l4.
func ipv4(src, dst byte, proto uint8, l4 ...byte) []byte {
	p := make([]byte, 20, 20+len(l4))
	p[0], p[9] = 0x45, proto
	p[15], p[19] = src, dst
	p = append(p, l4...)
	binary.BigEndian.PutUint16(p[2:4], uint16(len(p)))
	return p
}

func ipv6(src, dst byte, next uint8, l4 ...byte) []byte {
	p := make([]byte, 40, 40+len(l4))
	p[0], p[6] = 0x60, next
	p[23], p[39] = src, dst
	return append(p, l4...)
}

func mustHash(t *testing.T, name string, pkt []byte) uint32 {
	t.Helper()
	h, ok := Hash(pkt)
	if !ok {
		t.Fatalf("%s: no flow", name)
	}
	return h
}

func TestFlowsApartAndTogether(t *testing.T) {
	same := [][2][]byte{
		{ipv4(1, 2, protoTCP, 0, 80, 1, 1, 9, 9, 9, 9), ipv4(1, 2, protoTCP, 0, 80, 1, 1, 7, 7, 7, 7)}, // sequence numbers differ
		{ipv4(1, 2, protoICMP, 8, 0, 0xaa, 0xbb, 0, 1, 0, 1), ipv4(1, 2, protoICMP, 8, 0, 0xcc, 0xdd, 0, 1, 0, 2)},
		{ipv4(1, 2, 47), ipv4(1, 2, 47, 1, 2, 3, 4)}, // GRE: by addresses only
		{ipv6(1, 2, protoUDP, 0, 53, 0, 53, 1), ipv6(1, 2, protoUDP, 0, 53, 0, 53, 2)},
	}
	for i, c := range same {
		if a, b := mustHash(t, "a", c[0]), mustHash(t, "b", c[1]); a != b {
			t.Errorf("pair %d: one flow hashed apart, %#x and %#x", i, a, b)
		}
	}
	apart := [][2][]byte{
		{ipv4(1, 2, protoTCP, 0, 80, 1, 1), ipv4(1, 2, protoTCP, 0, 80, 1, 2)},
		{ipv4(1, 2, protoTCP, 0, 80, 1, 1), ipv4(1, 2, protoUDP, 0, 80, 1, 1)},
		{ipv4(1, 2, protoTCP, 0, 80, 1, 1), ipv4(2, 1, protoTCP, 0, 80, 1, 1)},
		{ipv4(1, 2, protoICMP, 8, 0, 0, 0, 0, 1), ipv4(1, 2, protoICMP, 8, 0, 0, 0, 0, 2)}, // echo identifiers
		{ipv6(1, 2, protoICMPv6, 128, 0, 0, 0, 0, 1), ipv6(1, 2, protoICMPv6, 128, 0, 0, 0, 0, 2)},
		{ipv6(1, 2, protoTCP, 0, 80, 1, 1), ipv6(1, 3, protoTCP, 0, 80, 1, 1)},
	}
	for i, c := range apart {
		if a, b := mustHash(t, "a", c[0]), mustHash(t, "b", c[1]); a == b {
			t.Errorf("pair %d: two flows hashed together, %#x", i, a)
		}
	}
}

func TestWhatHasNoFlow(t *testing.T) {
	mf := ipv4(1, 2, protoUDP, 0, 53, 0, 53)
	mf[6] = 0x20 // more fragments
	later := ipv4(1, 2, protoUDP, 0, 53, 0, 53)
	later[7] = 0x10 // an offset
	for name, pkt := range map[string][]byte{
		"empty":               nil,
		"short":               ipv4(1, 2, protoUDP)[:19],
		"not IP":              append([]byte{0x50}, make([]byte, 30)...),
		"IPv4 header overrun": append([]byte{0x4f}, make([]byte, 30)...),
		"short IPv6":          ipv6(1, 2, protoUDP)[:39],
		"first fragment":      mf,
		"later fragment":      later,
		"IPv6 fragment":       ipv6(1, 2, 44, 17, 0, 0, 1, 0, 0, 0, 1),
	} {
		if h, ok := Hash(pkt); ok {
			t.Errorf("%s: flow %#x, want none", name, h)
		}
	}
}

func TestTruncatedTransportIsStillAFlow(t *testing.T) {
	a := mustHash(t, "udp with 2 bytes", ipv4(1, 2, protoUDP, 0, 53))
	b := mustHash(t, "udp with none", ipv4(1, 2, protoUDP))
	if a != b {
		t.Errorf("a transport header too short to read is named by the addresses alone: %#x and %#x", a, b)
	}
}
