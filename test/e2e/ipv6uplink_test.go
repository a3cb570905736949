package e2e

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// An uplink with IPv6 only (DS-Lite cable, an IPv6-only mobile network) joins the bond
// next to two IPv4 ones: the CPE sends on it to the headend's IPv6 address
// (uplinks[].endpoint), the headend listens on both versions ("[::]:4242"), and a single
// TCP flow each way uses all three links. With the fast path asked for (the suite's
// second run), the kernel sends on the IPv6 link too, both ways, the CPE by a
// link-local next hop: what left each side's IPv6-only interface without passing its
// daemon's UDP sockets says so.
func TestIPv6OnlyUplink(t *testing.T) {
	const v6 = 3
	n := buildTopologyWith(t, "a6", topologyOptions{shaped: true, ipv6Uplink: v6})
	b := startBondWith(t, n, ipv6BondOptions(v6))
	if out := n.Run("cpe", "ip", "-4", "addr", "show", "dev", "up3"); strings.Contains(out, "inet ") {
		t.Fatalf("up3 has an IPv4 address, the test needs an IPv6-only line:\n%s", out)
	}
	// As on a real line, whose default route a router advertisement gives: the next
	// hop is the headend side's link-local address.
	n.Run("cpe", "ip", "-6", "route", "replace", headendIPv6+"/128", "via", linkLocal(t, n, "hub", "hl3"), "dev", "up3")
	fast := strings.Contains(os.Getenv("AGGD_E2E_DAEMON_ARGS"), "--fast-path")
	verdictsBefore := map[string]map[string]map[string]float64{}
	if fast {
		for _, ns := range []string{"cpe", "hub"} {
			verdictsBefore[ns] = b.verdictCounts(t, ns)
		}
	}
	// Each side's IPv6-only interface (the CPE's up3, the headend's hl3) against its
	// daemon's IPv6 UDP sockets.
	sides := []struct{ ns, dev string }{{"cpe", "up3"}, {"hub", "hl3"}}
	socketBefore, linkBefore, csumBefore := map[string]int{}, map[string]int{}, map[string]int{}
	for _, s := range sides {
		socketBefore[s.ns], linkBefore[s.ns] = udp6Out(t, n, s.ns), txPackets(t, n, s.ns, s.dev)
		csumBefore[s.ns] = snmp6(t, n, s.ns, "Udp6InCsumErrors")
	}
	singleFlowOverAllLinks(t, n, b, 0.05)
	for _, s := range sides {
		bySocket, onLink := udp6Out(t, n, s.ns)-socketBefore[s.ns], txPackets(t, n, s.ns, s.dev)-linkBefore[s.ns]
		t.Logf("%s's %s sent %d packets, %d of them from its UDP sockets", s.ns, s.dev, onLink, bySocket)
		// What the other side's kernel sent and its receive program handed to this
		// daemon's socket (a gap, a control message) had its checksum checked there.
		if bad := snmp6(t, n, s.ns, "Udp6InCsumErrors") - csumBefore[s.ns]; bad != 0 {
			t.Errorf("%s's IPv6 UDP sockets dropped %d datagrams with a wrong checksum", s.ns, bad)
		}
		if onLink < 1000 {
			t.Errorf("%s sent %d packets over the IPv6-only %s during the transfers, want its share of them", s.ns, onLink, s.dev)
		}
		switch kernel := onLink - bySocket; {
		case !fast && bySocket < 1000:
			t.Errorf("%s's sockets sent %d UDP datagrams over IPv6 during the transfers, want the IPv6 link's share of them", s.ns, bySocket)
		case fast && kernel < 1000:
			t.Errorf("the kernel sent %d of %s's %d packets on %s (the rest came from its sockets), want the IPv6 link's share of the transfers", kernel, s.ns, onLink, s.dev)
		}
	}
	if !fast {
		return
	}
	for _, ns := range []string{"cpe", "hub"} {
		after := b.verdictCounts(t, ns)
		for _, d := range []string{"tx", "rx"} {
			share, total := fastShare(verdictsBefore[ns][d], after[d])
			t.Logf("%s %s fast path share %.3f of %.0f data packets (gso %.0f)", ns, d, share, total, after[d]["gso"]-verdictsBefore[ns][d]["gso"])
		}
	}
}

// linkLocal is an interface's IPv6 link-local address, once it has passed duplicate
// address detection.
func linkLocal(t *testing.T, n interface {
	Run(ns string, args ...string) string
}, ns, dev string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		out := n.Run(ns, "ip", "-6", "-o", "addr", "show", "dev", dev, "scope", "link")
		if f := strings.Fields(out); len(f) >= 4 && !strings.Contains(out, "tentative") {
			return strings.Split(f[3], "/")[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s in %s has no usable link-local address:\n%s", dev, ns, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// txPackets is an interface's count of packets sent, in a namespace.
func txPackets(t *testing.T, n interface {
	Run(ns string, args ...string) string
}, ns, dev string) int {
	t.Helper()
	v, err := strconv.Atoi(strings.TrimSpace(n.Run(ns, "cat", "/sys/class/net/"+dev+"/statistics/tx_packets")))
	if err != nil {
		t.Fatalf("tx_packets of %s in %s: %v", dev, ns, err)
	}
	return v
}

// An IPv6-only uplink follows its interface's address as an IPv4 one does (an LTE
// re-attach with a new prefix, a privacy address rotating): the CPE re-binds the
// uplink's socket to the new IPv6 address within the session.
func TestIPv6UplinkAddressChangeKeepsSession(t *testing.T) {
	n := buildTopologyWith(t, "a7", topologyOptions{shaped: true, ipv6Uplink: 3})
	b := startBondWith(t, n, ipv6BondOptions(3))
	n.Run("cpe", "ip", "-6", "addr", "add", "2001:db8:98:3::3/64", "dev", "up3", "nodad")
	n.Run("cpe", "ip", "-6", "addr", "del", "2001:db8:98:3::2/64", "dev", "up3")
	b.followsNewAddress(t, n, "[2001:db8:98:3::3]:")
}

// udp6Out is a namespace's count of UDP datagrams sent over IPv6 (Udp6OutDatagrams).
func udp6Out(t *testing.T, n interface {
	Run(ns string, args ...string) string
}, ns string) int {
	t.Helper()
	return snmp6(t, n, ns, "Udp6OutDatagrams")
}

// snmp6 is one counter of a namespace's /proc/net/snmp6.
func snmp6(t *testing.T, n interface {
	Run(ns string, args ...string) string
}, ns, name string) int {
	t.Helper()
	for _, line := range strings.Split(n.Run(ns, "cat", "/proc/net/snmp6"), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			var v int
			for _, c := range f[1] {
				v = 10*v + int(c-'0')
			}
			return v
		}
	}
	t.Fatalf("no %s in %s's /proc/net/snmp6", name, ns)
	return 0
}
