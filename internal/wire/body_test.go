package wire

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"strings"
	"testing"
)

func TestProbeBodies(t *testing.T) {
	p := ProbeBody{Counter: 0x0102030405060708}
	b := p.Marshal()
	if !bytes.Equal(b, []byte{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Fatalf("probe % x", b)
	}
	if got, err := ParseProbe(b); err != nil || got != p {
		t.Fatalf("round trip %+v, %v", got, err)
	}

	r := ProbeReplyBody{Counter: 9, EchoTimestamp: 0xaabbccdd, EchoLinkID: 3}
	b = r.Marshal()
	want := []byte{0, 0, 0, 0, 0, 0, 0, 9, 0xaa, 0xbb, 0xcc, 0xdd, 3}
	if !bytes.Equal(b, want) {
		t.Fatalf("probe reply % x, want % x", b, want)
	}
	if got, err := ParseProbeReply(b); err != nil || got != r {
		t.Fatalf("round trip %+v, %v", got, err)
	}

	tr := ProbeReplyBody{Counter: 9, EchoTimestamp: 0xaabbccdd, EchoLinkID: 3, Train: true, Arrival: 0x01020304}
	b = tr.Marshal()
	want = append(want, 1, 2, 3, 4)
	if !bytes.Equal(b, want) {
		t.Fatalf("train probe reply % x, want % x", b, want)
	}
	if got, err := ParseProbeReply(b); err != nil || got != tr {
		t.Fatalf("round trip %+v, %v", got, err)
	}
	for _, n := range []int{ProbeReplyLen + 1, ProbeReplyLen + 2, ProbeReplyLen + 3, TrainReplyLen + 1} {
		if _, err := ParseProbeReply(append(bytes.Clone(b), 0)[:n]); ReasonOf(err) != ReasonBadLength {
			t.Errorf("probe reply of %d bytes: %v, want bad_length", n, err)
		}
	}
}

// A train probe is the counter and zero padding: any length from 8 on, and only zeros.
func TestTrainProbe(t *testing.T) {
	p := ProbeBody{Counter: 5, Padding: 1364}
	b := p.Marshal()
	if len(b) != 1372 || !bytes.Equal(b[8:], make([]byte, 1364)) {
		t.Fatalf("train probe is %d bytes: % x", len(b), b[:16])
	}
	got, err := ParseProbe(b)
	if err != nil || got != p || !got.Train() {
		t.Fatalf("round trip %+v (train %v), %v", got, got.Train(), err)
	}
	if plain, _ := ParseProbe(b[:8]); plain.Train() {
		t.Error("an 8-byte probe parsed as a train probe")
	}
	for n := 0; n < ProbeBodyLen; n++ {
		if _, err := ParseProbe(b[:n]); ReasonOf(err) != ReasonBadLength {
			t.Errorf("probe cut to %d bytes: %v", n, err)
		}
	}
	b[100] = 1
	if _, err := ParseProbe(b); ReasonOf(err) != ReasonBadBody {
		t.Errorf("train probe with a non-zero padding byte: %v, want bad_body", err)
	}
}

func TestLinkReportLayoutByHand(t *testing.T) {
	fb := FeedbackBody{Counter: 1, Links: []LinkReport{{
		LinkID: 7, RxPackets: 0x01020304, RxBytes: 0x05060708090a0b0c, HighestLinkSeq: 0x0d0e0f10,
		Lost: 0x11121314, OWDMinMicros: -2, OWDLastMicros: 0x15161718,
	}}}
	want := []byte{
		0, 0, 0, 0, 0, 0, 0, 1, // counter
		1,          // n
		7, 0, 0, 0, // link id, reserved
		0x01, 0x02, 0x03, 0x04,
		0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c,
		0x0d, 0x0e, 0x0f, 0x10,
		0x11, 0x12, 0x13, 0x14,
		0xff, 0xff, 0xff, 0xfe, // -2
		0x15, 0x16, 0x17, 0x18,
	}
	got := fb.Marshal()
	if !bytes.Equal(got, want) {
		t.Fatalf("feedback\n got % x\nwant % x", got, want)
	}
	back, err := ParseFeedback(got)
	if err != nil || !reflect.DeepEqual(back, fb) {
		t.Fatalf("round trip %+v, %v", back, err)
	}
}

func TestLossNoticeLayoutByHand(t *testing.T) {
	ln := LossNoticeBody{Counter: 2, Ranges: []SeqRange{{Start: 0xfffffffe, Count: 4}, {Start: 1, Count: 0x0102}}}
	want := []byte{0, 0, 0, 0, 0, 0, 0, 2, 2, 0xff, 0xff, 0xff, 0xfe, 0, 4, 0, 0, 0, 1, 1, 2}
	got := ln.Marshal()
	if !bytes.Equal(got, want) {
		t.Fatalf("loss notice\n got % x\nwant % x", got, want)
	}
	back, err := ParseLossNotice(got)
	if err != nil || !reflect.DeepEqual(back, ln) {
		t.Fatalf("round trip %+v, %v", back, err)
	}
}

func TestLinkParamsLayoutByHand(t *testing.T) {
	lp := LinkParamsBody{Counter: 0x0102030405060708, Links: []LinkParam{
		{LinkID: 0, Class: LinkClassPrimary, MTU: 0x0102, RateBps: 0x1112131415161718},
		{LinkID: 3, Class: LinkClassOverflow, MTU: 1436, RateBps: 50_000_000},
		{LinkID: 254, Class: LinkClassBackup, RateBps: 0},
		{LinkID: 7, Class: LinkClassOverflow, Offline: true, MTU: 1424, RateBps: 1},
	}}
	want := []byte{
		1, 2, 3, 4, 5, 6, 7, 8, // counter
		4,          // n
		0, 0, 1, 2, // link 0, primary, MTU 0x0102
		0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18,
		3, 1, 0x05, 0x9c, // link 3, overflow, MTU 1436
		0, 0, 0, 0, 0x02, 0xfa, 0xf0, 0x80, // 50 Mbit/s
		254, 2, 0, 0, // link 254, backup, MTU unknown
		0, 0, 0, 0, 0, 0, 0, 0, // rate unknown
		7, 0x81, 0x05, 0x90, // link 7, overflow and offline, MTU 1424
		0, 0, 0, 0, 0, 0, 0, 1,
	}
	got := lp.Marshal()
	if !bytes.Equal(got, want) {
		t.Fatalf("link params\n got % x\nwant % x", got, want)
	}
	if len(got) != listHeaderLen+4*LinkParamLen {
		t.Fatalf("length %d", len(got))
	}
	back, err := ParseLinkParams(got)
	if err != nil || !reflect.DeepEqual(back, lp) {
		t.Fatalf("round trip %+v, %v", back, err)
	}
}

func TestLinkParamsBadLengths(t *testing.T) {
	valid := LinkParamsBody{Counter: 1, Links: []LinkParam{{LinkID: 1, RateBps: 7}, {LinkID: 2, Class: LinkClassBackup}}}.Marshal()
	cases := map[string][]byte{
		"empty":            {},
		"counter only":     valid[:CounterLen],
		"count too big":    append(append([]byte{}, valid[:CounterLen]...), append([]byte{3}, valid[listHeaderLen:]...)...),
		"count too small":  append(append([]byte{}, valid[:CounterLen]...), append([]byte{1}, valid[listHeaderLen:]...)...),
		"partial entry":    valid[:listHeaderLen+LinkParamLen+5],
		"trailing byte":    append(bytes.Clone(valid), 0),
		"n=0 with entries": append(append([]byte{}, valid[:CounterLen]...), append([]byte{0}, valid[listHeaderLen:]...)...),
	}
	for name, b := range cases {
		if _, err := ParseLinkParams(b); ReasonOf(err) != ReasonBadLength {
			t.Errorf("%s: %v, want bad_length", name, err)
		}
	}
}

func TestLinkParamsBadClass(t *testing.T) {
	b := LinkParamsBody{Links: []LinkParam{{LinkID: 1}, {LinkID: 2, Class: LinkClassBackup}}}.Marshal()
	for _, class := range []byte{3, 4, 0x40, 0x83, 0xff} {
		c := bytes.Clone(b)
		c[listHeaderLen+LinkParamLen+1] = class // second entry's class
		if _, err := ParseLinkParams(c); ReasonOf(err) != ReasonBadBody {
			t.Errorf("class %d: %v, want bad_body", class, err)
		}
	}
	for class := LinkClassPrimary; class <= LinkClassBackup; class++ {
		for _, offline := range []bool{false, true} {
			c := bytes.Clone(b)
			c[listHeaderLen+1] = class
			if offline {
				c[listHeaderLen+1] |= LinkParamOffline
			}
			if got, err := ParseLinkParams(c); err != nil || got.Links[0].Class != class || got.Links[0].Offline != offline {
				t.Errorf("class %d, offline %v: %+v, %v", class, offline, got, err)
			}
		}
	}
}

// Bytes 2-3 of an entry were reserved (zero) before they carried the MTU; a zero there
// still reads as "MTU unknown", so a CPE that does not announce one changes nothing.
func TestLinkParamsMTUBytes(t *testing.T) {
	b := LinkParamsBody{Links: []LinkParam{{LinkID: 1}, {LinkID: 2, MTU: 1436}}}.Marshal()
	back, err := ParseLinkParams(b)
	if err != nil {
		t.Fatal(err)
	}
	if back.Links[0].MTU != 0 || back.Links[1].MTU != 1436 {
		t.Fatalf("MTUs %d, %d; want 0 (unknown), 1436", back.Links[0].MTU, back.Links[1].MTU)
	}
	if got := b[listHeaderLen+LinkParamLen+2:][:2]; !bytes.Equal(got, []byte{0x05, 0x9c}) {
		t.Fatalf("entry 1's MTU on the wire: % x, want 05 9c (big-endian)", got)
	}
}

func TestLinkParamsAppendPanicsBeyondOneByteCount(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("256 link params were encoded with a one-byte count")
		}
	}()
	LinkParamsBody{Links: make([]LinkParam, MaxLinkParams+1)}.Marshal()
}

