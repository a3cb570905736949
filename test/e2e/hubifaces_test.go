package e2e

import (
	"path/filepath"
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
	if out, err := n.Try("lan", "ping", "-c", "3", "-i", "0.2", "-W", "2", server); err != nil {
		t.Errorf("no ping through the bond with the shield on hl1 only: %v\n%s", err, out)
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
