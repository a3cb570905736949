package reseq

import "github.com/aggd/aggd/internal/flow"

// Which flows the held packets belong to, so that a sparse packet (PushSparse) is
// delivered ahead of a gap only when no earlier packet of its flow waits behind that
// gap. Held packets are counted per bucket of their flow hash: two flows in one bucket
// only make a sparse packet wait for the other's packets, as every packet used to.

// flowBuckets is how many buckets the held packets' flows are counted in.
const flowBuckets = 256

// heldFlows counts held packets per flow bucket; index 0 counts those that name no
// flow (a fragment: it could be part of any flow).
type heldFlows [flowBuckets + 1]uint32

// bucketOf returns pkt's flow bucket, 1 to flowBuckets, or 0 for a packet that names
// no flow.
func bucketOf(pkt []byte) uint16 {
	h, ok := flow.Hash(pkt)
	if !ok {
		return 0
	}
	return uint16(h%flowBuckets) + 1
}

func (f *heldFlows) add(b uint16)    { f[b]++ }
func (f *heldFlows) remove(b uint16) { f[b]-- }

// mayHold reports whether a packet of the flow in bucket b may be among the held
// ones: one of its bucket is, or one that names no flow. A packet that names no flow
// (b 0) is never sure of it.
func (f *heldFlows) mayHold(b uint16) bool { return b == 0 || f[0] > 0 || f[b] > 0 }
