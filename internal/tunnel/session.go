package tunnel

import (
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aggd/aggd/internal/aqm"
	"github.com/aggd/aggd/internal/auth"
	"github.com/aggd/aggd/internal/clock"
	"github.com/aggd/aggd/internal/ecn"
	"github.com/aggd/aggd/internal/estimate"
	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/reseq"
	"github.com/aggd/aggd/internal/sched"
	"github.com/aggd/aggd/internal/wire"
)

// SessionConfig is what a session needs from the daemon's configuration.
type SessionConfig struct {
	Peer      string // label for logs and metrics
	MaxHold   time.Duration
	MaxBuffer int
	Probe     time.Duration // probe and feedback interval
	DownAfter time.Duration // a link with no probe reply for this long leaves the schedule
	// StandbyProbe, when longer than Probe, is how often an idle standby link (class
	// overflow or backup) is probed, and its silence judged in its multiples (probeUnit).
	StandbyProbe time.Duration
	// AQMTarget, when set, is the standing queue (on every link carrying traffic)
	// above which the bond drops at its entry, CoDel-style (internal/aqm).
	// AQMMaxTarget is how far it may rise for a slow link (aqmTarget); below
	// AQMTarget (zero, say), it does not rise.
	AQMTarget    time.Duration
	AQMMaxTarget time.Duration
	// AQMECN: mark ECN-capable packets Congestion Experienced instead of dropping
	// them (internal/ecn).
	AQMECN bool
	// Keys, when set, is told every session's receive keys, so that the XDP shield can
	// verify tags before the daemon sees the packets.
	Keys KeyObserver
	// FastPath, when set, takes the session's per-packet work into the kernel for the
	// inner destinations in Routes; the session does what the kernel hands up.
	FastPath FastPath
	Routes   []netip.Prefix
	// PeerMTU, when set, is told the largest inner packet all the peer's links take
	// (the smallest MTU its LINK_PARAMS announce) whenever that changes.
	PeerMTU func(peer string, mtu int)
	// LossRepair: ask the peer to send again what a link lost at random, and deliver
	// it late (repair.go).
	LossRepair bool
	// SparseFlows: mark the packets of sparse flows (sparse.go).
	SparseFlows bool
}

// sendStall is how long a write to a link's socket may take before the time counts as
// blocked by a full local queue (an unblocked UDP write takes microseconds).
const sendStall = 100 * time.Microsecond

// aqmInterval is CoDel's interval: longer than the feedback period plus its way back,
// so a queue is seen standing before it is acted on.
const aqmInterval = 100 * time.Millisecond

// KeyGeneration is one receive key generation of a session.
type KeyGeneration struct {
	ID  uint8
	Key [16]byte
}

// KeyObserver follows sessions' receive keys (implemented by the XDP shield's loader).
type KeyObserver interface {
	SessionKeys(index uint32, gens []KeyGeneration)
	SessionClosed(index uint32)
}

// Session is one bond between a CPE and the headend: both directions' sequence state,
// the scheduler for what we send, the resequencer for what we receive, and the links.
type Session struct {
	cfg        SessionConfig
	log        *slog.Logger
	m          *metrics.Set
	localIndex uint32 // the peer puts this in the header of packets to us
	peerIndex  atomic.Uint32
	// peerMTU is 1 + the last MTU passed on to cfg.PeerMTU (0: none passed on yet);
	// linkParamsSeen the counter of the newest LINK_PARAMS applied.
	peerMTU        atomic.Int32
	linkParamsSeen atomic.Uint64
	fp             SessionPath // nil: everything in userspace
	keys           keyRing
	deliver        func([]byte) // writes an in-order inner packet to the tunnel interface

	// Transmit: one lock orders sequence assignment, scheduling and the write to the
	// socket, so that each link stays FIFO and probe watermarks are exact.
	txMu     sync.Mutex
	txSeq    uint32
	sched    *sched.Scheduler
	txCtrl   atomic.Uint64
	schedDue atomic.Bool
	// refreshMu orders refreshSchedule's runs (the tick's, a sender's, a link going
	// down): the one that runs last read the links last, so the schedule it hands the
	// scheduler and the kernel is the newest.
	refreshMu sync.Mutex
	// aqm is the bond's entry AQM (nil: none); guarded by txMu. With the kernel fast
	// path it makes the drop schedule (Codel.Spacing) both paths carry out (aqmSignal).
	aqm *aqm.Codel
	// aqmOffered is when (clock.Nanos) the daemon last offered a packet to the AQM
	// without the fast path: one after an interval without any is not dropped
	// (Codel.Idle). Guarded by txMu.
	aqmOffered int64
	// aqmHeld: a link that carries traffic is in doubt, and the AQM drops nothing
	// (failoverUnderWay). Guarded by txMu.
	aqmHeld bool
	// dropped is the AQM's last drop, kept until a failover takes it back or the doubt
	// ends (takeback.go); carrying is the rate (bits/s) of the links that carried
	// traffic in the schedule the AQM last acted under. Guarded by txMu.
	dropped  droppedPacket
	carrying float64
	kept     keptPackets // the latest data packets sent, for a rescue (rescue.go)
	// sparse and sparseMargin find the packets of sparse flows (sparse.go). Guarded by
	// txMu; the margin is set with the schedule, 0 when sparse_flows is off.
	sparse       sparseFlows
	sparseMargin int64
	// backupReturn keeps backup links as overflow links for a while after the
	// primaries are back (backupreturn.go). Guarded by txMu.
	backupReturn backupReturn
	// repairWait is how long (ns) after a request the receiver expects its repair
	// (repair.go; 0: it asks for none), set each tick.
	repairWait atomic.Int64
	// repairAsked is when (clock.Nanos) the receiver last asked for a repair.
	repairAsked atomic.Int64
	// fpGap is the AQM's drop spacing (ns) with the kernel fast path, fpNext when the
	// daemon's next packet is due for a drop, fpLast when its schedule last saw a
	// packet (aqmSignal, dueEvery). Guarded by txMu.
	fpGap, fpNext, fpLast int64
	// kernelSentAt is when (clock.Nanos) the kernel was last seen to have sent data
	// packets for the session (mergeFastTx).
	kernelSentAt atomic.Int64
	// bondQueue is the least queueing delay (ns) among the links that carried traffic
	// in the peer's last report period: the bond's standing queue.
	bondQueue atomic.Int64
	// bondQueueGen counts the updates of bondQueue (the AQM acts once per measure).
	bondQueueGen atomic.Uint64
	// bondUnmeasured: the peer's last report was no measure of the bond's queue (a
	// busy link fell silent in it: publishBondQueue); the AQM signals nothing until one is.
	bondUnmeasured atomic.Bool
	// peerCopied is when (clock.Nanos) the last authenticated copy (FlagDuplicate)
	// arrived from the peer: it has a link in doubt (markDoubt).
	peerCopied atomic.Int64
	// feedbackMu orders FEEDBACK handling; lastFeedback is the peer's timestamp of the
	// newest one taken (haveFeedback: any yet), lastFeedbackAt when it was taken.
	feedbackMu     sync.Mutex
	lastFeedback   uint32
	haveFeedback   bool
	lastFeedbackAt time.Time
	// owd is the frame of the one-way delays we measure of the peer's packets.
	owd owdFrame
	// fbRxPackets is the packets our last FEEDBACK reported received on all links;
	// until fbFlowUntil a flow counts as arriving (flowArriving, from the tick only).
	fbRxPackets uint32
	fbFlowUntil time.Time
	// fbRxBytes and fbTxBytes are the bytes received and sent on all links when the last
	// FEEDBACK went out, fbLast the link that carried the last one alone (mostlySending,
	// takeTurns; from the tick only).
	fbRxBytes, fbTxBytes uint64
	fbLast               uint8

	// Receive: the resequencer and its hold timer.
	rxMu  sync.Mutex
	reseq *reseq.Resequencer
	// rxInFlight counts DATA packets the handover has counted as consumed (fast path)
	// that are not yet in the resequencer: another goroutine must not hand the ordering
	// back to the kernel while one is between the two, or the kernel would resume with
	// a packet about to be held here (a crash seen in the e2e tests).
	rxInFlight int
	// lastFastData is when the last DATA packet reached the daemon (fast path; Resync).
	lastFastData time.Time
	// deferredSkips are loss notices that arrived while the kernel may have owned the
	// ordering (handback.go).
	deferredSkips []wire.SeqRange
	holdTimer     *time.Timer
	armedAt       int64
	lastStats     reseq.Stats

	notices lossNotices // loss notices to repeat (lossnotice.go)
	// controlTx counts what each control message type costs the links (sendControlStamped),
	// resolved once per session: probes and FEEDBACK go out ten times a second per link.
	controlTx [wire.TypeRepairRequest + 1]struct{ bytes, packets prometheus.Counter }
	pm        peerMetrics

	linksMu sync.RWMutex
	links   map[uint8]*link
	// onNewLink is set by the headend: it creates a link when a CPE uplink first shows up.
	onNewLink func(id uint8) *link
	// linkIDs lists every link the session has once that is known (the CPE knows its
	// uplinks; the headend learns them from the CPE's LINK_PARAMS), and kernelBar says
	// why the kernel fast path may not carry the session ("" when it may: kernel.go).
	linkIDs   atomic.Pointer[[]uint8]
	kernelBar atomic.Pointer[string]
	// receiveBar says why the kernel may not own the session's receive ordering
	// although it may carry it ("" when it may: kernel.go).
	receiveBar atomic.Pointer[string]
	// receiveSaid is when the daemon last logged a change of receiveBar (clock.Nanos):
	// at most every receiveSayEvery, should a link's packets alternate interfaces.
	receiveSaid atomic.Int64
	// linkNames: what the peer calls its links (linknames.go).
	linkNames peerLinkNames

	closed chan struct{}
	once   sync.Once
}

