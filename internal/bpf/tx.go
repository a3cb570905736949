package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Limits of the transmit fast path (bpf/include/aggd_fastpath.h).
const (
	// MaxTxLinks is how many links of a session the fast path schedules over.
	MaxTxLinks = 8
	// MaxTxSessions is how many sessions it serves; slots are 0 to MaxTxSessions-1.
	MaxTxSessions = 1024
	// SentLogSize is how many of a link's most recent packets its sent log holds
	// (AGGD_FP_SENT_LOG).
	SentLogSize = 1024
)

// TxVerdicts names the transmit fast path's counters, indexed like enum
// aggd_fp_tx_verdict: "fast" for packets it encapsulated and sent, the others
// for packets it handed to the slow path (the daemon reads them from agg0).
// LoadTx checks this list against the enum compiled into the object.
var TxVerdicts = []string{"fast", "not_ip", "no_route", "disabled", "gso", "oversize", "no_link", "no_neigh", "encap_failed", "aqm_drop", "aqm_mark", "aqm_drop_ect"}

// TxLinkState is a link's state as the fast path's scheduler sees it.
type TxLinkState uint8

const (
	// TxLinkDown links are not scheduled.
	TxLinkDown TxLinkState = 0
	// TxLinkUp links are scheduled.
	TxLinkUp TxLinkState = 1
	// TxLinkSuspect links are scheduled, and each of their packets is also
	// copied to the best other link.
	TxLinkSuspect TxLinkState = 2
)

// TxLink is one uplink of a session as the fast path sends on it.
type TxLink struct {
	// Ifindex is the uplink's interface; 0 leaves the link slot unused.
	Ifindex int
	// LinkID goes into the header's Link ID field.
	LinkID uint8
	State  TxLinkState
	// Class is the link's class (sched.Class: 0 primary, 1 overflow, 2 backup).
	Class uint8
	// Ethernet links are sent with bpf_redirect_neigh via Gateway (or Dst
	// when Gateway is the zero Addr: on-link); other links are L3 devices
	// (PPP, raw-IP WWAN) and get the packet as it is.
	Ethernet bool
	// NeighOK says the gateway's neighbour entry is resolved. While it is
	// not, packets the scheduler puts on this Ethernet link go to the slow
	// path (verdict no_neigh).
	NeighOK bool
	// Src and Dst are the outer addresses and UDP ports: both IPv4 or both
	// IPv6, and Gateway (if set) of the same version.
	Src, Dst netip.AddrPort
	Gateway  netip.Addr
	// GatewayMAC and SrcMAC are an IPv6 Ethernet link's next hop's and own
	// hardware addresses: what a redundant copy on the link carries (the
	// program sends a copy as it is, and for IPv6 cannot ask the kernel,
	// whose FIB lookup refuses link-local next hops). Without them the link
	// gets no copies. IPv4 links do not use them.
	GatewayMAC, SrcMAC net.HardwareAddr
	// RateBps is the rate the scheduler assumes; 0 makes the link unusable.
	RateBps uint64
	// BaseOWD is the link's one-way delay without queueing, relative to
	// the session's fastest link (whole microseconds are used).
	BaseOWD time.Duration
}

// TxSession is a session's transmit side in the fast path.
type TxSession struct {
	// Enabled lets the fast path send for the session; while false every
	// packet of the session goes to the slow path (verdict disabled).
	Enabled bool
	// PeerIndex is the receiver's index, the header's Session field.
	PeerIndex uint32
	// KeyID and Key are the send key generation and its SipHash key.
	KeyID uint8
	Key   [16]byte
	// MTU is the largest inner packet the fast path sends; longer non-GSO
	// packets go to the slow path (verdict oversize). 0 to 65535.
	MTU int
	// AQMGap is the bond's AQM drop spacing while it drops (bpf/include/aggd_aqm.h):
	// the kernel drops one packet, then one each AQMGap; 0: no dropping. Whole
	// microseconds, at most about 71 minutes.
	AQMGap time.Duration
	// ECN: where the AQM drops, an ECN-capable packet is marked Congestion
	// Experienced and sent instead (bpf/include/aggd_ecn.h; verdict aqm_mark).
	ECN bool
	// Links[i] is link slot i (the index TxSeq.TakeLink and LinkCounts use).
	Links []TxLink
}

// TxLinkCounts is what the fast path sent on one link of a session.
type TxLinkCounts struct {
	Packets uint64 // datagrams, copies included
	Bytes   uint64 // inner bytes
	Copies  uint64 // redundant copies of a suspect link's packets
}

