package reseq

import "testing"

// A loss notice is sent twice (either copy may be lost), and overlaps what the receiver
// already resolved: applying it again, partly or wholly, must change nothing. Covered:
// numbers delivered, numbers skipped by an earlier copy, numbers held, numbers marked
// but not reached yet, and a range straddling next.
func TestSkipIsIdempotent(t *testing.T) {
	r, s := newRS(Config{}, 0)
	r.Push(0, 0, 0, pkt(0), s.deliver) // delivered
	r.Push(0, 3, 0, pkt(3), s.deliver) // held behind 1, 2
	r.Push(0, 6, 0, pkt(6), s.deliver) // held behind 4, 5

	// The notice names 1, 2 and 8 (sent on a dead link), and 0 and 3, which arrived
	// (sent before the peer's last report reached the sender).
	notice := [][2]uint32{{0, 4}, {8, 1}}
	apply := func() {
		for _, n := range notice {
			r.Skip(n[0], uint16(n[1]), s.deliver)
		}
	}
	apply()
	expect(t, "first copy", s.take(), []uint32{0, 3})
	st := r.Stats()
	if st.NoticeSkips != 2 || st.HeldPackets != 1 {
		t.Fatalf("after the first copy: %+v, want 1 and 2 skipped and 6 still held", st)
	}

	apply()                 // the repeat
	r.Skip(1, 3, s.deliver) // 1 and 2 skipped, 3 delivered
	expect(t, "repeat and an overlapping range", s.take(), nil)
	if again := r.Stats(); again != st {
		t.Fatalf("a repeated notice changed the state: before %+v, after %+v", st, again)
	}

	// 8 stays marked until next reaches it, however often it is named.
	r.Skip(8, 1, s.deliver)
	r.Push(0, 4, 1, pkt(4), s.deliver)
	r.Push(0, 5, 1, pkt(5), s.deliver)
	r.Push(0, 7, 1, pkt(7), s.deliver)
	expect(t, "the gap closes", s.take(), []uint32{4, 5, 6, 7})
	r.Push(0, 9, 1, pkt(9), s.deliver)
	expect(t, "8 was given up once", s.take(), []uint32{9})
	if st := r.Stats(); st.NoticeSkips != 3 || st.Lost != 3 || st.HeldPackets != 0 || st.Duplicates != 0 {
		t.Fatalf("final stats %+v, want 1, 2 and 8 skipped by notice, nothing else lost", st)
	}
}
