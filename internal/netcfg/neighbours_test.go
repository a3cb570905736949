package netcfg

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/testnet"
)

// After a carrier comes back, the entries still being resolved or given up are
// deleted, in both families; resolved and static ones stay.
func TestFlushUnresolvedNeighboursKeepsTheResolved(t *testing.T) {
	n := testnet.New(t, "nc")
	n.AddNS("a", "b")
	n.Veth("a", "nb0", "10.0.0.1/24", "b", "nb1", "") // nb1 has no address: nothing resolves
	n.Run("a", "ip", "-6", "addr", "add", "2001:db8:7::1/64", "dev", "nb0", "nodad")
	n.Run("a", "ip", "neigh", "add", "10.0.0.6", "dev", "nb0", "nud", "failed")
	n.Run("a", "ip", "neigh", "add", "10.0.0.7", "dev", "nb0", "lladdr", "02:00:00:00:00:07", "nud", "permanent")
	n.Run("a", "ip", "neigh", "add", "10.0.0.8", "dev", "nb0", "lladdr", "02:00:00:00:00:08", "nud", "reachable")
	n.Run("a", "ip", "neigh", "add", "2001:db8:7::8", "dev", "nb0", "lladdr", "02:00:00:00:00:18", "nud", "stale")
	// What a packet to a next hop that does not answer (yet) leaves: an INCOMPLETE entry.
	_, _ = n.Try("a", "ping", "-c1", "-W0.1", "10.0.0.9")
	_, _ = n.Try("a", "ping", "-c1", "-W0.1", "2001:db8:7::9")
	before := n.Run("a", "ip", "neigh", "show", "dev", "nb0")
	for _, want := range []string{"10.0.0.9 INCOMPLETE", "2001:db8:7::9 INCOMPLETE", "10.0.0.6 FAILED"} {
		if !strings.Contains(before, want) {
			t.Fatalf("the test's neighbour table has no %q:\n%s", want, before)
		}
	}

	var deleted int
	if err := n.Do("a", func() (err error) { deleted, err = FlushUnresolvedNeighbours("nb0", 0); return err }); err != nil {
		t.Fatal(err)
	}
	after := n.Run("a", "ip", "neigh", "show", "dev", "nb0")
	if deleted != 3 {
		t.Errorf("deleted %d entries, want 3; before:\n%s\nafter:\n%s", deleted, before, after)
	}
	for _, gone := range []string{"10.0.0.9", "2001:db8:7::9", "10.0.0.6"} {
		if strings.Contains(after, gone+" ") {
			t.Errorf("%s is still there:\n%s", gone, after)
		}
	}
	for _, kept := range []string{"10.0.0.7 lladdr", "10.0.0.8 lladdr", "2001:db8:7::8 lladdr"} {
		if !strings.Contains(after, kept) {
			t.Errorf("%s was deleted:\n%s", kept, after)
		}
	}

	if err := n.Do("a", func() error { _, err := FlushUnresolvedNeighbours("nb9", 0); return err }); err == nil || !strings.Contains(err.Error(), "nb9") {
		t.Errorf("a missing interface: error %v, want one naming it", err)
	}
}

// A recheck after the carrier's return deletes the entries left unanswered, not one a
// packet has just created, whose question is still on its way.
func TestFlushUnresolvedNeighboursSparesTheJustAsked(t *testing.T) {
	n := testnet.New(t, "nd")
	n.AddNS("a", "b")
	n.Veth("a", "nb0", "10.0.0.1/24", "b", "nb1", "") // nb1 has no address: nothing resolves
	_, _ = n.Try("a", "ping", "-c1", "-W0.1", "10.0.0.9")
	time.Sleep(time.Second) // 10.0.0.9 has waited over a second for its answer

	var deleted int
	if err := n.Do("a", func() error {
		c, err := net.Dial("udp", "10.0.0.10:9") // 10.0.0.10 is asked for now
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.Write([]byte("x")); err != nil {
			return err
		}
		deleted, err = FlushUnresolvedNeighbours("nb0", 500*time.Millisecond)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	after := n.Run("a", "ip", "neigh", "show", "dev", "nb0")
	if deleted != 1 || strings.Contains(after, "10.0.0.9 ") || !strings.Contains(after, "10.0.0.10 ") {
		t.Errorf("deleted %d entries; want only 10.0.0.9's, unanswered for a second, not 10.0.0.10's, just asked:\n%s", deleted, after)
	}
}
