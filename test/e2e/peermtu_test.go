package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
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
// to fit it: 1400 - 56 = 1344.
func TestUplinkMTUChangeIsFollowed(t *testing.T) {
	n := newTopology(t)
	b := startBond(t, n)
	n.Run("srv", "ip", "route", "add", "100.64.0.0/24", "via", "10.97.0.1")
	n.Run("cpe", "ip", "link", "set", "up3", "mtu", "1400")
	n.Run("hub", "ip", "link", "set", "hl3", "mtu", "1400")

	b.waitRouteMTU(t, 1344)
	if out := n.Run("cpe", "ip", "link", "show", "agg0"); !strings.Contains(out, " mtu 1344 ") {
		t.Errorf("agg0 after up3's MTU went to 1400: want mtu 1344:\n%s", out)
	}
	if out, err := b.Try("srv", "ping", "-c", "5", "-i", "0.2", "-W", "2", "-M", "do", "-s", "1316", "100.64.0.2"); err != nil || !strings.Contains(out, " 0% packet loss") {
		t.Errorf("1344-byte packets with DF set to the CPE lost (%v):\n%s", err, out)
	}
	out, _ := b.Try("srv", "ping", "-c", "2", "-i", "0.2", "-W", "2", "-M", "do", "-s", "1317", "100.64.0.2")
	if !strings.Contains(out, "mtu = 1344") && !strings.Contains(out, "mtu=1344") {
		t.Errorf("a 1345-byte packet with DF set to the CPE: want \"fragmentation needed\" with mtu 1344, got:\n%s", out)
	}
}

// waitRouteMTU waits until the headend routes the CPE's tunnel address with the given
// MTU.
func (b *bond) waitRouteMTU(t *testing.T, mtu int) {
	t.Helper()
	want := fmt.Sprintf(" mtu %d", mtu)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(b.Run("hub", "ip", "route", "show", "100.64.0.2"), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the headend's route to the CPE has no mtu %d after 10 s:\n%s", mtu, b.Run("hub", "ip", "route", "show", "dev", "agg0"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