// TxSessionCounts is what the bond's AQM did to a session's packets in the kernel.
type TxSessionCounts struct {
	AQMDrops    uint64 // dropped
	AQMDropsECT uint64 // of AQMDrops, the ECN-capable
	AQMMarks    uint64 // marked Congestion Experienced and sent
}

// Tx is the loaded transmit fast path (aggd_tc_tx, for agg0's egress) and
// its maps.
type Tx struct {
	objs     fptxObjects
	seqMem   []byte        // tx_seq, mmapped
	keptRing *ebpf.MapSpec // a session's ring of kept packets (kept.go)
}

// LoadTx loads the transmit fast path into the kernel. The caller attaches
// Program to agg0's egress and must Close the Tx.
func LoadTx() (*Tx, error) {
	return loadTx(0, "")
}

// LoadTxPinned is LoadTx with the maps pinned in dir (see loadCollection): a
// transmit path an earlier daemon pinned there is adopted with all its state
// (sessions, routes, sequence numbers, counters).
func LoadTxPinned(dir string) (*Tx, error) {
	return loadTx(0, dir)
}

// loadTx loads the program for packets that start l2 bytes before their IP
// header: 0 on agg0, 14 under BPF_PROG_TEST_RUN (see in_l2_len in tc_tx.c).
func loadTx(l2 uint32, pinDir string) (*Tx, error) {
	spec, err := loadFptx()
	if err != nil {
		return nil, fmt.Errorf("load tx fast path: %w", err)
	}
	if err := checkTxVerdictEnum(spec); err != nil {
		return nil, fmt.Errorf("load tx fast path: %w", err)
	}
	if l2 != 0 {
		v, ok := spec.Variables["in_l2_len"]
		if !ok {
			return nil, errors.New("load tx fast path: object has no in_l2_len variable (rebuild with go generate)")
		}
		if err := v.Set(l2); err != nil {
			return nil, fmt.Errorf("load tx fast path: set in_l2_len: %w", err)
		}
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("load tx fast path: %w", permErr(err))
	}
	ring, err := keptRingSpec(spec)
	if err != nil {
		return nil, fmt.Errorf("load tx fast path: %w", err)
	}
	t := &Tx{keptRing: ring}
	if err := loadCollection(spec, &t.objs, pinDir); err != nil {
		return nil, fmt.Errorf("load tx fast path: %w", loadErr(err))
	}
	if err := t.mapSeq(); err != nil {
		return nil, fmt.Errorf("load tx fast path: %w", errors.Join(err, t.objs.Close()))
	}
	return t, nil
}

// txSeqSize is the size of one tx_seq value: next_seq and the link numbers.
const txSeqSize = 8 + 8*MaxTxLinks

// mapSeq maps tx_seq into the process (BPF_F_MMAPABLE array: the values lie
// back to back from offset 0, each 8-byte aligned).
func (t *Tx) mapSeq() error {
	m := t.objs.TxSeq
	if m.ValueSize() != txSeqSize || m.MaxEntries() != MaxTxSessions {
		return fmt.Errorf("tx_seq has value size %d and %d entries, want %d and %d (object and Go code out of step: rebuild)",
			m.ValueSize(), m.MaxEntries(), txSeqSize, MaxTxSessions)
	}
	page := os.Getpagesize()
	size := (txSeqSize*MaxTxSessions + page - 1) / page * page
	mem, err := unix.Mmap(m.FD(), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap tx_seq (needs a kernel with BPF_F_MMAPABLE arrays, 5.5+): %w", err)
	}
	t.seqMem = mem
	return nil
}

// Program returns the loaded tc program (to attach to agg0's egress, and for
// tests and pinning). It stays owned by the Tx.
func (t *Tx) Program() *ebpf.Program { return t.objs.AggdTcTx }

// SetSession installs or replaces the transmit side of the session in slot.
// The replacement is one map update: the program sees the old session or the
// new one. The scheduler's state for the slot is created on first use and
// kept across replacements, so a busy link does not look idle after a
// parameter update.
func (t *Tx) SetSession(slot uint32, s TxSession) error {
	if slot >= MaxTxSessions {
		return fmt.Errorf("set tx session: slot %d out of range (0 to %d)", slot, MaxTxSessions-1)
	}
	v, err := txSessionValue(s)
	if err != nil {
		return fmt.Errorf("set tx session %d: %w", slot, err)
	}
	var sched fptxAggdFpTxSched
	err = t.objs.TxSched.Update(slot, &sched, ebpf.UpdateNoExist)
	if err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("set tx session %d: create scheduler state: %w", slot, err)
	}
	if err := t.objs.TxSessions.Update(slot, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("set tx session %d: %w", slot, err)
	}
	return nil
}

