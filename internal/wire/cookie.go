package wire

// Cookies: a headend under a flood of handshakes answers an INIT with a COOKIE_REPLY
// instead of the responder's work, and then does that work only for INITs that carry
// a mac2 made with the cookie it sent to their source address (package cookie has the
// cryptography; docs/wire-format.md, "Handshake floods").

const (
	// Mac2Len is the length of the mac2 at the end of a HANDSHAKE_INIT with FlagMac2.
	Mac2Len = 16
	// CookieNonceLen and CookieSealedLen make up a COOKIE_REPLY body: an XChaCha20
	// nonce, and the 16-byte cookie sealed with its Poly1305 tag.
	CookieNonceLen  = 24
	CookieSealedLen = 16 + 16
	CookieReplyLen  = CookieNonceLen + CookieSealedLen
)

// ParseHandshakeInitMac2 decodes the body of a HANDSHAKE_INIT with FlagMac2: what
// ParseHandshakeInit takes, then Mac2Len bytes of mac2.
func ParseHandshakeInitMac2(b []byte) (HandshakeBody, error) {
	if len(b) < SenderIndexLen+HandshakeInitNoiseMin+Mac2Len {
		return HandshakeBody{}, errorf(ReasonBadLength, "%s body with a mac2 is %d bytes, want at least %d",
			TypeHandshakeInit, len(b), SenderIndexLen+HandshakeInitNoiseMin+Mac2Len)
	}
	body, err := ParseHandshakeInit(b[:len(b)-Mac2Len])
	if err != nil {
		return HandshakeBody{}, err
	}
	body.Mac2 = b[len(b)-Mac2Len:]
	return body, nil
}

// Mac2Covered calls f with the two parts of a HANDSHAKE_INIT datagram its mac2 covers:
// header bytes 0–19 (the tag, which covers the mac2, is left out) and the body up to
// the mac2. pkt must hold the header and at least Mac2Len body bytes.
func Mac2Covered(pkt []byte, f func(header, body []byte)) {
	f(pkt[:TaggedHeaderLen], pkt[HeaderLen:len(pkt)-Mac2Len])
}

// CookieReplyBody is the body of COOKIE_REPLY. The header's Session is the INIT's
// sender index, and its Link ID and Key ID are the INIT's.
type CookieReplyBody struct {
	Nonce  [CookieNonceLen]byte
	Sealed [CookieSealedLen]byte
}

func (b CookieReplyBody) Append(dst []byte) []byte {
	dst = append(dst, b.Nonce[:]...)
	return append(dst, b.Sealed[:]...)
}

func (b CookieReplyBody) Marshal() []byte { return b.Append(make([]byte, 0, CookieReplyLen)) }

// ParseCookieReply decodes a COOKIE_REPLY body, which is exactly CookieReplyLen bytes.
func ParseCookieReply(b []byte) (CookieReplyBody, error) {
	if len(b) != CookieReplyLen {
		return CookieReplyBody{}, errorf(ReasonBadLength, "%s body is %d bytes, want %d", TypeCookieReply, len(b), CookieReplyLen)
	}
	var body CookieReplyBody
	copy(body.Nonce[:], b)
	copy(body.Sealed[:], b[CookieNonceLen:])
	return body, nil
}
