package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/testnet"
)

// A CPE whose lines take less than a full-size tunnel packet (PPPoE's 1492 bytes here,
// so 1492 - 56 = 1436 bytes of inner packet) tells the headend, and the headend routes
// that CPE's prefixes into agg0 (MTU 1444) with 1436: larger packets are fragmented,
// or refused with "fragmentation needed" when they must not be, before they reach the
// tunnel. Before, the headend sent them as 1493-1500-byte datagrams the CPE's lines
// could not carry: the fast path's were dropped, and userspace's were fragmented
// into two datagrams without the sender ever hearing of the smaller MTU.
func TestHeadendFitsPacketsToTheCPEsLines(t *testing.T) {
	n := buildTopologyWith(t, "am", topologyOptions{shaped: true, mtu: 1492})
	b := startBond(t, n)
	const cpeTunnelIP, cpeMTU = "100.64.0.2", 1436

	// The server reaches the CPE's tunnel address through the headend (no NAT that way).
	n.Run("srv", "ip", "route", "add", "100.64.0.0/24", "via", "10.97.0.1")
	b.waitRouteMTU(t, cpeMTU)
	for ns, series := range map[string]string{
		"cpe": `aggd_link_mtu_bytes{link="up1",peer="headend"}`,
		"hub": `aggd_link_mtu_bytes{link="link0",peer="cpe1"}`,
	} {
		waitMetric(t, b, ns, series, cpeMTU, 5*time.Second)
	}

	// ping -s is the ICMP payload: 28 bytes of IPv4 and ICMP headers make the packet.
	// tooBig is a full-size packet of the headend's tunnel: a veth lets a frame of up to
	// 4 bytes over its MTU through (room for a VLAN tag), a real PPPoE line does not.
	fits, tooBig := "1408", "1416" // 1436 and 1444 bytes
	for _, c := range []struct{ what, ns, dst, size, pmtudisc string }{
		{"the largest packet the CPE's lines take, DF set", "srv", cpeTunnelIP, fits, "do"},
		{"a larger one without DF, to the CPE (fragmented by the headend)", "srv", cpeTunnelIP, tooBig, "dont"},
		{"a larger one without DF, to a LAN host behind the CPE's NAT (its reply)", "lan", server, tooBig, "dont"},
	} {
		out, err := b.Try(c.ns, "ping", "-c", "5", "-i", "0.2", "-W", "2", "-M", c.pmtudisc, "-s", c.size, c.dst)
		if err != nil || !strings.Contains(out, " 0% packet loss") {
			t.Errorf("%s: ping -M %s -s %s %s from %s lost packets (%v):\n%s", c.what, c.pmtudisc, c.size, c.dst, c.ns, err, out)
		}
	}

	// Too big with DF set: the sender hears the CPE's MTU (path MTU discovery).
	out, _ := b.Try("srv", "ping", "-c", "2", "-i", "0.2", "-W", "2", "-M", "do", "-s", tooBig, cpeTunnelIP)
	if !strings.Contains(out, "mtu = 1436") && !strings.Contains(out, "mtu=1436") {
		t.Errorf("a 1444-byte packet with DF set to the CPE: want \"fragmentation needed\" with mtu 1436, got:\n%s", out)
	}
}

// An uplink whose MTU shrinks while the bond runs (a DHCP client applying an LTE
// modem's MTU option) shrinks the CPE's tunnel, and the headend's route to the CPE,
// to fit it at once: 1400 - 56 = 1344. The tunnel goes back up once the uplinks have
// allowed more for tunnel.mtu_raise_after (4 s here), whether the small uplink left
// (its interface taken down and deleted, as a PPPoE line's at a disconnect) or its MTU grew; the
// headend's route follows.
func TestUplinkMTUChangeIsFollowed(t *testing.T) {
	n := newTopology(t)
	b := startBondWith(t, n, bondOptions{tunnel: "  mtu_raise_after: 4s\n"})
	n.Run("srv", "ip", "route", "add", "100.64.0.0/24", "via", "10.97.0.1")
	setUp3MTU(n, 1400)

	b.waitRouteMTU(t, 1344)
	b.checkTunnelMTU(t, 1344, "after up3's MTU went to 1400")
	b.checkDFPings(t, 1344)

	// up3 leaves as a PPPoE line's ppp0 does (taken down, then deleted): the tunnel
	// keeps its MTU through the wait, then goes up, and the headend is told up3's MTU
	// is unknown.
	n.Run("cpe", "ip", "link", "set", "up3", "down")
	time.Sleep(300 * time.Millisecond)
	n.Run("cpe", "ip", "link", "del", "up3")
	time.Sleep(1500 * time.Millisecond)
	b.checkTunnelMTU(t, 1344, "1.5 s after up3's interface was deleted (the wait is 4 s)")
	b.waitMTUs(t, 1444, 0)
	b.checkDFPings(t, 1444)

	// up3 comes back as small as it left: down again at once, no wait.
	addUplink(n, 3, topologyOptions{shaped: true, mtu: 1400})
	b.waitMTUs(t, 1344, 1344)

	// Its MTU grows: up again after the wait.
	setUp3MTU(n, 1500)
	b.waitMTUs(t, 1444, 0)
	b.checkDFPings(t, 1444)
}

