package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"

	"github.com/aggd/aggd/internal/handover"
)

// RxVerdicts names the receive fast path's counters, indexed like enum
// aggd_fp_rx_verdict: "fast" for DATA packets it delivered into agg0,
// "drop_old" for duplicates and late ones it dropped, "late_copy" for copies of
// numbers the daemon had given up that it delivered out of order, the others for
// packets it passed up to the daemon. LoadRx checks this list against the
// enum compiled into the object.
var RxVerdicts = []string{"fast", "not_data", "no_session", "gap", "daemon_owns", "drop_old", "decap_failed", "malformed",
	"late_copy"}

// Owner says who orders a session's received DATA packets (the kernel or
// the daemon); see internal/handover.
type Owner = handover.Owner

// The owners, as in aggd_fastpath.h.
const (
	OwnerBPF    = handover.OwnerBPF
	OwnerDaemon = handover.OwnerDaemon
)

// Order is a session's receive ordering state (struct aggd_fp_rx_order
// without its lock).
type Order = handover.Order

// RxLinkStats is what the receive fast path delivered on one link of a
// session: the daemon adds it to its own counts.
type RxLinkStats struct {
	Packets    uint64
	Bytes      uint64 // inner bytes
	MaxLinkSeq uint32 // highest link sequence number (serial arithmetic)
	LastTstamp uint32 // the header's timestamp of the latest packet, µs
	// LastArrivalNs is the kernel's CLOCK_MONOTONIC (bpf_ktime_get_ns)
	// when the latest packet arrived.
	LastArrivalNs uint64
}

// Rx is the loaded receive fast path (aggd_tc_rx, for the uplinks' tc
// ingress, behind the XDP shield) and its maps.
//
// A session takes part once EnableSession created its ordering state, with
// the daemon as the owner: the kernel passes every DATA packet up until the
// daemon hands the ordering back (internal/handover). Bpf.Rx implements
// handover.OrderMap.
type Rx struct {
	objs fprxObjects
}

var _ handover.OrderMap = (*Rx)(nil)

// LoadRx loads the receive fast path for the given tunnel UDP port. The
// caller attaches Program to the ingress of every interface tunnel packets
// arrive on, calls SetAgg0, and must Close the Rx.
func LoadRx(tunnelPort uint16) (*Rx, error) {
	return LoadRxPinned(tunnelPort, "")
}

// LoadRxPinned is LoadRx with the maps pinned in dir (see loadCollection):
// the ordering state and counters an earlier daemon pinned there are adopted.
func LoadRxPinned(tunnelPort uint16, dir string) (*Rx, error) {
	if tunnelPort == 0 {
		return nil, errors.New("load rx fast path: tunnel port must not be 0")
	}
	spec, err := loadFprx()
	if err != nil {
		return nil, fmt.Errorf("load rx fast path: %w", err)
	}
	if err := checkRxVerdictEnum(spec); err != nil {
		return nil, fmt.Errorf("load rx fast path: %w", err)
	}
	if err := setTunnelPort(spec, tunnelPort); err != nil {
		return nil, fmt.Errorf("load rx fast path: %w", err)
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("load rx fast path: %w", permErr(err))
	}
	r := &Rx{}
	if err := loadCollection(spec, &r.objs, dir); err != nil {
		return nil, fmt.Errorf("load rx fast path: %w", loadErr(err))
	}
	return r, nil
}

// Program returns the loaded tc program. It stays owned by the Rx.
func (r *Rx) Program() *ebpf.Program { return r.objs.AggdTcRx }

// SetAgg0 tells the program where in-order packets go: the tunnel
// interface's index. 0 makes it deliver nothing (the daemon then gets
// every DATA packet).
func (r *Rx) SetAgg0(ifindex int) error {
	if ifindex < 0 || int64(ifindex) > int64(^uint32(0)) {
		return fmt.Errorf("rx fast path: tunnel interface index %d is out of range", ifindex)
	}
	cfg := fprxAggdFpRxConfig{Agg0Ifindex: uint32(ifindex)}
	if err := r.objs.RxConfig.Update(uint32(0), &cfg, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("rx fast path: set tunnel interface %d: %w", ifindex, err)
	}
	return nil
}

// EnableSession lets the fast path receive for the session with the given
// receive index (the header's Session field): a divert count of 0 and an
// ordering state owned by the daemon in epoch 0. The daemon hands the
// ordering to the kernel when its resequencer is empty (handover.Daemon).
// An enabled session is reset to that state.
func (r *Rx) EnableSession(index uint32) error {
	if index == 0 {
		return errors.New("rx fast path: enable session: index 0 is not a session index")
	}
	key := sessionMapKey(index)
	// The order entry last: the program looks at a session only when both
	// exist, and with the order entry present it counts into the other.
	if err := r.objs.RxDivert.Update(key, fprxAggdFpRxDivert{}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("rx fast path: enable session %#x: %w", index, err)
	}
	o := fprxAggdFpRxOrder{Owner: uint32(OwnerDaemon)}
	if err := r.objs.RxOrder.Update(key, &o, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("rx fast path: enable session %#x: %w", index, err)
	}
	return nil
}

