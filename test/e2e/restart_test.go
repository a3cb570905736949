package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/testnet"
)

// TestFastPathSurvivesDaemonKill kills the CPE's daemon (SIGKILL: no cleanup runs)
// while traffic flows through the kernel fast path (ARCHITECTURE §8, issue #5).
//
//   - In-order traffic keeps flowing while no daemon runs: a 10 Mbit/s UDP flow, whose
//     packets arrive in order (TestFastPathCarriesTraffic), goes on reaching the
//     server through the pinned programs, with the persistent agg0 and the last link
//     states.
//   - The restarted daemon adopts the pinned state (it says so, and keeps agg0), makes
//     a new session, and retires the earlier run's once its own has taken the routes.
//   - A TCP transfer that spans the kill and the restart finishes, and is still moving
//     at its end.
//   - A TCP transfer across a kill and restart of the headend's daemon finishes too.
//   - A clean stop afterwards removes agg0 and every pin.
func TestFastPathSurvivesDaemonKill(t *testing.T) {
	n := newTopology(t)
	wireLikeHosts(n)
	b := startBond(t, n, "--fast-path")
	startIperfServer(t, n)
	restarts := 0

	// In order, no daemon: UDP for 9 s, the CPE dead from 2 s to 5 s.
	udpOut := filepath.Join(b.dir, "udp.json")
	udp := n.Start("lan", udpOut, "iperf3", "-c", server, "-u", "-b", "10M", "-l", "1200", "-t", "9", "-J", "--connect-timeout", "3000")
	time.Sleep(2 * time.Second)
	before := serverRxPackets(t, b)
	killCPE(t, b)
	killed := time.Now()
	time.Sleep(3 * time.Second)
	delivered := serverRxPackets(t, b) - before
	dead := time.Since(killed)
	if out, err := b.Try("cpe", "ip", "-br", "link", "show", "agg0"); err != nil {
		t.Errorf("agg0 is gone while the daemon is dead: %v %s", err, out)
	}
	sent := 10e6 / 8 / (1200 + 28) * dead.Seconds() // datagrams the flow sent meanwhile
	t.Logf("no daemon for %.1f s: the server received %d packets, %.0f%% of what the flow sent", dead.Seconds(), delivered, 100*float64(delivered)/sent)
	if float64(delivered) < 0.9*sent {
		t.Errorf("while the CPE's daemon was dead the server received %d packets, want at least 90%% of the %.0f the flow sent", delivered, sent)
	}
	restartCPE(t, b, &restarts)
	<-udp.Done
	lost, ooo := udpSummary(t, udpOut)
	t.Logf("UDP over the kill and restart: lost %.2f%%, out of order %d", lost, ooo)
	if udp.Err != nil {
		t.Fatalf("UDP flow: iperf3 failed: %v", udp.Err)
	}
	log := readFileString(filepath.Join(b.dir, "cpe-restart1.log"))
	if !strings.Contains(log, "adopting the fast path an earlier run left pinned") || strings.Contains(log, "removed leftover tunnel interface") {
		t.Errorf("the restarted CPE did not adopt the pinned fast path; its log:\n%s", tail([]byte(log), 3000))
	}
	waitLog(t, filepath.Join(b.dir, "cpe-restart1.log"), "earlier run's sessions are retired", 10*time.Second)

	// A TCP transfer across a kill and a restart finishes, and moves at its end.
	tcpAcrossRestart(t, b, "cpe", func() { restartCPE(t, b, &restarts) })

	// The headend's daemon too. While it is dead its kernel forwards, but the CPE gets
	// no probe answers and takes the links down after probe.down_after; it handshakes
	// again after 3 × down_after of silence, and the new headend daemon adopts the
	// pins. The transfer stalls for those seconds and must survive them.
	hubLog := filepath.Join(b.dir, "hub-restart.log")
	tcpAcrossRestart(t, b, "hub", func() {
		b.headend = b.Start("hub", hubLog, append([]string{aggdBinary, "headend", "--config", filepath.Join(b.dir, "hub.yaml"), "--fast-path"},
			strings.Fields(os.Getenv("AGGD_E2E_DAEMON_ARGS"))...)...)
		b.waitReady(t)
	})
	if !strings.Contains(readFileString(hubLog), "adopting the fast path an earlier run left pinned") {
		t.Error("the restarted headend did not adopt the pinned fast path")
	}
	waitLog(t, hubLog, "earlier run's sessions are retired", 10*time.Second)

	// A clean stop leaves nothing: no agg0, no routes, no NAT, no pins.
	for _, p := range []*testnet.Proc{b.cpe, b.headend} {
		if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		<-p.Done
	}
	for _, ns := range []string{"cpe", "hub"} {
		if b.hasTunnelState(ns) {
			t.Errorf("aggd in %s left state behind after a clean stop:\n%s", ns, b.tunnelState(ns))
		}
	}
	if left := pinsLeft(); len(left) > 0 {
		t.Errorf("pins left after a clean stop: %v", left)
	}
}

