package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// An uplink with IPv6 only (DS-Lite cable, an IPv6-only mobile network) joins the bond
// next to two IPv4 ones: the CPE sends on it to the headend's IPv6 address
// (uplinks[].endpoint), the headend listens on both versions ("[::]:4242"), and a single
// TCP flow each way uses all three links. With the fast path asked for (the suite's
// second run), the session says why it stays in userspace and still uses every link.
func TestIPv6OnlyUplink(t *testing.T) {
	const v6 = 3
	n := buildTopologyWith(t, "a6", topologyOptions{shaped: true, ipv6Uplink: v6})
	b := startBondWith(t, n, bondOptions{
		listen: "[::]:4242",
		uplink: map[int]string{v6: `    endpoint: "[` + headendIPv6 + `]:4242"` + "\n"},
	})
	if out := n.Run("cpe", "ip", "-4", "addr", "show", "dev", "up3"); strings.Contains(out, "inet ") {
		t.Fatalf("up3 has an IPv4 address, the test needs an IPv6-only line:\n%s", out)
	}
	sentBefore := udp6Out(t, n, "cpe")
	singleFlowOverAllLinks(t, n, b, 0.05)
	if sent := udp6Out(t, n, "cpe") - sentBefore; sent < 1000 {
		t.Errorf("the CPE sent %d UDP datagrams over IPv6 during the transfers, want the IPv6 link's share of them", sent)
	}
	if strings.Contains(os.Getenv("AGGD_E2E_DAEMON_ARGS"), "--fast-path") {
		for _, f := range []string{"cpe.log", "hub.log"} {
			data, _ := os.ReadFile(filepath.Join(b.dir, f))
			if !strings.Contains(string(data), "fast path: this session forwards in userspace") {
				t.Errorf("%s does not say that the session with an IPv6 link forwards in userspace", f)
			}
		}
	}
}

// An IPv6-only uplink follows its interface's address as an IPv4 one does (an LTE
// re-attach with a new prefix, a privacy address rotating): the CPE re-binds the
// uplink's socket to the new IPv6 address within the session.
func TestIPv6UplinkAddressChangeKeepsSession(t *testing.T) {
	n := buildTopologyWith(t, "a7", topologyOptions{shaped: true, ipv6Uplink: 3})
	b := startBondWith(t, n, bondOptions{
		listen: "[::]:4242",
		uplink: map[int]string{3: `    endpoint: "[` + headendIPv6 + `]:4242"` + "\n"},
	})
	n.Run("cpe", "ip", "-6", "addr", "add", "2001:db8:98:3::3/64", "dev", "up3", "nodad")
	n.Run("cpe", "ip", "-6", "addr", "del", "2001:db8:98:3::2/64", "dev", "up3")
	b.followsNewAddress(t, n, "[2001:db8:98:3::3]:")
}

// udp6Out is a namespace's count of UDP datagrams sent over IPv6 (Udp6OutDatagrams).
func udp6Out(t *testing.T, n interface {
	Run(ns string, args ...string) string
}, ns string) int {
	t.Helper()
	for _, line := range strings.Split(n.Run(ns, "cat", "/proc/net/snmp6"), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "Udp6OutDatagrams" {
			var v int
			for _, c := range f[1] {
				v = 10*v + int(c-'0')
			}
			return v
		}
	}
	t.Fatalf("no Udp6OutDatagrams in %s's /proc/net/snmp6", ns)
	return 0
}
