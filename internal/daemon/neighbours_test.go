package daemon

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"
)

// flushLog records what a neighbourRechecks asked to delete, in order.
type flushLog struct {
	mu    sync.Mutex
	calls []string // "ifname olderThan"
	seen  chan struct{}
}

func (f *flushLog) flush(ifname string, olderThan time.Duration) (int, error) {
	f.mu.Lock()
	f.calls = append(f.calls, ifname+" "+olderThan.String())
	f.mu.Unlock()
	f.seen <- struct{}{}
	return 0, nil
}

func (f *flushLog) got() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func newTestRechecks(ctx context.Context, f *flushLog) *neighbourRechecks {
	r := newNeighbourRechecks(ctx)
	r.at = []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}
	r.flush = f.flush
	return r
}

// waitCalls waits for n flushes.
func waitCalls(t *testing.T, f *flushLog, n int) {
	t.Helper()
	for range n {
		select {
		case <-f.seen:
		case <-time.After(10 * time.Second):
			t.Fatalf("only %v flushes came", f.got())
		}
	}
}

// At a carrier's return every unresolved entry goes, then at each recheck those left
// unanswered; nothing more after the last.
func TestACarriersReturnIsFollowedByRechecks(t *testing.T) {
	f := &flushLog{seen: make(chan struct{}, 16)}
	r := newTestRechecks(context.Background(), f)
	r.carrier(slog.New(slog.NewTextHandler(io.Discard, nil)), "up3", true)
	waitCalls(t, f, 4)
	time.Sleep(20 * time.Millisecond) // room for a stray fifth
	want := []string{"up3 0s", "up3 " + unansweredAfter.String(), "up3 " + unansweredAfter.String(), "up3 " + unansweredAfter.String()}
	if got := f.got(); !slices.Equal(got, want) {
		t.Errorf("flushes %q, want %q", got, want)
	}
}

// A carrier lost again, or the daemon stopping, ends the rechecks of the last return:
// they would delete the entries of a dead interface, or of one the daemon left.
func TestRechecksEndWithTheCarrierOrTheDaemon(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f := &flushLog{seen: make(chan struct{}, 16)}
	r := newTestRechecks(context.Background(), f)
	r.at = []time.Duration{50 * time.Millisecond}
	r.carrier(log, "up3", true)
	r.carrier(log, "up3", false)
	ctx, stop := context.WithCancel(context.Background())
	g := newTestRechecks(ctx, f)
	g.at = r.at
	g.carrier(log, "up4", true)
	stop()
	waitCalls(t, f, 2) // the returns' own
	time.Sleep(200 * time.Millisecond)
	if got, want := f.got(), []string{"up3 0s", "up4 0s"}; !slices.Equal(got, want) {
		t.Errorf("flushes %q, want %q (no recheck)", got, want)
	}
}
