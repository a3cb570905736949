package tunnel

import (
	"bytes"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// A flood does not become a log line per INIT: a thousand rejected handshakes and a
// thousand cookie replies make a dozen lines that say how many there were.
func TestHandshakeLoadIsLoggedInSummaries(t *testing.T) {
	var buf bytes.Buffer
	l := hsLoadLog{log: slog.New(slog.NewTextHandler(&buf, nil))}
	from := netip.MustParseAddrPort("198.51.100.9:4000")
	t0 := time.Now()
	for i := range 1000 {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		l.rejected(from, errors.New("noise: bad static key"), now)
		l.cookieSent(now)
		l.tick(now)
	}
	lines := func(s string) int { return strings.Count(buf.String(), s) }
	if n := lines(`msg="handshake rejected" from=`); n != rejectsLogged {
		t.Errorf("%d rejections logged one by one in 1 s, want %d", n, rejectsLogged)
	}
	if n := lines("handshake rate limit spent"); n != 1 {
		t.Errorf("the start of the cookie replies logged %d times, want once", n)
	}
	if n := lines("handshake load over"); n != 0 {
		t.Errorf("the cookie replies' end logged while they go on")
	}

	l.tick(t0.Add(12 * time.Second))
	if !strings.Contains(buf.String(), "not_logged=990") {
		t.Errorf("no count of the 990 rejections not logged one by one:\n%s", buf.String())
	}
	if !strings.Contains(buf.String(), "cookie_replies=1000") || !strings.Contains(buf.String(), "lasted=999ms") {
		t.Errorf("the end of the cookie replies does not say how many there were and how long:\n%s", buf.String())
	}
	if n := strings.Count(buf.String(), "\n"); n != rejectsLogged+3 {
		t.Errorf("%d log lines for a flood of 1000 INITs, want %d:\n%s", n, rejectsLogged+3, buf.String())
	}

	// A new window logs its first rejections again, and a new stretch its start.
	later := t0.Add(time.Minute)
	l.rejected(from, errors.New("replayed"), later)
	l.cookieSent(later)
	if n := lines(`msg="handshake rejected" from=`); n != rejectsLogged+1 {
		t.Errorf("a rejection a minute later is not logged: %d logged in all", n)
	}
	if n := lines("handshake rate limit spent"); n != 2 {
		t.Errorf("a new stretch of cookie replies is not logged")
	}
}