func newSession(cfg SessionConfig, m *metrics.Set, log *slog.Logger, localIndex uint32, deliver func([]byte)) *Session {
	s := &Session{
		cfg: cfg, m: m, localIndex: localIndex, deliver: deliver,
		log:    log.With("peer", cfg.Peer, "session", localIndex),
		sched:  sched.New(sched.Config{}),
		reseq:  reseq.New(reseq.Config{MaxHold: int64(cfg.MaxHold), MaxBytes: cfg.MaxBuffer}, 0),
		links:  make(map[uint8]*link),
		closed: make(chan struct{}),
	}
	s.reseq.SetHold(int64(cfg.MaxHold))
	s.pm = newPeerMetrics(m, cfg.Peer)
	for t := wire.TypeProbe; t <= wire.TypeRepairRequest; t++ {
		s.controlTx[t].bytes = m.ControlTxBytes.WithLabelValues(cfg.Peer, t.String())
		s.controlTx[t].packets = m.ControlTxPackets.WithLabelValues(cfg.Peer, t.String())
	}
	if cfg.AQMTarget > 0 {
		s.aqm = aqm.New(int64(cfg.AQMTarget), int64(aqmInterval))
	}
	if cfg.FastPath != nil {
		s.fp = cfg.FastPath.OpenSession(localIndex, cfg.Routes)
	}
	s.holdTimer = time.AfterFunc(time.Hour, s.onHoldTimer)
	s.holdTimer.Stop()
	return s
}

// addLink creates the link with the given spec if it is new and returns it.
func (s *Session) addLink(spec LinkSpec, send func(self *link, pkt []byte) error) *link {
	s.linksMu.Lock()
	defer s.linksMu.Unlock()
	if l, ok := s.links[spec.ID]; ok {
		return l
	}
	lbl := []string{s.cfg.Peer, spec.Name}
	l := &link{
		spec: spec, send: send, schedDue: &s.schedDue,
		m: linkMetrics{
			txBytes: s.m.LinkTxBytes.WithLabelValues(lbl...), txPackets: s.m.LinkTxPackets.WithLabelValues(lbl...),
			rxBytes: s.m.LinkRxBytes.WithLabelValues(lbl...), rxPackets: s.m.LinkRxPackets.WithLabelValues(lbl...),
			lost: s.m.LinkLost.WithLabelValues(lbl...), dup: s.m.LinkDuplicate.WithLabelValues(lbl...),
			rtt: s.m.LinkRTT.WithLabelValues(lbl...), loss: s.m.LinkLoss.WithLabelValues(lbl...),
			rate: s.m.LinkRate.WithLabelValues(lbl...), schedRate: s.m.LinkRatePrior.WithLabelValues(lbl...),
			up: s.m.LinkUp.WithLabelValues(lbl...), suspect: s.m.LinkSuspect.WithLabelValues(lbl...),
			changed:  s.m.LinkStateChanged.WithLabelValues(lbl...),
			capacity: s.m.LinkCapacity.WithLabelValues(lbl...), queue: s.m.LinkQueueDelay.WithLabelValues(lbl...),
			mtu: s.m.LinkMTU.WithLabelValues(lbl...), baseDelay: s.m.LinkBaseDelay.WithLabelValues(lbl...),
			jitter: s.m.LinkJitter.WithLabelValues(lbl...),
		},
	}
	// Every cause's series exists from the start (at 0), like the rest: a rate over
	// them works at once, and a late write after a reload cannot bring one back.
	for c := range numCauses {
		l.m.suspicions[c] = s.m.LinkSuspicions.WithLabelValues(s.cfg.Peer, spec.Name, c.label())
	}
	l.logged.Store(s.log.With("link", spec.Name))
	l.rx.askRepairs(s.asksRepairs())
	if s.fp != nil {
		l.peekLinkSeq = func() uint32 { return s.fp.PeekLinkSeq(spec.ID) }
	}
	l.est = estimate.New(estimate.Config{})
	l.est.SetPrior(l.prior())
	l.publishCapacity()
	l.setState(stateProbing)
	l.m.changed.SetToCurrentTime() // a new link starts in probing (the zero state)
	s.links[spec.ID] = l
	s.rxMu.Lock()
	s.reseq.SetLinks(evidenceLinks(s.links))
	s.rxMu.Unlock()
	s.schedDue.Store(true)
	s.showLinkName(l) // under linksMu, the one order linksMu and linkNames.mu are taken in
	return l
}

func (s *Session) link(id uint8) *link {
	s.linksMu.RLock()
	defer s.linksMu.RUnlock()
	return s.links[id]
}

func (s *Session) allLinks() []*link { return valuesUnder(&s.linksMu, s.links) }

// valuesUnder returns a copy of m's values, read under mu: a list to act on after
// letting go of the lock.
func valuesUnder[K comparable, V any](mu *sync.RWMutex, m map[K]V) []V {
	mu.RLock()
	defer mu.RUnlock()
	return slices.Collect(maps.Values(m))
}

// SendData stripes one inner packet. buf holds wire.HeaderLen bytes of headroom followed
// by the packet; the header is written in place. It reports false when no link is usable.
func (s *Session) SendData(buf []byte) bool {
	k := s.keys.sending()
	if k == nil {
		return false
	}
	if s.schedDue.Swap(false) {
		s.refreshSchedule()
	}
	now := clock.Nanos()
	s.txMu.Lock()
	defer s.txMu.Unlock()
	if s.entryAQMDrops(now, buf[wire.HeaderLen:]) {
		s.keepDrop(buf)
		return true
	}
	return s.stripe(k, now, buf)
}