// checkDFPings checks that the server reaches the CPE with packets of mtu bytes with
// DF set, and that a packet one byte larger gets "fragmentation needed" with mtu.
func (b *bond) checkDFPings(t *testing.T, mtu int) {
	t.Helper()
	// The server's kernel remembers a smaller path MTU it was told of for 10 minutes
	// (net.ipv4.route.mtu_expires), as any sender does: forget it, to see the path as
	// it is now.
	b.Run("srv", "ip", "route", "flush", "cache")
	// ping -s is the ICMP payload: 28 bytes of IPv4 and ICMP headers make the packet.
	fits, tooBig := strconv.Itoa(mtu-28), strconv.Itoa(mtu-27)
	if out, err := b.Try("srv", "ping", "-c", "5", "-i", "0.2", "-W", "2", "-M", "do", "-s", fits, "100.64.0.2"); err != nil || !strings.Contains(out, " 0% packet loss") {
		t.Errorf("%d-byte packets with DF set to the CPE lost (%v):\n%s", mtu, err, out)
	}
	out, _ := b.Try("srv", "ping", "-c", "2", "-i", "0.2", "-W", "2", "-M", "do", "-s", tooBig, "100.64.0.2")
	if want := fmt.Sprintf("mtu = %d", mtu); !strings.Contains(out, want) && !strings.Contains(out, strings.ReplaceAll(want, " ", "")) {
		t.Errorf("a %d-byte packet with DF set to the CPE: want \"fragmentation needed\" with mtu %d, got:\n%s", mtu+1, mtu, out)
	}
}

// checkTunnelMTU checks the CPE's agg0 MTU now.
func (b *bond) checkTunnelMTU(t *testing.T, mtu int, when string) {
	t.Helper()
	if out := b.Run("cpe", "ip", "link", "show", "agg0"); !strings.Contains(out, fmt.Sprintf(" mtu %d ", mtu)) {
		t.Errorf("agg0 %s: want mtu %d:\n%s", when, mtu, out)
	}
}

// setUp3MTU sets the MTU of uplink 3's two ends.
func setUp3MTU(n *testnet.Net, mtu int) {
	n.Run("cpe", "ip", "link", "set", "up3", "mtu", strconv.Itoa(mtu))
	n.Run("hub", "ip", "link", "set", "hl3", "mtu", strconv.Itoa(mtu))
}

// waitMTUs waits until the CPE's agg0 has MTU tunnel and the headend routes the CPE
// with MTU route (0: none).
func (b *bond) waitMTUs(t *testing.T, tunnel, route int) {
	t.Helper()
	b.waitTunnelMTU(t, tunnel)
	b.waitRouteMTU(t, route)
}

