package netwatch

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/aggd/aggd/internal/testnet"
)

// deadline bounds every wait for an event. It only decides when the test gives up.
const deadline = 20 * time.Second

// A veth pair between two fresh namespaces; the watcher watches end "wa" in "a".
// Everything an operator (or a cable, a modem, a DHCP client) does to it shows up as
// events.
func TestWatchVeth(t *testing.T) {
	n := testnet.New(t, "nw")
	n.AddNS("a", "b")
	n.Veth("a", "wa", "10.77.0.2/24", "b", "wb", "10.77.0.1/24")
	ns, err := netns.GetFromName(n.NS("a"))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := Start(ctx, Config{Interfaces: []string{"wa", "absent0"}, Namespace: &ns})
	if err != nil {
		t.Fatal(err)
	}
	ev := &events{t: t, ch: w.Events()}

	// Administratively down, and up again.
	n.Run("a", "ip", "link", "set", "wa", "down")
	ev.expect(Event{Interface: "wa", Kind: CarrierLost})
	n.Run("a", "ip", "link", "set", "wa", "up")
	ev.expect(Event{Interface: "wa", Kind: CarrierBack})

	// The far end goes away: wa is still up but loses its carrier (a pulled cable).
	n.Run("b", "ip", "link", "set", "wb", "down")
	lost := ev.expect(Event{Interface: "wa", Kind: CarrierLost})
	if lost.Cause == "interface set down" {
		t.Errorf("carrier lost at the far end reported as %q", lost.Cause)
	}
	n.Run("b", "ip", "link", "set", "wb", "up")
	ev.expect(Event{Interface: "wa", Kind: CarrierBack})

	// Addresses come and go (DHCP, LTE re-attach).
	n.Run("a", "ip", "addr", "add", "10.78.0.3/24", "dev", "wa")
	ev.expect(Event{Interface: "wa", Kind: AddressAdded, Address: netip.MustParsePrefix("10.78.0.3/24")})
	n.Run("a", "ip", "addr", "del", "10.77.0.2/24", "dev", "wa")
	ev.expect(Event{Interface: "wa", Kind: AddressRemoved, Address: netip.MustParsePrefix("10.77.0.2/24")})

	// The default route appears, changes gateway, goes.
	n.Run("a", "ip", "route", "add", "default", "via", "10.78.0.1", "dev", "wa")
	ev.expect(Event{Interface: "wa", Kind: RouteChanged, Gateway: netip.MustParseAddr("10.78.0.1")})
	n.Run("a", "ip", "route", "replace", "default", "via", "10.78.0.9", "dev", "wa")
	ev.expect(Event{Interface: "wa", Kind: RouteChanged, Gateway: netip.MustParseAddr("10.78.0.9")})
	n.Run("a", "ip", "route", "del", "default")
	ev.expect(Event{Interface: "wa", Kind: RouteChanged})

	// Its MTU changes (a DHCP client applying the modem's MTU option).
	n.Run("a", "ip", "link", "set", "wa", "mtu", "1400")
	ev.expect(Event{Interface: "wa", Kind: MTUChanged, MTU: 1400})

	// An interface that appears later is watched from then on: created first, then
	// its carrier.
	n.Run("a", "ip", "link", "add", "absent0", "type", "veth", "peer", "name", "absent1")
	ev.expect(Event{Interface: "absent0", Kind: Created})
	n.Run("a", "ip", "link", "set", "absent1", "up")
	n.Run("a", "ip", "link", "set", "absent0", "up")
	ev.expect(Event{Interface: "absent0", Kind: CarrierBack})
	n.Run("a", "ip", "link", "del", "absent0")
	ev.expect(Event{Interface: "absent0", Kind: CarrierLost})
	ev.expect(Event{Interface: "absent0", Kind: Deleted})

	// Deleted and created again under the same name (a PPPoE reconnect's new ppp0):
	// created again, with its address.
	n.Run("a", "ip", "link", "del", "wa")
	ev.expect(Event{Interface: "wa", Kind: CarrierLost})
	ev.expect(Event{Interface: "wa", Kind: Deleted})
	n.Veth("a", "wa", "10.77.0.2/24", "b", "wb", "10.77.0.1/24")
	ev.expect(Event{Interface: "wa", Kind: Created})
	ev.expect(Event{Interface: "wa", Kind: AddressAdded, Address: netip.MustParsePrefix("10.77.0.2/24")})
	ev.expect(Event{Interface: "wa", Kind: CarrierBack})

	// Nothing about interfaces it does not watch, and no duplicates.
	ev.none()

	cancel()
	waitClosed(t, w.Events())
}

// events reads a watcher's events, skipping the ones a step may bring along
// (addresses and routes a carrier change takes with it) until the one expected.
type events struct {
	t  *testing.T
	ch <-chan Event
}

// expect waits for an event matching want in interface, kind, address, gateway and MTU,
// and fails on any event about an interface the test does not touch.
func (e *events) expect(want Event) Event {
	e.t.Helper()
	timeout := time.After(deadline)
	var seen []string
	for {
		select {
		case got, ok := <-e.ch:
			if !ok {
				e.t.Fatalf("events closed while waiting for %v", want)
			}
			e.t.Logf("event: %v", got)
			if got.Interface != "wa" && got.Interface != "absent0" {
				e.t.Fatalf("event for an interface not watched: %v", got)
			}
			if got.Interface == want.Interface && got.Kind == want.Kind &&
				got.Address == want.Address && got.Gateway == want.Gateway && got.MTU == want.MTU {
				return got
			}
			seen = append(seen, got.String())
		case <-timeout:
			e.t.Fatalf("no %v within %v; saw %v", want, deadline, seen)
		}
	}
}

// none checks that no event is pending now. The steps above each waited for their
// event, so anything left would be a stray or a duplicate.
func (e *events) none() {
	e.t.Helper()
	time.Sleep(200 * time.Millisecond) // only lets a stray show up; passing does not depend on it
	select {
	case got := <-e.ch:
		e.t.Fatalf("unexpected event %v", got)
	default:
	}
}

func waitClosed(t *testing.T, ch <-chan Event) {
	t.Helper()
	timeout := time.After(deadline)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("events not closed after the context ended")
		}
	}
}

func TestKindNames(t *testing.T) {
	for k := CarrierLost; k <= Deleted; k++ {
		if s := k.String(); s == "" || s == fmt.Sprintf("kind(%d)", uint8(k)) {
			t.Errorf("kind %d has no name", k)
		}
	}
}
