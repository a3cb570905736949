package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/testnet"
)

// TestShutdownAndCrashRecovery checks that aggd removes everything it installed when it
// stops cleanly, and that after a crash (SIGKILL leaves the NAT table behind) a new
// aggd cleans up the leftovers and brings the bond back.
func TestShutdownAndCrashRecovery(t *testing.T) {
	n := newTopology(t)
	b := startBond(t, n)

	// Crash the CPE: its host changes stay behind.
	if err := b.cpe.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-b.cpe.Done
	if !b.hasTunnelState("cpe") {
		t.Fatal("after SIGKILL expected agg0/routes/NAT left behind (the test would prove nothing)")
	}

	// A new CPE adopts the host: cleans up, handshakes again (the headend replaces the
	// old session), and traffic flows.
	b.cpe = n.Start("cpe", filepath.Join(b.dir, "cpe2.log"), append([]string{aggdBinary, "cpe", "--config", filepath.Join(b.dir, "cpe.yaml")},
		strings.Fields(os.Getenv("AGGD_E2E_DAEMON_ARGS"))...)...)
	b.waitReady(t)
	if out, err := n.Try("lan", "ping", "-c3", "-i0.2", "-W1", server); err != nil {
		t.Fatalf("no traffic after the CPE restarted: %v\n%s", err, out)
	}

	// Clean stop: SIGTERM, exit 0, nothing left, and no warning on the way out (the
	// headend's interface watch once warned of its own socket closing at every stop).
	for _, side := range []struct {
		ns, log string
		p       *testnet.Proc
	}{{"cpe", "cpe2.log", b.cpe}, {"hub", "hub.log", b.headend}} {
		p := side.p
		logged, _ := os.ReadFile(filepath.Join(b.dir, side.log))
		if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.Done:
		case <-time.After(10 * time.Second):
			t.Fatalf("aggd in %s did not exit within 10 s of SIGTERM", side.ns)
		}
		if p.Err != nil {
			t.Errorf("aggd in %s exited with %v", side.ns, p.Err)
		}
		if b.hasTunnelState(side.ns) {
			t.Errorf("aggd in %s left state behind after a clean stop:\n%s", side.ns, b.tunnelState(side.ns))
		}
		all, _ := os.ReadFile(filepath.Join(b.dir, side.log))
		for _, line := range strings.Split(string(all[min(len(logged), len(all)):]), "\n") {
			if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
				t.Errorf("aggd in %s warned as it stopped cleanly: %s", side.ns, line)
			}
		}
	}
	data, _ := os.ReadFile(filepath.Join(b.dir, "cpe2.log"))
	// Without the fast path the kernel deletes a TUN with its routes when the crashed
	// process's descriptor closes; the NAT table is what stays, and the new daemon must
	// say it removed it. With the fast path (AGGD_E2E_DAEMON_ARGS=--fast-path) agg0 is
	// persistent and the pinned programs keep forwarding: the new daemon adopts them
	// (TestFastPathSurvivesDaemonKill tests that in full).
	want := "removed leftover nftables table"
	if strings.Contains(os.Getenv("AGGD_E2E_DAEMON_ARGS"), "--fast-path") {
		want = "adopting the fast path an earlier run left pinned"
	}
	if !strings.Contains(string(data), want) {
		t.Errorf("the restarted CPE's log does not say %q", want)
	}
	if left := pinsLeft(); len(left) > 0 {
		t.Errorf("pins left after a clean stop: %v", left)
	}
}

// tunnelState lists what aggd installs in a namespace: the tunnel interface, routes
// with aggd's protocol number (0xa6 = 166), and the nftables table.
func (b *bond) tunnelState(ns string) string {
	link, _ := b.Try(ns, "ip", "-br", "link", "show", "agg0")
	routes, _ := b.Try(ns, "ip", "route", "show", "proto", "166")
	nft, _ := b.Try(ns, "nft", "list", "table", "inet", "aggd")
	return strings.TrimSpace(strings.Join([]string{onlyIf(link, "agg0"), routes, onlyIf(nft, "table")}, "\n"))
}

func (b *bond) hasTunnelState(ns string) bool { return b.tunnelState(ns) != "" }

func onlyIf(out, marker string) string {
	if strings.Contains(out, marker) && !strings.Contains(out, "does not exist") && !strings.Contains(out, "No such file") {
		return out
	}
	return ""
}
