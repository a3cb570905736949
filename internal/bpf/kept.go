package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Kept packets (tx_kept in bpf/tc_tx.c, struct aggd_fp_kept): the transmit program
// keeps each packet it sends in its session's ring, so that the daemon can send a copy
// of what a link had in flight when the link goes into doubt (internal/tunnel's rescue),
// as it does for the packets it sends itself.

const (
	// KeptPackets is how many of a session's latest packets its ring holds
	// (AGGD_FP_KEPT): the one with global sequence number seq is in element
	// seq % KeptPackets until a newer one takes its place.
	KeptPackets = 256
	// KeptBytes is the longest inner packet the ring keeps (AGGD_FP_KEPT_BYTES).
	KeptBytes = 1500
	// keptValueSize is the size of struct aggd_fp_kept: seq_head (8), len (4), the
	// packet, seq_tail (8).
	keptValueSize = 12 + KeptBytes + 8
)

// keptRingSpec returns the spec of a session's ring (tx_kept's inner map), checked
// against the layout this code reads.
func keptRingSpec(spec *ebpf.CollectionSpec) (*ebpf.MapSpec, error) {
	outer, ok := spec.Maps["tx_kept"]
	if !ok || outer.InnerMap == nil {
		return nil, errors.New("object has no tx_kept map of maps (rebuild with go generate)")
	}
	inner := outer.InnerMap.Copy()
	if inner.ValueSize != keptValueSize || inner.MaxEntries != KeptPackets {
		return nil, fmt.Errorf("tx_kept's rings have value size %d and %d entries, want %d and %d (object and Go code out of step: rebuild)",
			inner.ValueSize, inner.MaxEntries, keptValueSize, KeptPackets)
	}
	return inner, nil
}

// EnableKept gives the session in slot a new, empty ring of kept packets (389 kB of
// kernel memory), in place of any it had: from then on the program keeps every packet
// it sends for the session. Call it once per session: a ring left by an earlier
// session in the slot (one a daemon before this one pinned) holds packets under the
// numbers the new one sends, which a rescue must never send as the new session's.
// DeleteSession removes the ring.
func (t *Tx) EnableKept(slot uint32) error {
	if slot >= MaxTxSessions {
		return fmt.Errorf("enable kept packets: slot %d out of range", slot)
	}
	ring, err := ebpf.NewMap(t.keptRing)
	if err != nil {
		return fmt.Errorf("enable kept packets of session %d: create its ring: %w", slot, loadErr(err))
	}
	defer func() { _ = ring.Close() }() // tx_kept holds its own reference
	if err := t.objs.TxKept.Update(slot, ring, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("enable kept packets of session %d: %w", slot, err)
	}
	return nil
}

// Kept returns the inner packets the program sent for the session in slot with the
// global sequence numbers seqs, each in its own buffer: nil where the ring no longer
// holds the packet (a newer one took its place, it was too long to keep, or a CPU was
// writing its element while it was read). The caller should ask for recent numbers
// only: a packet is kept until KeptPackets more have been sent.
func (t *Tx) Kept(slot uint32, seqs []uint32) ([][]byte, error) {
	if slot >= MaxTxSessions {
		return nil, fmt.Errorf("kept packets: slot %d out of range", slot)
	}
	var ring *ebpf.Map
	if err := t.objs.TxKept.Lookup(slot, &ring); err != nil {
		return nil, fmt.Errorf("kept packets of session %d: %w", slot, err)
	}
	defer func() { _ = ring.Close() }()
	out := make([][]byte, len(seqs))
	for i, seq := range seqs {
		v, err := ring.LookupBytes(seq % KeptPackets)
		if err != nil {
			return nil, fmt.Errorf("kept packet %d of session %d: %w", seq, slot, err)
		}
		if out[i] = keptPacket(v, seq); out[i] != nil {
			fillPendingChecksum(out[i])
		}
	}
	return out, nil
}

