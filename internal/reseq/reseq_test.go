package reseq

import (
	"encoding/binary"
	"slices"
	"testing"
)

const ms = int64(1e6)

// sink records the sequence numbers delivered; packets carry their number in the
// first four bytes.
type sink struct{ got []uint32 }

func (s *sink) deliver(p []byte) { s.got = append(s.got, binary.BigEndian.Uint32(p)) }

// take returns what was delivered since the last call.
func (s *sink) take() []uint32 {
	got := s.got
	s.got = nil
	return got
}

func pkt(seq uint32) []byte { return sized(seq, 64) }

func sized(seq uint32, n int) []byte {
	p := make([]byte, n)
	binary.BigEndian.PutUint32(p, seq)
	return p
}

func seqs(from uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = from + uint32(i)
	}
	return out
}

// newRS returns a resequencer for links 0 and 1, starting at start.
func newRS(cfg Config, start uint32) (*Resequencer, *sink) {
	r := New(cfg, start)
	r.SetLinks([]uint8{0, 1})
	return r, &sink{}
}

func expect(t *testing.T, what string, got, want []uint32) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: delivered %v, want %v", what, got, want)
	}
}

func TestInOrderPassesThroughWithoutHolding(t *testing.T) {
	r, s := newRS(Config{}, 0)
	for i := range uint32(1000) {
		p := pkt(i)
		var passed []byte
		r.Push(int64(i)*ms, i, uint8(i%2), p, func(b []byte) { passed = b; s.deliver(b) })
		if len(s.got) != int(i)+1 {
			t.Fatalf("packet %d not delivered at once", i)
		}
		if &passed[0] != &p[0] {
			t.Fatalf("packet %d was copied; in-order packets should pass through", i)
		}
	}
	st := r.Stats()
	if st.Delivered != 1000 || st.Held != 0 || st.Lost != 0 || st.HeldPackets != 0 {
		t.Fatalf("stats %+v, want 1000 delivered and nothing held or lost", st)
	}
	if _, ok := r.NextDeadline(); ok {
		t.Fatal("deadline armed with nothing held")
	}
}

func TestMissingPacketArrivalReleasesRun(t *testing.T) {
	r, s := newRS(Config{}, 0)
	r.Push(0, 1, 1, pkt(1), s.deliver)
	r.Push(0, 2, 1, pkt(2), s.deliver)
	expect(t, "ahead of the gap", s.take(), nil)
	r.Push(ms, 0, 0, pkt(0), s.deliver)
	expect(t, "gap filled", s.take(), []uint32{0, 1, 2})
	if st := r.Stats(); st.Held != 2 || st.HoldTimeNsSum != uint64(2*ms) || st.Lost != 0 {
		t.Fatalf("stats %+v, want 2 held for 1 ms each, none lost", st)
	}
}

func TestEvidenceFromBothLinksReleasesAtOnce(t *testing.T) {
	// 0 was sent on link 0 and lost, 1 on link 1, 2 on link 0.
	r, s := newRS(Config{}, 0)
	r.Push(0, 1, 1, pkt(1), s.deliver)
	expect(t, "only link 1 has passed 0", s.take(), nil)
	r.Push(0, 2, 0, pkt(2), s.deliver)
	expect(t, "both links have passed 0", s.take(), []uint32{1, 2})
	if st := r.Stats(); st.Lost != 1 || st.EvidenceSkips != 1 || st.TimeoutSkips != 0 {
		t.Fatalf("stats %+v, want 0 skipped by evidence", st)
	}
}

func TestLossOnOneLinkReleasedByLaterTraffic(t *testing.T) {
	// Links alternate; 1 (on link 1) is lost. Link 0's packet 2 is held until link
	// 1's next packet, 3, shows 1 is not coming.
	r, s := newRS(Config{}, 0)
	r.Push(0, 0, 0, pkt(0), s.deliver)
	r.Push(0, 2, 0, pkt(2), s.deliver)
	r.Push(0, 4, 0, pkt(4), s.deliver)
	expect(t, "link 1 silent so far", s.take(), []uint32{0})
	r.Push(0, 3, 1, pkt(3), s.deliver)
	expect(t, "link 1 passed 1", s.take(), []uint32{2, 3, 4})
	if _, ok := r.NextDeadline(); ok {
		t.Fatal("deadline still armed")
	}
}