// stripe sends buf (headroom, then the inner packet) on the link the scheduler picks,
// with its copies, under the next sequence number, and reports false when no link is
// usable. Caller holds txMu.
func (s *Session) stripe(k *keyGen, now int64, buf []byte) bool {
	primary, dup, hasDup, ok := s.sched.Pick(now, len(buf)+wire.Overhead-wire.HeaderLen) // over IPv4 (an IPv6 link adds its own)
	if !ok {
		return false
	}
	seq := s.takeSeq()
	var flags uint8
	if s.cfg.SparseFlows && s.markSparse(now, primary, buf[wire.HeaderLen:]) {
		flags = wire.FlagSparse
	}
	standby, toStandby := s.sched.StandbyCopy(now, len(buf)+20+8, int64(standbyCopyBacklog), dup, hasDup)
	s.sendDataOn(primary, k, seq, flags, hasDup || toStandby, now, buf)
	if hasDup {
		s.sendDataOn(dup, k, seq, flags|wire.FlagDuplicate, true, now, buf)
	}
	if toStandby {
		s.sendDataOn(standby, k, seq, flags|wire.FlagDuplicate, true, now, buf)
	}
	return true
}

// standbyCopyBacklog bounds the queue the copies sent while a primary is in doubt may
// build on a standby link (sched.StandbyCopy): the most the bond's AQM lets a lone
// link queue by default (aqm.max_target), which the link will be if the primaries die.
const standbyCopyBacklog = 30 * time.Millisecond

// entryAQMDrops applies the bond's AQM to the inner packet about to be sent at now and
// reports whether to drop it. Where the AQM signals congestion, an ECN-capable packet is
// marked Congestion Experienced and sent instead (aqm.ecn). Caller holds txMu.
func (s *Session) entryAQMDrops(now int64, inner []byte) bool {
	if !s.aqmSignal(now) {
		return false
	}
	if s.cfg.AQMECN && ecn.Mark(inner) {
		s.pm.aqmMarks.Inc()
		return false
	}
	s.pm.aqmDrops.Inc()
	if cp, ok := ecn.Of(inner); ok && cp != ecn.NotECT {
		s.pm.aqmECTDrops.Inc()
	}
	return true
}

// aqmSignal reports whether the bond's AQM signals congestion (a drop or a mark) on the
// packet the daemon sends at now. Caller holds txMu.
//
// With the kernel fast path the session's CoDel makes one schedule (a spacing): the
// kernel carries it out on the packets it sends, and the daemon on its own only while
// the kernel sends none (a session the kernel must not send for, or one whose packets
// all come to the daemon, as GSO blocks do). While both send, the daemon leaves it to
// the kernel: two paths each signalling once per spacing signalled twice as often as
// CoDel meant (the end-to-end ECN test with --fast-path, where the daemon sent 2,100
// GSO-born packets of 2,500: 139–154 signals in 8 s against 65–73 in userspace).
func (s *Session) aqmSignal(now int64) bool {
	if s.aqm == nil {
		return false
	}
	if s.fp == nil {
		if afterIdle(&s.aqmOffered, now) || s.aqmHeld {
			s.aqm.Idle()
			return false
		}
		if s.bondUnmeasured.Load() {
			return false
		}
		q := s.bondQueue.Load()
		drop := s.aqm.Drop(now, q, s.bondQueueGen.Load())
		if drop {
			s.log.Debug("aqm signal", "queue", time.Duration(q))
		}
		return drop
	}
	if now-s.kernelSentAt.Load() < kernelCarriesAQM*int64(s.cfg.Probe) {
		s.fpNext, s.fpLast = 0, 0
		return false
	}
	return dueEvery(&s.fpNext, &s.fpLast, s.fpGap, now)
}

// kernelCarriesAQM is how many probe intervals after the kernel was last seen sending
// the daemon still leaves the AQM's schedule to it: what the kernel sent is merged
// every tick (one interval) and with every FEEDBACK.
const kernelCarriesAQM = 3

// dueEvery carries out a drop schedule of one signal per gap ns (0: none), as the
// kernel's aggd_aqm_drop does: the first packet once a gap is set, then one a gap
// after the last, or after now if packets stopped for longer; but never a packet that
// comes an AQM interval or more after the last one the schedule saw (the sender was
// not feeding the queue: Codel.Idle), from which the schedule restarts. next is the
// next due time, 0 when none is scheduled; last when the schedule last saw a packet, 0
// when none since the gap was set.
func dueEvery(next, last *int64, gap, now int64) bool {
	if gap <= 0 {
		*next, *last = 0, 0
		return false
	}
	idle := afterIdle(last, now)
	if !idle && *next != 0 && now < *next {
		return false
	}
	if idle || *next == 0 || now-*next > gap {
		*next = now + gap
	} else {
		*next += gap
	}
	return !idle
}

// afterIdle records a packet offered to the AQM at now in *last (when the last one
// was, 0: none yet) and tells whether it came an AQM interval or more after that one:
// the sender was not feeding the queue, and the packet is not dropped (Codel.Idle).
func afterIdle(last *int64, now int64) bool {
	prev := *last
	*last = now
	return prev != 0 && now-prev >= int64(aqmInterval)
}

// sendDataOn writes the header for one link into buf and sends it; copied says the
// packet also goes on another link (then no loss notice may name it). It returns the
// link sequence number the packet carried, and false if there is no link id. Caller
// holds txMu.
//
// Every data packet is logged on its link, copied ones marked, so that the link's
// rescue or a repair can send it again; the original send (not FlagDuplicate) keeps
// the packet for that, and every send notes its link in what was kept. Copied ones
// too, because when the primaries die together a packet sent while the first was in
// doubt can have its copy on the other dying one, and only that one's rescue still
// speaks for it (the lab's standby scenario lost such packets to a 664-ms stall and a
// TCP retransmission timeout).
func (s *Session) sendDataOn(id uint8, k *keyGen, seq uint32, flags uint8, copied bool, now int64, buf []byte) (linkSeq uint32, ok bool) {
	l := s.link(id)
	if l == nil {
		return 0, false
	}
	h := wire.Header{
		Type: wire.TypeData, Flags: flags, LinkID: id, KeyID: k.id,
		Session: s.peerIndex.Load(), Seq: seq, LinkSeq: s.takeLinkSeq(l),
		Timestamp: clock.Micros32(now),
	}
	h.Put(buf)
	auth.Seal(k.send, buf)
	l.sent.record(h.LinkSeq, seq, copied) // even if the send fails: then it surely never arrives
	if flags&wire.FlagDuplicate == 0 {
		s.kept.keep(seq, buf)
	}
	t0 := clock.Nanos()
	if err := l.send(l, buf); err != nil {
		s.log.Debug("send failed", "link", l.spec.Name, "err", err)
		return h.LinkSeq, true
	}
	if d := clock.Nanos() - t0; d > int64(sendStall) {
		l.blockedNs.Add(uint64(d))
	}
	s.kept.sentOn(seq, id)
	l.m.txPackets.Inc()
	onWire := len(buf) + l.outerLen()
	l.m.txBytes.Add(float64(onWire))
	l.txData.Add(uint64(onWire))
	l.txPkts.Add(1)
	if flags&wire.FlagDuplicate != 0 {
		l.m.dup.Inc()
	}
	return h.LinkSeq, true
}

// takeSeq takes the next global sequence number. Caller holds txMu.
func (s *Session) takeSeq() uint32 {
	if s.fp != nil {
		return s.fp.TakeSeq()
	}
	seq := s.txSeq
	s.txSeq++
	return seq
}

// takeLinkSeq takes the next sequence number of link l. Caller holds txMu.
func (s *Session) takeLinkSeq(l *link) uint32 {
	if s.fp != nil {
		return s.fp.TakeLinkSeq(l.spec.ID)
	}
	return l.txLinkSeq.Add(1)
}

// watermark is what a probe on link l carries: the next global sequence number, and the
// link's last sequence number. Caller holds txMu.
func (s *Session) watermark(l *link) (seq, linkSeq uint32) {
	seq = s.txSeq
	if s.fp != nil {
		seq = s.fp.PeekSeq()
	}
	return seq, l.sentLinkSeq()
}

