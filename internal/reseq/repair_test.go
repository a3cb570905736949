package reseq

import "testing"

// A lone link loses 1. Without a repair wait its next packet, 2, proves 1 lost at
// once (TestLossOnOneLinkReleasedByLaterTraffic); while the receiver waits for the
// sender to send 1 again, 2 is held, and the repair fills the hole: nothing is lost.
func TestRepairFillsTheGapEvidenceWouldHaveGivenUp(t *testing.T) {
	r := New(Config{}, 0)
	r.SetLinks([]uint8{0})
	s := &sink{}
	r.Push(0, 0, 0, pkt(0), s.deliver)
	r.AwaitRepair(0, 40*ms)
	r.Push(1*ms, 2, 0, pkt(2), s.deliver)
	r.Push(2*ms, 3, 0, pkt(3), s.deliver)
	expect(t, "waiting for the repair of 1", s.take(), []uint32{0})
	if d, ok := r.NextDeadline(); !ok || d != 40*ms {
		t.Fatalf("NextDeadline = %d, %v; want 40 ms (the wait's end, before the hold's)", d, ok)
	}
	r.PushCopy(30*ms, 1, 0, pkt(1), s.deliver)
	expect(t, "the repair arrived", s.take(), []uint32{1, 2, 3})
	if st := r.Stats(); st.Lost != 0 || st.RepairWaits != 1 {
		t.Fatalf("stats %+v, want nothing lost and one repair wait", st)
	}
	// The freeze outlives the repair; later packets pass straight through, and the
	// wait's end changes nothing.
	r.Push(35*ms, 4, 0, pkt(4), s.deliver)
	r.Expire(40*ms, s.deliver)
	expect(t, "after the repair", s.take(), []uint32{4})
}

// No repair comes (the sender no longer had the packet): the gap is given up by
// evidence when the wait ends, not at the hold timer.
func TestUnrepairedGapIsGivenUpWhenTheWaitEnds(t *testing.T) {
	r := New(Config{}, 0)
	r.SetLinks([]uint8{0})
	r.SetHold(200 * ms)
	s := &sink{}
	r.Push(0, 0, 0, pkt(0), s.deliver)
	r.AwaitRepair(0, 50*ms)
	r.Push(10*ms, 2, 0, pkt(2), s.deliver)
	r.Expire(50*ms-1, s.deliver)
	expect(t, "before the wait's end", s.take(), []uint32{0})
	r.Expire(50*ms, s.deliver)
	expect(t, "at the wait's end", s.take(), []uint32{2})
	if st := r.Stats(); st.EvidenceSkips != 1 || st.TimeoutSkips != 0 {
		t.Fatalf("stats %+v, want 1 given up by evidence", st)
	}
	if _, ok := r.NextDeadline(); ok {
		t.Fatal("a deadline is still armed with nothing held")
	}
}

// A loss notice for the awaited number (the sender could not send it again) gives it
// up at once.
func TestLossNoticeEndsTheWaitForItsNumbers(t *testing.T) {
	r := New(Config{}, 0)
	r.SetLinks([]uint8{0})
	s := &sink{}
	r.AwaitRepair(0, 50*ms)
	r.Push(1*ms, 1, 0, pkt(1), s.deliver)
	expect(t, "waiting for 0", s.take(), nil)
	r.Skip(0, 1, s.deliver)
	expect(t, "0 will never come", s.take(), []uint32{1})
}

// Only the frozen link's evidence waits: a gap another link has not passed yet is
// still held for that link, and one both links passed before the freeze is not
// held back by it.
func TestRepairWaitHoldsOnlyItsLinksEvidence(t *testing.T) {
	r, s := newRS(Config{}, 0)
	// 0 on link 0, lost; 1 on link 1 arrives; link 0 then shows 2 before the receiver
	// knew to ask: 0 is given up by evidence as before.
	r.Push(0, 1, 1, pkt(1), s.deliver)
	r.Push(1*ms, 2, 0, pkt(2), s.deliver)
	expect(t, "0 passed by both links", s.take(), []uint32{1, 2})
	// 3 on link 1 is lost and the receiver asks for it; link 0 goes on with 4 and 5.
	r.AwaitRepair(1, 60*ms)
	r.Push(2*ms, 6, 1, pkt(6), s.deliver)
	r.Push(3*ms, 4, 0, pkt(4), s.deliver)
	r.Push(4*ms, 5, 0, pkt(5), s.deliver)
	expect(t, "3 awaited", s.take(), nil)
	r.Push(5*ms, 7, 0, pkt(7), s.deliver) // link 0 passed 6 as well: only link 1's wait holds 3
	expect(t, "still awaited", s.take(), nil)
	r.Expire(60*ms, s.deliver)
	expect(t, "the wait is over", s.take(), []uint32{4, 5, 6, 7})
	if st := r.Stats(); st.Lost != 2 || st.EvidenceSkips != 2 {
		t.Fatalf("stats %+v, want 0 and 3 given up by evidence", st)
	}
}

// A restart forgets freezes with the rest of the evidence.
func TestRestartForgetsRepairWaits(t *testing.T) {
	r := New(Config{}, 0)
	r.SetLinks([]uint8{0})
	s := &sink{}
	r.AwaitRepair(0, 50*ms)
	r.Restart(100)
	r.Push(1*ms, 101, 0, pkt(101), s.deliver)
	r.Push(2*ms, 102, 0, pkt(102), s.deliver)
	expect(t, "100 passed by the only link, no wait", s.take(), []uint32{101, 102})
}