// txSessionValue checks s and lays it out as the C side reads it.
func txSessionValue(s TxSession) (fptxAggdFpTxSession, error) {
	var v fptxAggdFpTxSession
	if len(s.Links) > MaxTxLinks {
		return v, fmt.Errorf("%d links, the fast path schedules at most %d: leave the session to the slow path", len(s.Links), MaxTxLinks)
	}
	if s.MTU < 0 || s.MTU > 0xffff {
		return v, fmt.Errorf("mtu %d out of range (0 to 65535)", s.MTU)
	}
	if s.Enabled {
		v.Flags = 1 // AGGD_FP_SESSION_ENABLED
	}
	if s.ECN {
		v.Flags |= 2 // AGGD_FP_SESSION_ECN
	}
	v.PeerIndex = wireOrder32(s.PeerIndex)
	v.KeyId = s.KeyID
	v.Nlinks = uint8(len(s.Links))
	v.Mtu = uint16(s.MTU)
	v.Key = s.Key
	if s.AQMGap < 0 || s.AQMGap/time.Microsecond > 1<<31-1 {
		return v, fmt.Errorf("aqm gap %s out of range (0 to 35 minutes)", s.AQMGap)
	}
	v.AqmGapUs = uint32(s.AQMGap / time.Microsecond)
	if s.AQMGap > 0 && v.AqmGapUs == 0 {
		v.AqmGapUs = 1
	}
	for i, l := range s.Links {
		if l.Ifindex == 0 {
			continue // unused slot
		}
		if l.Ifindex < 0 || l.Ifindex > 1<<31-1 {
			return v, fmt.Errorf("link %d: ifindex %d out of range", i, l.Ifindex)
		}
		if l.State > TxLinkSuspect {
			return v, fmt.Errorf("link %d: state %d unknown (want down, up or suspect)", i, l.State)
		}
		if l.Class > 2 {
			return v, fmt.Errorf("link %d: class %d unknown (want 0 primary, 1 overflow or 2 backup)", i, l.Class)
		}
		if l.LinkID == 255 { // AGGD_LINK_ID_RESERVED
			return v, fmt.Errorf("link %d: link id %d is reserved", i, l.LinkID)
		}
		src, dst := l.Src.Addr().Unmap(), l.Dst.Addr().Unmap()
		if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
			return v, fmt.Errorf("link %d: outer addresses %s -> %s: want both IPv4 or both IPv6", i, l.Src, l.Dst)
		}
		if l.Src.Port() == 0 || l.Dst.Port() == 0 {
			return v, fmt.Errorf("link %d: outer ports %s -> %s: a port is 0", i, l.Src, l.Dst)
		}
		var gw netip.Addr
		if l.Gateway.IsValid() {
			gw = l.Gateway.Unmap()
			if gw.Is4() != dst.Is4() {
				return v, fmt.Errorf("link %d: gateway %s is not of the outer addresses' IP version (%s)", i, l.Gateway, l.Dst.Addr())
			}
		}
		for _, m := range []net.HardwareAddr{l.GatewayMAC, l.SrcMAC} {
			if len(m) != 0 && len(m) != 6 {
				return v, fmt.Errorf("link %d: hardware address %s is not 6 bytes", i, m)
			}
		}
		if l.BaseOWD < 0 || l.BaseOWD/time.Microsecond > 1<<32-1 {
			return v, fmt.Errorf("link %d: base one-way delay %v out of range (0 to ~71 minutes)", i, l.BaseOWD)
		}
		var flags uint8
		if l.Ethernet {
			flags |= 0x01 // AGGD_FP_LINK_ETHERNET
		}
		if l.NeighOK {
			flags |= 0x02 // AGGD_FP_LINK_NEIGH_OK
		}
		if dst.Is6() {
			flags |= 0x04 // AGGD_FP_LINK_IPV6
		}
		c := &v.Links[i]
		c.Ifindex = uint32(l.Ifindex)
		c.LinkId = l.LinkID
		c.State = uint8(l.State)
		c.Cls = l.Class
		c.Flags = flags
		c.Saddr = addrBytes(src)
		c.Daddr = addrBytes(dst)
		c.Sport = wireOrder16(l.Src.Port())
		c.Dport = wireOrder16(l.Dst.Port())
		if gw.IsValid() {
			c.Gateway = addrBytes(gw)
		}
		if dst.Is6() && len(l.GatewayMAC) == 6 && len(l.SrcMAC) == 6 {
			c.GwMac = [6]byte(l.GatewayMAC)
			c.SrcMac = [6]byte(l.SrcMAC)
		}
		c.RateBps = l.RateBps
		c.BaseOwdUs = uint32(l.BaseOWD / time.Microsecond)
	}
	return v, nil
}