// refreshSchedule hands the links' current parameters to the scheduler.
func (s *Session) refreshSchedule() {
	s.refreshMu.Lock()
	defer s.refreshMu.Unlock()
	links := s.allLinks()
	params := make([]sched.LinkParams, 0, len(links))
	var minFloor int32
	floors := make([]int32, len(links))
	haveFloors := true
	for i, l := range links {
		f, ok := l.peerOWDFloor()
		floors[i] = f
		haveFloors = haveFloors && ok
		if i == 0 || f < minFloor {
			minFloor = f
		}
	}
	rtts := make([]time.Duration, len(links))
	signs := make([]time.Time, len(links))
	for i, l := range links {
		p := l.params()
		rtts[i] = l.rtt()
		signs[i] = l.lastSign()
		// Base one-way delay towards the peer: from the peer's OWD reports when every
		// link has them (offsets between the clocks cancel), else half the RTT.
		if haveFloors {
			p.BaseOWD = int64(floors[i]-minFloor) * 1000
		}
		l.m.baseDelay.Set(float64(p.BaseOWD) / 1e9)
		params = append(params, p)
	}
	var gap time.Duration
	s.txMu.Lock()
	now := clock.Nanos()
	began, ended := s.backupReturn.apply(params, now)
	s.sched.SetLinks(params)
	if s.cfg.SparseFlows {
		s.sparseMargin = sparseMargin(params, rtts)
	}
	if s.aqm != nil {
		target := int64(aqmTarget(s.cfg.AQMTarget, s.cfg.AQMMaxTarget, params))
		s.aqm.SetTarget(target)
		reaction := aqmReaction(s.cfg.Probe, params, rtts)
		s.aqm.SetReaction(int64(reaction))
		held := failoverUnderWay(params)
		switch {
		case held:
			s.aqm.Idle()
			s.takeBack(now, params, signs, reaction)
		case s.aqmHeld:
			// The doubt is resolved: the measure now comes from the links left.
			s.aqm.Settle(now)
			s.log.Debug("aqm settles: the doubt is resolved", "first_drop_after", reaction)
			s.dropped.forget()
		}
		s.aqmHeld = held
		if !held {
			s.carrying = carryingRate(params)
		}
		if s.fp != nil {
			q := s.bondQueue.Load()
			if !s.aqmHeld && !s.bondUnmeasured.Load() {
				gap = time.Duration(s.aqm.Spacing(now, q, s.bondQueueGen.Load(), int64(s.cfg.Probe)))
			}
			// Logged when it changes: the kernel's drops and marks show in its
			// verdict counts only, not why they came when they did.
			if int64(gap) != s.fpGap {
				s.log.Debug("aqm spacing", "queue", time.Duration(q), "spacing", gap, "target", time.Duration(target))
			}
			s.fpGap = int64(gap)
		}
	}
	s.txMu.Unlock()
	if began {
		s.log.Info("a primary link is back: backup links take only what the primaries cannot carry yet",
			"at_most_for", backupReturnWindow)
	}
	if ended {
		s.log.Info("backup links stand by again: the primaries carry the traffic")
	}
	if s.fp != nil {
		s.programFastPath(links, params, gap)
	}
}

// aqmTarget is the standing queue the bond's entry tolerates: the configured target,
// or, if longer, the time the fastest usable primary link takes to pass one full-size
// packet (the least-queued link, which the measure is, never shows less while it
// carries data), up to ceiling (aqm.max_target).
//
// A slow link does not raise it. By arrival time alone the scheduler gave a slow link a
// packet only when the other links' queues were as long as its packet time, so the
// target was once the slowest link's (a scaled ADSL upstream, 67 ms per packet, idled
// through most of a CUBIC transfer while the bond dropped at 10 ms), and every packet
// of the bond waited that long. The scheduler now gives an idle slow link a packet
// whenever the bond is full (sched.idleSlowLink), and only the packets sent while it
// transmits wait for it, at the receiver.
//
// With a single usable link (a backup left alone when the primaries die) the bond
// tolerates the whole budget: nothing is reordered then, and one TCP flow on a lossy
// link needs a queue to keep the link busy through its window reductions. Behind the
// 10-ms target, a CUBIC flow on the lab's LTE backup (0.3 % loss, 45 ms) got 80-90 % of
// what the link gave it alone.
func aqmTarget(configured, ceiling time.Duration, links []sched.LinkParams) time.Duration {
	usable := 0
	var fastest time.Duration
	for _, p := range links {
		if !p.Usable {
			continue
		}
		usable++
		if p.Class == sched.ClassPrimary && p.RateBps > 0 {
			if pt := estimate.FullPacketTime(p.RateBps); fastest == 0 || pt < fastest {
				fastest = pt
			}
		}
	}
	t := max(configured, fastest)
	if usable == 1 {
		t = max(t, ceiling)
	}
	return min(t, max(configured, ceiling))
}

// failoverUnderWay reports whether a link that carries traffic now (a usable primary,
// or any usable link if no primary is) is suspect. Then the bond's AQM holds: it drops
// nothing, and leaves its dropping state. Its measure is then the dying links' last
// report, a queue that is not being fed any more, and what the senders send in the
// meantime is mostly what a failover makes them send: retransmissions after a timeout,
// tail-loss probes, whose loss costs a flow another timeout. In the lab's standby
// scenario with the fast path, the kernel dropped TCP's timeout resend 40 ms after the
// primaries went suspect, on the 26-ms queue their last report had shown; the next
// resend came 540 ms later (BENCHMARKS.md, "Late copies, and no AQM drop in a
// failover"). Once the doubt is resolved, the queue must stand above the target for an
// interval again, on measures that came at least a reaction time later, before the AQM
// drops (aqm.Codel.Settle): those show the links left, with what the failover itself
// queued on them drained.
func failoverUnderWay(links []sched.LinkParams) bool {
	carries := carriesTraffic(links)
	return slices.ContainsFunc(links, func(p sched.LinkParams) bool { return carries(p) && p.Suspect })
}

// carriesTraffic returns whether a link among links carries traffic now: a usable
// primary, or any usable link if no primary is.
func carriesTraffic(links []sched.LinkParams) func(sched.LinkParams) bool {
	primary := slices.ContainsFunc(links, func(p sched.LinkParams) bool {
		return p.Usable && p.Class == sched.ClassPrimary
	})
	return func(p sched.LinkParams) bool { return p.Usable && (p.Class == sched.ClassPrimary || !primary) }
}

// aqmReaction is the earliest a measure of the bond's queue can show the sender's
// answer to an AQM drop: the sender learns of the drop an RTT later at the soonest, the
// packets of its smaller window take up to another to reach the peer, and the report
// of the period they arrived in comes a period after that. The RTT is the smallest of
// the links that carry traffic now (the usable primaries, or the usable links if no
// primary is), as probes measure it with the link's queue: a lower bound of the flows'
// RTTs. Their real RTT is longer (a flow striped over several links waits for its
// slowest link's packets; one beyond the headend adds the internet's): with the
// largest link RTT instead, the bond dropped less often, and in the lab's standby
// scenario, whose 0.2 Mbit/s ADSL upstream's probes wait behind 60-ms packets, pings
// under load rose by about 7 ms, past the 30-ms budget in two runs of five
// (BENCHMARKS.md, "An AQM drop waits for its answer").
func aqmReaction(period time.Duration, links []sched.LinkParams, rtts []time.Duration) time.Duration {
	carries := carriesTraffic(links)
	rtt := time.Duration(-1)
	for i, p := range links {
		if carries(p) && (rtt < 0 || rtts[i] < rtt) {
			rtt = rtts[i]
		}
	}
	return period + 2*max(rtt, 0)
}

