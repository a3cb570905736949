package bpf

import (
	"encoding/binary"
	"testing"

	"github.com/aggd/aggd/internal/auth"
)

// Test frame builder: Ethernet (+ VLAN tags) / IPv4 / UDP around an aggd
// datagram, with knobs to break each length field on purpose.

const (
	etherTypeIPv4 = 0x0800
	etherTypeIPv6 = 0x86dd
	etherTypeARP  = 0x0806
	etherTypeVLAN = 0x8100
	etherTypeQinQ = 0x88a8

	protoTCP = 6
	protoUDP = 17
)

var (
	testDstMAC = []byte{0x02, 0x00, 0x00, 0x00, 0x00, 0x02}
	testSrcMAC = []byte{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}
)

type frameSpec struct {
	vlans     []uint16 // outer first: TPIDs of the tags to insert
	etherType uint16   // 0 means IPv4 (IPv6 with ipv6)
	ipv6      bool     // an IPv6 packet: fixed header, then proto's header
	ipOptions int      // 4-byte words of IPv4 options
	proto     uint8    // 0 means UDP
	fragOff   uint16   // raw IPv4 flags+fragment offset field
	frag6     uint16   // raw IPv6 fragment offset+M field; non-zero inserts a fragment header
	dport     uint16   // 0 means DefaultTunnelPort
	payload   []byte   // the UDP payload (an aggd datagram or not)

	ipLenDelta  int // added to the correct IPv4 total length or IPv6 payload length
	udpLenDelta int // added to the correct UDP length
	pad         int // bytes behind the IPv4 packet (Ethernet padding)
	cut         int // bytes removed from the end of the frame
}

func (f frameSpec) build() []byte {
	etherType := f.etherType
	switch {
	case etherType == 0 && f.ipv6:
		etherType = etherTypeIPv6
	case etherType == 0:
		etherType = etherTypeIPv4
	}
	proto := f.proto
	if proto == 0 {
		proto = protoUDP
	}
	dport := f.dport
	if dport == 0 {
		dport = DefaultTunnelPort
	}

	b := append([]byte{}, testDstMAC...)
	b = append(b, testSrcMAC...)
	// Ethernet's type field carries the first TPID; each tag is then a TCI
	// (VLAN id 100+i) followed by the next TPID, the last being the real
	// EtherType.
	types := append(append([]uint16{}, f.vlans...), etherType)
	b = binary.BigEndian.AppendUint16(b, types[0])
	for i := range f.vlans {
		b = binary.BigEndian.AppendUint16(b, uint16(100+i))
		b = binary.BigEndian.AppendUint16(b, types[i+1])
	}

	if f.ipv6 {
		return f.ipv6Packet(b, proto, dport)
	}
	if etherType != etherTypeIPv4 {
		// Something that is not IPv4 but would look like aggd if misparsed.
		b = append(b, make([]byte, 40)...)
		b = append(b, f.payload...)
		return b
	}

	ihl := 5 + f.ipOptions
	l4 := udpHeader(dport, len(f.payload)+8+f.udpLenDelta)
	if proto != protoUDP {
		l4 = make([]byte, 20) // a TCP header's worth of zeros, dport 4242
		binary.BigEndian.PutUint16(l4[2:], dport)
	}
	totLen := ihl*4 + len(l4) + len(f.payload) + f.ipLenDelta

	ip := make([]byte, ihl*4)
	ip[0] = 0x40 | byte(ihl)
	binary.BigEndian.PutUint16(ip[2:], uint16(totLen))
	binary.BigEndian.PutUint16(ip[4:], 0x1234)
	binary.BigEndian.PutUint16(ip[6:], f.fragOff)
	ip[8] = 64
	ip[9] = proto
	copy(ip[12:], []byte{192, 0, 2, 1})
	copy(ip[16:], []byte{192, 0, 2, 2})
	for i := 20; i < len(ip); i++ {
		ip[i] = 1 // NOP options
	}
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))

	b = append(b, ip...)
	b = append(b, l4...)
	b = append(b, f.payload...)
	b = append(b, make([]byte, f.pad)...)
	return b[:len(b)-f.cut]
}

// ipv6Packet appends an IPv6 packet to the Ethernet header b: the fixed header with
// next header proto, then a UDP header (or, for another proto, 8 zero bytes as an
// extension header would have) and the payload.
func (f frameSpec) ipv6Packet(b []byte, proto uint8, dport uint16) []byte {
	l4 := udpHeader(dport, len(f.payload)+8+f.udpLenDelta)
	if proto != protoUDP {
		l4 = make([]byte, 8)
	}
	if f.frag6 != 0 {
		fh := []byte{proto, 0, byte(f.frag6 >> 8), byte(f.frag6), 0, 0, 0x12, 0x34}
		l4 = append(fh, l4...)
		proto = 44
	}
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)+len(f.payload)+f.ipLenDelta))
	ip[6] = proto
	ip[7] = 64
	copy(ip[8:], []byte{0x20, 0x01, 0x0d, 0xb8, 15: 1})
	copy(ip[24:], []byte{0x20, 0x01, 0x0d, 0xb8, 15: 2})
	b = append(b, ip...)
	b = append(b, l4...)
	b = append(b, f.payload...)
	b = append(b, make([]byte, f.pad)...)
	return b[:len(b)-f.cut]
}

func udpHeader(dport uint16, length int) []byte {
	u := make([]byte, 8)
	binary.BigEndian.PutUint16(u[0:], 40000)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(length))
	return u // checksum 0: legal for IPv4
}

func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// The session the test datagrams belong to: addTestSession installs it.
const (
	testSession = 0xdeadbeef
	testKeyID   = 1
	testLinkID  = 3
)

var testKey = auth.Key{0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef}

func addTestSession(t *testing.T, s *Shield) {
	t.Helper()
	if err := s.SetSession(testSession, []SessionKey{{ID: testKeyID, Key: testKey}}); err != nil {
		t.Fatalf("SetSession: %v", err)
	}
}

// aggdDatagram is a header with the given first two bytes (version<<4|type,
// flags) and recognisable other fields, followed by body, with the tag of
// testKey (by the rule of the type in its low nibble).
func aggdDatagram(verType, flags byte, body []byte) []byte {
	h := make([]byte, 28, 28+len(body))
	h[0] = verType
	h[1] = flags
	h[2] = testLinkID
	h[3] = testKeyID
	binary.BigEndian.PutUint32(h[4:], testSession)
	binary.BigEndian.PutUint32(h[8:], 1000)
	binary.BigEndian.PutUint32(h[12:], 500)
	binary.BigEndian.PutUint32(h[16:], 123456)
	d := append(h, body...)
	auth.Seal(testKey, d)
	return d
}

// reseal recomputes d's tag under key after the caller changed the header.
func reseal(key auth.Key, d []byte) []byte {
	auth.Seal(key, d)
	return d
}

// badTag flips one bit of d's tag.
func badTag(d []byte) []byte {
	d[27] ^= 0x01
	return d
}

// validData is a well-formed version 1 DATA datagram with a small body.
func validData() []byte {
	return aggdDatagram(0x11, 0, []byte("inner packet bytes"))
}
