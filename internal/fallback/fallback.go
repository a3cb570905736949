// Package fallback routes a CPE's LAN traffic directly out of one of its uplinks while
// the headend is unreachable (docs/architecture.md, "Headend unreachable").
//
// The switch is per connection, not per packet, so that nothing established breaks
// when the bond comes back:
//
//   - While direct routing is on, a rule in prerouting marks every new connection that
//     did not arrive on an uplink or the tunnel (that is, one from the LAN) and that the
//     main routing table sends into the tunnel, with Mark in conntrack.
//   - Packets in the original direction of a marked connection get Mark as their
//     packet mark; a policy routing rule sends such packets to Table, whose one
//     default route leaves through the chosen uplink; postrouting masquerades them to
//     the uplink's address.
//
// Turning direct routing off removes only the first rule: new connections take the
// bond again, while the marked ones keep their mark, and with it their path and their
// NAT mapping, until they end. Everything lives in nftables table inet aggd-fallback,
// routing table Table and one rule, all removed by Remove.
package fallback

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"

	"github.com/aggd/aggd/internal/nat"
	"github.com/aggd/aggd/internal/netcfg"
)

// TableName is the nftables table (family inet) of the fallback's rules.
const TableName = "aggd-fallback"

// Mark is the conntrack and packet mark of direct connections ("aggd" in ASCII).
const Mark uint32 = 0x61676764

// Table is the routing table of direct connections, and RulePriority the priority of
// the rule that selects it.
const (
	Table        = 24935
	RulePriority = 24935
)

// Exit is where direct connections of one IP version leave: an uplink interface and
// its next hop (none on a point-to-point link).
type Exit struct {
	Interface string
	Gateway   netip.Addr
	IPv6      bool // the exit of IPv6 connections, else of IPv4 ones
}

func (e Exit) family() int {
	if e.IPv6 {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}

// families are the IP versions direct routing handles, each with its own route and rule.
var families = []int{netlink.FAMILY_V4, netlink.FAMILY_V6}

// Router installs and switches the fallback. Uplinks and Tunnel name the interfaces
// whose traffic is never a LAN connection.
type Router struct {
	Uplinks []string
	Tunnel  string
}

// Direct turns direct routing on through exits (one per IP version that has one): it
// installs their routes and rules, removes those of a version without an exit (its
// new connections keep waiting for the bond), and installs the table (with the marking
// rule for new connections).
func (r *Router) Direct(exits []Exit) error {
	if err := r.Refresh(exits); err != nil {
		return err
	}
	return r.install(true)
}

// Refresh makes the routes and rules those of exits: it re-installs those that went
// missing (the kernel deletes a route when its interface goes down) and removes those
// of a version without an exit; the nftables table is left alone.
func (r *Router) Refresh(exits []Exit) error {
	var errs []error
	for _, fam := range families {
		i := slices.IndexFunc(exits, func(e Exit) bool { return e.family() == fam })
		if i < 0 {
			errs = append(errs, removeRoutes(fam), removeRule(fam))
			continue
		}
		if err := setRoute(exits[i]); err != nil {
			return err
		}
		if err := addRule(fam); err != nil {
			return err
		}
	}
	return errors.Join(errs...)
}

// Bond turns direct routing off for new connections; established direct connections
// keep their path (the route and rule stay).
func (r *Router) Bond() error {
	return r.install(false)
}

// install replaces the nftables table; markNew adds the rule that marks new LAN
// connections.
func (r *Router) install(markNew bool) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("fallback: open nftables: %w", err)
	}
	nat.DeleteTable(c, TableName)
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName})
	pre := c.AddChain(&nftables.Chain{
		Name: "prerouting", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle,
	})
	if markNew {
		var e []expr.Any
		for _, name := range append(append([]string(nil), r.Uplinks...), r.Tunnel) {
			e = append(e, nat.IfaceMatch(expr.MetaKeyIIFNAME, name, expr.CmpOpNeq)...)
		}
		e = append(e, ctStateNew()...)
		// Only what the bond would carry (the main table routes it into the tunnel):
		// traffic between LAN subnets, or to routes of the user's own, stays as it is.
		tun, err := netlink.LinkByName(r.Tunnel)
		if err != nil {
			return fmt.Errorf("fallback: tunnel interface %s: %w", r.Tunnel, err)
		}
		e = append(e, routedInto(tun.Attrs().Index)...)
		e = append(e, setCtMark()...)
		c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: e})
	}
	// Original-direction packets of direct connections get the packet mark that the
	// routing rule selects (replies must not: they go to the LAN by the main table).
	c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: append(append(ctMarkIs(), ctOriginal()...), setMetaMark()...)})
	post := c.AddChain(&nftables.Chain{
		Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource,
	})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: append(ctMarkIs(), &expr.Masq{})})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("fallback: install table inet %s: %w (does the kernel have nf_tables, nft_ct and nft_masq?)", TableName, err)
	}
	return nil
}