// programFastPath hands the kernel the session's transmit side: keys, and each link's
// addresses, state, class, rate and base delay as the scheduler has them.
func (s *Session) programFastPath(links []*link, params []sched.LinkParams, aqmGap time.Duration) {
	k := s.keys.sending()
	if k == nil {
		return
	}
	st := TxState{
		PeerIndex: s.peerIndex.Load(), KeyID: k.id, Key: k.send, AQMGap: aqmGap, Userspace: s.kernelBarred(),
		AQMECN: s.cfg.AQMECN,
	}
	for i, l := range links {
		p := params[i]
		tl := TxLink{
			ID: l.spec.ID, Local: l.local(), Interface: l.spec.Interface,
			Usable: p.Usable, Suspect: p.Suspect, Class: uint8(p.Class),
			RateBps: p.RateBps, BaseOWD: time.Duration(p.BaseOWD),
		}
		if r := l.remote.Load(); r != nil {
			tl.Remote = *r
		}
		st.Links = append(st.Links, tl)
	}
	s.fp.Program(st)
}

// sendControl seals and sends one control message on a link.
func (s *Session) sendControl(l *link, t wire.Type, seq, linkSeq uint32, body []byte) {
	s.sendControlStamped(l, t, seq, linkSeq, body, clock.Micros32(clock.Nanos()))
}

// sendControlStamped is sendControl with the header's timestamp given: copies of one
// message on several links carry the same one, so the peer takes the first to arrive
// and sees the rest as stale.
func (s *Session) sendControlStamped(l *link, t wire.Type, seq, linkSeq uint32, body []byte, stamp uint32) {
	k := s.keys.sending()
	if k == nil {
		return
	}
	pkt := make([]byte, wire.HeaderLen+len(body))
	h := wire.Header{
		Type: t, LinkID: l.spec.ID, KeyID: k.id, Session: s.peerIndex.Load(),
		Seq: seq, LinkSeq: linkSeq, Timestamp: stamp,
	}
	h.Put(pkt)
	copy(pkt[wire.HeaderLen:], body)
	auth.Seal(k.send, pkt)
	if err := l.send(l, pkt); err != nil {
		l.logger().Debug("control send failed", "type", t, "err", err)
		return
	}
	onWire := float64(len(pkt) + l.outerLen())
	l.m.txPackets.Inc()
	l.m.txBytes.Add(onWire)
	if int(t) < len(s.controlTx) && s.controlTx[t].bytes != nil {
		s.controlTx[t].packets.Inc()
		s.controlTx[t].bytes.Add(onWire)
	}
}

// probeAtOnce probes link l now rather than at the tick's turn: a link that came back
// (setLinkOffline) or moved to a new address (CPE.RebindUplink).
func (s *Session) probeAtOnce(l *link) {
	l.probed(time.Now())
	s.sendProbe(l, 0)
}

// sendProbe sends a probe whose sequence field is the data watermark of this link. It
// takes txMu so that no data packet with a lower sequence number can still be on its way
// to the socket behind it.
func (s *Session) sendProbe(l *link, padding int) {
	body := wire.ProbeBody{Counter: s.txCtrl.Add(1), Padding: padding}.Append(nil)
	s.txMu.Lock()
	defer s.txMu.Unlock()
	seq, linkSeq := s.watermark(l)
	s.sendControl(l, wire.TypeProbe, seq, linkSeq, body)
}

// receive handles one datagram that parsed and matched this session. via is the link
// the session's peer sent it on; from its source address; arr what the kernel said of
// its arrival (readLoop).
func (s *Session) receive(h *wire.Header, pkt []byte, from netip.AddrPort, now time.Time, arr arrival) (reason wire.Reason, ok bool) {
	counted := false // counted by the handover, not yet in the resequencer (rxInFlight)
	if h.Type == wire.TypeData && s.fp != nil {
		// Before anything can reject it: the kernel counted it when it passed it up, and
		// takes the ordering back only when the daemon has seen all it passed up.
		s.rxMu.Lock()
		restart, next, drop := s.fp.OnData(h.LinkID, h.LinkSeq, now)
		s.afterHandover(restart, next)
		s.rxInFlight++
		s.lastFastData = now
		counted = true
		s.rxMu.Unlock()
		defer func() {
			if counted { // rejected before it reached the resequencer
				s.rxMu.Lock()
				s.rxInFlight--
				s.armHoldTimer(clock.Nanos())
				s.rxMu.Unlock()
			}
		}()
		if drop {
			return wire.ReasonReplay, false
		}
	}
	k := s.keys.lookup(h.KeyID, now)
	if k == nil {
		return wire.ReasonStaleKey, false
	}
	if !auth.Verify(k.recv, pkt) {
		return wire.ReasonBadTag, false
	}
	if h.Type == wire.TypeData && h.Duplicate() {
		if nanos := clock.Nanos(); !s.awaitingRepair(nanos) { // a repair is no doubt
			if !s.copiedWithinSpan(s.peerCopied.Swap(nanos), nanos) {
				defer s.onPeerCopies(now)
			}
		}
	}
	l := s.link(h.LinkID)
	if l == nil {
		l = s.learnLink(h.LinkID)
		if l == nil {
			return wire.ReasonUnknownSession, false
		}
	}
	s.noteArrival(l, arr.ifindex)
	if h.Type == wire.TypeData {
		if !k.acceptData(h.Seq) {
			// Mostly the later of a suspect link's packet and its copy. It did cross
			// its link, and the link's accounting must show that: a suspect link whose
			// copies won every race looked to the sender as if nothing arrived on it,
			// and stayed suspect for good (quiet.go), its packets counted lost.
			l.rx.account(h, len(pkt)+l.outerLen(), s.owd.rel(clock.Micros32(clock.Nanos())-h.Timestamp), now, s.fp == nil)
			return wire.ReasonReplay, false
		}
	} else {
		msg, err := wire.Parse(pkt)
		if err != nil {
			return wire.ReasonOf(err), false
		}
		if !k.acceptControl(msg.Counter()) {
			return wire.ReasonReplay, false
		}
		defer s.handleControl(l, h, msg, now, arr.stamp)
	}
	if s.keys.confirm(k) {
		s.schedDue.Store(true) // the kernel must send with the confirmed keys too
	}
	s.follow(l, from)
	s.evidenceBack(l) // before its data reaches the resequencer
	// After follow: the peer's address, and with it the outer header, may have changed.
	onWire := len(pkt) + l.outerLen()
	l.m.rxPackets.Inc()
	l.m.rxBytes.Add(float64(onWire))
	if h.Type == wire.TypeData {
		nanos := clock.Nanos()
		gap := l.rx.account(h, onWire, s.owd.rel(clock.Micros32(nanos)-h.Timestamp), now, s.fp == nil)
		if gap.lost > 0 {
			l.m.lost.Add(float64(gap.lost))
		}
		if gap.lost > 0 && s.wantsRepair(l, gap) {
			defer s.requestRepair(l, h.LinkSeq, gap.lost) // at return, after rxMu: it sends
		}
		s.rxMu.Lock()
		if counted {
			s.rxInFlight--
			counted = false
		}
		switch {
		case h.Flags&wire.FlagSparse != 0: // copies too: a late one is delivered either way
			s.reseq.PushSparse(nanos, h.Seq, h.LinkID, pkt[wire.HeaderLen:], s.deliver)
		case h.Flags&wire.FlagDuplicate != 0:
			s.reseq.PushCopy(nanos, h.Seq, h.LinkID, pkt[wire.HeaderLen:], s.deliver) // late copies too (rescue.go)
		default:
			s.reseq.Push(nanos, h.Seq, h.LinkID, pkt[wire.HeaderLen:], s.deliver)
		}
		s.armHoldTimer(nanos)
		s.rxMu.Unlock()
	}
	return 0, true
}