// wireOrder32 and friends give the value whose in-memory bytes (as the
// generated structs are marshalled: host order) are v's big-endian bytes,
// for the fields aggd_fastpath.h keeps in wire order.
func wireOrder32(v uint32) uint32 {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return binary.NativeEndian.Uint32(b[:])
}

func wireOrder16(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// addrBytes lays an address out as aggd_fp_tx_link keeps it: wire order, an
// IPv4 address in the first 4 bytes.
func addrBytes(a netip.Addr) [16]byte {
	var b [16]byte
	copy(b[:], a.AsSlice())
	return b
}

// DeleteSession removes the session in slot (its packets then go to the slow
// path as no_route), its scheduler state, its links' sent logs and its kept
// packets. Its sequence numbers stay in tx_seq. Deleting an absent session is not an error.
func (t *Tx) DeleteSession(slot uint32) error {
	if err := t.objs.TxSessions.Delete(slot); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete tx session %d: %w", slot, err)
	}
	if err := t.objs.TxSched.Delete(slot); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete tx session %d: scheduler state: %w", slot, err)
	}
	for i := range MaxTxLinks {
		if err := t.objs.TxSentLog.Delete(sentLogKey(slot, i)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete tx session %d: sent log of link slot %d: %w", slot, i, err)
		}
	}
	if err := t.objs.TxKept.Delete(slot); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete tx session %d: kept packets: %w", slot, err)
	}
	return nil
}

// Sent logs (tx_sent_log): which global sequence number each recent packet the
// fast path sent on a link carried, so that the daemon can name them in a loss
// notice when the link goes down. Entry k of a log holds link_seq<<32 | seq for
// the newest packet whose link_seq % SentLogSize is k.

// SentEntry is one logged packet: its link and global sequence numbers.
type SentEntry struct{ LinkSeq, Seq uint32 }

func sentLogKey(slot uint32, i int) uint32 { return slot*MaxTxLinks + uint32(i) }

// EnableSentLog creates the sent log of link slot i of the session in slot, if
// it has none: from then on the program logs the link's packets that it sends
// without a copy. A new log holds no entry any link sequence number near the
// session's start matches.
func (t *Tx) EnableSentLog(slot uint32, i int) error {
	if slot >= MaxTxSessions || i < 0 || i >= MaxTxLinks {
		return fmt.Errorf("enable sent log: slot %d, link slot %d out of range", slot, i)
	}
	var v fptxAggdFpSentLog
	for k := range v.Entry {
		v.Entry[k] = uint64(uint32(k)|0x80000000) << 32 // half the number space away from 0
	}
	err := t.objs.TxSentLog.Update(sentLogKey(slot, i), &v, ebpf.UpdateNoExist)
	if err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("enable sent log of session %d, link slot %d: %w", slot, i, err)
	}
	return nil
}

// SentOn returns the logged packets of link slot i of the session in slot whose
// link sequence numbers follow after, up to and including through, in link
// order. missing counts the numbers in that span the log has no entry for:
// packets sent with a copy, sent by the daemon, or overwritten (more than
// SentLogSize in the span), or whose entry a CPU is still writing.
func (t *Tx) SentOn(slot uint32, i int, after, through uint32) (sent []SentEntry, missing int, err error) {
	if slot >= MaxTxSessions || i < 0 || i >= MaxTxLinks {
		return nil, 0, fmt.Errorf("sent log: slot %d, link slot %d out of range", slot, i)
	}
	var v fptxAggdFpSentLog
	if err := t.objs.TxSentLog.Lookup(sentLogKey(slot, i), &v); err != nil {
		return nil, 0, fmt.Errorf("sent log of session %d, link slot %d: %w", slot, i, err)
	}
	span := through - after // numbers after+1 .. through, modulo 2^32
	if span > 1<<31 {
		return nil, 0, nil // through is not after after: nothing in between
	}
	first := after + 1
	if span > SentLogSize {
		missing += int(span - SentLogSize)
		first = through - SentLogSize + 1
	}
	for ls := first; ls != through+1; ls++ {
		e := v.Entry[ls%SentLogSize]
		if uint32(e>>32) != ls {
			missing++
			continue
		}
		sent = append(sent, SentEntry{LinkSeq: ls, Seq: uint32(e)})
	}
	return sent, missing, nil
}

