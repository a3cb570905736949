// Package nat installs aggd's masquerading rules with nftables (through netlink, no nft
// binary). All rules live in one table of aggd's own, so removing them is removing the
// table, and a table left by a crashed daemon is replaced at start.
package nat

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// TableName is the nftables table (family inet) that holds every rule aggd installs.
const TableName = "aggd"

// Masquerade describes one rule: packets that leave through OutIface (when set), and that
// entered through InIface (when set), but not through NotOutIface (when set), get the
// source address of the interface they leave through.
type Masquerade struct {
	InIface     string
	OutIface    string
	NotOutIface string
}

// Install replaces aggd's table with one postrouting NAT chain holding the given rules.
func Install(rules []Masquerade) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nat: open nftables: %w", err)
	}
	removeTable(c)
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName})
	ch := c.AddChain(&nftables.Chain{
		Name:     "postrouting",
		Table:    t,
		Type:     nftables.ChainTypeNAT,
		Hooknum:  nftables.ChainHookPostrouting,
		Priority: nftables.ChainPriorityNATSource,
	})
	for _, r := range rules {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.exprs()})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nat: install table inet %s: %w (does the kernel have nf_tables and nft_masq?)", TableName, err)
	}
	return nil
}

// Remove deletes aggd's table if present and reports whether it was.
func Remove() (existed bool, err error) {
	c, err := nftables.New()
	if err != nil {
		return false, fmt.Errorf("nat: open nftables: %w", err)
	}
	if !removeTable(c) {
		return false, nil
	}
	if err := c.Flush(); err != nil {
		return true, fmt.Errorf("nat: delete table inet %s: %w", TableName, err)
	}
	return true, nil
}

// removeTable queues deletion of aggd's table and reports whether it existed.
func removeTable(c *nftables.Conn) bool { return DeleteTable(c, TableName) }

// DeleteTable queues deletion of the inet table name and reports whether it existed.
func DeleteTable(c *nftables.Conn, name string) bool {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false
	}
	for _, t := range tables {
		if t.Name == name {
			c.DelTable(t)
			return true
		}
	}
	return false
}

func (m Masquerade) exprs() []expr.Any {
	var e []expr.Any
	if m.InIface != "" {
		e = append(e, IfaceMatch(expr.MetaKeyIIFNAME, m.InIface, expr.CmpOpEq)...)
	}
	if m.OutIface != "" {
		e = append(e, IfaceMatch(expr.MetaKeyOIFNAME, m.OutIface, expr.CmpOpEq)...)
	}
	if m.NotOutIface != "" {
		e = append(e, IfaceMatch(expr.MetaKeyOIFNAME, m.NotOutIface, expr.CmpOpNeq)...)
	}
	return append(e, &expr.Masq{})
}

// IfaceMatch compares the packet's input or output interface name (key) with name.
func IfaceMatch(key expr.MetaKey, name string, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: ifname(name)},
	}
}

// ifname pads an interface name the way the kernel stores it (IFNAMSIZ bytes, NUL filled).
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}
