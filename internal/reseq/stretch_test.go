package reseq

import "testing"

// timeoutThenLate makes the hold timer give up next at now + the hold in force, and
// then has the number arrive lateBy after that. It returns when the timer fired.
func timeoutThenLate(t *testing.T, r *Resequencer, s *sink, now, lateBy int64) int64 {
	t.Helper()
	gap := r.Next()
	r.Push(now, gap+1, 1, pkt(gap+1), s.deliver)
	fired := now + r.Hold()
	r.Expire(fired-1, s.deliver)
	expect(t, "before the hold is over", s.take(), nil)
	r.Expire(fired, s.deliver)
	expect(t, "the timer gives the gap up", s.take(), []uint32{gap + 1})
	r.Push(fired+lateBy, gap, 0, pkt(gap), s.deliver)
	expect(t, "the late packet", s.take(), nil)
	return fired
}

// The e2e fast-path test's case: on a busy host a packet reaches the resequencer
// just after the timer gave it up. The next gap must be held longer: 10 ms more for
// each timeout a late packet answers, up to 30 ms more, whatever the hold set.
func TestALatePacketLengthensTheHold(t *testing.T) {
	r, s := newRS(Config{}, 0)
	r.SetHold(60 * ms)
	now := int64(0)
	for i, want := range []int64{70 * ms, 80 * ms, 90 * ms, 90 * ms} {
		now = timeoutThenLate(t, r, s, now, ms/5) + ms
		if got := r.Hold(); got != want {
			t.Fatalf("after %d late packets: hold %d ms, want %d ms", i+1, got/ms, want/ms)
		}
	}
	if st := r.Stats(); st.TimeoutSkips != 4 || st.Late != 4 || st.Stretches != 4 {
		t.Fatalf("stats %+v: want 4 timeouts, 4 late packets, 4 stretches", st)
	}
}

// Numbers given up together by one timeout, arriving late together, are one piece of
// evidence, not several: the hold grows by one step.
func TestOneTimeoutLengthensTheHoldOnce(t *testing.T) {
	r, s := newRS(Config{}, 0)
	r.SetHold(10 * ms)
	r.Push(0, 3, 1, pkt(3), s.deliver)
	r.Expire(10*ms, s.deliver)
	expect(t, "the timer gives 0-2 up", s.take(), []uint32{3})
	for seq := range uint32(3) {
		r.Push(10*ms+int64(seq+1)*ms/10, seq, 0, pkt(seq), s.deliver)
	}
	if st := r.Stats(); st.Late != 3 || st.Stretches != 1 || r.Hold() != 20*ms {
		t.Fatalf("stats %+v, hold %d ms: want 3 late packets, 1 stretch, a 20-ms hold", st, r.Hold()/ms)
	}
}

// A late packet whose number FIFO evidence gave up says nothing about the hold (a link
// that reorders would have broken the rule however long the hold), and neither does
// one long after the last timeout.
func TestOnlyATimeoutsLatePacketLengthensTheHold(t *testing.T) {
	r, s := newRS(Config{MaxHold: 200 * ms}, 0)
	r.SetHold(10 * ms)
	r.Push(0, 1, 0, pkt(1), s.deliver)
	r.Push(0, 2, 1, pkt(2), s.deliver) // both links are past 0: given up by evidence
	expect(t, "evidence", s.take(), []uint32{1, 2})
	r.Push(ms, 0, 0, pkt(0), s.deliver)
	if st := r.Stats(); st.EvidenceSkips != 1 || st.Late != 1 || st.Stretches != 0 || r.Hold() != 10*ms {
		t.Fatalf("after an evidence skip: stats %+v, hold %d ms; want one late packet and the hold unchanged", st, r.Hold()/ms)
	}

	r.Push(2*ms, 4, 1, pkt(4), s.deliver)
	r.Expire(12*ms, s.deliver) // gives 3 up
	r.Push(12*ms+201*ms, 3, 0, pkt(3), s.deliver)
	if st := r.Stats(); st.TimeoutSkips != 1 || st.Late != 2 || st.Stretches != 0 {
		t.Fatalf("a packet later than the longest hold after the timeout: stats %+v, want it late and no stretch", st)
	}
}

// The extra halves every 10 s without a late packet, and the hold never passes
// Config.MaxHold.
func TestTheStretchFadesAndIsCapped(t *testing.T) {
	r, s := newRS(Config{MaxHold: 45 * ms}, 0)
	r.SetHold(20 * ms)
	now := int64(0)
	for range 3 {
		now = timeoutThenLate(t, r, s, now, ms/5) + ms
	}
	if got := r.Hold(); got != 45*ms {
		t.Fatalf("hold %d ms after three stretches, want the 45-ms cap", got/ms)
	}
	stretched := now - ms + ms/5 // the last late packet
	for _, c := range []struct {
		after int64
		want  int64
	}{{10e9 - 1, 45 * ms}, {10e9, 35 * ms}, {20e9, 27*ms + ms/2}, {30e9, 23*ms + 3*ms/4}, {700e9, 20 * ms}} {
		r.Expire(stretched+c.after, s.deliver) // moves the resequencer's clock
		if got := r.Hold(); got != c.want {
			t.Fatalf("%.1f s after the last stretch: hold %.2f ms, want %.2f ms", float64(c.after)/1e9, float64(got)/float64(ms), float64(c.want)/float64(ms))
		}
	}
}
