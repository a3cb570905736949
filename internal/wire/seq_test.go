package wire

import "testing"

func TestSeqArithmetic(t *testing.T) {
	cases := []struct {
		a, b  uint32
		diff  int32
		after bool
	}{
		{1, 0, 1, true},
		{0, 1, -1, false},
		{5, 5, 0, false},
		{0, 0xffffffff, 1, true}, // wrapped forward
		{0xffffffff, 0, -1, false},
		{10, 0xfffffff0, 26, true},
		{0x7fffffff, 0, 0x7fffffff, true}, // the farthest "after"
		{0x80000000, 0, -0x80000000, false},
	}
	for _, c := range cases {
		if got := SeqDiff(c.a, c.b); got != c.diff {
			t.Errorf("SeqDiff(%#x, %#x) = %d, want %d", c.a, c.b, got, c.diff)
		}
		if got := SeqAfter(c.a, c.b); got != c.after {
			t.Errorf("SeqAfter(%#x, %#x) = %v, want %v", c.a, c.b, got, c.after)
		}
	}
}
