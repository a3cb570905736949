package wire

import "encoding/binary"

// A DATA body is exactly one inner IPv4 or IPv6 packet. Checking its version and
// length here means the daemon never writes a malformed packet into agg0, and the
// fast path (which checks the same) never redirects one into the kernel.

const (
	ipv4MinHeaderLen = 20
	ipv6HeaderLen    = 40
)

// CheckData validates a DATA body: an IPv4 packet whose total length is the body
// length and whose header length fits, or an IPv6 packet whose payload length plus
// 40 is the body length.
func CheckData(body []byte) error {
	if len(body) == 0 {
		return errorf(ReasonBadLength, "data body is empty")
	}
	switch v := body[0] >> 4; v {
	case 4:
		return checkIPv4(body)
	case 6:
		return checkIPv6(body)
	default:
		return errorf(ReasonBadBody, "data body is IP version %d, want 4 or 6", v)
	}
}

func checkIPv4(p []byte) error {
	if len(p) < ipv4MinHeaderLen {
		return errorf(ReasonBadLength, "inner IPv4 packet is %d bytes, shorter than its header", len(p))
	}
	if total := int(binary.BigEndian.Uint16(p[2:])); total != len(p) {
		return errorf(ReasonBadLength, "inner IPv4 total length %d, but the body is %d bytes", total, len(p))
	}
	if ihl := int(p[0]&0x0f) * 4; ihl < ipv4MinHeaderLen || ihl > len(p) {
		return errorf(ReasonBadBody, "inner IPv4 header length %d is invalid for a %d-byte packet", ihl, len(p))
	}
	return nil
}

func checkIPv6(p []byte) error {
	if len(p) < ipv6HeaderLen {
		return errorf(ReasonBadLength, "inner IPv6 packet is %d bytes, shorter than its header", len(p))
	}
	if payload := int(binary.BigEndian.Uint16(p[4:])); ipv6HeaderLen+payload != len(p) {
		return errorf(ReasonBadLength, "inner IPv6 payload length %d, but the body holds %d", payload, len(p)-ipv6HeaderLen)
	}
	return nil
}
