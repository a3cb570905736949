package wire

import (
	"encoding/binary"
	"fmt"
)

// Control bodies. Each has Append (encode onto a buffer), Marshal (encode into a new
// buffer) and a Parse function. Parsers demand the exact length the type implies
// (bad_length) and zero reserved bytes (bad_body), so that a parsed body re-encodes to
// the same bytes. Parsed slices alias the input buffer.

// Fixed sizes of the control bodies.
const (
	CounterLen     = 8
	SenderIndexLen = 4
	ProbeBodyLen   = CounterLen
	ProbeReplyLen  = CounterLen + 4 + 1
	// TrainReplyLen: the reply to a train probe also carries the probe's arrival time.
	TrainReplyLen    = ProbeReplyLen + 4
	LinkReportLen    = 32
	SeqRangeLen      = 6
	LinkParamLen     = 12
	listHeaderLen    = CounterLen + 1 // counter + n
	MaxLinkReports   = 255            // n is one byte
	MaxSeqRanges     = 255
	MaxLinkParams    = 255
	noiseKeyLen      = 32
	noiseTagLen      = 16
	handshakeStamped = 12 // the INIT payload: seconds u64 + nanoseconds u32

	// HandshakeInitNoiseMin is the smallest Noise IK message 1 aggd sends: ephemeral
	// key, encrypted static key, encrypted 12-byte timestamp.
	HandshakeInitNoiseMin = noiseKeyLen + (noiseKeyLen + noiseTagLen) + (handshakeStamped + noiseTagLen)
	// HandshakeRespNoiseMin is the smallest Noise IK message 2: ephemeral key and an
	// encrypted empty payload.
	HandshakeRespNoiseMin = noiseKeyLen + noiseTagLen

	// EphemeralKeyLen is the length of the ephemeral public key that starts a Noise
	// message: new for every INIT, which is how the headend tells an INIT's copies
	// apart, and what binds a cookie reply to its INIT.
	EphemeralKeyLen = noiseKeyLen
)

// HandshakeBody is the body of HANDSHAKE_INIT and HANDSHAKE_RESP: the index the
// sender chose for this session (the peer puts it in the Session field of every packet
// it sends back) and the Noise message; an INIT with FlagMac2 then has its mac2
// (Mac2Len bytes, cookie.go).
type HandshakeBody struct {
	SenderIndex uint32
	Noise       []byte
	Mac2        []byte // nil unless the header has FlagMac2
}

func (b HandshakeBody) Append(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, b.SenderIndex)
	dst = append(dst, b.Noise...)
	return append(dst, b.Mac2...)
}

func (b HandshakeBody) Marshal() []byte {
	return b.Append(make([]byte, 0, SenderIndexLen+len(b.Noise)+len(b.Mac2)))
}

// Ephemeral is the ephemeral public key that starts the Noise message. b must be a
// parsed body (the parsers demand at least that much), or one made from a Noise message.
func (b HandshakeBody) Ephemeral() []byte { return b.Noise[:EphemeralKeyLen] }

// ParseHandshakeInit decodes a HANDSHAKE_INIT body. The Noise message may be longer
// than HandshakeInitNoiseMin (a later payload may carry more), never shorter.
func ParseHandshakeInit(b []byte) (HandshakeBody, error) {
	return parseHandshake(b, TypeHandshakeInit, HandshakeInitNoiseMin)
}

// ParseHandshakeResp decodes a HANDSHAKE_RESP body.
func ParseHandshakeResp(b []byte) (HandshakeBody, error) {
	return parseHandshake(b, TypeHandshakeResp, HandshakeRespNoiseMin)
}

func parseHandshake(b []byte, t Type, noiseMin int) (HandshakeBody, error) {
	if len(b) < SenderIndexLen+noiseMin {
		return HandshakeBody{}, errorf(ReasonBadLength, "%s body is %d bytes, want at least %d", t, len(b), SenderIndexLen+noiseMin)
	}
	idx := binary.BigEndian.Uint32(b)
	if idx == 0 {
		// Zero means "no session" in the header's Session field, so no side may
		// choose it as its index.
		return HandshakeBody{}, errorf(ReasonBadBody, "%s sender index is 0", t)
	}
	return HandshakeBody{SenderIndex: idx, Noise: b[SenderIndexLen:]}, nil
}

