package wire

import (
	"bytes"
	"reflect"
	"testing"
)

// The fuzz targets check that no input panics a parser, that every rejection carries
// a reason, and that whatever parses re-encodes to the same bytes (so no two byte
// strings mean the same packet).

func addSeeds(f *testing.F) {
	for _, m := range sampleMessages() {
		f.Add(m.Append(nil))
	}
	f.Add([]byte{})
	f.Add(make([]byte, HeaderLen))
}

func checkRejection(t *testing.T, err error) {
	t.Helper()
	if err != nil && ReasonOf(err) == ReasonNone {
		t.Fatalf("rejection without a reason: %v", err)
	}
}

func FuzzParseHeader(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeader(b)
		checkRejection(t, err)
		if err != nil {
			return
		}
		if got := h.Append(nil); !bytes.Equal(got, b[:HeaderLen]) {
			t.Fatalf("re-encoded % x, input % x", got, b[:HeaderLen])
		}
	})
}

func FuzzParse(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Parse(b)
		checkRejection(t, err)
		if err != nil {
			return
		}
		if got := p.Append(nil); !bytes.Equal(got, b) {
			t.Fatalf("re-encoded\n% x\ninput\n% x", got, b)
		}
	})
}

// fuzzBody runs one body parser: no panic, a reason for every rejection, and
// parse(marshal(parse(b))) == parse(b) with marshal(parse(b)) == b.
func fuzzBody[T any](f *testing.F, seed []byte, parse func([]byte) (T, error), marshal func(T) []byte) {
	f.Add(seed)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := parse(b)
		checkRejection(t, err)
		if err != nil {
			return
		}
		enc := marshal(v)
		if !bytes.Equal(enc, b) {
			t.Fatalf("re-encoded % x, input % x", enc, b)
		}
		again, err := parse(enc)
		if err != nil || !reflect.DeepEqual(again, v) {
			t.Fatalf("second parse %+v, %v; first %+v", again, err, v)
		}
	})
}

func FuzzParseHandshakeInit(f *testing.F) {
	seed := HandshakeBody{SenderIndex: 1, Noise: make([]byte, HandshakeInitNoiseMin)}.Marshal()
	fuzzBody(f, seed, ParseHandshakeInit, HandshakeBody.Marshal)
}

func FuzzParseHandshakeResp(f *testing.F) {
	seed := HandshakeBody{SenderIndex: 1, Noise: make([]byte, HandshakeRespNoiseMin)}.Marshal()
	fuzzBody(f, seed, ParseHandshakeResp, HandshakeBody.Marshal)
}

func FuzzParseProbe(f *testing.F) {
	fuzzBody(f, ProbeBody{Counter: 1}.Marshal(), ParseProbe, ProbeBody.Marshal)
}

func FuzzParseProbeReply(f *testing.F) {
	fuzzBody(f, ProbeReplyBody{Counter: 1, EchoLinkID: 2}.Marshal(), ParseProbeReply, ProbeReplyBody.Marshal)
}

func FuzzParseFeedback(f *testing.F) {
	seed := FeedbackBody{Counter: 1, Links: []LinkReport{{LinkID: 1, OWDMinMicros: -3}}}.Marshal()
	fuzzBody(f, seed, ParseFeedback, FeedbackBody.Marshal)
}

func FuzzParseLossNotice(f *testing.F) {
	seed := LossNoticeBody{Counter: 1, Ranges: []SeqRange{{Start: 1, Count: 2}}}.Marshal()
	fuzzBody(f, seed, ParseLossNotice, LossNoticeBody.Marshal)
}

func FuzzParseLinkParams(f *testing.F) {
	seed := LinkParamsBody{Counter: 1, Links: []LinkParam{
		{LinkID: 0, Class: LinkClassPrimary, RateBps: 100_000_000},
		{LinkID: 1, Class: LinkClassBackup},
	}}.Marshal()
	fuzzBody(f, seed, ParseLinkParams, LinkParamsBody.Marshal)
}

func FuzzParseLinkNames(f *testing.F) {
	seed := LinkNamesBody{Counter: 1, Links: []LinkName{{LinkID: 0, Name: "dsl"}, {LinkID: 7, Name: "lte-2.x_y"}}}.Marshal()
	fuzzBody(f, seed, ParseLinkNames, LinkNamesBody.Marshal)
}

func FuzzParseRepairRequest(f *testing.F) {
	seed := RepairRequestBody{Counter: 1, Gaps: []LinkSeqRange{{LinkID: 2, Count: 1, Start: 9}, {LinkID: 0, Count: 3, Start: 0xffffffff}}}.Marshal()
	fuzzBody(f, seed, ParseRepairRequest, RepairRequestBody.Marshal)
}

func FuzzParseHandshakeInitMac2(f *testing.F) {
	seed := HandshakeBody{SenderIndex: 1, Noise: make([]byte, HandshakeInitNoiseMin), Mac2: make([]byte, Mac2Len)}.Marshal()
	fuzzBody(f, seed, ParseHandshakeInitMac2, HandshakeBody.Marshal)
}

func FuzzParseCookieReply(f *testing.F) {
	fuzzBody(f, CookieReplyBody{Nonce: [CookieNonceLen]byte{1}}.Marshal(), ParseCookieReply, CookieReplyBody.Marshal)
}

func FuzzCheckData(f *testing.F) {
	f.Add(ipv4Packet(20))
	f.Add(ipv6Packet(0))
	f.Fuzz(func(t *testing.T, b []byte) {
		checkRejection(t, CheckData(b))
	})
}