func TestEmptyListsRoundTrip(t *testing.T) {
	fb, err := ParseFeedback(FeedbackBody{Counter: 3}.Marshal())
	if err != nil || fb.Counter != 3 || len(fb.Links) != 0 {
		t.Fatalf("empty feedback: %+v, %v", fb, err)
	}
	ln, err := ParseLossNotice(LossNoticeBody{Counter: 4}.Marshal())
	if err != nil || ln.Counter != 4 || len(ln.Ranges) != 0 {
		t.Fatalf("empty loss notice: %+v, %v", ln, err)
	}
	lp, err := ParseLinkParams(LinkParamsBody{Counter: 5}.Marshal())
	if err != nil || lp.Counter != 5 || len(lp.Links) != 0 {
		t.Fatalf("empty link params: %+v, %v", lp, err)
	}
}

func TestHandshakeBodies(t *testing.T) {
	noise := bytes.Repeat([]byte{0xab}, HandshakeInitNoiseMin)
	hb := HandshakeBody{SenderIndex: 0xdeadbeef, Noise: noise}
	b := hb.Marshal()
	if !bytes.Equal(b[:4], []byte{0xde, 0xad, 0xbe, 0xef}) || !bytes.Equal(b[4:], noise) {
		t.Fatalf("handshake body % x", b)
	}
	got, err := ParseHandshakeInit(b)
	if err != nil || !reflect.DeepEqual(got, hb) {
		t.Fatalf("init round trip %+v, %v", got, err)
	}
	if _, err := ParseHandshakeInit(b[:len(b)-1]); ReasonOf(err) != ReasonBadLength {
		t.Errorf("init one byte short: %v", err)
	}
	resp := b[:4+HandshakeRespNoiseMin]
	if _, err := ParseHandshakeResp(resp); err != nil {
		t.Errorf("minimal resp: %v", err)
	}
	if _, err := ParseHandshakeResp(resp[:len(resp)-1]); ReasonOf(err) != ReasonBadLength {
		t.Errorf("resp one byte short: %v", err)
	}
	if got, err := ParseHandshakeResp(b); err != nil || len(got.Noise) != HandshakeInitNoiseMin {
		t.Errorf("resp with a longer Noise message (a payload): %d bytes, %v", len(got.Noise), err)
	}
	binary.BigEndian.PutUint32(b, 0)
	if _, err := ParseHandshakeInit(b); ReasonOf(err) != ReasonBadBody {
		t.Errorf("sender index 0: %v", err)
	}
}