func TestSilentLinkForcesTimer(t *testing.T) {
	r, s := newRS(Config{MaxHold: 50 * ms}, 0)
	r.SetHold(20 * ms)
	// 0 went to link 1, which then died; link 0 carries on.
	r.Push(100*ms, 1, 0, pkt(1), s.deliver)
	r.Push(105*ms, 2, 0, pkt(2), s.deliver)
	if d, ok := r.NextDeadline(); !ok || d != 120*ms {
		t.Fatalf("NextDeadline = %d, %v; want 120 ms (oldest arrival + hold)", d, ok)
	}
	r.Expire(120*ms-1, s.deliver)
	expect(t, "before the deadline", s.take(), nil)
	r.Expire(120*ms, s.deliver)
	expect(t, "at the deadline", s.take(), []uint32{1, 2})
	st := r.Stats()
	if st.TimeoutSkips != 1 || st.Lost != 1 || st.HoldTimeNsSum != uint64(20*ms+15*ms) {
		t.Fatalf("stats %+v, want one timeout skip and 35 ms of holding", st)
	}
}

func TestWatermarkReleases(t *testing.T) {
	r, s := newRS(Config{}, 0)
	r.Push(0, 1, 0, pkt(1), s.deliver) // 0 went to link 1 and was lost
	r.Watermark(0, 1, 0, s.deliver)
	expect(t, "watermark not past the gap", s.take(), nil)
	r.Watermark(0, 1, 1, s.deliver) // everything below 1 sent on link 1 is in or lost
	expect(t, "watermark past the gap", s.take(), []uint32{1})
	if st := r.Stats(); st.EvidenceSkips != 1 {
		t.Fatalf("stats %+v, want one evidence skip", st)
	}
	// Watermarks alone, with nothing held, also resolve numbers that never came.
	r.Watermark(0, 0, 10, s.deliver)
	r.Watermark(0, 1, 10, s.deliver)
	r.Push(0, 10, 0, pkt(10), s.deliver)
	expect(t, "after watermarks at 10", s.take(), []uint32{10})
	if st := r.Stats(); st.Lost != 1+8 || st.HeldPackets != 0 {
		t.Fatalf("stats %+v, want 2..9 lost and nothing held", st)
	}
}

func TestEvidenceIgnoresLinksOutsideTheSession(t *testing.T) {
	r, s := newRS(Config{}, 0)
	r.Push(0, 1, 0, pkt(1), s.deliver)
	r.Watermark(0, 7, 100, s.deliver) // link 7 is not in the session
	expect(t, "link 1 has said nothing", s.take(), nil)
	// Once link 1 leaves the session, link 0's evidence alone suffices.
	r.SetLinks([]uint8{0})
	r.Expire(0, s.deliver)
	expect(t, "link 1 removed", s.take(), []uint32{1})
}

func TestSkipNotice(t *testing.T) {
	r, s := newRS(Config{}, 0)
	r.Push(0, 3, 0, pkt(3), s.deliver)
	r.Skip(0, 3, s.deliver)
	expect(t, "0..2 will never come", s.take(), []uint32{3})

	// A notice ahead of next is remembered until next gets there.
	r.Skip(5, 2, s.deliver)
	expect(t, "notice ahead", s.take(), nil)
	r.Push(0, 4, 0, pkt(4), s.deliver)
	r.Push(0, 7, 0, pkt(7), s.deliver)
	expect(t, "4 arrives, 5 and 6 given up", s.take(), []uint32{4, 7})

	// A packet the sender gave up on that arrives after all is still delivered.
	r.Skip(9, 1, s.deliver)
	r.Push(0, 9, 1, pkt(9), s.deliver)
	r.Push(0, 8, 1, pkt(8), s.deliver)
	expect(t, "noticed packet arrives", s.take(), []uint32{8, 9})

	r.Skip(0, 5, s.deliver) // all resolved already
	st := r.Stats()
	if st.NoticeSkips != 5 || st.Lost != 5 || st.Delivered != 5 {
		t.Fatalf("stats %+v, want 0,1,2,5,6 skipped by notice and 5 delivered", st)
	}
}

