package tunnel

import (
	"testing"
	"time"

	"github.com/aggd/aggd/internal/wire"
)

// While a handback is pending the kernel may be delivering: a probe's watermark must
// not make the resequencer count the kernel's packets as lost, and a loss notice must
// take effect where the kernel hands the ordering over, not be lost in the restart.
func TestPendingHandbackKeepsTheResequencerWhereItWas(t *testing.T) {
	s, l, sp := fastSessionWithLink()
	sp.pending = true

	// The kernel took the ordering at 0 and has delivered 0..999; the peer's probe on
	// the session's only link says everything below 1000 has arrived or is lost.
	probe := wire.Message{Header: wire.Header{Type: wire.TypeProbe, LinkID: 3, Seq: 1000}, Body: wire.ProbeBody{}}
	s.handleControl(l, &probe.Header, probe, time.Now(), 0)
	if st := s.reseq.Stats(); st.Lost != 0 || s.reseq.Next() != 0 {
		t.Fatalf("a watermark moved the resequencer while the kernel may own the ordering: lost %d, next %d", st.Lost, s.reseq.Next())
	}

	// The link went down at the peer with 1002 and 1003 in flight; the kernel, stuck at
	// 1002, hands over there when the next packet comes.
	s.onLossNotice(wire.LossNoticeBody{Counter: 1, Ranges: []wire.SeqRange{{Start: 1002, Count: 2}}})
	if s.reseq.Next() != 0 {
		t.Fatalf("a loss notice moved the resequencer while the kernel may own the ordering: next %d", s.reseq.Next())
	}
	sp.handover, sp.handoverAt = true, 1002
	s.rxMu.Lock()
	restart, next, _ := s.fp.OnData(0, 0, time.Now())
	s.afterHandover(restart, next)
	s.rxMu.Unlock()
	if got := s.reseq.Next(); got != 1004 {
		t.Errorf("after the handover at 1002 the resequencer waits at %d, want 1004 (the notice's numbers skipped)", got)
	}
	if st := s.reseq.Stats(); st.NoticeSkips != 2 {
		t.Errorf("notice skips %d, want 2", st.NoticeSkips)
	}
	if len(s.deferredSkips) != 0 {
		t.Errorf("deferred notices left after use: %v", s.deferredSkips)
	}

	// Owned by the daemon again, a watermark counts as before.
	s.handleControl(l, &wire.Header{Type: wire.TypeProbe, LinkID: 3, Seq: 1010}, wire.Message{Body: wire.ProbeBody{}}, time.Now(), 0)
	if st := s.reseq.Stats(); st.EvidenceSkips != 6 || s.reseq.Next() != 1010 {
		t.Errorf("a watermark with the daemon owning: evidence skips %d, next %d; want 6 and 1010", st.EvidenceSkips, s.reseq.Next())
	}
}
