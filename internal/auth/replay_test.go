package auth

import (
	"math/rand/v2"
	"testing"
)

func TestReplayWindowBasics(t *testing.T) {
	var w ReplayWindow
	steps := []struct {
		seq  uint32
		want bool
	}{
		{10000, true},                  // first number: anything
		{10000, false},                 // replay
		{10001, true},                  // next
		{9999, true},                   // late but inside the window
		{9999, false},                  // replay of a late one
		{10001 - WindowSize + 1, true}, // oldest still in the window
		{10001 - WindowSize, false},    // one behind it
		{50000, true},                  // jump ahead
		{10001, false},                 // now behind the window
		{50000 - WindowSize + 1, true},
	}
	for i, s := range steps {
		if got := w.Check(s.seq); got != s.want {
			t.Fatalf("step %d: Check(%d) = %v, want %v", i, s.seq, got, s.want)
		}
		if got := w.Accept(s.seq); got != s.want {
			t.Fatalf("step %d: Accept(%d) = %v, want %v", i, s.seq, got, s.want)
		}
	}
}

func TestCheckDoesNotChangeState(t *testing.T) {
	var w ReplayWindow
	w.Accept(10)
	for range 3 {
		if !w.Check(11) {
			t.Fatal("Check(11) = false")
		}
	}
	if !w.Accept(11) {
		t.Fatal("Check consumed 11")
	}
}

func TestReplayWindowAcrossWrap(t *testing.T) {
	var w ReplayWindow
	start := uint32(0xffffffff - 10)
	for i := range uint32(30) {
		if !w.Accept(start + i) {
			t.Fatalf("fresh %#x rejected", start+i)
		}
	}
	for i := range uint32(30) {
		if w.Accept(start + i) {
			t.Fatalf("replayed %#x accepted after the wrap", start+i)
		}
	}
	// A late packet from before the wrap is still fresh if not seen.
	var w2 ReplayWindow
	w2.Accept(0xfffffff0)
	w2.Accept(5) // 21 ahead, across the wrap
	if !w2.Accept(0xfffffff8) {
		t.Fatal("unseen pre-wrap number inside the window rejected")
	}
	if w2.Accept(0xfffffff0) {
		t.Fatal("pre-wrap replay accepted")
	}
}

func TestReplayWindowFirstNumberLowAndOldBelow(t *testing.T) {
	var w ReplayWindow
	w.Accept(3)
	// 0xfffffffe is 5 behind 3 in serial arithmetic: late, fresh once.
	if !w.Accept(0xfffffffe) || w.Accept(0xfffffffe) {
		t.Fatal("late number just before the first one across the wrap mishandled")
	}
}

func TestReplayWindowReset(t *testing.T) {
	var w ReplayWindow
	w.Accept(7)
	w.Reset()
	if !w.Accept(7) {
		t.Fatal("after Reset, 7 is still remembered")
	}
}

// A jump of exactly WindowSize, and of more, must forget everything behind: the ring
// slots are reused, and a stale bit would reject a fresh number.
func TestReplayWindowBigJumpClearsRing(t *testing.T) {
	for _, jump := range []uint32{WindowSize - 1, WindowSize, WindowSize + 1, 1 << 20} {
		var w ReplayWindow
		for s := uint32(0); s < 64; s++ {
			w.Accept(s)
		}
		top := 63 + jump
		if !w.Accept(top) {
			t.Fatalf("jump %d: rejected", jump)
		}
		for s := top - 60; s != top; s++ {
			if inWindow(top, s) && !w.Check(s) {
				t.Fatalf("jump %d: fresh %d rejected (stale ring bit)", jump, s)
			}
		}
	}
}

// inWindow mirrors the documented semantics for the model below.
func inWindow(top, s uint32) bool {
	d := int32(top - s)
	return d >= 0 && d < WindowSize
}

// Compare against a plain model (a set of seen numbers and the highest one) on random
// traffic: in-order runs, reordering, duplicates and jumps, starting near the wrap.
func TestReplayWindowMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var w ReplayWindow
	seen := map[uint64]bool{}
	var top uint64
	started := false
	next := uint64(1<<32 - 3000)
	for range 200000 {
		var pos uint64
		switch r := rng.IntN(100); {
		case r < 60:
			next++
			pos = next
		case r < 90: // late or duplicate, up to 1.5 windows back
			pos = next - uint64(rng.IntN(WindowSize*3/2))
		case r < 99:
			pos = next + uint64(rng.IntN(10))
		default:
			next += uint64(rng.IntN(3 * WindowSize))
			pos = next
		}
		want := !started || pos > top || (top-pos < WindowSize && !seen[pos])
		if got := w.Accept(uint32(pos)); got != want {
			t.Fatalf("Accept(%#x) with top %#x = %v, model says %v", uint32(pos), uint32(top), got, want)
		}
		if want {
			seen[pos] = true
			if !started || pos > top {
				top, started = pos, true
			}
		}
	}
}

func TestWindow64(t *testing.T) {
	var w Window64
	if !w.Accept(^uint64(0)-1) || !w.Accept(^uint64(0)) || !w.Accept(0) || !w.Accept(1) {
		t.Fatal("counter wrapping at 2^64 rejected")
	}
	if w.Accept(^uint64(0)) || w.Accept(0) {
		t.Fatal("replay across the 2^64 wrap accepted")
	}
	if !w.Check(2) || w.Check(1) {
		t.Fatal("Check disagrees")
	}
	w.Accept(1 << 40)
	if w.Accept(5) {
		t.Fatal("counter far behind the window accepted")
	}
	w.Reset()
	if !w.Accept(5) {
		t.Fatal("after Reset, 5 rejected")
	}
}
