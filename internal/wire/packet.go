package wire

// Body is a decoded message body: Data for DATA, HandshakeBody for both handshake
// types, and ProbeBody, ProbeReplyBody, FeedbackBody, LossNoticeBody, LinkParamsBody
// LinkNamesBody, RepairRequestBody or CookieReplyBody.
// Receivers type-switch on it; Append encodes it.
type Body interface {
	Append(dst []byte) []byte
}

// Data is a DATA body: one inner IPv4 or IPv6 packet.
type Data []byte

func (d Data) Append(dst []byte) []byte { return append(dst, d...) }

// Message is a whole parsed datagram. Slices in Body alias the parsed buffer.
type Message struct {
	Header Header
	Body   Body
}

// Parse decodes and validates a whole aggd datagram (no outer IP/UDP): first the
// header (ParseHeader), then the body by type. It does not check the tag, the session
// or replay: those need state and come after, in the order docs/wire-format.md gives.
// The fast per-packet DATA path may use ParseHeader and CheckData instead, which do
// the same checks without boxing the body.
func Parse(b []byte) (Message, error) {
	h, err := ParseHeader(b)
	if err != nil {
		return Message{}, err
	}
	body, err := parseBody(&h, b[HeaderLen:])
	if err != nil {
		return Message{}, err
	}
	return Message{Header: h, Body: body}, nil
}

func parseBody(h *Header, b []byte) (Body, error) {
	switch t := h.Type; t {
	case TypeData:
		if err := CheckData(b); err != nil {
			return nil, err
		}
		return Data(b), nil
	case TypeHandshakeInit:
		if h.HasMac2() {
			return asBody(ParseHandshakeInitMac2(b))
		}
		return asBody(ParseHandshakeInit(b))
	case TypeHandshakeResp:
		return asBody(ParseHandshakeResp(b))
	case TypeProbe:
		return asBody(ParseProbe(b))
	case TypeProbeReply:
		return asBody(ParseProbeReply(b))
	case TypeFeedback:
		return asBody(ParseFeedback(b))
	case TypeLossNotice:
		return asBody(ParseLossNotice(b))
	case TypeLinkParams:
		return asBody(ParseLinkParams(b))
	case TypeLinkNames:
		return asBody(ParseLinkNames(b))
	case TypeRepairRequest:
		return asBody(ParseRepairRequest(b))
	case TypeCookieReply:
		return asBody(ParseCookieReply(b))
	}
	// ParseHeader has already rejected every other type.
	return nil, errorf(ReasonBadType, "message type %d is not defined", uint8(h.Type))
}

// asBody turns a typed parse result into a Body, keeping a failed parse's nil.
func asBody[T Body](v T, err error) (Body, error) {
	if err != nil {
		return nil, err
	}
	return v, nil
}

// Counter returns the control counter of a control message (the value its replay
// window guards), and 0 for DATA and handshake messages, which have none.
func (m Message) Counter() uint64 {
	switch b := m.Body.(type) {
	case ProbeBody:
		return b.Counter
	case ProbeReplyBody:
		return b.Counter
	case FeedbackBody:
		return b.Counter
	case LossNoticeBody:
		return b.Counter
	case LinkParamsBody:
		return b.Counter
	case LinkNamesBody:
		return b.Counter
	case RepairRequestBody:
		return b.Counter
	}
	return 0
}

// Append encodes the message onto dst: the header (with Header.Tag as is), then the
// body. To send it, seal the result with auth.Seal, which overwrites the tag.
func (m Message) Append(dst []byte) []byte {
	dst = m.Header.Append(dst)
	if m.Body == nil {
		return dst
	}
	return m.Body.Append(dst)
}
