package tunnel

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/clock"
)

// A datagram's receive time is when the kernel took it in, not when the daemon read it:
// a reader that is late by 50 ms still sees the time of the send.
func TestReadLoopReportsKernelReceiveTime(t *testing.T) {
	rx, err := listenUDP(netip.MustParseAddrPort("127.0.0.1:0"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	tx, err := listenUDP(netip.MustParseAddrPort("127.0.0.1:0"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()

	before := clock.Nanos()
	if _, err := tx.WriteToUDPAddrPort([]byte("x"), localAddrPort(rx)); err != nil {
		t.Fatal(err)
	}
	after := clock.Nanos() // loopback delivers within the send
	time.Sleep(50 * time.Millisecond)

	got := make(chan int64, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go readLoop(ctx, rx, slog.New(slog.DiscardHandler), func(_ []byte, _ netip.AddrPort, rxNanos int64) { got <- rxNanos })
	at := <-got
	read := clock.Nanos()
	// The realtime and monotonic clocks are read a few µs apart: a millisecond of slack.
	const slack = int64(time.Millisecond)
	if at < before-slack || at > after+slack {
		t.Errorf("receive time %.1f ms after the send started (send took %.1f ms, read %.1f ms after it): want the kernel's time of receipt",
			float64(at-before)/1e6, float64(after-before)/1e6, float64(read-before)/1e6)
	}
}

// Without a timestamp (or with a malformed one) the time of reading stands in.
func TestKernelRxNanosFallsBackToNow(t *testing.T) {
	for _, oob := range [][]byte{nil, make([]byte, 8), make([]byte, 64)} {
		before := clock.Nanos()
		got := kernelRxNanos(oob)
		if got < before || got > clock.Nanos() {
			t.Errorf("oob of %d bytes: %d, want now", len(oob), got)
		}
	}
}