// follow updates the peer's address for a link after an authenticated packet, so the
// headend follows NAT rebinding. The CPE's links have fixed remotes and ignore it.
func (s *Session) follow(l *link, from netip.AddrPort) {
	if !from.IsValid() {
		return
	}
	old := l.remote.Load()
	if old != nil && *old == from {
		return
	}
	l.remote.Store(&from)
	if old != nil {
		l.logger().Info("peer address changed", "from", *old, "to", from)
	} else {
		// A link first heard from (the headend learns the CPE's links so): probe it
		// now, not at the next tick, so that it is in the schedule an RTT later. Until
		// then downstream packets find no usable link and are dropped at the entry.
		s.sendProbe(l, 0)
	}
	s.checkKernel()
}

// learnLink is set by the role: the headend creates links as the CPE's uplinks appear.
func (s *Session) learnLink(id uint8) *link {
	if s.onNewLink == nil {
		return nil
	}
	return s.onNewLink(id)
}

func (s *Session) handleControl(l *link, h *wire.Header, msg wire.Message, now time.Time, rxStamp int64) {
	switch body := msg.Body.(type) {
	case wire.ProbeBody:
		// Timed before the reply goes out, as a data packet is when it is read.
		owd := s.owd.rel(clock.Micros32(clock.Nanos()) - h.Timestamp)
		l.rx.probeSample(owd)
		reply := wire.ProbeReplyBody{Counter: s.txCtrl.Add(1), EchoTimestamp: h.Timestamp, EchoLinkID: h.LinkID}
		if body.Train() {
			reply.Train, reply.Arrival = true, clock.Micros32(rxMonotonic(rxStamp))
		}
		s.sendControl(l, wire.TypeProbeReply, 0, 0, reply.Append(nil))
		if l.probeBack(now, s.cfg.Probe) {
			s.sendProbe(l, 0)
		}
		nanos := clock.Nanos()
		var gap rxGap
		if s.fp == nil { // with a fast path the daemon does not see all the link's data
			gap = l.rx.behindProbe(h.LinkSeq, owd, now)
			if gap.lost > 0 {
				l.m.lost.Add(float64(gap.lost))
			}
		}
		if gap.lost > 0 && s.wantsRepair(l, gap) {
			defer s.requestRepair(l, h.LinkSeq+1, gap.lost) // at return, after rxMu: it sends
		}
		s.rxMu.Lock()
		if !s.kernelMayOwn() {
			s.reseq.Watermark(nanos, h.LinkID, h.Seq, s.deliver)
		}
		s.armHoldTimer(nanos)
		s.rxMu.Unlock()
	case wire.ProbeReplyBody:
		if l.isOffline() {
			break // a reply that was on its way when the uplink went offline
		}
		rtt := time.Duration(clock.Micros32(clock.Nanos())-body.EchoTimestamp) * time.Microsecond
		if body.Train && l.onTrainReply(body.Arrival) {
			go s.sendTrain(l, longTrain)
		}
		switch was := l.onReply(now, rtt); was {
		// The new state has made the schedule due (setState).
		case stateProbing, stateDown:
			l.logger().Info("link up", "was", was, "rtt", rtt)
			go s.sendTrain(l, shortTrain) // not on the receive path: it sends datagrams
		case stateSuspect:
			l.logger().Info("link recovered: probe replies are back", "rtt", rtt)
		}
	case wire.FeedbackBody:
		s.onFeedback(now, h.Timestamp, body)
		s.ackSent(body.Links)
	case wire.LossNoticeBody:
		s.onLossNotice(body)
	case wire.LinkParamsBody:
		if body.Counter <= s.linkParamsSeen.Load() {
			break // an older copy overtaken by a newer one (the CPE sends one per link)
		}
		s.linkParamsSeen.Store(body.Counter)
		ids := make([]uint8, 0, len(body.Links))
		for _, p := range body.Links {
			ids = append(ids, p.LinkID)
			if pl := s.link(p.LinkID); pl != nil {
				pl.setPeerPrior(float64(p.RateBps), sched.Class(p.Class))
				pl.m.mtu.Set(float64(p.MTU))
				cause := causePeerOnline
				if p.Offline {
					cause = causePeerOffline
				}
				s.setLinkOffline(p.LinkID, offlineUplink, p.Offline, cause)
			}
		}
		s.setLinkIDs(ids)
		s.schedDue.Store(true)
		s.notePeerMTU(body.Links)
	case wire.LinkNamesBody:
		s.onLinkNames(body)
	case wire.RepairRequestBody:
		s.onRepairRequest(body)
	}
}

// notePeerMTU passes on the smallest MTU the peer announces for its links (0 when it
// announces none: a new session of a CPE that knows none must not keep the old one's),
// when it differs from the last one passed on. An MTU below IPv4's 576 is no MTU a link
// has: it counts as unknown.
func (s *Session) notePeerMTU(links []wire.LinkParam) {
	if s.cfg.PeerMTU == nil {
		return
	}
	mtu := 0
	for _, p := range links {
		if p.MTU >= minPeerMTU && (mtu == 0 || int(p.MTU) < mtu) {
			mtu = int(p.MTU)
		}
	}
	if s.peerMTU.Swap(int32(mtu)+1) != int32(mtu)+1 {
		s.cfg.PeerMTU(s.cfg.Peer, mtu)
	}
}

// minPeerMTU is the smallest link MTU notePeerMTU believes (IPv4's minimum datagram).
const minPeerMTU = 576

// armHoldTimer makes sure the hold timer fires by the resequencer's next deadline and
// (fast path) offers the kernel the ordering back when the resequencer is empty and no
// packet the handover counted is still on its way into it. Caller holds rxMu.
func (s *Session) armHoldTimer(now int64) {
	if s.fp != nil && s.rxInFlight == 0 {
		var skipped uint64 // read only when it can go with a handback
		empty := s.reseq.Empty() && s.kernelMayCarry()
		if empty {
			skipped = s.reseq.Skipped()
		}
		s.fp.Idle(s.reseq.Next(), skipped, empty)
	}
	d, ok := s.reseq.NextDeadline()
	if !ok || (s.armedAt != 0 && s.armedAt <= d) {
		return
	}
	s.armedAt = d
	s.holdTimer.Reset(time.Duration(d - now))
}

func (s *Session) onHoldTimer() {
	s.rxMu.Lock()
	defer s.rxMu.Unlock()
	now := clock.Nanos()
	s.armedAt = 0
	s.reseq.Expire(now, s.deliver)
	s.armHoldTimer(now)
}

// tick runs the per-session control work every probe interval: probes on every link,
// health, feedback to the peer, the resequencer's hold time, and metrics.
func (s *Session) tick(now time.Time) {
	links := s.allLinks()
	if s.fp != nil {
		// Before the links' marks (noteSent, checkHealth): a mark that missed what
		// the kernel sent since the last look dated those packets a tick late, so a
		// report that showed them all arriving confirmed none, and the next one, with
		// nothing new, owed them all (TestKernelSendsCountAtTheTickAfterThem).
		s.mergeFastTx(links)
	}
	s.repeatLossNotices()
	primaryUp := slices.ContainsFunc(links, upPrimary)
	for _, l := range links {
		l.noteSent(now)
		l.setUnit(s.probeUnit(l, now, primaryUp), now)
	}
	s.markSilentPeers(links, now)
	doubt := markDoubt(links, s.peerCopies())
	for _, l := range links {
		if l.probeDue(now, s.cfg.Probe, doubt) {
			s.sendProbe(l, 0)
		}
		if l.checkTrain(now) {
			go s.sendTrain(l, longTrain)
		} else if l.retryTrain(now) || l.retrainDue(now) {
			go s.sendTrain(l, shortTrain)
		}
		s.checkLinkHealth(l, now)
	}
	if s.fp != nil {
		s.mergeFastRx(links, now)
	}
	s.sendFeedback(now, links, doubt)
	s.adaptHold(now, links)
	if s.asksRepairs() {
		s.repairWait.Store(int64(repairTime(links, s.cfg.MaxHold)))
	}
	s.publishReseqStats()
	s.txMu.Lock()
	returning := s.backupReturn.pending() // its window must begin and end on time
	s.txMu.Unlock()
	if due := s.schedDue.Swap(false); due || returning {
		s.refreshSchedule()
	}
}