// ProbeBody is the body of PROBE: the control counter, and for a *train* probe zero
// padding after it. A train is a few padded probes sent back to back on one link; the
// peer's replies carry their arrival times, whose spread is the time the link's
// bottleneck took to pass them: its capacity, measured before any traffic (the
// session's capacity estimators start from it).
type ProbeBody struct {
	Counter uint64
	Padding int // zero bytes after the counter; > 0 makes it a train probe
}

// Train reports whether the probe is part of a capacity train.
func (b ProbeBody) Train() bool { return b.Padding > 0 }

func (b ProbeBody) Append(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, b.Counter)
	return append(dst, make([]byte, b.Padding)...)
}
func (b ProbeBody) Marshal() []byte { return b.Append(make([]byte, 0, ProbeBodyLen+b.Padding)) }

func ParseProbe(b []byte) (ProbeBody, error) {
	if len(b) < ProbeBodyLen {
		return ProbeBody{}, errorf(ReasonBadLength, "probe body is %d bytes, want %d or more", len(b), ProbeBodyLen)
	}
	for _, c := range b[ProbeBodyLen:] {
		if c != 0 {
			return ProbeBody{}, errorf(ReasonBadBody, "probe padding is not zero")
		}
	}
	return ProbeBody{Counter: binary.BigEndian.Uint64(b), Padding: len(b) - ProbeBodyLen}, nil
}

// ProbeReplyBody is the body of PROBE_REPLY: the replier's own control counter, the
// probe's timestamp echoed (so the prober gets the RTT from its own clock) and the
// link id the probe arrived on; for a train probe also when it arrived, on the
// replier's clock (µs, like the header's timestamp).
type ProbeReplyBody struct {
	Counter       uint64
	EchoTimestamp uint32
	EchoLinkID    uint8
	Train         bool
	Arrival       uint32 // with Train
}

func (b ProbeReplyBody) Append(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, b.Counter)
	dst = binary.BigEndian.AppendUint32(dst, b.EchoTimestamp)
	dst = append(dst, b.EchoLinkID)
	if b.Train {
		dst = binary.BigEndian.AppendUint32(dst, b.Arrival)
	}
	return dst
}

func (b ProbeReplyBody) Marshal() []byte { return b.Append(make([]byte, 0, TrainReplyLen)) }

func ParseProbeReply(b []byte) (ProbeReplyBody, error) {
	if len(b) != ProbeReplyLen && len(b) != TrainReplyLen {
		return ProbeReplyBody{}, errorf(ReasonBadLength, "probe_reply body is %d bytes, want %d or %d", len(b), ProbeReplyLen, TrainReplyLen)
	}
	r := ProbeReplyBody{
		Counter:       binary.BigEndian.Uint64(b),
		EchoTimestamp: binary.BigEndian.Uint32(b[8:]),
		EchoLinkID:    b[12],
	}
	if len(b) == TrainReplyLen {
		r.Train, r.Arrival = true, binary.BigEndian.Uint32(b[ProbeReplyLen:])
	}
	return r, nil
}

// LinkReport is what the receiver tells the sender about one link (32 bytes on the
// wire: link id, 3 reserved zero bytes, then the fields in this order). Counters are
// cumulative and wrap; the sender works with differences between reports.
type LinkReport struct {
	LinkID         uint8
	RxPackets      uint32
	RxBytes        uint64
	HighestLinkSeq uint32
	Lost           uint32
	OWDMinMicros   int32 // minimum one-way delay in the period, receiver clock − sender timestamp
	OWDLastMicros  int32 // latest one-way delay
}

func (r LinkReport) Append(dst []byte) []byte {
	dst = append(dst, r.LinkID, 0, 0, 0)
	dst = binary.BigEndian.AppendUint32(dst, r.RxPackets)
	dst = binary.BigEndian.AppendUint64(dst, r.RxBytes)
	dst = binary.BigEndian.AppendUint32(dst, r.HighestLinkSeq)
	dst = binary.BigEndian.AppendUint32(dst, r.Lost)
	dst = binary.BigEndian.AppendUint32(dst, uint32(r.OWDMinMicros))
	return binary.BigEndian.AppendUint32(dst, uint32(r.OWDLastMicros))
}

