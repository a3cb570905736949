package metrics

import (
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// maxConns is how many connections the metrics server holds at once: a few scrapers
// (a Prometheus pair, `aggd status`, someone's curl) need one each. Without a bound a
// client that opens connections and forgets them, or means harm, could take every file
// descriptor the daemon has, and with them its uplinks' sockets. A variable for the
// tests.
var maxConns = 16

// connLimit keeps the server within maxConns (http.Server.ConnState). At the limit a
// new connection takes the place of the one idle the longest, which is closed: an idle
// connection costs its client nothing to open again, and a scraper that came back is
// not shut out by ones that were left. If none is idle, every one is inside a request,
// which the server's timeouts bound, and the new connection is closed instead. Each
// close is counted by why (ConnsClosedEvicted, ConnsClosedRefused): scrapes that fail
// now and then with the counter rising say that something else holds the endpoint's
// connections.
type connLimit struct {
	max    int
	closed *prometheus.CounterVec // by reason
	mu     sync.Mutex
	conns  map[net.Conn]connState
}

// connState is what connLimit knows of one connection.
type connState struct {
	idle  bool
	since time.Time // when it went idle
}

// The values of aggd_metrics_connections_closed_total's label.
const (
	ConnsClosedEvicted = "evicted" // an idle connection, closed to make room for a new one
	ConnsClosedRefused = "refused" // a new connection, closed because every held one was busy
)

// ConnsClosedReasons lists the label's values, so that each series exists from the start.
var ConnsClosedReasons = []string{ConnsClosedEvicted, ConnsClosedRefused}

// servedConnLimit, when set (by tests), is given the limit Serve installs, so a test can
// wait for the server's view of its connections instead of guessing how long it takes.
var servedConnLimit func(*connLimit)

func newConnLimit(max int, closed *prometheus.CounterVec) *connLimit {
	return &connLimit{max: max, closed: closed, conns: map[net.Conn]connState{}}
}

// track is the server's ConnState hook.
func (c *connLimit) track(conn net.Conn, state http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch state {
	case http.StateNew:
		if len(c.conns) >= c.max {
			oldest := c.longestIdle()
			if oldest == nil {
				_ = conn.Close() // the server sees it closed and lets it go
				c.closed.WithLabelValues(ConnsClosedRefused).Inc()
				return
			}
			_ = oldest.Close()
			delete(c.conns, oldest)
			c.closed.WithLabelValues(ConnsClosedEvicted).Inc()
		}
		c.conns[conn] = connState{}
	case http.StateActive:
		if _, ok := c.conns[conn]; ok {
			c.conns[conn] = connState{}
		}
	case http.StateIdle:
		if _, ok := c.conns[conn]; ok {
			c.conns[conn] = connState{idle: true, since: time.Now()}
		}
	case http.StateHijacked, http.StateClosed:
		delete(c.conns, conn)
	}
}

// idle counts the connections marked idle.
func (c *connLimit) idle() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, st := range c.conns {
		if st.idle {
			n++
		}
	}
	return n
}

// longestIdle returns the connection idle the longest, nil if none is. Caller holds mu.
func (c *connLimit) longestIdle() net.Conn {
	var oldest net.Conn
	var since time.Time
	for conn, st := range c.conns {
		if st.idle && (oldest == nil || st.since.Before(since)) {
			oldest, since = conn, st.since
		}
	}
	return oldest
}
