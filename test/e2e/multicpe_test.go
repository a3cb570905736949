package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/testnet"
)

// One headend serves many CPEs. A second CPE, with its own LAN and two uplinks of its
// own, is added to the running headend (peers reloaded on SIGHUP, as an operator adds a
// customer), and the two CPEs' LAN hosts then move TCP both ways at the same time. Each
// flow must complete, each CPE's traffic must arrive on that CPE's links, and the
// headend must send each CPE's downstream back to that CPE (longest-prefix match on
// the inner destination, in userspace or in the fast path's transmit program).
//
//	lan  ── cpe  ═══ up1..up3 ═══ hub ── srv
//	lan2 ── cpe2 ═══ up1, up2 ═══
func TestHeadendServesTwoCPEs(t *testing.T) {
	n := newTopology(t)
	// The server sends packets, not TSO blocks, as behind a wire: blocks go to the
	// daemon (fastpath.md, GSO). This test passed without it only while the headend
	// put its shield on every interface: XDP on the server's veth had it split them.
	wireLikeHosts(n)
	b := startBond(t, n)

	// The second CPE's network: its LAN, and two 20 Mbit/s uplinks to the headend.
	n.AddNS("lan2", "cpe2")
	n.Veth("lan2", "eth0", "10.99.2.2/24", "cpe2", "lan0", "10.99.2.1/24")
	n.Run("lan2", "ip", "route", "add", "default", "via", "10.99.2.1")
	const cpe2Uplinks = 2
	var ups strings.Builder
	for k := 1; k <= cpe2Uplinks; k++ {
		up, hm := fmt.Sprintf("up%d", k), fmt.Sprintf("hm%d", k)
		n.Veth("cpe2", up, fmt.Sprintf("10.96.%d.2/24", k), "hub", hm, fmt.Sprintf("10.96.%d.1/24", k))
		n.Run("cpe2", "ip", "route", "add", headendIP+"/32", "via", fmt.Sprintf("10.96.%d.1", k), "dev", up, "metric", strconv.Itoa(100+k))
		n.Shape("cpe2", up, "20mbit", 40)
		n.Shape("hub", hm, "20mbit", 40)
		fmt.Fprintf(&ups, "  - name: up%d\n    interface: up%d\n", k, k)
	}

	// The operator adds it to the headend's peers and reloads.
	b.addHubPeer(t, "cpe2", "cpe2.key", "100.64.0.3/32")
	// Listed, not yet connected: the headend says so, for an alert to name it.
	const cpe2Session = `aggd_peer_session{peer="cpe2"}`
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		m, err := b.metrics("hub")
		if err != nil {
			t.Fatalf("scrape the headend's metrics: %v", err)
		}
		if v, ok := m[cpe2Session]; ok {
			if v != 0 {
				t.Fatalf("%s %v before cpe2 started, want 0", cpe2Session, v)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 5 s of the reload that added cpe2", cpe2Session)
		}
	}

	cpe, err := os.ReadFile(filepath.Join(b.dir, "cpe.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(cpe), filepath.Join(b.dir, "cpe.key"), filepath.Join(b.dir, "cpe2.key"), 1)
	cfg = strings.Replace(cfg, "100.64.0.2/32", "100.64.0.3/32", 1)
	start, end := strings.Index(cfg, "uplinks:\n"), strings.Index(cfg, "log:\n")
	if start < 0 || end < start {
		t.Fatalf("cpe.yaml does not have the layout this test edits:\n%s", cfg)
	}
	cfg = cfg[:start] + "uplinks:\n" + ups.String() + cfg[end:]
	writeFile(t, b.dir, "cpe2.yaml", cfg)
	args := append([]string{aggdBinary, "cpe", "--config", filepath.Join(b.dir, "cpe2.yaml")}, strings.Fields(os.Getenv("AGGD_E2E_DAEMON_ARGS"))...)
	cpe2 := n.Start("cpe2", filepath.Join(b.dir, "cpe2.log"), args...)
	t.Cleanup(func() {
		if t.Failed() {
			data, _ := os.ReadFile(filepath.Join(b.dir, "cpe2.log"))
			t.Logf("---- cpe2.log: above debug (last 8 KiB) ----\n%s", tail(aboveDebug(data), 8192))
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for b.linksUp("cpe2", "headend") < cpe2Uplinks || b.linksUp("hub", "cpe2") < cpe2Uplinks {
		if cpe2.Exited() {
			t.Fatalf("the second CPE's aggd exited: %v", cpe2.Err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second CPE not up within 20 s: its links up %d, the headend's links to it %d",
				b.linksUp("cpe2", "headend"), b.linksUp("hub", "cpe2"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The headend guards the interfaces that came up after its start, as it does the
	// others (where XDP works at all).
	hubLog := filepath.Join(b.dir, "hub.log")
	if logCount(hubLog, "XDP shield attached") > 0 {
		for k := 1; k <= cpe2Uplinks; k++ {
			if logCount(hubLog, "XDP shield attached", fmt.Sprintf("interface=hm%d ", k)) == 0 {
				t.Errorf("the headend did not attach its shield to hm%d, which came up after its start", k)
			}
		}
	}
	if got := b.metric(t, "hub", "aggd_sessions"); got != 2 {
		t.Errorf("aggd_sessions %v on the headend with both CPEs up, want 2", got)
	}
	for _, series := range []string{`aggd_peer_session{peer="cpe1"}`, cpe2Session} {
		if got := b.metric(t, "hub", series); got != 1 {
			t.Errorf("%s %v on the headend with both CPEs up, want 1", series, got)
		}
	}
	if got := b.metric(t, "cpe2", `aggd_peer_session{peer="headend"}`); got != 1 {
		t.Errorf(`aggd_peer_session{peer="headend"} %v on cpe2 with its session up, want 1`, got)
	}

	// Both LANs, both directions, at the same time.
	const port2 = "5202"
	startIperfServer(t, n)
	n.Start("srv", filepath.Join(t.TempDir(), "iperf3-server2.log"), "iperf3", "-s", "-p", port2)
	fast := strings.Contains(os.Getenv("AGGD_E2E_DAEMON_ARGS"), "--fast-path")
	for _, reverse := range []bool{false, true} {
		var verdicts map[string]map[string]float64
		if fast {
			verdicts = b.verdictCounts(t, "hub")
		}
		rx1, rx2 := b.peerBytes(t, "cpe1", reverse), b.peerBytes(t, "cpe2", reverse)
		dir := t.TempDir()
		waitIperfServerIdle(t, n, "5201")
		waitIperfServerIdle(t, n, port2)
		one := n.Start("lan", filepath.Join(dir, "lan.json"), iperfArgs("5201", reverse)...)
		two := n.Start("lan2", filepath.Join(dir, "lan2.json"), iperfArgs(port2, reverse)...)
		g1, g2 := iperfGoodput(t, one, filepath.Join(dir, "lan.json")), iperfGoodput(t, two, filepath.Join(dir, "lan2.json"))
		d1, d2 := b.peerBytes(t, "cpe1", reverse)-rx1, b.peerBytes(t, "cpe2", reverse)-rx2
		t.Logf("reverse=%v: lan %.1f Mbit/s, lan2 %.1f Mbit/s at once; the headend's links carried %.1f MB for cpe1, %.1f MB for cpe2",
			reverse, g1/1e6, g2/1e6, d1/1e6, d2/1e6)
		// With the fast path, the headend's transmit program carried both CPEs'
		// downstream: it finds each packet's session by its inner destination.
		if fast && reverse {
			share, total := fastShare(verdicts["tx"], b.verdictCounts(t, "hub")["tx"])
			t.Logf("the headend's transmit program carried %.3f of %v data packets", share, total)
			if share < 0.95 {
				t.Errorf("the headend's transmit program carried %.3f of the two CPEs' downstream packets, want >= 0.95", share)
			}
		}
		// Each CPE's flow went over that CPE's links (the flows' bytes are at least
		// g × 5 s / 8; a misrouted flow would leave its CPE's links nearly empty).
		for _, c := range []struct {
			peer, lan        string
			goodput, carried float64
		}{{"cpe1", "lan", g1, d1}, {"cpe2", "lan2", g2, d2}} {
			if want := 0.9 * c.goodput * 5 / 8; c.carried < want {
				t.Errorf("reverse=%v: the headend's links to %s carried %.1f MB, less than %s's flow (%.1f MB)",
					reverse, c.peer, c.carried/1e6, c.lan, want/1e6)
			}
		}
	}
	if c := logCount(filepath.Join(b.dir, "cpe.log"), `msg="session established"`); c != 1 {
		t.Errorf("cpe.log: %d sessions established; adding a second CPE must not disturb the first", c)
	}
}

// iperfArgs is a 5-s TCP flow from a LAN host to the server's iperf3 on port
// (reverse: from the server).
func iperfArgs(port string, reverse bool) []string {
	args := []string{"iperf3", "-c", server, "-p", port, "-t", "5", "-J", "--connect-timeout", "3000"}
	if reverse {
		args = append(args, "-R")
	}
	return args
}

// iperfGoodput waits for an iperf3 client started with n.Start and returns its
// receiver's goodput in bit/s; a failed flow fails the test.
func iperfGoodput(t *testing.T, p *testnet.Proc, out string) float64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !p.Exited() {
		if time.Now().After(deadline) {
			t.Fatalf("iperf3 (%s) did not finish within 30 s", filepath.Base(out))
		}
		time.Sleep(100 * time.Millisecond)
	}
	data, _ := os.ReadFile(out)
	var r iperfResult
	if err := json.Unmarshal(data, &r); err != nil || r.Error != "" {
		t.Fatalf("iperf3 (%s) failed: %v %s\n%s", filepath.Base(out), err, r.Error, tail(data, 2000))
	}
	return r.End.SumReceived.BitsPerSecond
}

// peerBytes is what the headend received from a peer over all its links (reverse:
// sent to it), outer headers included.
func (b *bond) peerBytes(t *testing.T, peer string, sent bool) float64 {
	t.Helper()
	m, err := b.metrics("hub")
	if err != nil {
		t.Fatal(err)
	}
	name := "aggd_link_receive_bytes_total{"
	if sent {
		name = "aggd_link_transmit_bytes_total{"
	}
	sum := 0.0
	for k, v := range m {
		if strings.HasPrefix(k, name) && strings.Contains(k, `peer="`+peer+`"`) {
			sum += v
		}
	}
	return sum
}
