package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"

	"github.com/aggd/aggd/internal/bpf"
	"github.com/aggd/aggd/internal/handover"
	"github.com/aggd/aggd/internal/netcfg"
	"github.com/aggd/aggd/internal/tunnel"
)

// fastPath is the kernel forwarding path: the tc program on agg0's egress that stripes
// and encapsulates, and the tc program on the uplinks' ingress that delivers in-order
// packets into agg0. It implements tunnel.FastPath; each session gets a slot in its maps.
type fastPath struct {
	log     *slog.Logger
	tx      *bpf.Tx
	rx      *bpf.Rx
	mtu     atomic.Int32       // the tunnel's MTU: longer packets go to the slow path (setMTU)
	attach  []bpf.TCAttachment // the transmit program's
	nexthop *nexthopCache
	pins    string

	rxMu     sync.Mutex
	rxAttach map[string]bpf.TCAttachment // the receive program's, by interface name
	rxIndex  map[string]int              // and the index each of those interfaces had then

	mu      sync.Mutex
	slots   [maxFastSessions]bool
	open    map[uint32]bool // receive indexes of the open sessions
	adopted *adoptedState   // an earlier run's sessions, until retired
	shield  *bpf.Shield

	// handbacks sums the sessions' handover outcomes (handover.Stats) for the metrics.
	handbacks handbackTotals

	csumMu   sync.Mutex
	csumDone map[int]bool      // interfaces completeChecksums has seen, by index
	csumOff  []string          // interfaces it turned checksum offload off on (turned back on at close)
	rps      map[string]string // RPS masks changed by steerReceive, to restore at close
}

// maxFastSessions is the number of session slots in the fast path's maps
// (AGGD_FP_MAX_SESSIONS in bpf/include/aggd_fastpath.h). Sessions beyond it stay in
// userspace.
const maxFastSessions = 1024

// startFastPath loads both tc programs and attaches them: transmit on the tunnel
// interface's egress, receive on the ingress of every interface tunnel packets arrive
// on (the ones the XDP shield guards, which checks them first). Any failure leaves
// nothing behind and returns why: the caller falls back to userspace forwarding.
//
// With keep.dir set, maps and links are pinned there (see persist.go); with keep.adopt,
// the programs load onto the earlier run's maps and take over its attachments.
func startFastPath(log *slog.Logger, port uint16, tunName string, mtu int, sh *shield, reg *prometheus.Registry, keep persistence) (*fastPath, error) {
	tunIfc, err := netcfg.InterfaceByName(tunName)
	if err != nil {
		return nil, fmt.Errorf("tunnel interface %s: %w", tunName, err)
	}
	rxIfaces := sh.interfaces()
	f := &fastPath{log: log, nexthop: newNexthopCache(), open: make(map[uint32]bool), shield: sh.prog,
		pins: keep.dir, rxAttach: make(map[string]bpf.TCAttachment), rxIndex: make(map[string]int)}
	f.mtu.Store(int32(mtu))
	ok := false
	defer func() {
		if !ok {
			f.close()
			// An earlier run's attachments this run did not take over would keep
			// forwarding with programs nobody programs any more.
			bpf.RemoveLinkPins(keep.dir, "tc_")
		}
	}()
	if f.tx, err = bpf.LoadTxPinned(keep.dir); err != nil {
		return nil, fmt.Errorf("loading the transmit program: %w", err)
	}
	if f.rx, err = bpf.LoadRxPinned(port, keep.dir); err != nil {
		return nil, fmt.Errorf("loading the receive program: %w", err)
	}
	if keep.adopt {
		if err := f.adopt(); err != nil {
			return nil, err
		}
	}
	if err := f.rx.SetAgg0(tunIfc.Index); err != nil {
		return nil, err
	}
	// GSO off on agg0: locally sent TCP then reaches the transmit program in packets,
	// not 64 KB blocks it would have to hand to the daemon (docs/fastpath.md, GSO).
	if err := netcfg.DisableGSO(tunName); err != nil {
		log.Warn("fast path: cannot turn GSO off on the tunnel interface; local TCP will take the slow path", "err", err)
	}
	a, mode, err := bpf.AttachTCPinned(f.tx.Program(), tunIfc.Index, true, bpf.LinkPin(keep.dir, "tc_egress", tunName))
	if err != nil {
		return nil, fmt.Errorf("%s egress: %w", tunName, err)
	}
	f.attach = append(f.attach, a)
	log.Info("fast path: transmit program attached", "interface", tunName, "mode", mode)
	for _, name := range rxIfaces {
		if err := f.attachReceive(name); err != nil {
			return nil, err
		}
	}
	f.rps = make(map[string]string)
	f.steerReceive(append([]string{tunName}, rxIfaces...))
	log.Info("fast path: receive processing of the uplinks and the tunnel interface steered to CPU 0 (RPS), which keeps delivery in order")
	reg.MustRegister(fastPathCollector{f})
	ok = true
	return f, nil
}

