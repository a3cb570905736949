package wire

import "encoding/binary"

// REPAIR_REQUEST (docs/wire-format.md): the receiver names data packets a link lost,
// by the link sequence numbers its FIFO order showed missing, and asks the sender to
// send them again. The sender knows which packets those were (its sent log) and, if it
// still has them, sends each once more under its own global sequence number, marked as
// a copy; what it cannot send again it names in a LOSS_NOTICE.

// LinkSeqRangeLen is the size of one LinkSeqRange on the wire: link id, a reserved
// zero byte, count, first link sequence number.
const LinkSeqRangeLen = 8

// MaxLinkSeqRanges is how many ranges one REPAIR_REQUEST carries (the count is a byte).
const MaxLinkSeqRanges = 255

// LinkSeqRange is Count consecutive link sequence numbers of link LinkID from Start.
type LinkSeqRange struct {
	LinkID uint8
	Count  uint16
	Start  uint32
}

// RepairRequestBody is the body of REPAIR_REQUEST.
type RepairRequestBody struct {
	Counter uint64
	Gaps    []LinkSeqRange
}

// Append encodes the body; more than MaxLinkSeqRanges ranges panics (see FeedbackBody).
func (b RepairRequestBody) Append(dst []byte) []byte {
	dst = appendListHeader(dst, b.Counter, len(b.Gaps), MaxLinkSeqRanges, "link sequence ranges")
	for _, g := range b.Gaps {
		dst = append(dst, g.LinkID, 0)
		dst = binary.BigEndian.AppendUint16(dst, g.Count)
		dst = binary.BigEndian.AppendUint32(dst, g.Start)
	}
	return dst
}

func (b RepairRequestBody) Marshal() []byte {
	return b.Append(make([]byte, 0, listHeaderLen+len(b.Gaps)*LinkSeqRangeLen))
}

func ParseRepairRequest(b []byte) (RepairRequestBody, error) {
	counter, items, err := parseListHeader(b, TypeRepairRequest, LinkSeqRangeLen)
	if err != nil {
		return RepairRequestBody{}, err
	}
	rr := RepairRequestBody{Counter: counter}
	if len(items) > 0 {
		rr.Gaps = make([]LinkSeqRange, 0, len(items)/LinkSeqRangeLen)
	}
	for off := 0; off < len(items); off += LinkSeqRangeLen {
		item := items[off : off+LinkSeqRangeLen]
		if item[1] != 0 {
			return RepairRequestBody{}, errorf(ReasonBadBody, "%s range for link %d has a non-zero reserved byte", TypeRepairRequest, item[0])
		}
		rr.Gaps = append(rr.Gaps, LinkSeqRange{
			LinkID: item[0],
			Count:  binary.BigEndian.Uint16(item[2:]),
			Start:  binary.BigEndian.Uint32(item[4:]),
		})
	}
	return rr, nil
}
