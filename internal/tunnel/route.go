package tunnel

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"sort"
	"syscall"
)

// prefixTable maps inner destinations to peers by longest-prefix match. Lookups probe
// one map per prefix length in use, longest first: a handful of map reads per packet
// whatever the number of peers.
type prefixTable struct {
	byPrefix map[netip.Prefix]string
	lengths4 []int // distinct IPv4 prefix lengths in use, longest first
	lengths6 []int
}

func (t *prefixTable) add(p netip.Prefix, peer string) {
	if t.byPrefix == nil {
		t.byPrefix = make(map[netip.Prefix]string)
	}
	p = p.Masked()
	t.byPrefix[p] = peer
	if p.Addr().Is4() {
		t.lengths4 = insertLength(t.lengths4, p.Bits())
	} else {
		t.lengths6 = insertLength(t.lengths6, p.Bits())
	}
}

func (t *prefixTable) lookup(a netip.Addr) (string, bool) {
	lengths := t.lengths6
	if a.Is4() {
		lengths = t.lengths4
	}
	for _, bits := range lengths {
		p, _ := a.Prefix(bits)
		if peer, ok := t.byPrefix[p]; ok {
			return peer, true
		}
	}
	return "", false
}

func insertLength(ls []int, bits int) []int {
	for _, l := range ls {
		if l == bits {
			return ls
		}
	}
	ls = append(ls, bits)
	sort.Sort(sort.Reverse(sort.IntSlice(ls)))
	return ls
}

// innerDestination reads the destination address of an IPv4 or IPv6 packet.
func innerDestination(pkt []byte) (netip.Addr, bool) {
	if len(pkt) < 1 {
		return netip.Addr{}, false
	}
	switch pkt[0] >> 4 {
	case 4:
		if len(pkt) < 20 {
			return netip.Addr{}, false
		}
		return netip.AddrFrom4([4]byte(pkt[16:20])), true
	case 6:
		if len(pkt) < 40 {
			return netip.Addr{}, false
		}
		return netip.AddrFrom16([16]byte(pkt[24:40])), true
	}
	return netip.Addr{}, false
}

// isClosed reports whether a read failed because the device or socket was closed.
func isClosed(err error) bool {
	return errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.EBADF)
}
