package tunnel

// While the daemon has offered the receive ordering back to the kernel and does not yet
// know whether the kernel took it (docs/fastpath-ordering.md), its resequencer must stay
// empty and where the offer left it: if the kernel took the ordering, the kernel is
// delivering the numbers after that point itself, and at the next handover the
// resequencer restarts wherever the kernel stopped. Two things would otherwise move it:
//
//   - a probe's watermark: every number below it on its link has arrived or is lost.
//     Arrived at the kernel and delivered, while the kernel owns; the resequencer would
//     skip them as lost (a CPE counted 22 146 "lost" sequence numbers on lossless veths
//     in one 6-second transfer). It is ignored; the next one after the outcome counts.
//   - a loss notice: the numbers it names may lie after the point where the kernel will
//     hand the ordering over. Applied to the old resequencer they would be forgotten at
//     the restart, and the resequencer would wait for its hold timer instead. They are
//     kept and applied once the outcome is known.

import "github.com/aggd/aggd/internal/wire"

// maxDeferredSkips bounds the loss notices kept while a handback is pending; the hold
// timer resolves whatever a longer list would have named.
const maxDeferredSkips = 64

// kernelMayOwn reports whether the kernel may own the receive ordering now.
func (s *Session) kernelMayOwn() bool { return s.fp != nil && s.fp.HandbackPending() }

// deferSkips keeps a loss notice's ranges until the handback's outcome is known.
func (s *Session) deferSkips(ranges []wire.SeqRange) {
	for _, r := range ranges {
		if len(s.deferredSkips) == maxDeferredSkips {
			s.deferredSkips = s.deferredSkips[1:]
		}
		s.deferredSkips = append(s.deferredSkips, r)
	}
}

// afterHandover acts on what the fast path said of the ordering for a DATA packet that
// reached the daemon (OnData) or after a quiet second (Resync): restart the resequencer
// where the kernel handed over, and once the daemon owns for certain, apply the loss
// notices kept meanwhile (Skip ignores numbers the restart left behind).
func (s *Session) afterHandover(restart bool, next uint32) {
	if restart {
		s.reseq.Restart(next)
	}
	if len(s.deferredSkips) == 0 || s.kernelMayOwn() {
		return
	}
	s.skipRanges(s.deferredSkips)
	s.deferredSkips = s.deferredSkips[:0]
}