// setMTU follows the tunnel's MTU as the CPE's uplinks move it (tunnelMTU): the
// sessions' next programming (each scheduling round) has it.
func (f *fastPath) setMTU(mtu int) { f.mtu.Store(int32(mtu)) }

func (f *fastPath) close() {
	if f == nil {
		return
	}
	f.rxMu.Lock()
	for _, a := range f.rxAttach {
		f.attach = append(f.attach, a)
	}
	rps := f.rps
	f.rxAttach, f.rxIndex, f.rps = nil, nil, nil // closed: interfaceCreated attaches nothing more
	f.rxMu.Unlock()
	for _, a := range f.attach {
		if err := a.Close(); err != nil {
			f.log.Warn("fast path: detaching a program", "err", err)
		}
	}
	netcfg.RestoreReceive(rps)
	f.csumMu.Lock()
	for _, name := range f.csumOff {
		if err := netcfg.EnableTxChecksum(name); err != nil {
			f.log.Warn("fast path: cannot turn transmit checksum offload back on", "interface", name, "err", err)
		}
	}
	f.csumOff = nil
	f.csumMu.Unlock()
	if f.tx != nil {
		_ = f.tx.Close()
	}
	if f.rx != nil {
		_ = f.rx.Close()
	}
}

// attachReceive attaches the receive program to the ingress of the interface now named
// name, in place of an attachment to an earlier interface of that name. Only behind
// the shield: the program trusts its tag check.
func (f *fastPath) attachReceive(name string) error {
	ifc, err := netcfg.InterfaceByName(name)
	if err != nil {
		return fmt.Errorf("uplink %s: %w", name, err)
	}
	f.rxMu.Lock()
	defer f.rxMu.Unlock()
	if f.rxAttach == nil {
		return errors.New("fast path closed")
	}
	if old, ok := f.rxAttach[name]; ok {
		_ = old.Close() // detached with its interface already; this frees it and its pin
		delete(f.rxAttach, name)
	}
	a, mode, err := bpf.AttachTCPinned(f.rx.Program(), ifc.Index, false, bpf.LinkPin(f.pins, "tc_ingress", name))
	if err != nil {
		return fmt.Errorf("%s ingress: %w", name, err)
	}
	f.rxAttach[name], f.rxIndex[name] = a, ifc.Index
	f.log.Info("fast path: receive program attached", "interface", name, "index", ifc.Index, "mode", mode)
	return nil
}

// receiveInterfaces lists the interfaces the receive program is attached to; none for a
// nil fast path.
func (f *fastPath) receiveInterfaces() []string {
	if f == nil {
		return nil
	}
	f.rxMu.Lock()
	defer f.rxMu.Unlock()
	return slices.Collect(maps.Keys(f.rxAttach))
}

// detachReceive forgets the receive program's attachment to the interface named name
// (deleted: its link is defunct), freeing the link and its pin, and the interface's
// saved RPS masks.
func (f *fastPath) detachReceive(name string) {
	f.rxMu.Lock()
	defer f.rxMu.Unlock()
	if a, ok := f.rxAttach[name]; ok {
		_ = a.Close()
		delete(f.rxAttach, name)
		delete(f.rxIndex, name)
	}
	prefix := filepath.Join("/sys/class/net", name) + "/"
	for k := range f.rps {
		if strings.HasPrefix(k, prefix) {
			delete(f.rps, k)
		}
	}
}

// steerReceive makes the kernel process everything the uplinks and agg0 receive on
// one CPU (RPS). The receive program decides "deliver k" under a lock but delivers
// after it; from two CPUs, k+1 could overtake k, and the daemon's writes into agg0
// could overtake (or be overtaken by) the program's deliveries at a handover. On one
// CPU's backlog they keep the order they were decided in (the SPIN model's variant
// "order-steered", docs/fastpath-ordering.md). The cost: the tunnel's receive work no
// longer spreads over CPUs.
func (f *fastPath) steerReceive(ifaces []string) {
	f.rxMu.Lock()
	defer f.rxMu.Unlock()
	if f.rps == nil {
		return // closed
	}
	for _, name := range ifaces {
		prev, err := netcfg.SteerReceive(name, "1")
		for k, v := range prev {
			if _, seen := f.rps[k]; !seen { // keep the first value: the one to restore
				f.rps[k] = v
			}
		}
		if err != nil {
			f.log.Warn("fast path: cannot steer receive processing to one CPU; packets may be delivered slightly out of order", "interface", name, "err", err)
		}
	}
}