// SessionSlots lists the slots that hold a session.
func (t *Tx) SessionSlots() ([]uint32, error) {
	var out []uint32
	var slot uint32
	var v fptxAggdFpTxSession
	it := t.objs.TxSessions.Iterate()
	for it.Next(&slot, &v) {
		out = append(out, slot)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("listing tx sessions: %w", err)
	}
	return out, nil
}

// RoutesPerSlot counts the routes that point at each slot.
func (t *Tx) RoutesPerSlot() (map[uint32]int, error) {
	out := make(map[uint32]int)
	var k fptxAggdFpRouteKey
	var slot uint32
	it := t.objs.TxRoutes.Iterate()
	for it.Next(&k, &slot) {
		out[slot]++
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("listing tx routes: %w", err)
	}
	return out, nil
}

// DeleteRoutesTo deletes every route that points at slot.
func (t *Tx) DeleteRoutesTo(slot uint32) error {
	var keys []fptxAggdFpRouteKey
	var k fptxAggdFpRouteKey
	var v uint32
	it := t.objs.TxRoutes.Iterate()
	for it.Next(&k, &v) {
		if v == slot {
			keys = append(keys, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("listing tx routes: %w", err)
	}
	for i := range keys {
		if err := t.objs.TxRoutes.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting a route to slot %d: %w", slot, err)
		}
	}
	return nil
}

// routeKey is the tx_routes key of p: the family byte (4 or 6) and the
// address, prefix length counting the family byte's 8 bits.
func routeKey(p netip.Prefix) (fptxAggdFpRouteKey, error) {
	var k fptxAggdFpRouteKey
	if !p.IsValid() {
		return k, fmt.Errorf("route %s: not a valid prefix", p)
	}
	a := p.Masked().Addr()
	switch {
	case a.Is4():
		k.Data[0] = 4
		b := a.As4()
		copy(k.Data[1:], b[:])
	case a.Is4In6():
		return k, fmt.Errorf("route %s: an IPv4-mapped IPv6 prefix never matches; write it as IPv4", p)
	default:
		k.Data[0] = 6
		b := a.As16()
		copy(k.Data[1:], b[:])
	}
	k.Prefixlen = uint32(8 + p.Bits())
	return k, nil
}

// SetRoute sends packets for inner destinations in p through the session in
// slot (the longest matching prefix wins).
func (t *Tx) SetRoute(p netip.Prefix, slot uint32) error {
	if slot >= MaxTxSessions {
		return fmt.Errorf("set route %s: slot %d out of range (0 to %d)", p, slot, MaxTxSessions-1)
	}
	k, err := routeKey(p)
	if err != nil {
		return fmt.Errorf("set %w", err)
	}
	if err := t.objs.TxRoutes.Update(&k, slot, ebpf.UpdateAny); err != nil {
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.E2BIG) {
			return fmt.Errorf("set route %s: the fast path's route table is full (%d prefixes): %w", p, t.objs.TxRoutes.MaxEntries(), err)
		}
		return fmt.Errorf("set route %s: %w", p, err)
	}
	return nil
}

// DeleteRoute removes the route for exactly p. Deleting an absent route is
// not an error.
func (t *Tx) DeleteRoute(p netip.Prefix) error {
	k, err := routeKey(p)
	if err != nil {
		return fmt.Errorf("delete %w", err)
	}
	if err := t.objs.TxRoutes.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete route %s: %w", p, err)
	}
	return nil
}

// TxSeq is a session's sequence numbers in the memory the fast path takes
// them from: whichever path sends a packet, the session's global and per-link
// numbers stay one series. Numbers are 64-bit counters; the low 32 bits go on
// the wire. A TxSeq is valid until its Tx is closed.
type TxSeq struct {
	v *[1 + MaxTxLinks]uint64
}

// Seq returns the sequence numbers of the session in slot.
func (t *Tx) Seq(slot uint32) (*TxSeq, error) {
	if slot >= MaxTxSessions {
		return nil, fmt.Errorf("tx seq: slot %d out of range (0 to %d)", slot, MaxTxSessions-1)
	}
	if t.seqMem == nil {
		return nil, errors.New("tx seq: the fast path is closed")
	}
	off := int(slot) * txSeqSize
	return &TxSeq{v: (*[1 + MaxTxLinks]uint64)(unsafe.Pointer(&t.seqMem[off]))}, nil
}

