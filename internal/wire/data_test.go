package wire

import (
	"encoding/binary"
	"testing"
)

func ipv4Packet(n int) []byte {
	p := make([]byte, n)
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(n))
	return p
}

func ipv6Packet(payload int) []byte {
	p := make([]byte, 40+payload)
	p[0] = 0x60
	binary.BigEndian.PutUint16(p[4:], uint16(payload))
	return p
}

func TestCheckData(t *testing.T) {
	withIHL := func(ihl byte) []byte { p := ipv4Packet(40); p[0] = 0x40 | ihl; return p }
	lenMismatch4 := ipv4Packet(40)
	binary.BigEndian.PutUint16(lenMismatch4[2:], 41)
	cases := []struct {
		name string
		body []byte
		want Reason
	}{
		{"ipv4 minimal", ipv4Packet(20), ReasonNone},
		{"ipv4 with options", withIHL(15)[:40], ReasonBadBody}, // IHL 60 > 40 bytes
		{"ipv4 ihl 6", withIHL(6), ReasonNone},
		{"ipv4 ihl 4", withIHL(4), ReasonBadBody},
		{"ipv4 total length too big", lenMismatch4, ReasonBadLength},
		{"ipv4 trailing byte", append(ipv4Packet(20), 0), ReasonBadLength},
		{"ipv4 19 bytes", ipv4Packet(20)[:19], ReasonBadLength},
		{"ipv4 maximum", ipv4Packet(65535), ReasonNone},
		{"ipv6 empty payload", ipv6Packet(0), ReasonNone},
		{"ipv6 1400 payload", ipv6Packet(1400), ReasonNone},
		{"ipv6 39 bytes", ipv6Packet(0)[:39], ReasonBadLength},
		{"ipv6 payload short", ipv6Packet(10)[:49], ReasonBadLength},
		{"empty", nil, ReasonBadLength},
		{"version 0", make([]byte, 20), ReasonBadBody},
		{"version 5", []byte{0x55}, ReasonBadBody},
	}
	for _, c := range cases {
		if got := ReasonOf(CheckData(c.body)); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