func TestDuplicatesAndLateAreToldApart(t *testing.T) {
	r, s := newRS(Config{}, 0)
	r.SetLinks([]uint8{0, 1, 2}) // link 2 is quiet, so only the timer resolves gaps
	r.SetHold(10 * ms)
	r.Push(0, 0, 0, pkt(0), s.deliver)
	r.Push(0, 0, 1, pkt(0), s.deliver) // redundant copy of a delivered packet
	r.Push(0, 3, 0, pkt(3), s.deliver)
	r.Push(0, 3, 1, pkt(3), s.deliver) // copy of a held one
	r.Expire(10*ms, s.deliver)         // gives up 1 and 2
	r.Push(11*ms, 1, 0, pkt(1), s.deliver)
	r.Push(11*ms, 3, 0, pkt(3), s.deliver)
	expect(t, "delivered", s.take(), []uint32{0, 3})
	st := r.Stats()
	if st.Duplicates != 3 || st.Late != 1 || st.Delivered != 2 {
		t.Fatalf("stats %+v, want 3 duplicates and 1 late", st)
	}
}

// A copy whose number was given up is delivered late, once; a copy of a delivered or
// held packet is a duplicate, and a late original is still dropped.
func TestLateCopiesAreDeliveredOnce(t *testing.T) {
	r, s := newRS(Config{}, 0)
	r.SetLinks([]uint8{0, 1, 2}) // link 2 is quiet, so only the timer resolves gaps
	r.SetHold(10 * ms)
	r.Push(0, 0, 0, pkt(0), s.deliver)
	r.Push(0, 3, 0, pkt(3), s.deliver)
	r.Expire(10*ms, s.deliver) // gives up 1 and 2
	expect(t, "before the copies", s.take(), []uint32{0, 3})

	r.PushCopy(11*ms, 1, 1, pkt(1), s.deliver) // given up: delivered late
	r.PushCopy(11*ms, 1, 2, pkt(1), s.deliver) // a second copy: duplicate
	r.Push(11*ms, 1, 0, pkt(1), s.deliver)     // the original after its copy: duplicate
	r.Push(11*ms, 2, 0, pkt(2), s.deliver)     // a late original: dropped
	r.PushCopy(11*ms, 2, 1, pkt(2), s.deliver) // its copy after it: delivered
	r.PushCopy(11*ms, 0, 1, pkt(0), s.deliver) // copy of a delivered packet: duplicate
	r.PushCopy(11*ms, 4, 1, pkt(4), s.deliver) // a copy in order: as any packet
	expect(t, "late copies", s.take(), []uint32{1, 2, 4})
	st := r.Stats()
	if st.LateCopies != 2 || st.Duplicates != 3 || st.Late != 1 || st.Delivered != 3 {
		t.Fatalf("stats %+v, want 2 late copies delivered, 3 duplicates, 1 late and 3 delivered in order", st)
	}
}

// Skipped names the numbers given up and not delivered below next (bit i: next-1-i),
// the ones whose late copy PushCopy still delivers: what a handback tells the kernel.
func TestSkippedNamesWhatALateCopyWouldStillFill(t *testing.T) {
	r, s := newRS(Config{}, 0xfffffffe) // across the wrap
	r.SetLinks([]uint8{0, 1, 2})
	r.SetHold(10 * ms)
	r.Push(0, 0xfffffffe, 0, pkt(0xfffffffe), s.deliver)
	r.Push(0, 2, 0, pkt(2), s.deliver)
	r.Expire(10*ms, s.deliver) // gives up 0xffffffff, 0 and 1
	expect(t, "before the copies", s.take(), []uint32{0xfffffffe, 2})
	if got := r.Skipped(); got != 0b1110 {
		t.Fatalf("Skipped() = %#b at next %d, want 0b1110 (0xffffffff, 0 and 1 given up, 2 delivered)", got, r.Next())
	}
	r.PushCopy(11*ms, 0, 1, pkt(0), s.deliver)
	if got := r.Skipped(); got != 0b1010 {
		t.Errorf("after 0's late copy: Skipped() = %#b, want 0b1010", got)
	}
	for i := range uint32(62) { // next 65: 1 is the 64th number below it, 0xffffffff out of reach
		r.Push(12*ms, 3+i, 0, pkt(3+i), s.deliver)
	}
	if got, want := r.Skipped(), uint64(1)<<63; got != want {
		t.Errorf("64 numbers on: Skipped() = %#x, want %#x (only 1 left within reach)", got, want)
	}
	r.Restart(100)
	if got := r.Skipped(); got != 0 {
		t.Errorf("after a restart: Skipped() = %#x, want 0 (the history is gone)", got)
	}
}

