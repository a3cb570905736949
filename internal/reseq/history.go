package reseq

// history remembers, for the most recent historyBits resolved sequence numbers,
// whether each was delivered or skipped. A packet arriving behind next is then a
// duplicate (its number was delivered) or late (its number was given up): two
// different stories in the metrics, redundant copies versus a hold time too short.

const historyBits = 1 << 14 // 2 KiB; well beyond any reorder span worth holding

type outcome uint8

const (
	unknown outcome = iota
	wasDelivered
	wasSkipped
)

type history struct {
	bits  [historyBits / 64]uint64 // bit set: delivered
	depth uint32                   // how many numbers behind next are recorded
}

// record stores the outcome of seq, the number being resolved now.
func (h *history) record(seq uint32, delivered bool) {
	w, b := (seq%historyBits)/64, seq%64
	if delivered {
		h.bits[w] |= 1 << b
	} else {
		h.bits[w] &^= 1 << b
	}
	if h.depth < historyBits {
		h.depth++
	}
}

// lookup returns the outcome of seq, which is behind next.
func (h *history) lookup(next, seq uint32) outcome {
	if next-seq > h.depth {
		return unknown
	}
	if h.bits[(seq%historyBits)/64]&(1<<(seq%64)) != 0 {
		return wasDelivered
	}
	return wasSkipped
}

// markDelivered records that seq, behind next and skipped, was delivered after all
// (a late copy): another copy of it is a duplicate.
func (h *history) markDelivered(seq uint32) {
	h.bits[(seq%historyBits)/64] |= 1 << (seq % 64)
}

// skippedBelow returns the numbers below next that were skipped and not delivered
// since, as bits: bit i for next-1-i, the 64 latest recorded.
func (h *history) skippedBelow(next uint32) uint64 {
	var bits uint64
	for i := uint32(0); i < 64 && i < h.depth; i++ {
		if h.lookup(next, next-1-i) == wasSkipped {
			bits |= 1 << i
		}
	}
	return bits
}