// Every proper prefix and every one-byte extension of a fixed-layout body must be
// rejected as bad_length: the parsers accept exactly one length per content. (A
// probe's padding makes its length free: TestTrainProbe.)
func TestBodiesRejectWrongLengths(t *testing.T) {
	parsers := map[string]struct {
		valid []byte
		parse func([]byte) error
	}{
		"probe_reply": {ProbeReplyBody{Counter: 1}.Marshal(), func(b []byte) error { _, err := ParseProbeReply(b); return err }},
		"feedback": {FeedbackBody{Counter: 1, Links: []LinkReport{{LinkID: 1}, {LinkID: 2}}}.Marshal(),
			func(b []byte) error { _, err := ParseFeedback(b); return err }},
		"loss_notice": {LossNoticeBody{Counter: 1, Ranges: []SeqRange{{1, 2}, {3, 4}}}.Marshal(),
			func(b []byte) error { _, err := ParseLossNotice(b); return err }},
		"link_params": {LinkParamsBody{Counter: 1, Links: []LinkParam{{LinkID: 1, Class: LinkClassOverflow, RateBps: 1}, {LinkID: 2}}}.Marshal(),
			func(b []byte) error { _, err := ParseLinkParams(b); return err }},
		"link_names": {LinkNamesBody{Counter: 1, Links: []LinkName{{LinkID: 1, Name: "dsl"}, {LinkID: 2, Name: "l"}}}.Marshal(),
			func(b []byte) error { _, err := ParseLinkNames(b); return err }},
	}
	for name, p := range parsers {
		if err := p.parse(p.valid); err != nil {
			t.Fatalf("%s: valid body rejected: %v", name, err)
		}
		for n := 0; n < len(p.valid); n++ {
			if err := p.parse(p.valid[:n]); ReasonOf(err) != ReasonBadLength {
				t.Errorf("%s cut to %d bytes: %v", name, n, err)
			}
		}
		if err := p.parse(append(bytes.Clone(p.valid), 0)); ReasonOf(err) != ReasonBadLength {
			t.Errorf("%s with a trailing byte: %v", name, err)
		}
	}
}