func TestStaleAndBogus(t *testing.T) {
	r, s := newRS(Config{}, 1000)
	r.Push(0, 999, 0, pkt(999), s.deliver) // before anything was resolved here
	r.Push(0, 1000+Window, 0, pkt(0), s.deliver)
	r.Push(0, 1000+1<<31, 0, pkt(0), s.deliver) // exactly half the space away: behind
	for i := range uint32(historyBits + 10) {
		r.Push(0, 1000+i, 0, pkt(1000+i), s.deliver)
	}
	r.Push(0, 1005, 0, pkt(1005), s.deliver) // out of the history's reach
	st := r.Stats()
	if st.Stale != 3 || st.Bogus != 1 || st.Duplicates != 0 || st.Late != 0 {
		t.Fatalf("stats %+v, want 3 stale and 1 bogus", st)
	}
}

func TestWrapAround(t *testing.T) {
	r, s := newRS(Config{}, 0xfffffffd)
	r.Push(0, 0xfffffffd, 0, pkt(0xfffffffd), s.deliver)
	r.Push(0, 0xffffffff, 0, pkt(0xffffffff), s.deliver)
	r.Push(0, 0, 0, pkt(0), s.deliver)
	expect(t, "held across the wrap", s.take(), []uint32{0xfffffffd})
	r.Push(0, 0xfffffffe, 1, pkt(0xfffffffe), s.deliver)
	expect(t, "released across the wrap", s.take(), []uint32{0xfffffffe, 0xffffffff, 0})
	// Evidence across the wrap: 1 lost on link 1.
	r.Push(0, 2, 0, pkt(2), s.deliver)
	r.Push(0, 3, 1, pkt(3), s.deliver)
	expect(t, "evidence after the wrap", s.take(), []uint32{2, 3})
	r.Push(0, 0xffffffff, 1, pkt(0xffffffff), s.deliver)
	r.Push(0, 1, 1, pkt(1), s.deliver)
	if st := r.Stats(); st.Duplicates != 1 || st.Late != 1 || st.Lost != 1 || st.Stale != 0 {
		t.Fatalf("stats %+v, want one duplicate, one late, one lost", st)
	}
}

func TestEvidenceSurvivesWindowBoundary(t *testing.T) {
	// Crossing a multiple of Window forgets passed bounds; bounds ahead must stay.
	start := uint32(3*Window - 2)
	r, s := newRS(Config{}, start)
	r.Watermark(0, 1, start+5, s.deliver)          // link 1 has passed everything below start+5
	r.Push(0, start, 0, pkt(start), s.deliver)     // in order
	r.Push(0, start+1, 0, pkt(start+1), s.deliver) // in order; next reaches 3*Window
	r.Push(0, start+3, 0, pkt(start+3), s.deliver) // start+2 was lost on link 0
	expect(t, "released by link 1's older watermark", s.take(), []uint32{start, start + 1, start + 3})
	if st := r.Stats(); st.EvidenceSkips != 1 {
		t.Fatalf("stats %+v, want start+2 skipped by evidence", st)
	}
}

