package wire

import (
	"bytes"
	"testing"
)

func TestHeaderLayoutByHand(t *testing.T) {
	h := Header{Type: TypeProbeReply, Flags: FlagDuplicate, LinkID: 0xfe, KeyID: 0x7f,
		Session: 0x01020304, Seq: 0x05060708, LinkSeq: 0x090a0b0c, Timestamp: 0x0d0e0f10,
		Tag: 0x1112131415161718}
	want := []byte{
		0x15, 0x01, 0xfe, 0x7f, // version 1 | type 5, flags, link, key id
		0x01, 0x02, 0x03, 0x04, // session
		0x05, 0x06, 0x07, 0x08, // seq
		0x09, 0x0a, 0x0b, 0x0c, // link seq
		0x0d, 0x0e, 0x0f, 0x10, // timestamp
		0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, // tag
	}
	got := h.Append(nil)
	if !bytes.Equal(got, want) {
		t.Fatalf("encoded\n got % x\nwant % x", got, want)
	}
	back, err := ParseHeader(want)
	if err != nil {
		t.Fatal(err)
	}
	if back != h {
		t.Fatalf("parsed %+v, want %+v", back, h)
	}
	if !back.Duplicate() {
		t.Error("Duplicate() = false for a header with FlagDuplicate")
	}
}

func TestHeaderRoundTripEveryType(t *testing.T) {
	for typ := TypeData; typ <= TypeRepairRequest; typ++ {
		h := Header{Type: typ, LinkID: 254, KeyID: 255, Session: ^uint32(0), Seq: ^uint32(0), LinkSeq: 1, Timestamp: 2, Tag: ^uint64(0)}
		b := make([]byte, HeaderLen)
		h.Put(b)
		got, err := ParseHeader(b)
		if err != nil || got != h {
			t.Errorf("%s: parsed %+v, %v; want %+v", typ, got, err, h)
		}
	}
}

func TestParseHeaderRejects(t *testing.T) {
	valid := (&Header{Type: TypeData}).Append(nil)
	with := func(i int, v byte) []byte {
		b := bytes.Clone(valid)
		b[i] = v
		return b
	}
	cases := []struct {
		name string
		b    []byte
		want Reason
	}{
		{"nil", nil, ReasonTruncated},
		{"27 bytes", valid[:27], ReasonTruncated},
		{"one byte over the maximum", make([]byte, MaxPacket+1), ReasonOversize},
		{"version 0", with(0, 0x01), ReasonBadVersion},
		{"version 2", with(0, 0x21), ReasonBadVersion},
		{"version 15", with(0, 0xf1), ReasonBadVersion},
		{"type 0", with(0, 0x10), ReasonBadType},
		{"type 12", with(0, 0x1c), ReasonBadType},
		{"type 15", with(0, 0x1f), ReasonBadType},
		{"flag 0x02 (mac2) on a data", with(1, 0x02), ReasonBadFlags},
		{"flag 0x08", with(1, 0x08), ReasonBadFlags},
		{"flag 0x04 (sparse) on a probe", []byte{Version<<4 | uint8(TypeProbe), FlagSparse, HeaderLen - 1: 0}, ReasonBadFlags},
		{"flag 0x80", with(1, 0x80), ReasonBadFlags},
		{"version checked before type", with(0, 0x20), ReasonBadVersion},
	}
	for _, c := range cases {
		_, err := ParseHeader(c.b)
		if got := ReasonOf(err); got != c.want {
			t.Errorf("%s: reason %s (%v), want %s", c.name, got, err, c.want)
		}
	}
}

func TestParseHeaderAcceptsMaxPacket(t *testing.T) {
	b := make([]byte, MaxPacket)
	(&Header{Type: TypeData}).Put(b)
	if _, err := ParseHeader(b); err != nil {
		t.Fatalf("a %d-byte datagram is rejected: %v", MaxPacket, err)
	}
}

func TestPutPanicsOnShortBuffer(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Put into a 27-byte buffer did not panic")
		}
	}()
	(&Header{}).Put(make([]byte, HeaderLen-1))
}

func TestTypeString(t *testing.T) {
	if TypeFeedback.String() != "feedback" || TypeHandshakeInit.String() != "handshake_init" || TypeLinkParams.String() != "link_params" {
		t.Errorf("names: %s, %s, %s", TypeFeedback, TypeHandshakeInit, TypeLinkParams)
	}
	if !TypeCookieReply.Valid() || Type(12).Valid() || Type(0).Valid() {
		t.Errorf("Valid: cookie_reply %v, 12 %v, 0 %v", TypeCookieReply.Valid(), Type(12).Valid(), Type(0).Valid())
	}
	if TypeLinkNames.String() != "link_names" || TypeRepairRequest.String() != "repair_request" || TypeCookieReply.String() != "cookie_reply" {
		t.Errorf("types 9, 10 and 11 print as %q, %q and %q", TypeLinkNames, TypeRepairRequest, TypeCookieReply)
	}
	if Type(12).String() != "type(12)" {
		t.Errorf("undefined type prints as %q", Type(12))
	}
}

func TestOverheadMatchesDoc(t *testing.T) {
	// 1500-byte uplinks give agg0 an MTU of 1444 (docs/wire-format.md).
	if 1500-Overhead != 1444 {
		t.Fatalf("overhead %d", Overhead)
	}
}