// parseLinkReport decodes exactly LinkReportLen bytes (the caller has checked).
func parseLinkReport(b []byte) (LinkReport, error) {
	if b[1]|b[2]|b[3] != 0 {
		return LinkReport{}, errorf(ReasonBadBody, "link report for link %d has non-zero reserved bytes", b[0])
	}
	return LinkReport{
		LinkID:         b[0],
		RxPackets:      binary.BigEndian.Uint32(b[4:]),
		RxBytes:        binary.BigEndian.Uint64(b[8:]),
		HighestLinkSeq: binary.BigEndian.Uint32(b[16:]),
		Lost:           binary.BigEndian.Uint32(b[20:]),
		OWDMinMicros:   int32(binary.BigEndian.Uint32(b[24:])),
		OWDLastMicros:  int32(binary.BigEndian.Uint32(b[28:])),
	}, nil
}

// FeedbackBody is the body of FEEDBACK: one report per link the receiver knows.
type FeedbackBody struct {
	Counter uint64
	Links   []LinkReport
}

// Append encodes the body. More than MaxLinkReports links is a programmer error (the
// count is one byte) and panics rather than sending a silently truncated report.
func (b FeedbackBody) Append(dst []byte) []byte {
	dst = appendListHeader(dst, b.Counter, len(b.Links), MaxLinkReports, "link reports")
	for i := range b.Links {
		dst = b.Links[i].Append(dst)
	}
	return dst
}

func (b FeedbackBody) Marshal() []byte {
	return b.Append(make([]byte, 0, listHeaderLen+len(b.Links)*LinkReportLen))
}

func ParseFeedback(b []byte) (FeedbackBody, error) {
	counter, items, err := parseListHeader(b, TypeFeedback, LinkReportLen)
	if err != nil {
		return FeedbackBody{}, err
	}
	fb := FeedbackBody{Counter: counter}
	if len(items) > 0 {
		fb.Links = make([]LinkReport, 0, len(items)/LinkReportLen)
	}
	for off := 0; off < len(items); off += LinkReportLen {
		r, err := parseLinkReport(items[off : off+LinkReportLen])
		if err != nil {
			return FeedbackBody{}, err
		}
		fb.Links = append(fb.Links, r)
	}
	return fb, nil
}

// SeqRange is Count global sequence numbers starting at Start (wrapping), which the
// receiver must stop waiting for.
type SeqRange struct {
	Start uint32
	Count uint16
}

// LossNoticeBody is the body of LOSS_NOTICE.
type LossNoticeBody struct {
	Counter uint64
	Ranges  []SeqRange
}

// Append encodes the body; more than MaxSeqRanges ranges panics (see FeedbackBody).
func (b LossNoticeBody) Append(dst []byte) []byte {
	dst = appendListHeader(dst, b.Counter, len(b.Ranges), MaxSeqRanges, "sequence ranges")
	for _, r := range b.Ranges {
		dst = binary.BigEndian.AppendUint32(dst, r.Start)
		dst = binary.BigEndian.AppendUint16(dst, r.Count)
	}
	return dst
}

func (b LossNoticeBody) Marshal() []byte {
	return b.Append(make([]byte, 0, listHeaderLen+len(b.Ranges)*SeqRangeLen))
}

func ParseLossNotice(b []byte) (LossNoticeBody, error) {
	counter, items, err := parseListHeader(b, TypeLossNotice, SeqRangeLen)
	if err != nil {
		return LossNoticeBody{}, err
	}
	ln := LossNoticeBody{Counter: counter}
	if len(items) > 0 {
		ln.Ranges = make([]SeqRange, 0, len(items)/SeqRangeLen)
	}
	for off := 0; off < len(items); off += SeqRangeLen {
		ln.Ranges = append(ln.Ranges, SeqRange{
			Start: binary.BigEndian.Uint32(items[off:]),
			Count: binary.BigEndian.Uint16(items[off+4:]),
		})
	}
	return ln, nil
}

// Link classes of a LINK_PARAMS entry: how the CPE means an uplink to be used.
const (
	LinkClassPrimary  uint8 = 0 // carries traffic all the time
	LinkClassOverflow uint8 = 1 // used when the primaries are full
	LinkClassBackup   uint8 = 2 // used only when no primary link is up (then beside overflow links)
)