func TestPacketCapSkipsOldestGap(t *testing.T) {
	r, s := newRS(Config{MaxPackets: 5}, 0) // 5 packets, over a span of 8 numbers
	for _, q := range []uint32{1, 2, 3, 4, 5} {
		r.Push(0, q, 0, pkt(q), s.deliver)
	}
	expect(t, "under the cap", s.take(), nil)
	r.Push(0, 7, 0, pkt(7), s.deliver)
	expect(t, "over the cap", s.take(), []uint32{1, 2, 3, 4, 5})
	if st := r.Stats(); st.OverflowSkips != 1 || st.HeldPackets != 1 {
		t.Fatalf("stats %+v, want 0 skipped for room and 7 held", st)
	}
	r.Push(0, 6, 0, pkt(6), s.deliver)
	expect(t, "gap filled", s.take(), []uint32{6, 7})
}

func TestSpanCapSkipsToReach(t *testing.T) {
	r, s := newRS(Config{MaxPackets: 4}, 0) // the buffer covers 4 numbers
	r.Push(0, 2, 0, pkt(2), s.deliver)
	r.Push(0, 9, 0, pkt(9), s.deliver) // needs next ≥ 6: 0,1 and 3,4,5 go, 2 is delivered
	expect(t, "reaching 9", s.take(), []uint32{2})
	if st := r.Stats(); st.OverflowSkips != 5 || st.HeldPackets != 1 {
		t.Fatalf("stats %+v, want 5 skipped for reach and 9 held", st)
	}
}

func TestByteCapSkipsOldestGapAndNeverDropsData(t *testing.T) {
	r, s := newRS(Config{MaxBytes: 2500}, 0)
	r.Push(0, 1, 0, sized(1, 1000), s.deliver)
	r.Push(0, 3, 0, sized(3, 1000), s.deliver)
	r.Push(0, 5, 0, sized(5, 1000), s.deliver) // 3000 > 2500: skip 0, deliver 1
	expect(t, "over the byte cap", s.take(), []uint32{1})
	if st := r.Stats(); st.HeldBytes != 2000 || st.OverflowSkips != 1 {
		t.Fatalf("stats %+v, want 2000 bytes held after one skip", st)
	}
	// A packet bigger than the whole cap cannot be held: everything before it goes.
	r.Push(0, 8, 0, sized(8, 3000), s.deliver)
	expect(t, "oversized packet", s.take(), []uint32{3, 5, 8})
	if st := r.Stats(); st.HeldPackets != 0 || st.Lost != 1+4 {
		t.Fatalf("stats %+v, want nothing held and 0,2,4,6,7 lost", st)
	}
}

func TestExpireFollowsArrivalOrder(t *testing.T) {
	r, s := newRS(Config{}, 0)
	r.SetHold(10 * ms)
	r.Push(0, 2, 0, pkt(2), s.deliver)    // gap 0,1 noticed at 0
	r.Push(5*ms, 5, 0, pkt(5), s.deliver) // gap 3,4
	r.Push(5*ms, 8, 0, pkt(8), s.deliver) // gap 6,7
	if d, _ := r.NextDeadline(); d != 10*ms {
		t.Fatalf("deadline %d, want 10 ms", d)
	}
	r.Expire(10*ms, s.deliver)
	expect(t, "first deadline", s.take(), []uint32{2})
	if d, _ := r.NextDeadline(); d != 15*ms {
		t.Fatalf("deadline %d, want 15 ms (5 and 8 arrived at 5 ms)", d)
	}
	r.Push(12*ms, 7, 0, pkt(7), s.deliver) // fills nothing yet
	r.Expire(15*ms, s.deliver)
	// 5 and 8 have waited 10 ms: both gaps before 8 go; 7 comes along.
	expect(t, "second deadline", s.take(), []uint32{5, 7, 8})
	if _, ok := r.NextDeadline(); ok {
		t.Fatal("deadline armed with nothing held")
	}
	if st := r.Stats(); st.TimeoutSkips != 5 {
		t.Fatalf("stats %+v, want 0,1,3,4,6 timed out", st)
	}
}

func TestExpireOldestHeldEvenIfNotFirst(t *testing.T) {
	r, s := newRS(Config{}, 0)
	r.SetHold(10 * ms)
	r.Push(0, 5, 0, pkt(5), s.deliver)
	r.Push(5*ms, 2, 0, pkt(2), s.deliver)
	r.Expire(10*ms, s.deliver) // 5 has waited the hold time: everything before it goes
	expect(t, "oldest arrival expired", s.take(), []uint32{2, 5})
}

