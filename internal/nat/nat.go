// Package nat installs aggd's netfilter rules with nftables (through netlink, no nft
// binary): masquerading, and the TCP MSS clamp on the tunnel interface. All rules live
// in one table of aggd's own, so removing them is removing the table, and a table left
// by a crashed daemon is replaced at start.
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

// Install replaces aggd's table with a postrouting NAT chain holding the masquerade
// rules, and, with clampIface set, a forward chain that clamps the MSS of TCP
// connections set up through that interface (ClampMSS).
func Install(rules []Masquerade, clampIface string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nat: open nftables: %w", err)
	}
	removeTable(c)
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName})
	if len(rules) > 0 {
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
	}
	if clampIface != "" {
		ch := c.AddChain(&nftables.Chain{
			Name:     "forward",
			Table:    t,
			Type:     nftables.ChainTypeFilter,
			Hooknum:  nftables.ChainHookForward,
			Priority: nftables.ChainPriorityMangle,
		})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: ClampMSS(clampIface)})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nat: install table inet %s: %w (does the kernel have nf_tables, nft_masq, nft_rt and nft_exthdr?)", TableName, err)
	}
	return nil
}

// ClampMSS is the rule `oifname IFACE tcp flags & (syn | rst) == syn tcp option maxseg
// size set rt mtu`: a SYN or SYN-ACK that leaves through the tunnel offers the other
// end an MSS no larger than the tunnel's route MTU allows (the kernel only ever lowers
// it). The far end then sends segments that fit the tunnel, and the tunnel's packets
// fit its uplinks, without relying on ICMP "fragmentation needed" reaching it (path MTU
// discovery, which firewalls break): on a CPE with a PPPoE line the tunnel is 1436, and
// a server answering with 1500-byte packets would otherwise have the headend send
// 1500-byte tunnel packets at a 1492-byte line.
func ClampMSS(iface string) []expr.Any {
	e := IfaceMatch(expr.MetaKeyOIFNAME, iface, expr.CmpOpEq)
	return append(e,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: tcpFlagsOffset, Len: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{tcpSYN | tcpRST}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{tcpSYN}},
		&expr.Rt{Register: 1, Key: expr.RtTCPMSS},
		// rt gives the MSS in host order; the option holds it in network order.
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 2, Size: 2},
		&expr.Exthdr{Op: expr.ExthdrOpTcpopt, Type: tcpOptMaxseg, Offset: 2, Len: 2, SourceRegister: 1},
	)
}

// The TCP header's flags byte and bits, and the MSS option's kind.
const (
	tcpFlagsOffset = 13
	tcpSYN         = 0x02
	tcpRST         = 0x04
	tcpOptMaxseg   = 2
)

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