// LinkParamOffline is set in a LINK_PARAMS entry's class byte, above the class, while
// the CPE's uplink cannot carry traffic (its carrier lost, its source address gone).
const LinkParamOffline uint8 = 0x80

// LinkParam is what the CPE announces about one uplink (12 bytes on the wire: link id,
// class, MTU, rate): its class, whether the uplink is offline (LinkParamOffline in the
// class byte), the largest inner packet it takes over the uplink (0 when unknown), and
// its configured downstream rate in bits per second (0 when unknown).
type LinkParam struct {
	LinkID, Class uint8
	Offline       bool
	MTU           uint16
	RateBps       uint64
}

func (p LinkParam) Append(dst []byte) []byte {
	classByte := p.Class
	if p.Offline {
		classByte |= LinkParamOffline
	}
	dst = append(dst, p.LinkID, classByte)
	dst = binary.BigEndian.AppendUint16(dst, p.MTU)
	return binary.BigEndian.AppendUint64(dst, p.RateBps)
}

// parseLinkParam decodes exactly LinkParamLen bytes (the caller has checked).
func parseLinkParam(b []byte) (LinkParam, error) {
	class := b[1] &^ LinkParamOffline
	if class > LinkClassBackup {
		return LinkParam{}, errorf(ReasonBadBody, "link params for link %d have undefined class %d", b[0], class)
	}
	return LinkParam{LinkID: b[0], Class: class, Offline: b[1]&LinkParamOffline != 0,
		MTU: binary.BigEndian.Uint16(b[2:]), RateBps: binary.BigEndian.Uint64(b[4:])}, nil
}

// LinkParamsBody is the body of LINK_PARAMS: the CPE announces each uplink's class and
// configured downstream rate, so the headend's scheduler starts from the user's numbers
// rather than from nothing, and the largest packet each uplink takes, so the headend
// sends the CPE no packet its lines cannot carry.
type LinkParamsBody struct {
	Counter uint64
	Links   []LinkParam
}

// Append encodes the body; more than MaxLinkParams links panics (see FeedbackBody).
func (b LinkParamsBody) Append(dst []byte) []byte {
	dst = appendListHeader(dst, b.Counter, len(b.Links), MaxLinkParams, "link params")
	for _, p := range b.Links {
		dst = p.Append(dst)
	}
	return dst
}

func (b LinkParamsBody) Marshal() []byte {
	return b.Append(make([]byte, 0, listHeaderLen+len(b.Links)*LinkParamLen))
}

func ParseLinkParams(b []byte) (LinkParamsBody, error) {
	counter, items, err := parseListHeader(b, TypeLinkParams, LinkParamLen)
	if err != nil {
		return LinkParamsBody{}, err
	}
	lp := LinkParamsBody{Counter: counter}
	if len(items) > 0 {
		lp.Links = make([]LinkParam, 0, len(items)/LinkParamLen)
	}
	for off := 0; off < len(items); off += LinkParamLen {
		p, err := parseLinkParam(items[off : off+LinkParamLen])
		if err != nil {
			return LinkParamsBody{}, err
		}
		lp.Links = append(lp.Links, p)
	}
	return lp, nil
}

// FEEDBACK, LOSS_NOTICE and LINK_PARAMS share a layout: counter (u64), n (u8), n fixed-size items.

func appendListHeader(dst []byte, counter uint64, n, max int, what string) []byte {
	if n > max {
		panic(fmt.Sprintf("wire: %d %s do not fit in one message (max %d)", n, what, max))
	}
	dst = binary.BigEndian.AppendUint64(dst, counter)
	return append(dst, uint8(n))
}

// parseListHeader checks that b holds exactly the counter, the count and count items
// of itemLen bytes, and returns the counter and the item bytes.
func parseListHeader(b []byte, t Type, itemLen int) (counter uint64, items []byte, err error) {
	if len(b) < listHeaderLen {
		return 0, nil, errorf(ReasonBadLength, "%s body is %d bytes, shorter than its %d-byte counter and count", t, len(b), listHeaderLen)
	}
	n := int(b[CounterLen])
	if want := listHeaderLen + n*itemLen; len(b) != want {
		return 0, nil, errorf(ReasonBadLength, "%s body is %d bytes, but %d items of %d bytes need %d", t, len(b), n, itemLen, want)
	}
	return binary.BigEndian.Uint64(b), b[listHeaderLen:], nil
}
