package tunnel

import (
	"net/netip"
	"testing"

	"github.com/aggd/aggd/internal/wire"
)

// A link's bytes are counted as its wire carries them: the aggd header and 28 bytes of
// outer IPv4 and UDP header, or 48 over IPv6, by the peer's address (28 while neither
// address is known), and the scheduler is told which links pay the longer header.
func TestALinksBytesCountItsOuterHeader(t *testing.T) {
	r := newRescueRig(t)
	four, six := netip.MustParseAddrPort("203.0.113.1:4242"), netip.MustParseAddrPort("[2001:db8::1]:4242")
	r.links[0].remote.Store(&four)
	r.links[1].remote.Store(&six)
	for _, l := range r.links {
		l.txData.Store(0)
		l.txPkts.Store(0)
	}
	const inner = 1000
	for range 200 {
		if !r.s.SendData(make([]byte, wire.HeaderLen+inner)) {
			t.Fatal("SendData found no usable link")
		}
	}
	for i, want := range []struct {
		outer int
		ipv6  bool
	}{{28, false}, {48, true}, {28, false}} {
		l := r.links[i]
		pkts, bytes := l.txPkts.Load(), l.txData.Load()
		if pkts == 0 {
			t.Errorf("%s carried nothing of 200 packets", l.spec.Name)
			continue
		}
		if per := bytes / pkts; per != uint64(inner+wire.HeaderLen+want.outer) {
			t.Errorf("%s: %d bytes a packet, want %d (inner %d + aggd header %d + outer %d)",
				l.spec.Name, per, inner+wire.HeaderLen+want.outer, inner, wire.HeaderLen, want.outer)
		}
		if got := l.params().OuterIPv6; got != want.ipv6 {
			t.Errorf("%s: the scheduler's OuterIPv6 is %v, want %v", l.spec.Name, got, want.ipv6)
		}
	}
}