// probeUnit is how often link l is to be probed while it carries nothing, and the unit
// its silence is judged in: the probe interval, or the longer standby interval for a
// standby link (overflow, backup) while a primary is up and the link stands by. Such a
// link waits for the primaries to fill up or fail, and a metered line (LTE) bills
// every probe: probed like the others, with FEEDBACK copies, an idle one cost 15.6 GB
// in 30 days. With no primary left, or carrying data (for three standby intervals
// after its last: a link that dies under load stops being reported busy at once, and
// must still be found dead in a fraction of a second), it is one of the bond's links.
// So is a standby link whose answer to its last probe is overdue, until it answers or
// is found down: judged in standby intervals, a link that died idle went unnoticed for
// 4-6 s; verified at the probe interval, in doubt from the missed answer on, it is
// found down a suspicion time (three probe intervals) after it, and a late or lost
// reply costs a probe or two.
func (s *Session) probeUnit(l *link, now time.Time, primaryUp bool) time.Duration {
	if s.cfg.StandbyProbe > s.cfg.Probe && primaryUp && l.isStandby() &&
		!l.carrying(now, s.cfg.Probe, 3*s.cfg.StandbyProbe) &&
		!l.missedAnswer(now, s.cfg.StandbyProbe, s.cfg.Probe) {
		return s.cfg.StandbyProbe
	}
	return s.cfg.Probe
}

// markSilentPeers tells each link whether any other link of the session showed life
// within half the suspicion time: a link owing data is in doubt for its silence only
// if it is alone in it (all links silent at once is the peer or the path, not a link).
// And it tells each whether no link at all showed life within a suspicion time
// (quietWatch.bondSilent): a link silent with all the others is not suspected for it.
func (s *Session) markSilentPeers(links []*link, now time.Time) {
	alive, heard := 0, 0
	signs := make([]bool, len(links))
	for i, l := range links {
		// An idle standby link answers every few seconds: alive until it would be
		// suspect, or one lost probe would count it silent.
		window := 3 * s.cfg.Probe / 2
		unit := l.probeUnit(s.cfg.Probe)
		if unit > s.cfg.Probe {
			window = 3 * unit
		}
		since := l.aliveSince()
		if signs[i] = since.After(now.Add(-window)); signs[i] {
			alive++
		}
		if since.After(now.Add(-3 * unit)) {
			heard++
		}
	}
	for i, l := range links {
		others := alive
		if signs[i] {
			others--
		}
		l.mu.Lock()
		l.quiet.othersSilent = others == 0
		l.quiet.bondSilent = heard == 0 && len(links) > 1
		l.mu.Unlock()
	}
}

// peerDoubtSpan is for how many probe intervals a copy from the peer puts our primaries
// in doubt: a peer with a link in doubt copies every packet it sends on it.
const peerDoubtSpan = 2

// peerCopies reports whether a copy came from the peer within the last peerDoubtSpan
// probe intervals.
func (s *Session) peerCopies() bool {
	return s.copiedWithinSpan(s.peerCopied.Load(), clock.Nanos())
}

// copiedWithinSpan tells whether a copy the peer sent at (clock.Nanos, 0: none) is
// within peerDoubtSpan probe intervals of nanos.
func (s *Session) copiedWithinSpan(at, nanos int64) bool {
	return at != 0 && nanos-at < int64(peerDoubtSpan*s.cfg.Probe)
}

// onPeerCopies puts the primaries in doubt as soon as the peer's first copy arrives
// if they have been silent long enough (link.doubtAround), not at the next tick: the
// copies say the peer doubts its links, which are ours too. Up to a probe interval
// sooner, the ACKs of a flow whose data the peer now copies to a standby link follow
// it there (the lab's standby scenario: the sender's retransmission timer fires about
// 300 ms after the primaries die, and the peer copies from about 200 ms). It only
// suspects: a link taken down here would leave the resequencer's evidence while the
// rest of the peer's copies of its packets are still on their way, and they would come
// late.
func (s *Session) onPeerCopies(now time.Time) {
	links := s.allLinks()
	markDoubt(links, true)
	for _, l := range links {
		s.doubtAtOnce(l, now)
	}
}

// doubtAtOnce makes l suspect now, between ticks, if it is in doubt (link.doubtNow),
// and acts on it as the tick would.
func (s *Session) doubtAtOnce(l *link, now time.Time) {
	if cause, ok := l.doubtNow(now, 3*l.probeUnit(s.cfg.Probe), s.cfg.DownAfter); ok {
		s.announceSuspect(l, cause)
		s.schedDue.Store(true)
	}
}

// markDoubt tells each primary link whether another link of the session owes data,
// and whether the peer copies what it sends (peerCopies: it has a link in doubt), for
// link.checkHealth; it reports whether either holds (every link is probed every
// interval then, link.probeDue). A standby link is left to its
// own probes: it is where a suspect primary's copies go, and a reply of its delayed
// behind them must not send them back to the primaries.
func markDoubt(links []*link, peerCopies bool) (doubt bool) {
	owing := 0
	owes := make([]bool, len(links))
	for i, l := range links {
		if owes[i] = l.owes(); owes[i] {
			owing++
		}
	}
	for i, l := range links {
		others := owing
		if owes[i] {
			others--
		}
		l.mu.Lock()
		standby := l.isStandbyLocked()
		l.quiet.othersOwe = others > 0 && !standby
		l.quiet.peerCopies = peerCopies && !standby
		l.mu.Unlock()
	}
	return owing > 0 || peerCopies
}

// checkLinkHealth moves l through its health states (link.checkHealth) and acts on a
// change: a link gone down has its share moved and its lost packets named to the peer.
func (s *Session) checkLinkHealth(l *link, now time.Time) {
	state, changed, cause := l.checkHealth(now, 3*l.probeUnit(s.cfg.Probe), s.cfg.DownAfter)
	if !changed {
		return
	}
	switch state {
	case stateUp:
		l.logger().Info("link no longer suspect", l.liftedBy(now)...)
	case stateSuspect:
		s.announceSuspect(l, cause)
	case stateDown:
		// Its companions first: the schedule that takes l out puts them in doubt too.
		// After linkDown, the kernel sent seven packets uncopied on a dead companion in
		// the 5 ms between the two refreshes (17 ms until the companion's rescue).
		s.doubtCompanions(l, now)
		noticed := s.linkDown(l)
		l.logger().Warn("link down", "cause", cause.String(), "down_after", s.cfg.DownAfter, "loss_notice_seqs", noticed)
	}
	// The change made the schedule due already (setState).
}

// doubtCompanions puts in doubt, at once, each primary that carried traffic beside the
// primary down, a link just found down for its silence, and has shown no sign of life
// since the doubt about it began, if a standby link stands by to take the copies; each
// stays in doubt until it shows one (link.doubtAround). Primaries die together (one
// power cut, one street cabinet), and once the first is down its doubt no longer makes
// the bond copy to the standby link (failoverUnderWay, sched.StandbyCopy): a slow
// companion, dead as well but not yet found so, then took every packet without a
// copy. In the lab's standby scenario with the fast path the cable was found down
// 62 ms after its doubt began, and the ADSL line, whose 0.2 Mbit/s upstream gives
// little to owe and answers probes late behind its queue, took the upload's packets
// alone for the 200 ms until it was found down too; their rescue copies came after the
// headend had given the numbers up, and the flow cut its window on the backup alone. A
// companion that is alive and busy shows it in the peer's reports, one a report period,
// so it is rarely in doubt at all, and then until the next report, at the cost of that
// period's copies on the standby link. Without a standby link nothing changes: the
// copies would go to the other primaries, halving what they carry while they recover,
// and a link's death is far more often its own. Nor after a carrier loss
// (setLinkOffline): a local event of that interface, not a silence.
func (s *Session) doubtCompanions(down *link, now time.Time) {
	if down.isStandby() {
		return
	}
	links := s.allLinks()
	standing := slices.ContainsFunc(links, func(l *link) bool {
		return l.isStandby() && l.isUp() && !l.isSuspect()
	})
	if !standing {
		return
	}
	since := down.doubtBegan(now)
	for _, l := range links {
		if l == down || l.isStandby() {
			continue
		}
		l.mu.Lock()
		l.quiet.companionDown = since
		l.mu.Unlock()
		s.doubtAtOnce(l, now)
	}
}