// Remove deletes the table, the rules and the routes, whichever exist.
func Remove() error {
	var errs []error
	if c, err := nftables.New(); err != nil {
		errs = append(errs, err)
	} else if nat.DeleteTable(c, TableName) {
		if err := c.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("delete table inet %s: %w", TableName, err))
		}
	}
	for _, fam := range families {
		errs = append(errs, removeRule(fam), removeRoutes(fam))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("fallback: cleanup: %w", err)
	}
	return nil
}

// removeRule deletes the rule of family fam that selects Table, if there is one.
func removeRule(fam int) error {
	rules, err := netlink.RuleList(fam)
	if err != nil {
		return err
	}
	var errs []error
	for i := range rules {
		if rules[i].Table == Table && rules[i].Priority == RulePriority {
			if err := netlink.RuleDel(&rules[i]); err != nil {
				errs = append(errs, fmt.Errorf("delete routing rule: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// removeRoutes deletes the routes of family fam in Table.
func removeRoutes(fam int) error {
	routes, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: Table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return err
	}
	var errs []error
	for i := range routes {
		if err := netlink.RouteDel(&routes[i]); err != nil {
			errs = append(errs, fmt.Errorf("delete route in table %d: %w", Table, err))
		}
	}
	return errors.Join(errs...)
}

// setRoute makes the exit the one default route of its IP version in Table.
func setRoute(exit Exit) error {
	l, err := netlink.LinkByName(exit.Interface)
	if err != nil {
		return fmt.Errorf("fallback: uplink %s: %w", exit.Interface, err)
	}
	dst := &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
	if exit.IPv6 {
		dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Table: Table, Dst: dst, Protocol: netcfg.RouteProtocol}
	if exit.Gateway.IsValid() {
		r.Gw = exit.Gateway.AsSlice()
	} else {
		r.Scope = netlink.SCOPE_LINK
	}
	if err := netlink.RouteReplace(r); err != nil {
		return fmt.Errorf("fallback: default route via %s in table %d: %w", exit.Interface, Table, err)
	}
	return nil
}

// addRule adds "fwmark Mark lookup Table" for family fam unless it is there.
func addRule(fam int) error {
	rules, err := netlink.RuleList(fam)
	if err != nil {
		return fmt.Errorf("fallback: list routing rules: %w", err)
	}
	for _, r := range rules {
		if r.Table == Table && r.Priority == RulePriority {
			return nil
		}
	}
	r := netlink.NewRule()
	r.Family, r.Table, r.Priority, r.Mark = fam, Table, RulePriority, Mark
	mask := uint32(0xffffffff)
	r.Mask = &mask
	if err := netlink.RuleAdd(r); err != nil {
		return fmt.Errorf("fallback: add routing rule fwmark %#x lookup %d: %w", Mark, Table, err)
	}
	return nil
}

func ctStateNew() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// routedInto matches packets whose destination the routing table sends out of ifindex.
func routedInto(ifindex int) []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultOIF: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(uint32(ifindex))},
	}
}

func ctOriginal() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeyDIRECTION},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0}}, // IP_CT_DIR_ORIGINAL
	}
}

func ctMarkIs() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeyMARK},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(Mark)},
	}
}

func setCtMark() []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(Mark)},
		&expr.Ct{Register: 1, Key: expr.CtKeyMARK, SourceRegister: true},
	}
}

func setMetaMark() []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(Mark)},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1, SourceRegister: true},
	}
}