func killCPE(t *testing.T, b *bond) { t.Helper(); kill(t, b.cpe) }

func kill(t testing.TB, p *testnet.Proc) {
	t.Helper()
	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Done
}

// tcpAcrossRestart runs a 12-s TCP upload, SIGKILLs the daemon in ns ("cpe" or "hub")
// 3 s into it, restarts it half a second later, and checks that the transfer finishes
// and still moves in its last second.
func tcpAcrossRestart(t *testing.T, b *bond, ns string, restart func()) {
	t.Helper()
	out := filepath.Join(b.dir, "tcp-"+ns+".json")
	tcp := b.Start("lan", out, "iperf3", "-c", server, "-t", "12", "-i", "1", "-J", "--connect-timeout", "3000")
	time.Sleep(3 * time.Second)
	if ns == "cpe" {
		kill(t, b.cpe)
	} else {
		kill(t, b.headend)
	}
	time.Sleep(500 * time.Millisecond)
	restart()
	select {
	case <-tcp.Done:
	case <-time.After(40 * time.Second):
		t.Fatalf("the TCP transfer across the restart of %s's daemon did not finish within 40 s", ns)
	}
	if tcp.Err != nil {
		t.Fatalf("TCP transfer across the restart of %s's daemon failed: %v\n%s", ns, tcp.Err, tail([]byte(readFileString(out)), 2000))
	}
	last := lastIntervalBits(t, out)
	t.Logf("TCP across the kill and restart of %s's daemon: last second %.1f Mbit/s, %d of its seconds under 1 Mbit/s", ns, last/1e6, slowSeconds(t, out))
	if last < goodputFloor {
		t.Errorf("TCP after the restart of %s's daemon: last second %.1f Mbit/s, below the floor of %.0f", ns, last/1e6, goodputFloor/1e6)
	}
}

// restartCPE starts the CPE's daemon again, with the options startBond gave it, and
// waits until the bond works.
func restartCPE(t *testing.T, b *bond, restarts *int) {
	t.Helper()
	*restarts++
	args := append([]string{aggdBinary, "cpe", "--config", filepath.Join(b.dir, "cpe.yaml"), "--fast-path"},
		strings.Fields(os.Getenv("AGGD_E2E_DAEMON_ARGS"))...)
	b.cpe = b.Start("cpe", filepath.Join(b.dir, "cpe-restart"+strconv.Itoa(*restarts)+".log"), args...)
	b.waitReady(t)
}

// serverRxPackets is what the server's interface has received.
func serverRxPackets(t *testing.T, b *bond) int {
	t.Helper()
	return sysCounter(t, b, "srv", "/sys/class/net/eth0/statistics/rx_packets")
}

// udpSummary reads an iperf3 -u -J client output.
func udpSummary(t *testing.T, path string) (lostPct float64, outOfOrder int) {
	t.Helper()
	out := readFileString(path)
	r, err := parseIperfUDP(out)
	if err != nil || r.Error != "" {
		t.Fatalf("iperf3 output %s: %v %s\n%s", path, err, r.Error, tail([]byte(out), 2000))
	}
	return r.End.Sum.LostPercent, r.End.Sum.OutOfOrder
}

// waitLog waits until a daemon's log contains s.
func waitLog(t *testing.T, path, s string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if strings.Contains(readFileString(path), s) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("%s: no %q within %s; its end:\n%s", filepath.Base(path), s, within, tail([]byte(readFileString(path)), 3000))
}

// pinsLeft lists the daemons' pin directories under pinRoot (not the BPF filesystem's
// own maps.debug and progs.debug).
func pinsLeft() []string {
	entries, _ := os.ReadDir(pinRoot)
	var out []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".debug") {
			out = append(out, e.Name())
		}
	}
	return out
}

// slowSeconds counts the seconds of an iperf3 -J -i 1 transfer under 1 Mbit/s.
func slowSeconds(t *testing.T, path string) int {
	n := 0
	for _, b := range intervalBits(t, path) {
		if b < 1e6 {
			n++
		}
	}
	return n
}