func TestFeedbackReservedBytesMustBeZero(t *testing.T) {
	b := FeedbackBody{Links: []LinkReport{{LinkID: 1}, {LinkID: 2}}}.Marshal()
	for _, off := range []int{1, 2, 3} {
		c := bytes.Clone(b)
		c[listHeaderLen+LinkReportLen+off] = 0x80 // second report's reserved bytes
		if _, err := ParseFeedback(c); ReasonOf(err) != ReasonBadBody {
			t.Errorf("reserved byte %d set: %v", off, err)
		}
	}
}

func TestListAppendPanicsBeyondOneByteCount(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("256 link reports were encoded with a one-byte count")
		}
	}()
	FeedbackBody{Links: make([]LinkReport, MaxLinkReports+1)}.Marshal()
}

func TestListAppendAcceptsMaximum(t *testing.T) {
	ln := LossNoticeBody{Ranges: make([]SeqRange, MaxSeqRanges)}
	back, err := ParseLossNotice(ln.Marshal())
	if err != nil || len(back.Ranges) != MaxSeqRanges {
		t.Fatalf("%d ranges: %d back, %v", MaxSeqRanges, len(back.Ranges), err)
	}
}

// A name the config would refuse cannot be sent: Append panics rather than put it on
// the wire, where the peer would drop the whole message.
func TestLinkNamesAppendRefusesBadNames(t *testing.T) {
	for _, name := range []string{"", "-dsl", "a b", "é", strings.Repeat("x", MaxLinkNameLen+1)} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("name %q encoded", name)
				}
			}()
			LinkNamesBody{Links: []LinkName{{LinkID: 1, Name: name}}}.Marshal()
		}()
	}
	long := strings.Repeat("x", MaxLinkNameLen)
	got, err := ParseLinkNames(LinkNamesBody{Links: []LinkName{{LinkID: 1, Name: long}}}.Marshal())
	if err != nil || got.Links[0].Name != long {
		t.Errorf("a %d-byte name: %v, %v", MaxLinkNameLen, got, err)
	}
}