// interfaceDeleted forgets the shield's and the receive program's attachments to a
// deleted interface.
func interfaceDeleted(sh *shield, fp *fastPath, name string) {
	sh.detach(name)
	if fp != nil {
		fp.detachReceive(name)
	}
}

// interfaceCarrier readies a headend interface that lost its carrier or has it again,
// as the CPE readies an uplink (uplinkWatch.prepareReturn): the fast path looks its
// links' next hops up afresh, and at the carrier's return the neighbour entries left
// unresolved meanwhile (by the transmit program's redirects in the moment before the
// links on it were found down, or by probes while it had no carrier) are deleted, so
// that they resolve at once instead of a retrans time later; those still unanswered in
// the moments after are deleted again (neighbourRechecks).
func interfaceCarrier(log *slog.Logger, fp *fastPath, neighbours *neighbourRechecks, name string, up bool) {
	log.Info("interface carrier changed", "interface", name, "up", up)
	if fp != nil {
		fp.uplinkChanged(name)
	}
	neighbours.carrier(log, name, up)
}

// interfaceCreated attaches the shield and, behind it, the receive program to an
// interface that was created anew (or appeared after the start), and steers its
// receive processing like the others'. The transmit side needs nothing: it looks the
// uplink's interface up again within a second (nexthopCache).
func interfaceCreated(log *slog.Logger, sh *shield, fp *fastPath, name string) {
	if sh == nil || !sh.attachTo(name) || fp == nil {
		return
	}
	if err := fp.attachReceive(name); err != nil {
		log.Warn("fast path: receive program not attached; what arrives there goes through the daemon", "interface", name, "err", err)
		return
	}
	fp.steerReceive([]string{name})
}

// OpenSession implements tunnel.FastPath.
func (f *fastPath) OpenSession(localIndex uint32, routes []netip.Prefix) tunnel.SessionPath {
	f.mu.Lock()
	slot := -1
	for i, used := range f.slots {
		if !used {
			slot = i
			f.slots[i] = true
			f.open[localIndex] = true
			break
		}
	}
	f.mu.Unlock()
	if slot < 0 {
		f.log.Warn("fast path full: this session forwards in userspace", "session", localIndex, "sessions", maxFastSessions)
		return nil
	}
	s := &fpSession{f: f, slot: uint32(slot), index: localIndex, routes: routes,
		prevRx: make(map[uint8]bpf.RxLinkStats)}
	fail := func(what string, err error) tunnel.SessionPath {
		f.log.Warn("fast path: "+what+"; this session forwards in userspace", "session", localIndex, "err", err)
		s.Close()
		return nil
	}
	var err error
	if s.seq, err = f.tx.Seq(s.slot); err != nil {
		return fail("no sequence memory", err)
	}
	s.seq.Set(0) // a new session's series starts at 0 on both paths
	if s.prevTx, err = f.tx.LinkCounts(s.slot); err != nil {
		return fail("cannot read transmit counters", err)
	}
	if s.prevAQM, err = f.tx.SessionCounts(s.slot); err != nil {
		return fail("cannot read the AQM's counters", err)
	}
	if err := f.rx.EnableSession(localIndex); err != nil {
		return fail("cannot enable receive", err)
	}
	s.rxOn = true
	s.ho = handover.New(f.rx, localIndex)
	return s
}

// fpSession is one session's share of the fast path (tunnel.SessionPath).
type fpSession struct {
	f      *fastPath
	slot   uint32
	index  uint32
	routes []netip.Prefix
	seq    *bpf.TxSeq
	ho     *handover.Daemon
	rxOn   bool
	// seen is ho's Stats when last added to the fast path's totals (guarded, like ho, by
	// the session's receive lock, which every caller of OnData, Idle and Resync holds).
	seen handover.Stats

	mu        sync.Mutex
	linkSlot  map[uint8]int // link id -> index in the session's link table
	txOn      bool
	routesOn  bool
	keptOn    bool // the kernel keeps the session's packets (keepPackets), or cannot
	lastWarn  time.Time
	prevRx    map[uint8]bpf.RxLinkStats
	prevTx    []bpf.TxLinkCounts // by link slot; the slot's counters outlive sessions
	prevAQM   bpf.TxSessionCounts
	closeOnce sync.Once
}

