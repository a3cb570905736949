package tunnel

import (
	"net/netip"
	"testing"
	"time"
)

func TestSourceLimitsKeepSourcesApart(t *testing.T) {
	var s sourceLimits
	now := time.Now()
	flooder, cpe := netip.MustParseAddr("198.51.100.9"), netip.MustParseAddr("192.0.2.7")
	admitted := 0
	for range 1000 {
		if s.allow(flooder, now) {
			admitted++
		}
	}
	if admitted != sourceBurst {
		t.Errorf("a source sending 1000 INITs at once had %d admitted, want its burst, %d", admitted, sourceBurst)
	}
	if !s.allow(cpe, now) {
		t.Error("another source is refused while one floods")
	}
	if !s.allow(flooder, now.Add(time.Second/sourceRate)) {
		t.Errorf("the flooding source has no token %v later", time.Second/sourceRate)
	}
	// An IPv4 address, mapped or not, is one source; an IPv6 /64 is one source.
	if sourceOf(netip.MustParseAddr("::ffff:192.0.2.7")) != sourceOf(cpe) {
		t.Error("a v4-mapped address counts apart from the IPv4 address")
	}
	a, b := netip.MustParseAddr("2001:db8:1:2::1"), netip.MustParseAddr("2001:db8:1:2:ffff::9")
	if sourceOf(a) != sourceOf(b) || sourceOf(a) == sourceOf(netip.MustParseAddr("2001:db8:1:3::1")) {
		t.Error("IPv6 sources are not their /64s")
	}
}

func TestSourceLimitsForgetIdleSources(t *testing.T) {
	var s sourceLimits
	now := time.Now()
	for i := range sourcesPrune {
		s.allow(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), now)
	}
	busy := netip.MustParseAddr("192.0.2.1")
	later := now.Add(sourceIdle)
	s.allow(busy, later)
	if n := len(s.sources); n > 2 {
		t.Errorf("%d sources remembered after %v idle, want the new ones only", n, sourceIdle)
	}
}
