package ecn

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// ipv4 returns a 20-byte IPv4 header with the given TOS and a correct checksum, the
// other fields drawn from r.
func ipv4(r *rand.Rand, tos byte) []byte {
	h := make([]byte, 20)
	for i := range h {
		h[i] = byte(r.Uint32())
	}
	h[0], h[1], h[10], h[11] = 0x45, tos, 0, 0
	c := checksum(h)
	h[10], h[11] = byte(c>>8), byte(c)
	return h
}

// checksum is the IPv4 header checksum computed from scratch (RFC 791).
func checksum(h []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		s += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func TestMarkIPv4(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		dscp := byte(r.Uint32()) &^ 0b11
		for _, cp := range []byte{NotECT, ECT1, ECT0, CE} {
			h := ipv4(r, dscp|cp)
			before := bytes.Clone(h)
			got := Mark(h)
			if want := cp != NotECT; got != want {
				t.Fatalf("case %d, codepoint %02b: Mark = %v, want %v", i, cp, got, want)
			}
			if cp == NotECT || cp == CE {
				if !bytes.Equal(h, before) {
					t.Fatalf("case %d, codepoint %02b: header changed to % x", i, cp, h)
				}
				continue
			}
			if h[1] != dscp|CE {
				t.Fatalf("case %d: TOS %#x, want %#x (DSCP kept, CE set)", i, h[1], dscp|CE)
			}
			if c := checksum(h); c != 0 {
				t.Fatalf("case %d: header % x does not check (sum %#x)", i, h, c)
			}
			h[1], h[10], h[11] = before[1], before[10], before[11]
			if !bytes.Equal(h, before) {
				t.Fatalf("case %d: bytes besides TOS and checksum changed", i)
			}
		}
	}
}

func TestMarkIPv6(t *testing.T) {
	for _, cp := range []byte{NotECT, ECT1, ECT0, CE} {
		h := make([]byte, 40)
		// Version 6, traffic class 0xb8|cp (DSCP EF), flow label 0x12345.
		tc := 0xb8 | cp
		h[0], h[1], h[2], h[3] = 0x60|tc>>4, tc<<4|0x1, 0x23, 0x45
		before := bytes.Clone(h)
		if got, want := Mark(h), cp != NotECT; got != want {
			t.Fatalf("codepoint %02b: Mark = %v, want %v", cp, got, want)
		}
		want := bytes.Clone(before)
		if cp != NotECT {
			want[1] |= 0x30
		}
		if !bytes.Equal(h, want) {
			t.Errorf("codepoint %02b: header % x, want % x", cp, h[:4], want[:4])
		}
		if got, _ := Of(h); cp != NotECT && got != CE {
			t.Errorf("codepoint %02b: Of after Mark = %02b, want CE", cp, got)
		}
	}
}

// Anything that is not a whole IPv4 or IPv6 header is neither read nor changed.
func TestMarkLeavesOtherBytesAlone(t *testing.T) {
	for _, p := range [][]byte{
		nil,
		{0x45, 0x02}, // IPv4, truncated
		append([]byte{0x60, 0x20}, make([]byte, 30)...), // IPv6, truncated
		append([]byte{0x52, 0x03}, make([]byte, 40)...), // version 5
	} {
		before := bytes.Clone(p)
		if _, ok := Of(p); ok {
			t.Errorf("% x: Of reports a codepoint", p)
		}
		if Mark(p) || !bytes.Equal(p, before) {
			t.Errorf("% x: marked", p)
		}
	}
}