func (s *fpSession) TakeSeq() uint32 { return s.seq.Take() }
func (s *fpSession) PeekSeq() uint32 { return s.seq.Peek() }

func (s *fpSession) TakeLinkSeq(id uint8) uint32 { return s.seq.TakeLink(s.slotOf(id)) }
func (s *fpSession) PeekLinkSeq(id uint8) uint32 { return s.seq.PeekLink(s.slotOf(id)) }

// slotOf gives each link id a fixed place in the session's link table, in the order
// the links first show up (at most AGGD_FP_MAX_LINKS; config allows no more uplinks).
func (s *fpSession) slotOf(id uint8) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.linkSlot == nil {
		s.linkSlot = make(map[uint8]int)
	}
	if i, ok := s.linkSlot[id]; ok {
		return i
	}
	i := len(s.linkSlot)
	s.linkSlot[id] = i
	return i
}

// Program implements tunnel.SessionPath: it resolves each link's interface and next
// hop and writes the session's transmit entry; the first complete one also routes the
// session's inner prefixes into the fast path.
func (s *fpSession) Program(st tunnel.TxState) {
	if st.Userspace != "" {
		s.stopTx()
		return
	}
	ts := bpf.TxSession{Enabled: true, PeerIndex: st.PeerIndex, KeyID: st.KeyID, Key: st.Key, MTU: int(s.f.mtu.Load()), AQMGap: st.AQMGap, ECN: st.AQMECN}
	for _, l := range st.Links {
		i := s.slotOf(l.ID)
		if i >= bpf.MaxTxLinks {
			continue
		}
		for len(ts.Links) <= i {
			ts.Links = append(ts.Links, bpf.TxLink{})
		}
		if err := s.f.tx.EnableSentLog(s.slot, i); err != nil {
			s.warn("fast path: no sent log for a link; a loss notice for it names only what the daemon sent", "link", l.ID, "err", err)
		}
		tl, err := s.f.resolveLink(l)
		if err != nil {
			if l.Usable { // a link that is down has often lost its route with it
				s.warn("fast path: link not usable by the kernel; its packets take the slow path", "link", l.ID, "err", err)
			}
			continue
		}
		ts.Links[i] = tl
	}
	if err := s.f.tx.SetSession(s.slot, ts); err != nil {
		s.warn("fast path: cannot program the session; it forwards in userspace", "err", err)
		return
	}
	s.mu.Lock()
	s.txOn = true
	if !s.routesOn {
		for _, p := range s.routes {
			if err := s.f.tx.SetRoute(p, s.slot); err != nil {
				s.f.log.Warn("fast path: cannot route a prefix into the kernel; its packets take the slow path", "prefix", p, "err", err)
			}
		}
		s.routesOn = true
	}
	s.mu.Unlock()
	s.f.retireAdopted()
}

// stopTx switches the kernel's transmit side of the session off if it was on: its
// routes stay, and the program hands the session's packets to the daemon (verdict
// disabled). The session's tunnel.Session has logged why.
func (s *fpSession) stopTx() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.txOn {
		return
	}
	if err := s.f.tx.SetSession(s.slot, bpf.TxSession{}); err != nil {
		s.f.log.Warn("fast path: cannot switch the session's transmit side off; the kernel may still send on its links", "session", s.index, "err", err)
		return
	}
	s.txOn = false
}

// warn logs at most once per 10 s per session: Program runs every probe interval.
func (s *fpSession) warn(msg string, args ...any) {
	s.mu.Lock()
	now := time.Now()
	quiet := now.Sub(s.lastWarn) < 10*time.Second
	if !quiet {
		s.lastWarn = now
	}
	s.mu.Unlock()
	if !quiet {
		s.f.log.Warn(msg, append(args, "session", s.index)...)
	}
}

// countHandbacks adds the handover's new outcomes to the fast path's totals.
func (s *fpSession) countHandbacks() {
	if st := s.ho.Stats(); st != s.seen {
		s.f.handbacks.add(s.seen, st)
		s.seen = st
	}
}

func (s *fpSession) OnData(link uint8, linkSeq uint32, now time.Time) (restart bool, next uint32, drop bool) {
	was := s.seen
	restart, next, err := s.ho.OnData(handover.PacketID{Link: link, LinkSeq: linkSeq}, now)
	s.countHandbacks()
	if s.seen.Tallies != was.Tallies {
		s.f.log.Info("fast path: the receive counts disagreed while traffic flowed (a packet the kernel passed up "+
			"was lost on the host: socket buffer full?); corrected so the kernel can take the ordering back",
			"session", s.index, "packets", s.seen.TallyLost-was.TallyLost, "tallies", s.seen.Tallies)
	}
	switch {
	case errors.Is(err, handover.ErrKernelOwns), errors.Is(err, handover.ErrCountedBefore):
		return false, 0, true
	case err != nil:
		s.warn("fast path: cannot read the ordering state", "err", err)
	}
	return restart, next, false
}

