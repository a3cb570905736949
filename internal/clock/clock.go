// Package clock reads CLOCK_MONOTONIC, the clock both the BPF fast path
// (bpf_ktime_get_ns) and the daemon stamp packets with, so their timestamps compare.
package clock

import (
	"time"

	"golang.org/x/sys/unix"
)

// Go's own monotonic clock is CLOCK_MONOTONIC on Linux, read through the vDSO, but it
// gives only differences (time.Since). unix.ClockGettime gives the absolute value, but
// as a real system call: on the lab's emulated CPUs that was 5 % of a daemon's CPU, for
// a clock read on every packet (BENCHMARKS.md, "Where aggd's CPU goes"). So the
// absolute value is read once, between two readings of Go's clock, and Nanos adds Go's
// elapsed time to it.
var (
	base      time.Time // a reading of Go's clock
	baseNanos int64     // CLOCK_MONOTONIC at base, within uncertain
	uncertain time.Duration
)

// anchorTries: the anchor is the narrowest of this many readings. The first is often
// wide: its code is paged in then (in the lab's VM, over 9p, it once took 8 ms, and a
// BPF program's timestamp fell outside the reading's middle by 3.9 ms).
const anchorTries = 16

func init() {
	for i := range anchorTries {
		before := time.Now()
		var ts unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail with a valid pointer
		after := time.Now()
		// The system call's reading lies between the two of Go's clock: take their middle.
		if half := after.Sub(before) / 2; i == 0 || half < uncertain {
			uncertain = half
			base, baseNanos = before.Add(half), ts.Nano()
		}
	}
}

// Nanos returns CLOCK_MONOTONIC in nanoseconds (to within Uncertainty).
func Nanos() int64 { return baseNanos + int64(time.Since(base)) }

// Uncertainty is how far Nanos can be from the kernel's CLOCK_MONOTONIC: half the time
// the one system call that anchors it took, a microsecond or so.
func Uncertainty() time.Duration { return uncertain }

// Micros32 is the wire format's timestamp: CLOCK_MONOTONIC in microseconds, truncated to
// 32 bits. Only differences of these values are meaningful.
func Micros32(nanos int64) uint32 { return uint32(nanos / 1000) }
