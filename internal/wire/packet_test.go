package wire

import (
	"bytes"
	"reflect"
	"testing"
)

func sampleMessages() []Message {
	hdr := func(t Type) Header { return Header{Type: t, LinkID: 1, KeyID: 2, Session: 3, Timestamp: 4, Tag: 5} }
	return []Message{
		{hdr(TypeData), Data(ipv4Packet(64))},
		{hdr(TypeData), Data(ipv6Packet(8))},
		{hdr(TypeHandshakeInit), HandshakeBody{SenderIndex: 9, Noise: make([]byte, HandshakeInitNoiseMin)}},
		{hdr(TypeHandshakeResp), HandshakeBody{SenderIndex: 9, Noise: make([]byte, HandshakeRespNoiseMin)}},
		{hdr(TypeProbe), ProbeBody{Counter: 1}},
		{hdr(TypeProbeReply), ProbeReplyBody{Counter: 2, EchoTimestamp: 3, EchoLinkID: 4}},
		{hdr(TypeFeedback), FeedbackBody{Counter: 3, Links: []LinkReport{{LinkID: 0, RxBytes: 1}}}},
		{hdr(TypeLossNotice), LossNoticeBody{Counter: 4, Ranges: []SeqRange{{Start: 5, Count: 6}}}},
		{hdr(TypeLinkParams), LinkParamsBody{Counter: 5, Links: []LinkParam{{LinkID: 0, Class: LinkClassOverflow, RateBps: 50_000_000}}}},
		{hdr(TypeLinkNames), LinkNamesBody{Counter: 6, Links: []LinkName{{LinkID: 0, Name: "dsl"}, {LinkID: 4, Name: "lte"}}}},
		{hdr(TypeRepairRequest), RepairRequestBody{Counter: 7, Gaps: []LinkSeqRange{{LinkID: 2, Count: 3, Start: 0xfffffffe}}}},
		{withFlags(hdr(TypeHandshakeInit), FlagMac2), HandshakeBody{SenderIndex: 9, Noise: make([]byte, HandshakeInitNoiseMin), Mac2: make([]byte, Mac2Len)}},
		{hdr(TypeCookieReply), CookieReplyBody{Nonce: [CookieNonceLen]byte{1}, Sealed: [CookieSealedLen]byte{2}}},
	}
}

func withFlags(h Header, flags uint8) Header { h.Flags = flags; return h }

func TestParseDispatchesByType(t *testing.T) {
	for _, want := range sampleMessages() {
		b := want.Append(nil)
		got, err := Parse(b)
		if err != nil {
			t.Fatalf("%s: %v", want.Header.Type, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: parsed\n%#v\nwant\n%#v", want.Header.Type, got, want)
		}
		if !bytes.Equal(got.Append(nil), b) {
			t.Errorf("%s: re-encoding differs", want.Header.Type)
		}
	}
}

func TestMessageCounter(t *testing.T) {
	want := map[Type]uint64{TypeData: 0, TypeHandshakeInit: 0, TypeHandshakeResp: 0,
		TypeProbe: 1, TypeProbeReply: 2, TypeFeedback: 3, TypeLossNotice: 4, TypeLinkParams: 5, TypeLinkNames: 6, TypeRepairRequest: 7,
		TypeCookieReply: 0}
	for _, m := range sampleMessages() {
		if got := m.Counter(); got != want[m.Header.Type] {
			t.Errorf("%s: Counter() = %d, want %d", m.Header.Type, got, want[m.Header.Type])
		}
	}
}

func TestParseReportsBodyFaults(t *testing.T) {
	for _, m := range sampleMessages() {
		b := m.Append(nil)
		b = b[:len(b)-1]
		if _, err := Parse(b); ReasonOf(err) != ReasonBadLength {
			t.Errorf("%s one byte short: %v", m.Header.Type, err)
		}
	}
}

func TestParseHeaderFaultBeforeBody(t *testing.T) {
	b := Message{Header: Header{Type: TypeProbe, Flags: 0x40}}.Append(nil) // no body either
	if _, err := Parse(b); ReasonOf(err) != ReasonBadFlags {
		t.Fatalf("bad flags and no body: %v, want bad_flags first", err)
	}
}