// waitTunnelMTU waits until the CPE's agg0 has the given MTU.
func (b *bond) waitTunnelMTU(t *testing.T, mtu int) {
	t.Helper()
	want := fmt.Sprintf(" mtu %d ", mtu)
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(b.Run("cpe", "ip", "link", "show", "agg0"), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the CPE's agg0 has no mtu %d after 15 s:\n%s", mtu, b.Run("cpe", "ip", "link", "show", "agg0"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitRouteMTU waits until the headend routes the CPE's tunnel address with the given
// MTU; 0: with none (agg0's own).
func (b *bond) waitRouteMTU(t *testing.T, mtu int) {
	t.Helper()
	b.waitPrefixMTU(t, "100.64.0.2", mtu)
}

// waitPrefixMTU waits until the headend routes prefix into agg0 with the given MTU; 0:
// with none.
func (b *bond) waitPrefixMTU(t *testing.T, prefix string, mtu int) {
	t.Helper()
	has := func(route string) bool {
		if mtu == 0 {
			return route != "" && !strings.Contains(route, " mtu ")
		}
		return strings.Contains(route, fmt.Sprintf(" mtu %d", mtu))
	}
	deadline := time.Now().Add(10 * time.Second)
	for !has(b.Run("hub", "ip", "route", "show", prefix)) {
		if time.Now().After(deadline) {
			t.Fatalf("the headend's route to %s has no mtu %d after 10 s:\n%s", prefix, mtu, b.Run("hub", "ip", "route", "show", "dev", "agg0"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A CPE that starts with a small uplink (up3 at 1400) sizes its tunnel to it, and
// raises it once the uplink grows. With the fast path the kernel then sends the larger
// packets itself: its MTU follows the tunnel's.
func TestTunnelMTUStartedSmallGoesUp(t *testing.T) {
	n := newTopology(t)
	setUp3MTU(n, 1400)
	b := startBondWith(t, n, bondOptions{tunnel: "  mtu_raise_after: 1s\n"})
	n.Run("srv", "ip", "route", "add", "100.64.0.0/24", "via", "10.97.0.1")
	b.checkTunnelMTU(t, 1344, "at the start, with up3 at 1400")
	b.waitRouteMTU(t, 1344)

	setUp3MTU(n, 1500)
	b.waitMTUs(t, 1444, 0)
	b.checkDFPings(t, 1444)
	if !strings.Contains(os.Getenv("AGGD_E2E_DAEMON_ARGS"), "--fast-path") {
		return
	}
	// The fast path takes the new MTU at the session's next programming (each probe
	// interval): until then a full-size packet takes the slow path (verdict oversize),
	// and without it every one would.
	deadline := time.Now().Add(5 * time.Second)
	for {
		before := b.verdictCounts(t, "cpe")["tx"]
		_, _ = b.Try("srv", "ping", "-c", "1", "-W", "2", "-M", "do", "-s", "1416", "100.64.0.2") // a 1444-byte reply
		after := b.verdictCounts(t, "cpe")["tx"]
		if after["fast"] > before["fast"] && after["oversize"] == before["oversize"] {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the CPE's fast path still hands 1444-byte packets to userspace 5 s after the tunnel went to 1444 (fast %v -> %v, oversize %v -> %v)",
				before["fast"], after["fast"], before["oversize"], after["oversize"])
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The headend's route MTU for a CPE follows what changes around it: a reload that gives
// the CPE a new prefix routes it with the CPE's MTU from the start (not only once the
// CPE, whose session the change closed, has handshaken again and announced its MTU),
// and a CPE that restarts on larger lines (a new session) has its routes go back to
// the tunnel's MTU.
func TestRouteMTUAcrossReloadAndNewSession(t *testing.T) {
	n := buildTopologyWith(t, "am", topologyOptions{shaped: true, mtu: 1492})
	b := startBond(t, n)
	b.waitRouteMTU(t, 1436)

	// A reload adds a LAN prefix behind the CPE.
	hubYAML := filepath.Join(b.dir, "hub.yaml")
	const lan = "192.168.77.0/24"
	cfg := readFileString(hubYAML)
	edited := strings.Replace(cfg, "tunnel_address: [100.64.0.2/32]\n", "tunnel_address: [100.64.0.2/32]\n    routes: ["+lan+"]\n", 1)
	if edited == cfg {
		t.Fatalf("hub.yaml does not have the layout this test edits:\n%s", cfg)
	}
	writeFile(t, b.dir, "hub.yaml", edited)
	if err := b.headend.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog(t, filepath.Join(b.dir, "hub.log"), "reload: peers applied", 10*time.Second)
	if route := b.Run("hub", "ip", "route", "show", lan); !strings.Contains(route, " mtu 1436") {
		t.Errorf("the CPE's new prefix %s is routed without the CPE's MTU 1436 once the reload is applied:\n%s", lan, route)
	}
	b.waitRouteMTU(t, 1436) // and with the new session
	b.waitPrefixMTU(t, lan, 1436)

	// The CPE restarts after its lines went to 1500 bytes: its new session announces
	// full-size packets, and the routes lose their MTU.
	if err := b.cpe.Cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	<-b.cpe.Done
	for k := 1; k <= len(uplinkRates); k++ {
		n.Run("cpe", "ip", "link", "set", fmt.Sprintf("up%d", k), "mtu", "1500")
		n.Run("hub", "ip", "link", "set", fmt.Sprintf("hl%d", k), "mtu", "1500")
	}
	b.cpe = b.Start("cpe", filepath.Join(b.dir, "cpe-restart.log"), append([]string{aggdBinary, "cpe", "--config", filepath.Join(b.dir, "cpe.yaml")},
		strings.Fields(os.Getenv("AGGD_E2E_DAEMON_ARGS"))...)...)
	b.waitReady(t)
	b.waitPrefixMTU(t, lan, 0)
	b.waitRouteMTU(t, 0)
}

// With tunnel.mtu set the tunnel's MTU never moves, but what the headend is told does:
// an uplink that carried less (up3 at 1400) and whose interface has been gone for
// tunnel.mtu_raise_after is announced as unknown, and the headend's route to the CPE
// loses the smaller MTU.
func TestFixedTunnelMTUForgetsAGoneUplink(t *testing.T) {
	n := newTopology(t)
	setUp3MTU(n, 1400)
	b := startBondWith(t, n, bondOptions{tunnel: "  mtu: 1444\n  mtu_raise_after: 1s\n"})
	b.checkTunnelMTU(t, 1444, "with tunnel.mtu 1444")
	b.waitRouteMTU(t, 1344)

	n.Run("cpe", "ip", "link", "del", "up3")
	b.waitRouteMTU(t, 0)
	b.checkTunnelMTU(t, 1444, "with tunnel.mtu 1444, after up3 left")
}
