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
	if keys := restartOnlyChanges(a, b); len(keys) != 0 {
		t.Errorf("peers alone reported as %v", keys)
	}
	b.Listen = netip.MustParseAddrPort("[::]:4242")
	b.Reorder.MaxHold = 300 * time.Millisecond
	if keys, want := restartOnlyChanges(a, b), []string{"listen", "reorder"}; !slices.Equal(keys, want) {
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
