package tunnel

import (
	"sync"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/wire"
)

// paramsTally counts the LINK_PARAMS a CPE's uplinks carry, by uplink (the relay's
// client address), and what the last one each carried said.
type paramsTally struct {
	mu   sync.Mutex
	n    map[string]int
	last map[string]wire.LinkParamsBody
}

func watchLinkParams(t *testing.T, b *bed) *paramsTally {
	pt := &paramsTally{n: map[string]int{}, last: map[string]wire.LinkParamsBody{}}
	b.relay.setHook(func(m *mapping, up bool, pkt []byte) []byte {
		if !up || len(pkt) < wire.HeaderLen || wire.Type(pkt[0]&0x0f) != wire.TypeLinkParams {
			return pkt
		}
		body, err := wire.ParseLinkParams(pkt[wire.HeaderLen:])
		if err != nil {
			t.Errorf("a LINK_PARAMS the relay cannot parse: %v", err)
			return pkt
		}
		pt.mu.Lock()
		pt.n[m.client.String()]++
		pt.last[m.client.String()] = body
		pt.mu.Unlock()
		return pkt
	})
	return pt
}

func (pt *paramsTally) counts() (total, links int) {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	for _, n := range pt.n {
		total += n
	}
	return total, len(pt.n)
}

// saidMTU reports how many uplinks carried, last, a LINK_PARAMS that gives link id
// this MTU.
func (pt *paramsTally) saidMTU(id uint8, mtu uint16) int {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	n := 0
	for _, body := range pt.last {
		for _, p := range body.Links {
			if p.LinkID == id && p.MTU == mtu {
				n++
			}
		}
	}
	return n
}

// readyOnThreeUplinks starts a CPE with three uplinks and waits until the headend
// knows them.
func readyOnThreeUplinks(t *testing.T) (*bed, *cpeNode) {
	p := newPeer(t, "cpe1", "100.64.0.2")
	b := newBed(t, p)
	n := b.startCPE(p, 3, time.Hour)
	b.waitReady(n)
	return b, n
}

// Once the headend knows the uplinks, the CPE's once-a-second LINK_PARAMS only makes up
// for a lost copy: it goes on one uplink at a time, each in turn, not on all of them.
// Every uplink still carries one within as many seconds as there are uplinks.
func TestUnchangedLinkParamsTakeTurns(t *testing.T) {
	b, n := readyOnThreeUplinks(t)
	pt := watchLinkParams(t, b)
	from := n.c.announced.Load()
	waitFor(t, "every uplink to carry a LINK_PARAMS", func() bool {
		_, links := pt.counts()
		return links == 3
	})
	made := n.c.announced.Load() - from
	// An announcement made before the count started may still be on its way: one more.
	if total, _ := pt.counts(); uint32(total) > made+1 {
		t.Errorf("%d LINK_PARAMS on the uplinks in %d announcements: not one at a time", total, made)
	}
}

// What is new goes on every uplink at once, not one a second: an uplink's smaller MTU
// must reach the headend before it sends anything larger, on whichever link gets
// through. Also when nothing asked for an announcement (a change its maker did not
// report): the message is compared with the last one.
func TestNewLinkParamsGoOnEveryUplink(t *testing.T) {
	b, n := readyOnThreeUplinks(t)
	pt := watchLinkParams(t, b)

	for i, mtu := range []uint16{1400, 1300} {
		from := n.c.announced.Load()
		if i == 0 {
			n.c.SetUplinkMTU(1, int(mtu))
		} else {
			n.c.conns[1].mtu.Store(uint32(mtu)) // unreported: the next second's finds it
		}
		waitFor(t, "every uplink to carry the new MTU", func() bool { return pt.saidMTU(1, mtu) == 3 })
		if made := n.c.announced.Load() - from; made > 2 {
			t.Errorf("MTU %d: %d announcements before every uplink had carried it, want one (two if the second's came between)",
				mtu, made)
		}
	}
}
