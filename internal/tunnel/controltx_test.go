package tunnel

import (
	"sync"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/wire"
)

// The CPE counts every control message it sends by type, as the wire carries it: once
// it has stopped, what the relay saw of its datagrams, type by type (outer IPv4 and UDP
// headers added), is what control_transmit_packets_total and _bytes_total say. Data
// and handshakes are not control traffic there.
func TestControlTrafficIsCountedByType(t *testing.T) {
	p := newPeer(t, "cpe1", "100.64.0.2")
	b := newBed(t, p)
	type tally struct{ packets, bytes int }
	var mu sync.Mutex
	seen := map[wire.Type]tally{}
	b.relay.setHook(func(_ *mapping, up bool, pkt []byte) []byte {
		if up && len(pkt) >= wire.HeaderLen {
			ty := wire.Type(pkt[0] & 0x0f)
			mu.Lock()
			seen[ty] = tally{seen[ty].packets + 1, seen[ty].bytes + len(pkt) + 28}
			mu.Unlock()
		}
		return pkt
	})
	n := b.startCPE(p, 2, time.Hour)
	b.waitReady(n)
	counted := func(ty wire.Type) tally {
		return tally{
			int(gauge(n.m.ControlTxPackets.WithLabelValues("headend", ty.String()))),
			int(gauge(n.m.ControlTxBytes.WithLabelValues("headend", ty.String()))),
		}
	}
	b.up(n, 50)
	waitFor(t, "a FEEDBACK from the CPE", func() bool { return counted(wire.TypeFeedback).packets > 0 })
	n.stop()

	control := []wire.Type{wire.TypeProbe, wire.TypeProbeReply, wire.TypeFeedback, wire.TypeLossNotice,
		wire.TypeLinkParams, wire.TypeLinkNames, wire.TypeRepairRequest}
	waitFor(t, "the relay to have seen every control message the CPE counted", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, ty := range control {
			if counted(ty) != seen[ty] {
				return false
			}
		}
		return true
	})
	for _, ty := range []wire.Type{wire.TypeProbe, wire.TypeProbeReply, wire.TypeFeedback, wire.TypeLinkParams} {
		if counted(ty).packets == 0 {
			t.Errorf("no %s counted: the CPE sends it on every session", ty)
		}
	}
	mu.Lock()
	data := seen[wire.TypeData]
	mu.Unlock()
	if data.packets < 50 {
		t.Errorf("the relay saw %d data packets, want the 50 sent at least", data.packets)
	}
	if c := counted(wire.TypeData); c != (tally{}) {
		t.Errorf("data counted as control traffic: %+v", c)
	}
}