func (s *fpSession) Idle(next uint32, skipped uint64, empty bool) {
	err := s.ho.Idle(next, skipped, empty)
	s.countHandbacks()
	if err != nil {
		s.warn("fast path: cannot hand the ordering back to the kernel", "err", err)
	}
}

func (s *fpSession) HandbackPending() bool { return s.ho.Pending() }

func (s *fpSession) ReceivesOn(ifindex int) bool { return s.f.receivesOn(ifindex) }

// receivesOn reports whether the receive program is attached to the interface with
// index ifindex.
func (f *fastPath) receivesOn(ifindex int) bool {
	f.rxMu.Lock()
	defer f.rxMu.Unlock()
	for _, i := range f.rxIndex {
		if i == ifindex {
			return true
		}
	}
	return false
}

func (s *fpSession) Resync(now time.Time, quiet time.Duration) (restart bool, next uint32) {
	was := s.seen.Resyncs
	restart, next, err := s.ho.Resync(now, quiet)
	s.countHandbacks()
	if err != nil {
		s.warn("fast path: cannot resynchronise the receive ordering with the kernel", "err", err)
		return false, 0
	}
	if n := s.seen.Resyncs; n != was {
		s.f.log.Info("fast path: packets the kernel passed up were lost on the host (socket buffer full?); "+
			"receive counts resynchronised so the kernel can take the ordering back", "session", s.index, "resyncs", n)
	}
	return restart, next
}

// RxDelta implements tunnel.SessionPath from the receive program's per-link counters.
func (s *fpSession) RxDelta() map[uint8]tunnel.RxDelta {
	cur, err := s.f.rx.LinkStats(s.index)
	if err != nil {
		s.warn("fast path: cannot read receive counters", "err", err)
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[uint8]tunnel.RxDelta, len(cur))
	for id, c := range cur {
		p := s.prevRx[id]
		if c.Packets == p.Packets {
			continue
		}
		out[id] = tunnel.RxDelta{
			Packets: c.Packets - p.Packets, Bytes: c.Bytes - p.Bytes, MaxLinkSeq: c.MaxLinkSeq,
			OWD: int32(uint32(c.LastArrivalNs/1000) - c.LastTstamp), HaveOWD: true,
		}
		s.prevRx[id] = c
	}
	return out
}

// TxDelta implements tunnel.SessionPath from the transmit program's per-link counters.
// It is called from the control tick and on each FEEDBACK, so the read and the update
// of prevTx happen under one lock (two readers must not both count the same packets).
func (s *fpSession) TxDelta() map[uint8]tunnel.TxDelta {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, err := s.f.tx.LinkCounts(s.slot)
	if err != nil {
		s.warn("fast path: cannot read transmit counters", "err", err)
		return nil
	}
	out := make(map[uint8]tunnel.TxDelta)
	for id, i := range s.linkSlot {
		if i >= len(cur) || i >= len(s.prevTx) || cur[i].Packets == s.prevTx[i].Packets {
			continue
		}
		c, p := cur[i], s.prevTx[i]
		out[id] = tunnel.TxDelta{Packets: c.Packets - p.Packets, Bytes: c.Bytes - p.Bytes, Copies: c.Copies - p.Copies}
		s.prevTx[i] = c
	}
	if len(out) > 0 && !s.keptOn {
		s.keepPackets()
	}
	return out
}

// AQMDelta implements tunnel.SessionPath from the transmit program's per-session
// counters, read and updated under one lock as TxDelta's.
func (s *fpSession) AQMDelta() tunnel.AQMDelta {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, err := s.f.tx.SessionCounts(s.slot)
	if err != nil {
		s.warn("fast path: cannot read the AQM's counters", "err", err)
		return tunnel.AQMDelta{}
	}
	p := s.prevAQM
	s.prevAQM = cur
	return tunnel.AQMDelta{Drops: cur.AQMDrops - p.AQMDrops, ECTDrops: cur.AQMDropsECT - p.AQMDropsECT, Marks: cur.AQMMarks - p.AQMMarks}
}