// fillPendingChecksum fills in the TCP or UDP checksum of the IPv4 or IPv6 packet p
// if it is still pending: the program keeps a packet as it finds it on agg0's egress,
// and there a packet sent by a local socket or forwarded from a veth (a container, a
// VM, the lab's LAN) carries only its pseudo-header's folded sum in the field
// (CHECKSUM_PARTIAL; the uplink's transmit fills it in for the packet the program
// sends). A copy the daemon sends of the kept bytes is bytes only, and the receiving
// host drops a segment with that checksum as corrupt: in the lab's standby scenario
// with the fast path, every rescue copy of what the dead primaries had in flight
// reached the headend and was delivered, and TCP resent them all after its
// retransmission timeout (BENCHMARKS.md, "Late copies, and no AQM drop in a
// failover"). The pending state is recognised as the transmit program recognises it
// (tx_inner_sum): the field equals the folded pseudo-header sum. A complete checksum
// that happens to equal it is recomputed to itself. Fragments, IPv6 extension headers,
// other protocols and packets whose lengths do not add up are left as they are.
func fillPendingChecksum(p []byte) {
	var hlen int
	var proto byte
	var addrs []byte // source and destination, back to back
	switch {
	case len(p) >= 20 && p[0]>>4 == 4:
		hlen = int(p[0]&0x0f) * 4
		fragment := binary.BigEndian.Uint16(p[6:])&0x3fff != 0 // MF or an offset
		if hlen < 20 || int(binary.BigEndian.Uint16(p[2:])) != len(p) || fragment {
			return
		}
		proto, addrs = p[9], p[12:20]
	case len(p) >= 40 && p[0]>>4 == 6:
		hlen = 40
		if 40+int(binary.BigEndian.Uint16(p[4:])) != len(p) {
			return
		}
		proto, addrs = p[6], p[8:40]
	default:
		return
	}
	seg := p[hlen:]
	var check int
	switch {
	case proto == unix.IPPROTO_TCP && len(seg) >= 20:
		check = 16
	case proto == unix.IPPROTO_UDP && len(seg) >= 8:
		check = 6
	default:
		return
	}
	n := len(seg) // the pseudo-header's length and protocol, as IPv6's 32-bit words (the same sum as IPv4's)
	pseudo := csumAdd(csumAdd(0, addrs), []byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n), 0, 0, 0, proto})
	if binary.BigEndian.Uint16(seg[check:]) != csumFold(pseudo) {
		return
	}
	binary.BigEndian.PutUint16(seg[check:], 0)
	sum := ^csumFold(csumAdd(pseudo, seg))
	if sum == 0 && proto == unix.IPPROTO_UDP {
		sum = 0xffff // 0 says "no checksum" in UDP
	}
	binary.BigEndian.PutUint16(seg[check:], sum)
}

// csumAdd adds b, as big-endian 16-bit words (an odd last byte padded with zero), to
// the one's complement sum s, unfolded.
func csumAdd(s uint32, b []byte) uint32 {
	for len(b) >= 2 {
		s += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	return s
}

// csumFold folds a one's complement sum to 16 bits.
func csumFold(s uint32) uint16 {
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// keptPacket returns the packet in the ring element v if it is the one sent with seq
// and was read whole: seq_head and seq_tail both name it (the writer sets seq_tail
// first and seq_head last, and the read copied from the start to the end).
func keptPacket(v []byte, seq uint32) []byte {
	if len(v) != keptValueSize {
		return nil
	}
	head := binary.NativeEndian.Uint64(v[0:8])
	n := binary.NativeEndian.Uint32(v[8:12])
	tail := binary.NativeEndian.Uint64(v[12+KeptBytes:])
	if head != uint64(seq) || tail != uint64(seq) || n == 0 || n > KeptBytes {
		return nil
	}
	return v[12 : 12+n : 12+n]
}
