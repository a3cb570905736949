package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// With fallback.enabled, a CPE whose headend goes silent routes new LAN connections
// directly out of an uplink (NAT to its address) and, when the headend answers again,
// sends new connections through the bond while the direct ones go on undisturbed.
//
// "Direct" here: the server can be reached without the headend daemon, because the
// headend's namespace also routes (it is the uplinks' gateway and forwards to the
// server's network), as an ISP would. The headend daemon is frozen with SIGSTOP, so
// its tunnel is dead while its namespace still forwards.
func TestHeadendSilenceFallsBackToDirectRouting(t *testing.T) {
	n := newTopology(t)
	// The server needs a route back to the uplinks' addresses for direct traffic.
	n.Run("srv", "ip", "route", "add", "default", "via", "10.97.0.1")
	// IPv6 too: the LAN, up1 (whose default route names its IPv6 gateway, as an ISP's
	// router advertisement would) and the server's network.
	for _, c := range [][]string{
		{"lan", "ip", "-6", "addr", "add", "fd00:99::2/64", "dev", "eth0", "nodad"},
		{"lan", "ip", "-6", "route", "add", "default", "via", "fd00:99::1"},
		{"cpe", "ip", "-6", "addr", "add", "fd00:99::1/64", "dev", "lan0", "nodad"},
		{"cpe", "ip", "-6", "addr", "add", "2001:db8:98:1::2/64", "dev", "up1", "nodad"},
		{"cpe", "ip", "-6", "route", "add", "default", "via", "2001:db8:98:1::1", "dev", "up1", "metric", "1024"},
		{"hub", "ip", "-6", "addr", "add", "2001:db8:98:1::1/64", "dev", "hl1", "nodad"},
		{"hub", "ip", "-6", "addr", "add", "2001:db8:97::1/64", "dev", "wan0", "nodad"},
		{"srv", "ip", "-6", "addr", "add", serverIPv6 + "/64", "dev", "eth0", "nodad"},
		{"srv", "ip", "-6", "route", "add", "default", "via", "2001:db8:97::1"},
	} {
		n.Run(c[0], c[1:]...)
	}
	b := startBondWith(t, n, bondOptions{
		uplink: map[int]string{1: "    gateway: 10.98.1.1\n"},
		cpe:    "fallback:\n  enabled: true\n  direct_after: 3s\n",
	})
	startIperfServer(t, n)
	const direct = "aggd_fallback_direct"
	if v := b.metric(t, "cpe", direct); v != 0 {
		t.Fatalf("%s = %v with the headend answering, want 0", direct, v)
	}

	// The headend goes silent: after direct_after, new connections leave directly.
	if err := b.headend.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = b.headend.Cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	waitMetric(t, b, "cpe", direct, 1, 20*time.Second)
	t.Logf("fallback on after the headend went silent: %s", logLine(t, filepath.Join(b.dir, "cpe.log"), "headend silent"))

	// IPv6 connections leave directly too, through up1's IPv6 gateway, NATed to its
	// IPv6 address.
	logLine(t, filepath.Join(b.dir, "cpe.log"), "headend silent", "IPv6: up1 via 2001:db8:98:1::1")
	aggV6 := agg0TxPackets(t, b)
	if out, err := n.Try("lan", "ping", "-6", "-c", "3", "-i", "0.2", "-W", "2", serverIPv6); err != nil {
		t.Errorf("no IPv6 ping from the LAN to the server while direct: %v\n%s", err, out)
	}
	if d := agg0TxPackets(t, b) - aggV6; d > 0 {
		t.Errorf("the LAN's IPv6 ping went into the tunnel (%d packets) while direct", d)
	}

	// Connection B, started direct, runs across the headend's return.
	outB := filepath.Join(t.TempDir(), "iperf-b.json")
	flowB := n.Start("lan", outB, "iperf3", "-c", server, "-t", "12", "-i", "1", "-J", "--connect-timeout", "3000")
	time.Sleep(3 * time.Second)
	aggBefore := agg0TxPackets(t, b)

	if err := b.headend.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed = true
	waitMetric(t, b, "cpe", direct, 0, 30*time.Second)
	t.Logf("back to the bond: %s", logLine(t, filepath.Join(b.dir, "cpe.log"), "headend answers again"))
	if d := agg0TxPackets(t, b) - aggBefore; d > 200 {
		t.Errorf("connection B (direct) moved into the tunnel: agg0 sent %d packets while only B ran", d)
	}

	// Connection C, new, takes the bond: agg0 carries it (a second server: B's is busy).
	n.Start("srv", filepath.Join(t.TempDir(), "iperf3-c.log"), "iperf3", "-s", "-p", "5202")
	time.Sleep(300 * time.Millisecond)
	before := agg0TxPackets(t, b)
	if out, err := n.Try("lan", "iperf3", "-c", server, "-p", "5202", "-t", "2", "--connect-timeout", "3000"); err != nil {
		t.Fatalf("connection C (new, after the headend's return) failed: %v\n%s", err, out)
	}
	if moved := agg0TxPackets(t, b) - before; moved < 1000 {
		t.Errorf("connection C (new, after the headend's return) sent only %d packets through agg0: it did not take the bond", moved)
	}

	// B finished unbroken, still carrying data after the headend's return.
	select {
	case <-flowB.Done:
	case <-time.After(30 * time.Second):
		t.Fatal("connection B (iperf3) did not finish")
	}
	if flowB.Err != nil {
		t.Fatalf("connection B broke: %v\n%s", flowB.Err, readTail(outB))
	}
	if last := lastIntervalBits(t, outB); last <= 0 {
		t.Errorf("connection B carried nothing in its last second (after the headend's return)")
	}
}

// serverIPv6 is the server's IPv6 address in the fallback test.
const serverIPv6 = "2001:db8:97::2"

// waitMetric waits until a metric of one side reaches want.
func waitMetric(t *testing.T, b *bond, ns, series string, want float64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for b.metricOr0(ns, series) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s on %s did not reach %v within %v (now %v)", series, ns, want, within, b.metricOr0(ns, series))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// agg0TxPackets is how many packets the CPE's agg0 has handed to aggd (LAN → tunnel).
func agg0TxPackets(t *testing.T, b *bond) int {
	t.Helper()
	return sysCounter(t, b, "cpe", "/sys/class/net/agg0/statistics/tx_packets")
}

// sysCounter reads an interface counter file in a namespace (ip netns exec mounts the
// namespace's own /sys).
func sysCounter(t *testing.T, b *bond, ns, path string) int {
	t.Helper()
	out := b.Run(ns, "cat", path)
	v, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("%s in %s: %q: %v", path, ns, out, err)
	}
	return v
}

// lastIntervalBits reads an iperf3 -J -i 1 client output and returns the rate of its
// last interval.
func lastIntervalBits(t *testing.T, path string) float64 {
	t.Helper()
	bits := intervalBits(t, path)
	return bits[len(bits)-1]
}

// intervalBits reads an iperf3 -J -i 1 client output and returns each interval's rate.
func intervalBits(t *testing.T, path string) []float64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Intervals []struct {
			Sum struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum"`
		} `json:"intervals"`
	}
	if err := json.Unmarshal(data, &r); err != nil || len(r.Intervals) == 0 {
		t.Fatalf("iperf3 output %s: %v (%d intervals)\n%s", path, err, len(r.Intervals), tail(data, 2000))
	}
	out := make([]float64, len(r.Intervals))
	for i, iv := range r.Intervals {
		out[i] = iv.Sum.BitsPerSecond
	}
	return out
}