// keepPackets has the kernel keep the session's packets from now on, for rescue copies
// (bpf.Tx.EnableKept): once the kernel has sent for the session, as the daemon keeps
// its own packets once it has sent one, so that a headend's idle CPEs cost no ring
// (389 kB each). Caller holds s.mu.
func (s *fpSession) keepPackets() {
	s.keptOn = true
	if err := s.f.tx.EnableKept(s.slot); err != nil {
		s.f.log.Warn("fast path: the kernel cannot keep the session's packets; a link going into doubt gets no copies of what the kernel had in flight on it",
			"session", s.index, "err", err)
	}
}

// SentOn implements tunnel.SessionPath.
func (s *fpSession) SentOn(id uint8, after, through uint32) ([]tunnel.SentEntry, bool) {
	got, _, err := s.f.tx.SentOn(s.slot, s.slotOf(id), after, through)
	if err != nil {
		s.warn("fast path: cannot read a link's sent log; its loss notice names only what the daemon sent", "link", id, "err", err)
		return nil, false
	}
	out := make([]tunnel.SentEntry, len(got))
	for i, e := range got {
		out[i] = tunnel.SentEntry{LinkSeq: e.LinkSeq, Seq: e.Seq}
	}
	return out, through-after <= bpf.SentLogSize
}

// Kept implements tunnel.SessionPath.
func (s *fpSession) Kept(seqs []uint32) [][]byte {
	s.mu.Lock()
	on := s.keptOn
	s.mu.Unlock()
	if !on {
		return nil // the kernel has sent nothing for the session yet
	}
	got, err := s.f.tx.Kept(s.slot, seqs)
	if err != nil {
		s.warn("fast path: cannot read the packets the kernel kept; a rescue copies only what the daemon sent", "err", err)
		return nil
	}
	return got
}

func (s *fpSession) Close() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		routesOn := s.routesOn
		s.mu.Unlock()
		if routesOn {
			for _, p := range s.routes {
				_ = s.f.tx.DeleteRoute(p)
			}
		}
		_ = s.f.tx.DeleteSession(s.slot)
		if s.rxOn {
			_ = s.f.rx.DisableSession(s.index)
		}
		s.f.mu.Lock()
		s.f.slots[s.slot] = false
		delete(s.f.open, s.index)
		s.f.mu.Unlock()
	})
}

// resolveLink turns a session's link into what the transmit program needs: the
// interface to redirect to, whether it is Ethernet (then the next hop and whether its
// neighbour entry is resolved), and the source address if the socket is unbound.
func (f *fastPath) resolveLink(l tunnel.TxLink) (bpf.TxLink, error) {
	if !l.Remote.IsValid() {
		return bpf.TxLink{}, fmt.Errorf("no peer address yet")
	}
	nh, err := f.nexthop.get(l.Interface, l.Remote.Addr(), l.Local.Addr())
	if err != nil {
		return bpf.TxLink{}, err
	}
	f.completeChecksums(nh.ifindex)
	state := bpf.TxLinkDown
	switch {
	case l.Usable && l.Suspect:
		state = bpf.TxLinkSuspect
	case l.Usable:
		state = bpf.TxLinkUp
	}
	src := l.Local.Addr()
	if !src.IsValid() || src.IsUnspecified() {
		src = nh.src
	}
	return bpf.TxLink{
		Ifindex: nh.ifindex, LinkID: l.ID, State: state, Class: l.Class,
		Ethernet: nh.ethernet, NeighOK: nh.neighOK,
		Src: netip.AddrPortFrom(src, l.Local.Port()), Dst: l.Remote, Gateway: nh.gateway,
		GatewayMAC: nh.gatewayMAC, SrcMAC: nh.srcMAC,
		RateBps: uint64(l.RateBps), BaseOWD: l.BaseOWD,
	}, nil
}

// uplinkChanged is told of an event on an uplink's interface (carrier, address, route):
// the links on it are looked up afresh when the session is next programmed.
func (f *fastPath) uplinkChanged(iface string) { f.nexthop.forget(iface) }

