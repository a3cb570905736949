package clock

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func kernelMonotonic(t *testing.T) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return ts.Nano()
}

// Nanos reads the kernel's CLOCK_MONOTONIC, the clock of the BPF programs'
// bpf_ktime_get_ns, to within its stated uncertainty: a reading taken between two of
// the kernel's lies between them.
func TestNanosIsTheKernelsMonotonicClock(t *testing.T) {
	u := int64(Uncertainty())
	t.Logf("anchored to within %v", Uncertainty())
	for range 1000 {
		before := kernelMonotonic(t)
		n := Nanos()
		after := kernelMonotonic(t)
		if n < before-u || n > after+u {
			t.Fatalf("Nanos %d outside the kernel's readings around it [%d, %d] by more than its uncertainty %v",
				n, before, after, Uncertainty())
		}
	}
	if Uncertainty() < 0 || Uncertainty() > time.Second {
		t.Errorf("uncertainty %v", Uncertainty())
	}
}

// It never runs backwards.
func TestNanosIsMonotonic(t *testing.T) {
	last := Nanos()
	for range 100000 {
		n := Nanos()
		if n < last {
			t.Fatalf("Nanos went back from %d to %d", last, n)
		}
		last = n
	}
}

// BenchmarkNanos against the system call it replaced (make bench's micro-benchmarks).
func BenchmarkNanos(b *testing.B) {
	for b.Loop() {
		Nanos()
	}
}

func BenchmarkClockGettimeSyscall(b *testing.B) {
	var ts unix.Timespec
	for b.Loop() {
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	}
}