func TestSetHoldIsCapped(t *testing.T) {
	r, s := newRS(Config{MaxHold: 30 * ms}, 0)
	r.SetHold(100 * ms)
	r.Push(0, 1, 0, pkt(1), s.deliver)
	if d, _ := r.NextDeadline(); d != 30*ms {
		t.Fatalf("deadline %d, want the 30 ms cap", d)
	}
	r.SetHold(-5)
	if d, _ := r.NextDeadline(); d != 0 {
		t.Fatalf("deadline %d, want 0 for a negative hold", d)
	}
}

func TestClockNeverGoesBackwards(t *testing.T) {
	r, s := newRS(Config{}, 0)
	r.SetHold(10 * ms)
	r.Push(50*ms, 2, 0, pkt(2), s.deliver)
	r.Push(40*ms, 3, 0, pkt(3), s.deliver) // a stale timestamp from a racing reader
	if d, _ := r.NextDeadline(); d != 60*ms {
		t.Fatalf("deadline %d, want 60 ms", d)
	}
	r.Expire(60*ms, s.deliver)
	expect(t, "expired together", s.take(), []uint32{2, 3})
	if st := r.Stats(); st.HoldTimeNsSum != uint64(20*ms) {
		t.Fatalf("hold time %d, want 2 × 10 ms", st.HoldTimeNsSum)
	}
}

func TestRingGrowthKeepsOrder(t *testing.T) {
	r, s := newRS(Config{}, 0xffffff00)
	// Hold 500 packets in a scrambled order, growing the ring several times.
	order := make([]uint32, 0, 500)
	for i := uint32(1); i <= 500; i++ {
		order = append(order, 0xffffff00+(i*7919)%500+1)
	}
	for i, q := range order {
		r.Push(int64(i), q, 0, pkt(q), s.deliver)
	}
	if d, _ := r.NextDeadline(); d != int64(0)+DefaultMaxHold {
		t.Fatalf("deadline %d: the first arrival should stay the oldest through growth", d)
	}
	r.Push(1000, 0xffffff00, 1, pkt(0xffffff00), s.deliver)
	expect(t, "after growth", s.take(), seqs(0xffffff00, 501))
}

func TestHotPathDoesNotAllocate(t *testing.T) {
	r := New(Config{}, 0)
	r.SetLinks([]uint8{0, 1})
	discard := func([]byte) {}
	p := pkt(0)
	seq := uint32(0)
	now := int64(0)
	reordered := func() {
		now += 1000
		r.Push(now, seq+1, 1, p, discard)
		r.Push(now, seq, 0, p, discard)
		seq += 2
	}
	for range 100 { // warm up the ring and the pool
		reordered()
	}
	if a := testing.AllocsPerRun(1000, reordered); a != 0 {
		t.Fatalf("reordered push allocates %.1f times", a)
	}
	inOrder := func() { now += 1000; r.Push(now, seq, 0, p, discard); seq++ }
	if a := testing.AllocsPerRun(1000, inOrder); a != 0 {
		t.Fatalf("in-order push allocates %.1f times", a)
	}
}

func BenchmarkPushInOrder(b *testing.B) {
	r := New(Config{}, 0)
	r.SetLinks([]uint8{0, 1, 2})
	p := make([]byte, 1400)
	discard := func([]byte) {}
	seq, now := uint32(0), int64(0)
	b.ReportAllocs()
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		now += 1000
		r.Push(now, seq, uint8(seq%3), p, discard)
		seq++
	}
}

func BenchmarkPushReordered(b *testing.B) {
	// Even numbers ride a slow link, odd ones a fast link that delivers them first:
	// every odd packet waits in the buffer until its even predecessor arrives.
	r := New(Config{}, 0)
	r.SetLinks([]uint8{0, 1})
	p := make([]byte, 1400)
	discard := func([]byte) {}
	seq, now := uint32(0), int64(0)
	b.ReportAllocs()
	b.SetBytes(2 * int64(len(p)))
	for b.Loop() {
		now += 1000
		r.Push(now, seq+1, 0, p, discard)
		r.Push(now, seq, 1, p, discard)
		seq += 2
	}
}
