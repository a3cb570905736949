package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Without bpf.interfaces the headend puts its shield on the interfaces of its default
// routes (where a server's traffic from the internet arrives), not on every interface
// that is up: here hl1 has the default route, and a veth like a container's (up, no
// address, its peer elsewhere) must be left alone, as must the other interfaces.
// Traffic arriving elsewhere is still checked and carried by the daemon. When the
// default route moves, the shield follows.
func TestHeadendShieldsItsDefaultRoutesInterfaces(t *testing.T) {
	n := newTopology(t)
	n.Run("hub", "ip", "route", "add", "default", "via", "10.98.1.2", "dev", "hl1")
	n.AddNS("ctr")
	n.Veth("hub", "vethctr", "", "ctr", "eth0", "")
	b := startBondWith(t, n, bondOptions{autoInterfaces: true})

	hubLog := filepath.Join(b.dir, "hub.log")
	if logCount(hubLog, "XDP shield attached", "interface=hl1 ") == 0 {
		t.Errorf("the headend's shield is not on hl1, the interface of its default route")
	}
	for _, other := range []string{"hl2", "hl3", "wan0", "vethctr"} {
		if c := logCount(hubLog, "XDP shield attached", "interface="+other+" "); c != 0 {
			t.Errorf("the headend's shield went on %s, which has no default route (bpf.interfaces unset)", other)
		}
	}
	// Every ping must come back. With the fast path, the receive program is on hl1
	// only, and the CPE's packets on hl2 and hl3 reach the headend's daemon uncounted:
	// the daemon keeps the receive ordering and says why. (Before it looked where
	// packets arrived, it gave the kernel the ordering, and what came on hl2 and hl3
	// was dropped as strays: one CI run got no reply to any of the three pings.)
	out, err := n.Try("lan", "ping", "-c", "3", "-i", "0.2", "-W", "2", server)
	if err != nil || !strings.Contains(out, " 0% packet loss") {
		t.Errorf("pings lost through the bond with the shield on hl1 only: %v\n%s", err, out)
	}
	if strings.Contains(os.Getenv("AGGD_E2E_DAEMON_ARGS"), "--fast-path") &&
		logCount(hubLog, "the daemon keeps this session's receive ordering", "where the receive program is not attached") == 0 {
		t.Errorf("the headend did not say why it keeps the receive ordering of packets arriving on hl2 and hl3")
	}

	// The default route moves to hl2 (a second line takes over), with no interface
	// changing: the headend looks again on its own and puts the shield there too.
	n.Run("hub", "ip", "route", "replace", "default", "via", "10.98.2.2", "dev", "hl2")
	deadline := time.Now().Add(30 * time.Second)
	for logCount(hubLog, "XDP shield attached", "interface=hl2 ") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the headend's shield is not on hl2 30 s after the default route moved there")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A headend that died (no clean stop) and comes back with fewer interfaces in
// bpf.interfaces, or a different choice of them (the default route moved, or a
// container's veth was listed by mistake), takes the earlier run's XDP shield and
// receive program off the interfaces it no longer wants: they were pinned, so they
// outlived the daemon that attached them, and nothing else would ever detach them. The
// interfaces it still wants keep theirs.
func TestAdoptingHeadendDetachesWhatItNoLongerWants(t *testing.T) {
	n := newTopology(t)
	n.AddNS("ctr")
	n.Veth("hub", "vethctr", "", "ctr", "eth0", "")
	b := startBondWith(t, n, bondOptions{hubInterfaces: "  interfaces: [hl1, hl2, hl3, vethctr]\n"}, "--fast-path")
	for _, ifc := range []string{"hl1", "vethctr"} {
		if !b.hasXDP(ifc) || !b.hasTCIngress(ifc) {
			t.Fatalf("before the restart: want the shield and the receive program on %s (the test would prove nothing):\n%s",
				ifc, b.Run("hub", "ip", "link", "show", "dev", ifc))
		}
	}

	kill(t, b.headend)
	cfg := filepath.Join(b.dir, "hub.yaml")
	writeFile(t, b.dir, "hub.yaml", strings.Replace(readFileString(cfg), ", vethctr]", "]", 1))
	hubLog := filepath.Join(b.dir, "hub-restart.log")
	b.headend = b.Start("hub", hubLog, append([]string{aggdBinary, "headend", "--config", cfg, "--fast-path"},
		strings.Fields(os.Getenv("AGGD_E2E_DAEMON_ARGS"))...)...)
	b.waitReady(t)
	if !strings.Contains(readFileString(hubLog), "adopting the fast path an earlier run left pinned") {
		t.Fatalf("the restarted headend did not adopt the pinned fast path; its log:\n%s", tail([]byte(readFileString(hubLog)), 3000))
	}
	if b.hasXDP("vethctr") || b.hasTCIngress("vethctr") {
		t.Errorf("the earlier run's programs are still on vethctr, which the restarted headend does not list (XDP %v, receive program pinned %v)",
			b.hasXDP("vethctr"), b.hasTCIngress("vethctr"))
	}
	for _, ifc := range []string{"hl1", "hl2", "hl3"} {
		if !b.hasXDP(ifc) || !b.hasTCIngress(ifc) {
			t.Errorf("the restarted headend lost its shield or receive program on %s (XDP %v, receive program pinned %v)", ifc, b.hasXDP(ifc), b.hasTCIngress(ifc))
		}
	}
	if out, err := n.Try("lan", "ping", "-c", "3", "-i", "0.2", "-W", "2", server); err != nil {
		t.Errorf("no ping through the bond after the restart: %v\n%s", err, out)
	}
}

// hasXDP says whether an XDP program is attached to the headend's interface ifc.
func (b *bond) hasXDP(ifc string) bool {
	return strings.Contains(b.Run("hub", "ip", "link", "show", "dev", ifc), "prog/xdp")
}

// hasTCIngress says whether the receive program's attachment to the headend's
// interface ifc is pinned in the headend's pin directory. (The bpftool of Debian 12
// does not list tcx links; a pinned link whose daemon died is held by its pin alone,
// so it is attached exactly while the pin is there.)
func (b *bond) hasTCIngress(ifc string) bool {
	ino := strings.TrimSpace(b.Run("hub", "stat", "-L", "-c", "%i", "/proc/self/ns/net"))
	_, err := os.Stat(filepath.Join(pinRoot, "agg0-netns"+ino, "link_tc_ingress_"+ifc))
	return err == nil
}