// announceSuspect acts on a link that just went suspect: the packets it had in flight
// get copies (rescue), and the log says why.
func (s *Session) announceSuspect(l *link, cause healthCause) {
	// With the kernel fast path the kernel learns of the doubt now, as of a link gone
	// down (linkDown), not at the tick's refresh up to a probe interval later: its
	// packets on l get their copies from here on, and the bond's AQM holds
	// (failoverUnderWay).
	if s.fp != nil {
		s.refreshSchedule()
	}
	l.m.suspicions[cause].Inc()
	l.logger().Warn("link suspect: copying its traffic to another link", "cause", cause.String(),
		"copied_in_flight", s.rescue(l))
}

// mergeFastRx adds what the kernel delivered on each link to the link's receive
// accounting, and settles the links' loss counts, which the daemon alone cannot tell
// from the few packets it sees itself. After a quiet period (now) it resynchronises the
// receive counts with the kernel's.
func (s *Session) mergeFastRx(links []*link, now time.Time) {
	delta := s.fp.RxDelta()
	for _, l := range links {
		if d, ok := delta[l.spec.ID]; ok {
			if d.HaveOWD {
				d.OWD = s.owd.rel(uint32(d.OWD)) // the kernel's raw sample, into the frame
			}
			perPacket := uint64(wire.HeaderLen + l.outerLen()) // the kernel counts inner bytes
			l.rx.addDelivered(d, perPacket, time.Now())
			l.m.rxPackets.Add(float64(d.Packets))
			l.m.rxBytes.Add(float64(d.Bytes + perPacket*d.Packets))
		}
		if lost := l.rx.settleLoss(); lost > 0 {
			l.m.lost.Add(float64(lost))
		}
	}
	s.checkReceive()
	s.rxMu.Lock()
	if s.rxInFlight == 0 && s.reseq.Empty() && now.Sub(s.lastFastData) > fastResyncQuiet {
		restart, next := s.fp.Resync(now, fastResyncQuiet)
		s.afterHandover(restart, next)
	}
	s.armHoldTimer(clock.Nanos())
	s.rxMu.Unlock()
}

// fastResyncQuiet is how long no DATA packet of a session must have reached the daemon
// before it trusts that nothing the kernel passed up is still on its way (a passed-up
// packet takes microseconds to reach the socket; a second also outlasts any hold time).
const fastResyncQuiet = time.Second

// mergeFastTx adds what the kernel sent on each link to the link's transmit counters.
// Besides the tick, every FEEDBACK calls it, so that the estimators' samples compare
// what was sent and what arrived over the same period.
func (s *Session) mergeFastTx(links []*link) {
	sent := s.fp.TxDelta()
	kernelSent := false
	for _, l := range links {
		if d, ok := sent[l.spec.ID]; ok {
			kernelSent = kernelSent || d.Packets > 0
			l.m.txPackets.Add(float64(d.Packets))
			onWire := d.Bytes + uint64(wire.HeaderLen+l.outerLen())*d.Packets // as sendDataOn counts
			l.m.txBytes.Add(float64(onWire))
			l.txData.Add(onWire)
			l.txPkts.Add(d.Packets)
			l.m.dup.Add(float64(d.Copies))
		}
	}
	if kernelSent {
		s.kernelSentAt.Store(clock.Nanos())
	}
	// The kernel's AQM drops and marks count as the daemon's own (entryAQMDrops).
	a := s.fp.AQMDelta()
	s.pm.aqmDrops.Add(float64(a.Drops))
	s.pm.aqmECTDrops.Add(float64(a.ECTDrops))
	s.pm.aqmMarks.Add(float64(a.Marks))
}

// holdMargin is added to the measured delay spread to make the hold time. A variable
// only so that tests can widen it.
var holdMargin = 10 * time.Millisecond

// adaptHold sets the resequencer's hold time from the spread of the links' one-way
// delays plus their jitter: long enough for the slowest link's packets, no longer.
func (s *Session) adaptHold(now time.Time, links []*link) {
	var lo, hi, jitter int32
	n := 0
	for _, l := range links {
		floor, last, active := l.rx.owd(now, 2*time.Second)
		if !active {
			continue
		}
		if n == 0 || floor < lo {
			lo = floor
		}
		if n == 0 || floor > hi {
			hi = floor
		}
		if j := last - floor; j > jitter {
			jitter = j
		}
		n++
	}
	hold := time.Duration(hi-lo+2*jitter)*time.Microsecond + holdMargin
	if n < 2 || hold > s.cfg.MaxHold {
		hold = s.cfg.MaxHold
	}
	s.rxMu.Lock()
	s.reseq.SetHold(int64(hold))
	inForce := time.Duration(s.reseq.Hold()) // with what late packets added (reseq/stretch.go)
	s.rxMu.Unlock()
	s.pm.holdNow.Set(inForce.Seconds())
}

// publishReseqStats adds what the resequencer counted since the last tick to the metrics.
func (s *Session) publishReseqStats() {
	s.rxMu.Lock()
	st := s.reseq.Stats()
	hold := time.Duration(s.reseq.Hold())
	prev := s.lastStats
	s.lastStats = st
	s.rxMu.Unlock()
	s.pm.reorderHeld.Add(float64(st.Held - prev.Held))
	s.pm.reorderLost.Add(float64(st.Lost - prev.Lost))
	s.pm.duplicates.Add(float64(st.Duplicates - prev.Duplicates))
	s.pm.latePackets.Add(float64(st.Late - prev.Late))
	if st.Stretches != prev.Stretches {
		s.pm.reorderStretches.Add(float64(st.Stretches - prev.Stretches))
		s.log.Info("resequencer hold lengthened: packets arrived after the hold timer had given them up",
			"late", st.Late-prev.Late, "hold", hold)
	}
	s.pm.lateCopies.Add(float64(st.LateCopies - prev.LateCopies))
	s.pm.sparseAhead.Add(float64(st.Ahead - prev.Ahead))
	s.pm.reorderSkips.Add(float64(st.OverflowSkips - prev.OverflowSkips))
	// Mean hold time = rate(reorder_hold_seconds_total) / rate(reorder_held_packets_total).
	s.pm.reorderHold.Add(float64(st.HoldTimeNsSum-prev.HoldTimeNsSum) / 1e9)
}

// installKeys adds a key generation and tells the observer the receive keys now valid.
func (s *Session) installKeys(g *keyGen, sendNow bool) {
	s.keys.install(g, sendNow)
	s.schedDue.Store(true) // the kernel's send key may have changed
	if s.cfg.Keys == nil {
		return
	}
	gens := []KeyGeneration{{ID: g.id, Key: g.recv}}
	s.keys.mu.RLock()
	if p := s.keys.prev; p != nil {
		gens = append(gens, KeyGeneration{ID: p.id, Key: p.recv})
	}
	s.keys.mu.RUnlock()
	s.cfg.Keys.SessionKeys(s.localIndex, gens)
}

func (s *Session) close() {
	s.once.Do(func() {
		close(s.closed)
		s.linkNames.close()
		s.holdTimer.Stop()
		if s.fp != nil {
			s.fp.Close()
		}
		if s.cfg.Keys != nil {
			s.cfg.Keys.SessionClosed(s.localIndex)
		}
	})
}
