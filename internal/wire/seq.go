package wire

// Sequence numbers, link sequence numbers and timestamps are 32-bit counters that
// wrap. They are compared in serial-number arithmetic (RFC 1982): a is after b when
// the signed distance from b to a is positive. This is correct as long as the two
// values being compared are less than 2^31 apart, which holds by a wide margin for
// anything a reorder buffer or replay window keeps.

// SeqDiff returns the signed distance from b to a (a - b), wrap-safe.
func SeqDiff(a, b uint32) int32 { return int32(a - b) }

// SeqAfter reports whether a comes after b.
func SeqAfter(a, b uint32) bool { return SeqDiff(a, b) > 0 }
