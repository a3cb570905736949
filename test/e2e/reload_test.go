package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A headend's peers change on SIGHUP (systemctl reload), without a restart: a removed
// CPE loses its session, its route and its metrics, and is refused; added back, it
// connects again; a config with problems changes nothing; settings other than peers[]
// are named as needing a restart.
func TestHeadendReloadsPeers(t *testing.T) {
	n := newTopology(t)
	b := startBond(t, n)
	hubYAML := filepath.Join(b.dir, "hub.yaml")
	hubLog := filepath.Join(b.dir, "hub.log")
	original, err := os.ReadFile(hubYAML)
	if err != nil {
		t.Fatal(err)
	}
	reload := func(content string) {
		t.Helper()
		if err := os.WriteFile(hubYAML, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := b.headend.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	waitLog := func(what string, parts ...string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for logCount(hubLog, parts...) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("the headend did not log %s (%q) within 10 s", what, parts)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// Remove cpe1, and change the log level on the way (restart only).
	peers := regexp.MustCompile(`(?s)peers:\n.*?\nlog:\n  level: debug\n`)
	if !peers.Match(original) {
		t.Fatalf("hub.yaml does not have the layout this test edits:\n%s", original)
	}
	reload(peers.ReplaceAllString(string(original), "peers: []\nlog:\n  level: info\n"))
	waitLog("the removal", "reload: peers applied", "removed=[cpe1]")
	if line := logLine(t, hubLog, "reload: these settings changed"); !strings.Contains(line, "keys=log") {
		t.Errorf("the restart-only change is not named: %q", line)
	}
	if got := b.metric(t, "hub", "aggd_sessions"); got != 0 {
		t.Errorf("aggd_sessions %v after removing the only peer, want 0", got)
	}
	if routes := n.Run("hub", "ip", "route", "show", "dev", "agg0"); strings.Contains(routes, "100.64.0.2") {
		t.Errorf("the removed peer's route is still there:\n%s", routes)
	}
	time.Sleep(2 * time.Second) // the CPE notices the silence and handshakes: refused
	if _, err := b.Try("lan", "ping", "-c1", "-W1", server); err == nil {
		t.Error("the LAN reaches the server through a headend that no longer accepts its CPE")
	}
	if logCount(hubLog, "handshake rejected") == 0 {
		t.Error("the removed CPE's handshakes were not rejected")
	}
	// Its metrics went with it (frozen, they would show its links up for ever).
	m, err := b.metrics("hub")
	if err != nil {
		t.Fatalf("scrape the headend's metrics: %v", err)
	}
	for series := range m {
		if strings.Contains(series, `peer="cpe1"`) {
			t.Errorf("the removed CPE's series still exported: %s", series)
		}
	}

	// A broken config: nothing changes (the peer stays removed), the problems are logged.
	reload("listen: nowhere\n")
	waitLog("the refused config", "reload: the config has problems")

	// cpe1 back: it connects again, without the CPE restarting.
	reload(string(original))
	waitLog("the addition", "reload: peers applied", "added=[cpe1]")
	b.waitReady(t)
	if b.cpe.Exited() || b.headend.Exited() {
		t.Fatal("a daemon exited during the reloads")
	}
	if got := b.metric(t, "hub", `aggd_peer_session{peer="cpe1"}`); got != 1 {
		t.Errorf(`aggd_peer_session{peer="cpe1"} %v after it connected again, want 1`, got)
	}
	if c := logCount(hubLog, `msg="session established"`); c != 2 {
		t.Errorf("%d sessions established at the headend, want 2 (before the removal and after the addition)", c)
	}
}