// completeChecksums turns transmit checksum offload off on a veth the transmit program
// redirects to, once per interface, before the program gets the link.
//
// A forwarded or locally sent packet can reach agg0's egress with its TCP/UDP checksum
// still pending (CHECKSUM_PARTIAL: only the pseudo-header sum is in the packet, and
// csum_start/csum_offset say where the rest goes). The encapsulation keeps it pending
// (now pointing into the inner packet), and on the way out the uplink's
// validate_xmit_skb leaves it to a device that offers checksum offload. A NIC fills it
// in; a veth does not: it passes the skb with its pending state to the peer namespace.
// There the receive program's fast path still works (the decapsulated skb stays
// CHECKSUM_PARTIAL, which the stack trusts), but every packet it hands to the daemon
// (gap, daemon_owns) reaches the daemon's UDP socket as bytes, with the inner checksum
// never filled in; written into agg0 it is CHECKSUM_NONE with a wrong checksum, and
// conntrack marks it invalid (no NAT reversal; the router's TCP counts TcpInCsumErrors).
// Without offload on the veth the kernel fills the checksum in on transmit.
func (f *fastPath) completeChecksums(ifindex int) {
	f.csumMu.Lock()
	defer f.csumMu.Unlock()
	if f.csumDone[ifindex] {
		return
	}
	if f.csumDone == nil {
		f.csumDone = make(map[int]bool)
	}
	f.csumDone[ifindex] = true
	lk, err := netlink.LinkByIndex(ifindex)
	if err != nil || lk.Type() != "veth" {
		return
	}
	name := lk.Attrs().Name
	if on, err := netcfg.TxChecksum(name); err == nil && !on {
		return // already off: nothing to do, nothing to restore
	}
	if err := netcfg.DisableTxChecksum(name); err != nil {
		f.log.Warn("fast path: cannot turn transmit checksum offload off on a veth uplink; packets the peer's daemon forwards may carry unfinished checksums",
			"interface", name, "err", err)
		return
	}
	f.csumOff = append(f.csumOff, name)
	f.log.Info("fast path: transmit checksum offload turned off on a veth uplink (back on at exit)", "interface", name)
}

// nexthop is where the kernel must send a link's packets.
type nexthop struct {
	ifindex  int
	ethernet bool
	gateway  netip.Addr // invalid: the destination is on-link
	src      netip.Addr
	neighOK  bool
	// gatewayMAC and srcMAC: the resolved next hop's and the interface's hardware
	// addresses, which a redundant copy on an IPv6 link carries (bpf.TxLink).
	gatewayMAC, srcMAC net.HardwareAddr
	at                 time.Time
}

// nexthopCache keeps route and neighbour lookups to one per link per second, or per
// tenth of a second while the next hop is not resolved (the transmit program hands
// the link's packets to the daemon until it is). An uplink event (forget) ends an
// interface's entries at once.
type nexthopCache struct {
	mu sync.Mutex
	m  map[string]nexthop
}

func newNexthopCache() *nexthopCache { return &nexthopCache{m: make(map[string]nexthop)} }

const (
	nexthopTTL           = time.Second
	unresolvedNexthopTTL = 100 * time.Millisecond
)

func (c *nexthopCache) get(iface string, dst, src netip.Addr) (nexthop, error) {
	key := iface + "|" + dst.String() + "|" + src.String()
	c.mu.Lock()
	nh, ok := c.m[key]
	c.mu.Unlock()
	if ok && time.Since(nh.at) < nh.ttl() {
		return nh, nil
	}
	nh, err := lookupNexthop(iface, dst, src)
	if err != nil {
		return nexthop{}, err
	}
	nh.at = time.Now()
	c.mu.Lock()
	c.m[key] = nh
	c.mu.Unlock()
	return nh, nil
}

// forget drops what is cached for links on interface iface: its carrier, addresses or
// routes changed, and the next lookup must see them as they are now.
func (c *nexthopCache) forget(iface string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key := range c.m {
		if strings.HasPrefix(key, iface+"|") {
			delete(c.m, key)
		}
	}
}

func (nh nexthop) ttl() time.Duration {
	if nh.ethernet && !nh.neighOK {
		return unresolvedNexthopTTL
	}
	return nexthopTTL
}

// lookupNexthop asks the kernel's routing table (as `ip route get DST [oif IFACE]
// [from SRC]` would) and its neighbour table.
func lookupNexthop(iface string, dst, src netip.Addr) (nexthop, error) {
	opts := &netlink.RouteGetOptions{Oif: iface}
	if src.IsValid() && !src.IsUnspecified() {
		opts.SrcAddr = src.AsSlice()
	}
	routes, err := netlink.RouteGetWithOptions(dst.AsSlice(), opts)
	if err != nil || len(routes) == 0 {
		return nexthop{}, fmt.Errorf("no route to %s (oif %q): %v", dst, iface, err)
	}
	r := routes[0]
	lk, err := netlink.LinkByIndex(r.LinkIndex)
	if err != nil {
		return nexthop{}, fmt.Errorf("route to %s: interface %d: %w", dst, r.LinkIndex, err)
	}
	nh := nexthop{ifindex: r.LinkIndex, ethernet: len(lk.Attrs().HardwareAddr) == 6}
	if a, ok := netip.AddrFromSlice(r.Src); ok {
		nh.src = a.Unmap()
	}
	hop := dst
	if a, ok := netip.AddrFromSlice(r.Gw); ok {
		nh.gateway = a.Unmap()
		hop = nh.gateway
	}
	if nh.ethernet {
		nh.gatewayMAC, nh.neighOK = resolvedNeighbour(r.LinkIndex, hop)
		nh.srcMAC = lk.Attrs().HardwareAddr
	}
	return nh, nil
}

