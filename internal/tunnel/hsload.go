package tunnel

import (
	"log/slog"
	"net/netip"
	"sync"
	"time"
)

// hsLoadLog tells the operator about a headend's handshake load without a log line per
// INIT, which a flood would turn into hundreds a second: when the headend starts
// answering INITs with cookie replies and when it stops, and rejected handshakes one by
// one up to rejectsLogged in a window, then as one count at the window's end.
type hsLoadLog struct {
	log *slog.Logger

	mu sync.Mutex
	// The current stretch of cookie replies: zero firstCookie when there is none.
	firstCookie, lastCookie time.Time
	cookies                 int
	// Rejected handshakes in the window that started at rejectWindow.
	rejectWindow time.Time
	rejects      int
	lastFrom     netip.AddrPort
	lastErr      error
}

const (
	// cookiesOverAfter is how long without a cookie reply ends a stretch of them.
	cookiesOverAfter = 5 * time.Second
	rejectsWindow    = 10 * time.Second
	rejectsLogged    = 10
)

// cookieSent records a cookie reply: the first of a stretch is logged.
func (l *hsLoadLog) cookieSent(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.firstCookie.IsZero() {
		l.firstCookie = now
		l.log.Warn("handshake rate limit spent: answering INITs with cookie replies " +
			"(a flood of INITs, or many CPEs at once); CPEs that prove their address with the cookie still connect")
	}
	l.lastCookie = now
	l.cookies++
}

// rejected records a handshake the responder refused: logged while the window has
// logged fewer than rejectsLogged, counted after that.
func (l *hsLoadLog) rejected(from netip.AddrPort, err error, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closeRejectWindow(now)
	if l.rejectWindow.IsZero() {
		l.rejectWindow = now
	}
	l.rejects++
	l.lastFrom, l.lastErr = from, err
	if l.rejects <= rejectsLogged {
		l.log.Info("handshake rejected", "from", from, "err", err)
	}
}

// tick ends what is over: a stretch of cookie replies, a window of rejections.
func (l *hsLoadLog) tick(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.firstCookie.IsZero() && now.Sub(l.lastCookie) >= cookiesOverAfter {
		l.log.Info("handshake load over: no more cookie replies",
			"cookie_replies", l.cookies, "lasted", l.lastCookie.Sub(l.firstCookie).Round(time.Millisecond))
		l.firstCookie, l.cookies = time.Time{}, 0
	}
	l.closeRejectWindow(now)
}

// closeRejectWindow ends the rejections' window if it is rejectsWindow old, with a count
// of those it did not log one by one. Under l.mu.
func (l *hsLoadLog) closeRejectWindow(now time.Time) {
	if l.rejectWindow.IsZero() || now.Sub(l.rejectWindow) < rejectsWindow {
		return
	}
	if n := l.rejects - rejectsLogged; n > 0 {
		l.log.Info("handshake rejected, more than were logged one by one", "not_logged", n,
			"in", rejectsWindow, "last_from", l.lastFrom, "last_err", l.lastErr)
	}
	l.rejectWindow, l.rejects = time.Time{}, 0
}