// DisableSession stops the fast path for the session: from then on its
// DATA packets are passed up (no_session). Its counters go too. Disabling
// an absent session is not an error.
func (r *Rx) DisableSession(index uint32) error {
	key := sessionMapKey(index)
	var errs []error
	for _, m := range []*ebpf.Map{r.objs.RxOrder, r.objs.RxDivert} {
		if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	for id := range 256 {
		lk := fprxAggdFpRxLinkKey{Session: nativeSession(index), LinkId: uint32(id)}
		if err := r.objs.RxLinkStats.Delete(&lk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("rx fast path: disable session %#x: %w", index, err)
	}
	return nil
}

// Sessions lists the receive indexes of the sessions the fast path receives for.
func (r *Rx) Sessions() ([]uint32, error) {
	ids, err := sessionIndexes(r.objs.RxOrder)
	if err != nil {
		return nil, fmt.Errorf("rx fast path: listing sessions: %w", err)
	}
	return ids, nil
}

// ReadOrder returns the session's ordering state, read under its lock.
func (r *Rx) ReadOrder(index uint32) (Order, error) {
	var v fprxAggdFpRxOrder
	if err := r.objs.RxOrder.LookupWithFlags(sessionMapKey(index), &v, ebpf.LookupLock); err != nil {
		return Order{}, fmt.Errorf("rx fast path: ordering state of session %#x: %w", index, err)
	}
	return Order{
		Owner: Owner(v.Owner), Next: v.Next, Epoch: v.Epoch,
		ReqValid: v.ReqValid != 0, ReqStamp: v.ReqStamp, ReqNext: v.ReqNext,
		LastDiverted:   handover.PacketID{Link: uint8(v.LastLink), LinkSeq: v.LastLinkSeq},
		DivertedBefore: v.LastBefore,
		ReqSkipped:     v.ReqSkipped, Skipped: v.Skipped, SkippedEnd: v.SkippedEnd,
	}, nil
}

// WriteOrder replaces the session's ordering state under its lock. The
// session must be enabled.
func (r *Rx) WriteOrder(index uint32, o Order) error {
	v := fprxAggdFpRxOrder{
		Owner: uint32(o.Owner), Next: o.Next, Epoch: o.Epoch,
		ReqStamp: o.ReqStamp, ReqNext: o.ReqNext,
		LastBefore: o.DivertedBefore, LastLinkSeq: o.LastDiverted.LinkSeq, LastLink: uint32(o.LastDiverted.Link),
		ReqSkipped: o.ReqSkipped, Skipped: o.Skipped, SkippedEnd: o.SkippedEnd,
	}
	if o.ReqValid {
		v.ReqValid = 1
	}
	if err := r.objs.RxOrder.Update(sessionMapKey(index), &v, ebpf.UpdateLock|ebpf.UpdateExist); err != nil {
		return fmt.Errorf("rx fast path: write ordering state of session %#x: %w", index, err)
	}
	return nil
}

// Diverted returns how many DATA packets of the session the kernel passed
// up to the daemon while the daemon owned the ordering (or at a handover).
func (r *Rx) Diverted(index uint32) (uint64, error) {
	var v fprxAggdFpRxDivert
	if err := r.objs.RxDivert.Lookup(sessionMapKey(index), &v); err != nil {
		return 0, fmt.Errorf("rx fast path: divert count of session %#x: %w", index, err)
	}
	return v.Count, nil
}

// Verdicts returns the receive counters summed over all CPUs, keyed by the
// names in RxVerdicts (every name present).
func (r *Rx) Verdicts() (map[string]uint64, error) {
	return sumPerCPU(r.objs.RxVerdicts, RxVerdicts, "rx fast path: counter")
}

// LinkStats returns what the kernel delivered for the session, per link ID
// (links it delivered nothing for are absent).
func (r *Rx) LinkStats(index uint32) (map[uint8]RxLinkStats, error) {
	out := map[uint8]RxLinkStats{}
	for id := range 256 {
		lk := fprxAggdFpRxLinkKey{Session: nativeSession(index), LinkId: uint32(id)}
		var v fprxAggdFpRxLinkStats
		err := r.objs.RxLinkStats.Lookup(&lk, &v)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("rx fast path: link %d counters of session %#x: %w", id, index, err)
		}
		out[uint8(id)] = RxLinkStats{
			Packets: v.Packets, Bytes: v.Bytes, MaxLinkSeq: v.MaxLinkSeq,
			LastTstamp: v.LastTstamp, LastArrivalNs: v.LastArrivalNs,
		}
	}
	return out, nil
}

// Close unloads the program and its maps (an attached program stays in the
// kernel until it is detached too).
func (r *Rx) Close() error {
	return r.objs.Close()
}

// nativeSession is the session index as a host-order uint32 whose memory
// holds the index's wire (big-endian) bytes: the rx_link_stats key's
// __be32 field as bpf2go types it.
func nativeSession(index uint32) uint32 {
	k := sessionMapKey(index)
	return binary.NativeEndian.Uint32(k[:])
}

// checkRxVerdictEnum compares RxVerdicts with enum aggd_fp_rx_verdict as
// compiled into the object.
func checkRxVerdictEnum(spec *ebpf.CollectionSpec) error {
	return checkEnum(spec, "aggd_fp_rx_verdict", "AGGD_FP_RX_", RxVerdicts, nil)
}
