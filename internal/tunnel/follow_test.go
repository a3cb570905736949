package tunnel

import (
	"net/netip"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/wire"
)

// The headend probes a CPE's link as soon as it first hears from it (follow), rather
// than at its next tick: until its probe is answered the link is not in the schedule,
// and downstream packets meanwhile are dropped at the entry. A link it already knew
// the address of is not probed again by a packet from it.
func TestFirstContactProbesTheLink(t *testing.T) {
	s := newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	defer s.close()
	s.installKeys(&keyGen{id: 1, created: time.Now()}, true)
	var sent []wire.Type
	l := s.addLink(LinkSpec{ID: 0, Name: "link0"}, func(_ *link, b []byte) error {
		h, err := wire.ParseHeader(b)
		if err != nil {
			t.Errorf("sent an unparsable packet: %v", err)
		}
		sent = append(sent, h.Type)
		return nil
	})

	from := netip.MustParseAddrPort("192.0.2.7:4242")
	s.follow(l, from)
	if len(sent) != 1 || sent[0] != wire.TypeProbe {
		t.Fatalf("first packet from a link: sent %v, want one probe", sent)
	}
	s.follow(l, from)
	if len(sent) != 1 {
		t.Fatalf("a later packet from the same address: sent %v, want nothing more", sent)
	}
}
