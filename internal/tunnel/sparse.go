package tunnel

// Sparse flows (wire.FlagSparse). The peer's resequencer puts the whole bond's packets
// back in order, so a ping or a DNS query sent during a bulk transfer waits there for
// the bulk's packets sent before it on slower links: up to a full packet's time on the
// slowest one, a few milliseconds on the lab's 1.5-Mbit/s links, on top of every queue.
// Yet such a packet need not wait for any other flow's. The sender knows which flows
// send sparsely: when a flow's previous packet left the sender's queue at least the
// links' largest smoothed RTT ago, that packet has reached the peer (or is lost) by
// the time this one can, and the peer may deliver this one as it comes. The peer still
// orders it behind any packet of its flow that it holds (reseq.PushSparse).
//
// A sparse flow, so, is one whose packets are further apart than the largest RTT:
// pings, DNS, keepalives, a game's or a call's packets on short links. A bulk flow's
// packets, back to back, never are; its first packet is.

import (
	"time"

	"github.com/aggd/aggd/internal/flow"
	"github.com/aggd/aggd/internal/sched"
)

// sparseSlots is how many flows the sender tells apart. Flows that share a slot share
// its time, the later one's: they are marked sparse less often, never wrongly.
const sparseSlots = 1024

// sparseFlows remembers, per flow slot, when the flow's last packet leaves the
// scheduler's virtual queue of its link. Guarded by txMu.
type sparseFlows struct {
	lastOut [sparseSlots]int64
}

// markSparse reports whether inner, about to be sent at now on link primary (its virtual
// backlog already charged), is the packet of a sparse flow, and counts it if so. Caller
// holds txMu.
func (s *Session) markSparse(now int64, primary uint8, inner []byte) bool {
	backlog, _ := s.sched.Backlog(now, primary)
	if !s.sparse.mark(inner, now, now+backlog, s.sparseMargin) {
		return false
	}
	s.pm.sparseSent.Inc()
	return true
}

// mark reports whether inner, sent at now and leaving its link's queue at out (ns), is
// the packet of a sparse flow, given margin (ns; 0: none is), and records it. A packet
// that names no flow (a fragment, not IP) is never sparse.
func (f *sparseFlows) mark(inner []byte, now, out, margin int64) bool {
	h, ok := flow.Hash(inner)
	if !ok {
		return false
	}
	i := h % sparseSlots
	last := f.lastOut[i]
	f.lastOut[i] = max(last, out)
	return margin > 0 && now-last >= margin
}

// sparseMargin is how long before a packet its flow's previous one must have left
// for the packet to be sparse: the largest smoothed RTT among the links in the
// schedule, which holds their queues and the peer's time to read. 0 (nothing is
// sparse) while one of them has no RTT yet.
func sparseMargin(params []sched.LinkParams, rtts []time.Duration) int64 {
	var margin time.Duration
	for i, p := range params {
		if !p.Usable {
			continue
		}
		if rtts[i] <= 0 {
			return 0
		}
		margin = max(margin, rtts[i])
	}
	return int64(margin)
}
