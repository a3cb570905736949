// Package clock reads CLOCK_MONOTONIC, the clock both the BPF fast path
// (bpf_ktime_get_ns) and the daemon stamp packets with, so their timestamps compare.
package clock

import "golang.org/x/sys/unix"

// Nanos returns CLOCK_MONOTONIC in nanoseconds.
func Nanos() int64 {
	var ts unix.Timespec
	// clock_gettime(CLOCK_MONOTONIC) cannot fail with a valid pointer; it is served by the vDSO.
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// Micros32 is the wire format's timestamp: CLOCK_MONOTONIC in microseconds, truncated to
// 32 bits. Only differences of these values are meaningful.
func Micros32(nanos int64) uint32 { return uint32(nanos / 1000) }