// Take takes the next global sequence number.
func (q *TxSeq) Take() uint32 { return uint32(atomic.AddUint64(&q.v[0], 1) - 1) }

// Peek returns the next global sequence number, not taken yet.
func (q *TxSeq) Peek() uint32 { return uint32(atomic.LoadUint64(&q.v[0])) }

// Set makes next the next global sequence number. Only for a session the
// fast path does not send for yet (not enabled): it is not an atomic
// read-modify-write against the program's adds.
func (q *TxSeq) Set(next uint32) { atomic.StoreUint64(&q.v[0], uint64(next)) }

// TakeLink takes the next sequence number of link slot i. i outside 0 to
// MaxTxLinks-1 is a programmer error and panics.
func (q *TxSeq) TakeLink(i int) uint32 { return uint32(atomic.AddUint64(q.link(i), 1) - 1) }

// PeekLink returns the next sequence number of link slot i, not taken yet.
func (q *TxSeq) PeekLink(i int) uint32 { return uint32(atomic.LoadUint64(q.link(i))) }

// SetLink makes next the next sequence number of link slot i; like Set, only
// before the session is enabled.
func (q *TxSeq) SetLink(i int, next uint32) { atomic.StoreUint64(q.link(i), uint64(next)) }

func (q *TxSeq) link(i int) *uint64 {
	if i < 0 || i >= MaxTxLinks {
		panic(fmt.Sprintf("bpf.TxSeq: link slot %d out of range (0 to %d)", i, MaxTxLinks-1))
	}
	return &q.v[1+i]
}

// Verdicts returns the fast path's verdict counters summed over all CPUs,
// keyed by the names in TxVerdicts (every name present).
func (t *Tx) Verdicts() (map[string]uint64, error) {
	return sumPerCPU(t.objs.TxVerdicts, TxVerdicts, "tx verdicts")
}

// LinkCounts returns what the fast path sent on each link slot of the
// session in slot, summed over all CPUs (MaxTxLinks entries).
func (t *Tx) LinkCounts(slot uint32) ([]TxLinkCounts, error) {
	if slot >= MaxTxSessions {
		return nil, fmt.Errorf("tx link counts: slot %d out of range (0 to %d)", slot, MaxTxSessions-1)
	}
	out := make([]TxLinkCounts, MaxTxLinks)
	var perCPU []fptxAggdFpLinkCounts
	for i := range out {
		if err := t.objs.TxLinkStats.Lookup(slot*MaxTxLinks+uint32(i), &perCPU); err != nil {
			return nil, fmt.Errorf("tx link counts %d/%d: %w", slot, i, err)
		}
		for _, c := range perCPU {
			out[i].Packets += c.Packets
			out[i].Bytes += c.Bytes
			out[i].Copies += c.Copies
		}
	}
	return out, nil
}

// SessionCounts returns what the AQM did to the packets of the session in slot,
// summed over all CPUs. The counts outlive sessions: a slot's next session starts
// from its previous one's.
func (t *Tx) SessionCounts(slot uint32) (TxSessionCounts, error) {
	var out TxSessionCounts
	if slot >= MaxTxSessions {
		return out, fmt.Errorf("tx session counts: slot %d out of range (0 to %d)", slot, MaxTxSessions-1)
	}
	var perCPU []fptxAggdFpSessionCounts
	if err := t.objs.TxSessionStats.Lookup(slot, &perCPU); err != nil {
		return out, fmt.Errorf("tx session counts %d: %w", slot, err)
	}
	for _, c := range perCPU {
		out.AQMDrops += c.AqmDrops
		out.AQMDropsECT += c.AqmDropsEct
		out.AQMMarks += c.AqmMarks
	}
	return out, nil
}

// Close unmaps the sequence numbers and releases the program and maps (an
// attached link, or pins, keep them alive in the kernel).
func (t *Tx) Close() error {
	var err error
	if t.seqMem != nil {
		err = unix.Munmap(t.seqMem)
		t.seqMem = nil
	}
	return errors.Join(err, t.objs.Close())
}

// checkTxVerdictEnum compares TxVerdicts with enum aggd_fp_tx_verdict as
// compiled into the object.
func checkTxVerdictEnum(spec *ebpf.CollectionSpec) error {
	return checkEnum(spec, "aggd_fp_tx_verdict", "AGGD_FP_TX_", TxVerdicts, nil)
}