// resolvedNeighbour returns the next hop's hardware address if it has a usable
// neighbour entry. An unresolved one makes the transmit program hand the packet to the
// daemon, whose socket send resolves it (ARCHITECTURE §9: redirect_neigh before
// resolution can send malformed packets).
func resolvedNeighbour(ifindex int, hop netip.Addr) (net.HardwareAddr, bool) {
	family := netlink.FAMILY_V4
	if hop.Is6() {
		family = netlink.FAMILY_V6
	}
	neighs, err := netlink.NeighList(ifindex, family)
	if err != nil {
		return nil, false
	}
	const usable = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE | netlink.NUD_PERMANENT | netlink.NUD_NOARP
	for _, n := range neighs {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == hop && n.State&usable != 0 {
			return n.HardwareAddr, true
		}
	}
	return nil, false
}

// fastPathCollector exports the fast path's per-verdict counters at scrape time.
type fastPathCollector struct{ f *fastPath }

var fastPathDesc = prometheus.NewDesc("aggd_fastpath_packets_total",
	"Data packets judged by the kernel fast path, by direction and verdict: fast (handled "+
		"in the kernel), drop_old (receive: duplicate or late, dropped), late_copy (receive: a copy of a "+
		"number the daemon had given up, delivered late by the kernel), aqm_drop (transmit: "+
		"dropped by the bond's AQM), aqm_drop_ect (transmit: of aqm_drop, the ECN-capable "+
		"packets, which with aqm.ecn on it marks instead), aqm_mark (transmit: marked ECN CE by "+
		"the bond's AQM, and counted again by its fate), or the reason it was handed to the daemon's slow path.",
	[]string{"direction", "verdict"}, nil)

var handbackDesc = prometheus.NewDesc("aggd_fastpath_handbacks_total",
	"The daemon's offers to hand the receive ordering back to the kernel, by outcome: "+
		"posted, accepted, died (a packet was passed up after the offer), resynced (the "+
		"daemon adopted the kernel's count after a quiet second: a passed-up packet was lost "+
		"on the host), tallied (the daemon corrected its count while traffic flowed, for the "+
		"same reason), late (not an offer: a passed-up packet that arrived after a resync or "+
		"tally had counted it lost, dropped), overcounted (an offer before which the daemon "+
		"brought its count down to the kernel's, after such a packet).",
	[]string{"outcome"}, nil)

func (c fastPathCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- fastPathDesc
	ch <- handbackDesc
}

func (c fastPathCollector) Collect(ch chan<- prometheus.Metric) {
	for dir, read := range map[string]func() (map[string]uint64, error){"tx": c.f.tx.Verdicts, "rx": c.f.rx.Verdicts} {
		v, err := read()
		if err != nil {
			continue
		}
		for verdict, n := range v {
			ch <- prometheus.MustNewConstMetric(fastPathDesc, prometheus.CounterValue, float64(n), dir, verdict)
		}
	}
	h := &c.f.handbacks
	for outcome, n := range map[string]*atomic.Uint64{"posted": &h.posted, "accepted": &h.accepted, "died": &h.died, "resynced": &h.resynced, "tallied": &h.tallied,
		"late": &h.late, "overcounted": &h.overcounted} {
		ch <- prometheus.MustNewConstMetric(handbackDesc, prometheus.CounterValue, float64(n.Load()), outcome)
	}
}

// handbackTotals are handover.Stats summed over sessions, readable at scrape time.
type handbackTotals struct {
	posted, accepted, died, resynced, tallied, late, overcounted atomic.Uint64
}

// add adds what changed from was to now.
func (h *handbackTotals) add(was, now handover.Stats) {
	h.posted.Add(now.Posted - was.Posted)
	h.accepted.Add(now.Accepted - was.Accepted)
	h.died.Add(now.Died - was.Died)
	h.resynced.Add(now.Resyncs - was.Resyncs)
	h.tallied.Add(now.Tallies - was.Tallies)
	h.late.Add(now.Late - was.Late)
	h.overcounted.Add(now.Overcounts - was.Overcounts)
}
