package reseq

import (
	"encoding/binary"
	"testing"
)

// udp builds an IPv4 UDP packet of flow port (its source port) carrying seq at byte 28.
func udp(port uint16, seq uint32) []byte {
	p := make([]byte, 64)
	p[0], p[9] = 0x45, 17
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	binary.BigEndian.PutUint16(p[20:], port)
	binary.BigEndian.PutUint32(p[28:], seq)
	return p
}

// udpSink records the sequence numbers of the udp packets delivered.
type udpSink struct{ got []uint32 }

func (s *udpSink) deliver(p []byte) { s.got = append(s.got, binary.BigEndian.Uint32(p[28:])) }

func (s *udpSink) take() []uint32 {
	got := s.got
	s.got = nil
	return got
}

const (
	bulk  = 5001
	pings = 7
)

func TestASparsePacketPassesAnotherFlowsGap(t *testing.T) {
	r := New(Config{}, 0)
	r.SetLinks([]uint8{0, 1})
	var s udpSink
	r.Push(0, 0, 0, udp(bulk, 0), s.deliver)
	r.Push(1*ms, 2, 0, udp(bulk, 2), s.deliver) // held behind 1
	r.PushSparse(2*ms, 3, 0, udp(pings, 3), s.deliver)
	expect(t, "the ping passes the bulk's gap", s.take(), []uint32{0, 3})
	if r.Empty() {
		t.Fatal("Empty with a packet held and a number passed")
	}
	r.PushSparse(3*ms, 3, 0, udp(pings, 3), s.deliver) // its copy
	r.Push(4*ms, 1, 1, udp(bulk, 1), s.deliver)
	expect(t, "the gap fills: the ping is not delivered again", s.take(), []uint32{1, 2})
	r.Push(5*ms, 4, 0, udp(bulk, 4), s.deliver)
	expect(t, "in order after it", s.take(), []uint32{4})
	st := r.Stats()
	if st.Delivered != 5 || st.Ahead != 1 || st.Duplicates != 1 || st.Held != 1 || st.Lost != 0 || !r.Empty() {
		t.Fatalf("stats %+v (empty %v): want 5 delivered, 1 of them ahead, its copy a duplicate, 1 held", st, r.Empty())
	}
}

func TestASparsePacketWaitsBehindItsOwnFlow(t *testing.T) {
	r := New(Config{}, 0)
	r.SetLinks([]uint8{0, 1})
	var s udpSink
	r.Push(0, 2, 0, udp(pings, 2), s.deliver) // the flow's last one, held behind 0 and 1
	r.PushSparse(1*ms, 3, 0, udp(pings, 3), s.deliver)
	r.PushSparse(1*ms, 4, 0, udp(bulk, 4), s.deliver) // another flow's passes
	expect(t, "only the other flow passes", s.take(), []uint32{4})
	r.Push(2*ms, 0, 1, udp(bulk, 0), s.deliver)
	r.Push(2*ms, 1, 1, udp(bulk, 1), s.deliver)
	expect(t, "the flow in order", s.take(), []uint32{0, 1, 2, 3})
	if st := r.Stats(); st.Ahead != 1 || st.Held != 2 {
		t.Fatalf("stats %+v: want one ahead, two held", st)
	}
}

func TestAPacketThatNamesNoFlowIsNeverSparse(t *testing.T) {
	r := New(Config{}, 0)
	var s udpSink
	frag := udp(pings, 2)
	frag[6] = 0x20 // more fragments: a fragment names no flow
	r.PushSparse(0, 2, 0, frag, s.deliver)
	r.PushSparse(0, 3, 0, udp(pings, 3), s.deliver) // a held fragment may be of any flow
	expect(t, "both wait", s.take(), nil)
	if st := r.Stats(); st.Ahead != 0 || st.Held != 2 {
		t.Fatalf("stats %+v: want none ahead, two held", st)
	}
}

// With nothing held behind it, the gap before a passed number is still given up by the
// hold timer, counted from the passed packet's arrival, and the ordering can then go
// back to the kernel.
func TestTheTimerGivesUpTheGapBeforeAPassedNumber(t *testing.T) {
	r := New(Config{}, 0)
	r.SetLinks([]uint8{0, 1})
	r.SetHold(10 * ms)
	var s udpSink
	r.PushSparse(5*ms, 2, 0, udp(pings, 2), s.deliver)
	expect(t, "passed", s.take(), []uint32{2})
	if r.Empty() {
		t.Fatal("Empty with a number passed: the kernel would deliver its copy again")
	}
	if d, ok := r.NextDeadline(); !ok || d != 15*ms {
		t.Fatalf("deadline %d, %v: want 15 ms from the passed packet", d, ok)
	}
	r.Expire(15*ms, s.deliver)
	expect(t, "nothing delivered again", s.take(), nil)
	if st := r.Stats(); st.TimeoutSkips != 2 || r.Next() != 3 || !r.Empty() {
		t.Fatalf("stats %+v, next %d, empty %v: want 0 and 1 given up, next 3", st, r.Next(), r.Empty())
	}
	r.PushSparse(16*ms, 1, 1, udp(pings, 1), s.deliver)
	expect(t, "a late sparse packet is delivered, as a late copy is", s.take(), []uint32{1})
	r.PushSparse(16*ms, 1, 1, udp(pings, 1), s.deliver)
	expect(t, "once", s.take(), nil)
}

// A loss notice for a number that then comes sparse, and a ring that grows past a
// passed number, keep it passed.
func TestAPassedNumberSurvivesNoticesAndGrowth(t *testing.T) {
	r := New(Config{}, 0)
	var s udpSink
	r.Skip(1, 1, s.deliver)
	r.PushSparse(0, 1, 0, udp(pings, 1), s.deliver)
	r.Skip(1, 1, s.deliver)
	r.Push(0, 200, 0, udp(bulk, 200), s.deliver) // grows the ring beyond minRing
	expect(t, "the marked number came after all", s.take(), []uint32{1})
	r.Push(0, 0, 0, udp(bulk, 0), s.deliver)
	for q := uint32(2); q < 200; q++ {
		r.Push(0, q, 0, udp(bulk, q), s.deliver)
	}
	got := s.take()
	if len(got) != 200 || got[0] != 0 || got[1] != 2 || got[199] != 200 {
		t.Fatalf("delivered %d numbers, %v...: want 0, 2 to 200", len(got), got[:min(len(got), 3)])
	}
	if st := r.Stats(); st.Lost != 0 || st.NoticeSkips != 0 || !r.Empty() {
		t.Fatalf("stats %+v: nothing lost", st)
	}
}
