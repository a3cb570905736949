package daemon

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/config"
	"github.com/aggd/aggd/internal/tunnel"
)

// A reload names the settings it cannot apply by their config keys, and never peers.
func TestRestartOnlyChanges(t *testing.T) {
	a := config.DefaultHeadend()
	b := config.DefaultHeadend()
	b.Peers = []config.Peer{{Name: "cpe9"}}
	if keys := restartOnlyChanges(a, b, "peers"); len(keys) != 0 {
		t.Errorf("peers alone reported as %v", keys)
	}
	b.Listen = netip.MustParseAddrPort("[::]:4242")
	b.Reorder.MaxHold = 300 * time.Millisecond
	if keys, want := restartOnlyChanges(a, b, "peers"), []string{"listen", "reorder"}; !slices.Equal(keys, want) {
		t.Errorf("changed keys %v, want %v", keys, want)
	}
}

// The routes a reload adds and removes: prefixes only the new peers have, and only the
// old ones had; one that moves from one peer to another stays.
func TestPeerRouteDiff(t *testing.T) {
	pfx := netip.MustParsePrefix
	old := []tunnel.Peer{{Name: "a", Prefixes: []netip.Prefix{pfx("100.64.0.2/32"), pfx("10.1.0.0/16")}}}
	next := []tunnel.Peer{{Name: "b", Prefixes: []netip.Prefix{pfx("10.1.0.0/16"), pfx("100.64.0.3/32")}}}
	add, del := routeDiff(old, next)
	if !slices.Equal(add, []netip.Prefix{pfx("100.64.0.3/32")}) || !slices.Equal(del, []netip.Prefix{pfx("100.64.0.2/32")}) {
		t.Errorf("add %v, delete %v", add, del)
	}
}

// A CPE reload applies the uplinks' class, rates and weight itself, and names every
// other difference as needing a restart: an uplink's interface, one more uplink, the
// log level.
func TestCPERestartOnlyChanges(t *testing.T) {
	cpe := func(ups ...config.Uplink) *config.CPE {
		c := config.DefaultCPE()
		c.Uplinks = ups
		return c
	}
	dsl := config.Uplink{Name: "dsl", Interface: "ppp0", Class: config.ClassPrimary}
	lte := config.Uplink{Name: "lte", Interface: "wwan0", Class: config.ClassPrimary}
	running := cpe(dsl, lte)

	tuned := lte
	tuned.Class, tuned.RateUp, tuned.RateDown, tuned.Weight = config.ClassBackup, 5e6, 20e6, 3
	next := cpe(dsl, tuned)
	if !sameUplinks(running.Uplinks, next.Uplinks) {
		t.Fatal("the same uplinks, retuned, are not the same uplinks")
	}
	if keys := restartOnlyChanges(running, withTuningOf(next, running, true), ""); len(keys) != 0 {
		t.Errorf("a retune alone reported as needing a restart: %v", keys)
	}

	moved := tuned
	moved.Interface = "wwan1"
	next = cpe(dsl, moved)
	next.Log.Level = config.LogDebug
	if keys, want := restartOnlyChanges(running, withTuningOf(next, running, true), ""), []string{"uplinks", "log"}; !slices.Equal(keys, want) {
		t.Errorf("changed keys %v, want %v", keys, want)
	}

	next = cpe(dsl, lte, config.Uplink{Name: "cable", Interface: "eth1"})
	if sameUplinks(running.Uplinks, next.Uplinks) {
		t.Error("an added uplink counts as the same uplinks")
	}
	if keys := restartOnlyChanges(running, withTuningOf(next, running, false), ""); !slices.Equal(keys, []string{"uplinks"}) {
		t.Errorf("an added uplink: changed keys %v, want [uplinks]", keys)
	}
}
