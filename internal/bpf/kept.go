package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
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
		out[i] = keptPacket(v, seq)
	}
	return out, nil
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
