// Package netwatch watches network interfaces through rtnetlink and reports what changes
// under the daemon (docs/architecture.md §6): an interface losing or regaining its
// carrier, global addresses appearing and disappearing on it, its default route
// (gateway) coming, changing or going, its MTU changing, and the interface itself being
// created anew.
//
// Events are edge-triggered from the kernel's notifications and checked against the
// state the watcher keeps, so that each change is reported once. If the notification
// socket overflows or fails, the watcher subscribes again and reports the difference
// between what it knew and what the kernel now says: a change may be reported late,
// never lost.
package netwatch

import (
	"fmt"
	"net/netip"
)

// Kind is what changed.
type Kind uint8

const (
	CarrierLost    Kind = iota + 1 // the interface is down or has no carrier (or was deleted)
	CarrierBack                    // the interface is up with carrier again
	AddressAdded                   // a global address appeared on the interface
	AddressRemoved                 // a global address disappeared from it
	RouteChanged                   // its default route appeared, changed gateway or went
	// Created: the interface exists anew, with a new index: created after the watch
	// began, or deleted and created again (a PPPoE reconnect makes a new ppp0, a modem
	// reset a new wwan0). Sockets bound to it and programs attached to it were bound to
	// the old one. Reported before the new interface's carrier and addresses.
	Created
	// MTUChanged: the interface's MTU changed while it existed (a DHCP client applying
	// a modem's MTU option); not reported for one created anew.
	MTUChanged
	// Deleted: the interface is gone (a PPPoE line's ppp0 at a disconnect). Reported
	// after its carrier and addresses went.
	Deleted
)

var kindNames = [...]string{
	CarrierLost:    "carrier_lost",
	CarrierBack:    "carrier_back",
	AddressAdded:   "address_added",
	AddressRemoved: "address_removed",
	RouteChanged:   "route_changed",
	Created:        "created",
	MTUChanged:     "mtu_changed",
	Deleted:        "deleted",
}

// String is the snake_case name, suitable as a metric label.
func (k Kind) String() string {
	if k >= CarrierLost && k <= Deleted {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Event is one change on a watched interface.
type Event struct {
	Interface string
	Kind      Kind
	// Address is the address added or removed (AddressAdded, AddressRemoved).
	Address netip.Prefix
	// Gateway is the default route's gateway after the change (RouteChanged); invalid
	// when the default route went away or has no gateway (point-to-point links).
	Gateway netip.Addr
	// MTU is the interface's MTU after the change (MTUChanged).
	MTU int
	// Cause says what the kernel reported, for logs: "oper state down", "interface
	// deleted", "resync after lost notifications", ...
	Cause string
}

func (e Event) String() string {
	s := e.Interface + " " + e.Kind.String()
	switch e.Kind {
	case AddressAdded, AddressRemoved:
		s += " " + e.Address.String()
	case MTUChanged:
		s += fmt.Sprintf(" %d", e.MTU)
	case RouteChanged:
		if e.Gateway.IsValid() {
			s += " via " + e.Gateway.String()
		} else {
			s += " (no default gateway)"
		}
	}
	if e.Cause != "" {
		s += ": " + e.Cause
	}
	return s
}
