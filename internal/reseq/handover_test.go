package reseq

import (
	"strings"
	"testing"
)

func collect(out *[]uint32) func([]byte) {
	return func(p []byte) { *out = append(*out, uint32(p[0])) }
}

func TestEmptyAndNext(t *testing.T) {
	var got []uint32
	r := New(Config{}, 10)
	if !r.Empty() || r.Next() != 10 {
		t.Fatalf("new: empty %v next %d, want true 10", r.Empty(), r.Next())
	}
	r.Push(1, 10, 0, []byte{10}, collect(&got))
	if !r.Empty() || r.Next() != 11 {
		t.Errorf("after in-order push: empty %v next %d, want true 11", r.Empty(), r.Next())
	}
	r.Push(2, 13, 0, []byte{13}, collect(&got))
	if r.Empty() || r.Next() != 11 {
		t.Errorf("holding 13: empty %v next %d, want false 11", r.Empty(), r.Next())
	}
	r.Push(3, 11, 0, []byte{11}, collect(&got))
	r.Push(4, 12, 0, []byte{12}, collect(&got))
	if !r.Empty() || r.Next() != 14 {
		t.Errorf("after filling the gap: empty %v next %d, want true 14", r.Empty(), r.Next())
	}
	// A loss marker ahead is something the kernel would not know of.
	r.Skip(20, 1, collect(&got))
	if r.Empty() {
		t.Error("with a loss marker ahead: empty")
	}
}

func TestRestartForgetsTheOldEra(t *testing.T) {
	var got []uint32
	r := New(Config{MaxHold: 100}, 0)
	r.SetLinks([]uint8{1, 2})
	for s := uint32(0); s < 5; s++ {
		r.Push(int64(s), s, 1, []byte{byte(s)}, collect(&got))
	}
	// Evidence from link 2 beyond a future gap, and a marker, then the kernel
	// takes over and hands back at 50.
	r.Watermark(6, 2, 60, collect(&got))
	r.Skip(7, 1, collect(&got))
	r.Restart(50)
	if r.Next() != 50 || !r.Empty() {
		t.Fatalf("after Restart(50): next %d empty %v", r.Next(), r.Empty())
	}
	// 3 was delivered in the old era, but the history must not say so now:
	// the kernel delivered 5..49, which the resequencer never saw.
	r.Push(10, 3, 1, []byte{3}, collect(&got))
	if st := r.Stats(); st.Duplicates != 0 || st.Stale != 1 {
		t.Errorf("an old-era number after Restart: %+v, want counted stale", st)
	}
	// Link 2's old bound (60) must not resolve the gap at 50 with link 1's
	// new evidence alone.
	r.Push(11, 52, 1, []byte{52}, collect(&got))
	if r.Next() != 50 {
		t.Errorf("old evidence resolved a gap: next %d", r.Next())
	}
	r.Push(12, 53, 2, []byte{53}, collect(&got))
	if r.Next() != 54 {
		t.Errorf("new evidence from both links: next %d, want 54", r.Next())
	}
	want := []uint32{0, 1, 2, 3, 4, 52, 53}
	if len(got) != len(want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("delivered %v, want %v", got, want)
		}
	}
}

func TestRestartWithHeldPanics(t *testing.T) {
	var got []uint32
	r := New(Config{}, 0)
	r.Push(1, 5, 0, []byte{5}, collect(&got))
	defer func() {
		p := recover()
		if s, ok := p.(string); !ok || !strings.Contains(s, "1 packets held") {
			t.Errorf("recovered %v, want the held-packets panic", p)
		}
	}()
	r.Restart(9)
}

// Restart across the wrap, with a grown ring: held slots come back empty.
func TestRestartReusesTheRing(t *testing.T) {
	var got []uint32
	r := New(Config{MaxHold: 10}, 0xfffffff0)
	for s := uint32(0xfffffff1); s != 0x30; s++ {
		r.Push(1, s, 0, []byte{byte(s)}, collect(&got))
	}
	r.Expire(100, collect(&got))
	if !r.Empty() || r.Next() != 0x30 {
		t.Fatalf("after expiry: empty %v next %#x", r.Empty(), r.Next())
	}
	r.Restart(0xfffffffe)
	got = got[:0]
	r.Push(200, 0xffffffff, 0, []byte{0xff}, collect(&got))
	r.Push(201, 0xfffffffe, 0, []byte{0xfe}, collect(&got))
	if len(got) != 2 || got[0] != 0xfe || got[1] != 0xff || r.Next() != 0 || !r.Empty() {
		t.Errorf("after Restart near the wrap: delivered %v next %#x", got, r.Next())
	}
}
