package metrics

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// A connection a client leaves open after its scrape is closed by the server once it
// has been idle for idleTimeout, where it used to be held (with a goroutine and a file
// descriptor in the daemon) for as long as the daemon ran.
func TestServeClosesConnectionsLeftIdle(t *testing.T) {
	defer func(d time.Duration) { idleTimeout = d }(idleTimeout)
	idleTimeout = 200 * time.Millisecond
	addr, _ := serveOnFreePort(t)
	conn, r := dial(t, addr)
	if err := scrape(conn, r); err != nil {
		t.Fatal(err)
	}

	// Send nothing more: the server must close the connection.
	expectClosed(t, conn, r, "a connection idle for longer than idleTimeout")
}

// The server holds at most maxConns connections. At the limit a new one takes the place
// of the one idle the longest; when none is idle (each is inside a request), the new
// one is closed at once.
func TestServeBoundsItsConnections(t *testing.T) {
	defer func(n int) { maxConns = n }(maxConns)
	maxConns = 2
	var limit *connLimit
	servedConnLimit = func(c *connLimit) { limit = c }
	defer func() { servedConnLimit = nil }()
	addr, m := serveOnFreePort(t)
	// The server marks a connection idle just after its response, which the client
	// may read first: wait for the mark, so that the first connection is the one idle
	// the longest and both are idle when the third comes.
	waitIdle := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); limit.idle() < n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the server marked %d connections idle after their scrapes, want %d", limit.idle(), n)
			}
		}
	}
	first, r1 := dial(t, addr)
	if err := scrape(first, r1); err != nil {
		t.Fatal(err)
	}
	waitIdle(1)
	second, r2 := dial(t, addr)
	if err := scrape(second, r2); err != nil {
		t.Fatal(err)
	}
	waitIdle(2)
	third, r3 := dial(t, addr)
	if err := scrape(third, r3); err != nil {
		t.Fatalf("a third scraper with both others idle: %v, want it served", err)
	}
	expectClosed(t, first, r1, "the connection idle the longest, at the limit")
	if err := scrape(second, r2); err != nil {
		t.Fatalf("the other idle connection: %v, want it kept", err)
	}
	wantClosed(t, m, 1, 0)
}

// wantClosed checks aggd_metrics_connections_closed_total's two series.
func wantClosed(t *testing.T, m *Set, evicted, refused float64) {
	t.Helper()
	got := func(reason string) float64 {
		var d dto.Metric
		if err := m.MetricsConnsClosed.WithLabelValues(reason).Write(&d); err != nil {
			t.Fatal(err)
		}
		return d.Counter.GetValue()
	}
	if got(ConnsClosedEvicted) != evicted || got(ConnsClosedRefused) != refused {
		t.Errorf("connections closed: evicted %v, refused %v; want %v, %v",
			got(ConnsClosedEvicted), got(ConnsClosedRefused), evicted, refused)
	}
}

// With every held connection inside a request, a new one is closed at once, and the
// busy ones are left alone; once one is idle again, the next new one takes its place.
func TestConnLimitTurnsAwayConnectionsWhenAllAreBusy(t *testing.T) {
	m := New()
	c := newConnLimit(2, m.MetricsConnsClosed)
	pipe := func() net.Conn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		return a
	}
	busy1, busy2, late := pipe(), pipe(), pipe()
	for _, conn := range []net.Conn{busy1, busy2} {
		c.track(conn, http.StateNew)
		c.track(conn, http.StateActive)
	}
	c.track(late, http.StateNew)
	if !closed(late) {
		t.Error("a new connection with both held ones inside a request was kept")
	}
	if closed(busy1) || closed(busy2) {
		t.Error("a connection inside a request was closed to make room")
	}
	c.track(late, http.StateClosed) // what the server reports for it
	wantClosed(t, m, 0, 1)

	c.track(busy2, http.StateIdle)
	next := pipe()
	c.track(next, http.StateNew)
	if closed(next) || !closed(busy2) || closed(busy1) {
		t.Errorf("with one held connection idle: new closed %v, idle closed %v, busy closed %v; want only the idle one closed",
			closed(next), closed(busy2), closed(busy1))
	}
	wantClosed(t, m, 1, 1)
}

// closed reports whether conn, one end of a net.Pipe, was closed.
func closed(conn net.Conn) bool {
	return errors.Is(conn.SetDeadline(time.Time{}), io.ErrClosedPipe)
}

// serveOnFreePort starts the metrics server on a free port of the loopback until the
// test ends, and returns its address and metrics.
func serveOnFreePort(t *testing.T) (string, *Set) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	m := New()
	if err := Serve(ctx, addr, m); err != nil {
		t.Fatal(err)
	}
	return addr, m
}

// dial opens a connection to addr, closed when the test ends.
func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, bufio.NewReader(conn)
}

// scrape asks for /metrics on conn, reads the whole answer and checks that the
// connection is kept alive.
func scrape(conn net.Conn, r *bufio.Reader) error {
	if _, err := io.WriteString(conn, "GET /metrics HTTP/1.1\r\nHost: aggd\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return fmt.Errorf("scrape: %w", err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || resp.Close {
		return fmt.Errorf("scrape: status %d, close %v; want 200 on a connection kept alive", resp.StatusCode, resp.Close)
	}
	return nil
}

// expectClosed fails the test unless the server closes conn, read through r. The
// deadline only keeps a failing test from hanging.
func expectClosed(t *testing.T, conn net.Conn, r *bufio.Reader, what string) {
	t.Helper()
	if err := conn.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadByte(); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("%s: reading it gave %v, want it closed by the server", what, err)
	}
}
