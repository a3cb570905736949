package tunnel

import (
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aggd/aggd/internal/estimate"
	"github.com/aggd/aggd/internal/sched"
	"github.com/aggd/aggd/internal/wire"
)

// LinkSpec describes one link of a session as the local side knows it before any
// measurement: its identity, class and the rate priors from the configuration.
type LinkSpec struct {
	ID     uint8
	Name   string
	Class  sched.Class
	TxRate float64 // prior for the rate we can send at, bits/s (0 = unknown)
	RxRate float64 // prior for the rate the peer can send to us at, bits/s (0 = unknown)
	Weight float64 // pinned scheduler weight; 0 = automatic
	// Where the link's packets leave from: our address and port, and (CPE) the uplink
	// interface. The fast path needs them to send on the link itself.
	Local     netip.AddrPort
	Interface string
}

// link is one path of a session: our uplink (CPE) or the CPE's uplink as seen from the
// headend. It carries the transmit counters, the receive accounting the peer wants in
// feedback, and the health state derived from probes.
type link struct {
	spec LinkSpec
	// logged is the link's logger: link=<our name>, and on the headend also
	// name=<the CPE's name for it> once the CPE has named it (linknames.go). Read it
	// with logger(): the name arrives while other goroutines log.
	logged atomic.Pointer[slog.Logger]

	// send writes one finished datagram onto this path. It gets the link itself so
	// that it can read the link's current remote address (headend).
	send func(self *link, pkt []byte) error

	// Transmit side: the link sequence number of the last data packet sent on it,
	// taken under the session's txMu and read by the health checks without it. With a
	// fast path the kernel and the daemon share one series instead, read with
	// peekLinkSeq (the next number, not yet taken).
	txLinkSeq   atomic.Uint32
	peekLinkSeq func() uint32

	rx rxAccount
	// rxIfindex is the interface the link's packets last arrived on (0: none yet, or
	// the kernel did not say): the kernel fast path sees only some (kernel.go).
	rxIfindex atomic.Int32

	// Health (from probe replies) and estimation (from the peer's FEEDBACK), under mu.
	mu        sync.Mutex
	lastReply time.Time
	lastProbe time.Time // when the tick last probed the link (probeDue)
	// awaiting is when the first probe still unanswered went out: the first one the
	// tick sent after the link's last sign (missedProbe).
	awaiting time.Time
	// unit is how often the link is probed while idle and the unit its silence is
	// judged in (Session.probeUnit; 0 before the first tick: the probe interval);
	// unitShrunk is when it last became shorter (setUnit), and shrunkOverdue whether
	// the link's answer on the old scale was overdue then. lastSent is when the tick
	// last saw data sent on the link (txPkts moved since sentSeen).
	unit          time.Duration
	unitShrunk    time.Time
	shrunkOverdue bool
	lastSent      time.Time
	sentSeen      uint64
	// lastDelivered is when the peer last reported new data received on the link: a
	// sign of life as good as a probe reply, and the only timely one from a slow link
	// with a deep queue, whose probes wait behind its data (a scaled ADSL upstream with
	// 1 s of buffer went suspect in startup, and its traffic was copied for nothing).
	lastDelivered time.Time
	// suspectedAt is when the link last went suspect: what it showed since then says
	// why it is found up again (liftedBy).
	suspectedAt time.Time
	state       linkState
	// schedDue is the session's: set by every change of state, before the metrics show
	// it, so that whoever reads a link up in them (a test, an operator's script) and
	// sends at once finds the schedule due to take it in (a CI run of the tunnel's
	// tests under the race detector lost its one packet to a schedule still without
	// the link it read up). Nil for links made outside a session (tests).
	schedDue      *atomic.Bool
	train         *train // the probe train measuring the link's capacity (train.go)
	trainRetries  int    // short trains sent again after one measured nothing (train.go)
	retrain       retrainWatch
	rttNs         float64 // smoothed
	peerRate      float64 // bits/s the peer reports receiving from us, smoothed
	peerLoss      float64
	prevReport    wire.LinkReport
	prevAt        time.Time
	peerPrior     float64 // rate prior the peer announced for its receive direction
	peerAnnounced bool    // the peer has announced its prior and class (LINK_PARAMS)

	// How many packets the last report showed newly arrived, and whether no report has
	// shown anything new since one that showed the link delivering steadily (fellSilent).
	prevPackets     uint32
	silentAfterBusy bool

	// The estimator sample in progress: where it started (report, the peer's time in
	// µs, txData, blockedNs), the smallest one-way delay of its reports, and how long
	// its reports that showed nothing arriving on the link span (estimate.Sample.Idle).
	smpIdle     time.Duration
	smpStarted  bool
	smpReport   wire.LinkReport
	smpPeerTime uint32
	smpSent     uint64
	smpBlocked  uint64
	smpMinOWD   int32
	smpHaveOWD  bool
	// est turns the peer's reports into the rate the scheduler assumes (capacity,
	// queueing control); the configured rates are its prior and cap.
	est       *estimate.Estimator
	loggedCap float64 // capacity estimate last logged
	jitterUs  float64 // smoothed spread of one-way delay within a report period, µs
	// Windowed minimum of the one-way delay the peer measures on this link (µs, with the
	// clocks' offset, which is the same for every link and cancels in comparisons).
	owdFloor     [2]int32
	owdFloorSet  [2]bool
	owdFloorTurn time.Time

	// remote is the peer's address for this link (headend: learned from authenticated
	// packets, so it follows NAT rebinding).
	remote atomic.Pointer[netip.AddrPort]

	// sent maps recent link sequence numbers to global ones, for loss notices when the
	// link goes down (lossnotice.go). offline: why the link cannot carry traffic now
	// (offlineReason bits; none: it can), so that it stays down whatever stray probe
	// replies say; rebound:
	// the address the uplink's socket was re-bound to when its address changed
	// (uplinkevents.go).
	sent sentLog
	// rescuedThrough is how many of the link's logged packets (sent.n) its last rescue
	// took in: those had their copies (rescue.go). A count, not a link sequence number:
	// a number kept while 2^31 packets went by would look ahead of the newest, and the
	// next rescue would find nothing in flight. Guarded by the session's txMu.
	rescuedThrough uint64
	// kernelRescuedThrough is the link sequence number of the last packet the kernel
	// fast path had sent on the link when its last rescue looked: those after it are
	// the next rescue's (kernelInFlight). A number, unlike rescuedThrough: the kernel's
	// log is read by number. Guarded by the session's txMu.
	kernelRescuedThrough uint32
	offline              atomic.Uint32
	rebound              atomic.Pointer[netip.AddrPort]
	// noEvidence: found down and nothing heard on it since, so the resequencer does
	// not wait for its FIFO evidence (evidence.go).
	noEvidence atomic.Bool

	// txData counts the data bytes sent on the link (outer headers included, as the
	// peer counts them), by the daemon and the kernel alike: what we offered the link.
	txData atomic.Uint64
	// txPkts counts the data packets sent on the link, likewise; quiet judges the
	// peer's reports against it (quiet.go), under mu.
	txPkts atomic.Uint64
	quiet  quietWatch
	// blockedNs adds up the time writes to the link stalled (its own qdisc was full
	// and pushed back on the socket): the sign of a saturated link whose queue is
	// local, so that the peer sees no queueing delay.
	blockedNs atomic.Uint64

	m linkMetrics
}

type linkMetrics struct {
	txBytes, txPackets, rxBytes, rxPackets, lost, dup prometheus.Counter
	rtt, loss, rate, schedRate, up, suspect, changed  prometheus.Gauge
	capacity, queue, mtu, baseDelay, jitter           prometheus.Gauge
	suspicions                                        [numCauses]prometheus.Counter
}

// rxAccount is what the receiver learns about a link from the data arriving on it.
type rxAccount struct {
	mu          sync.Mutex
	packets     uint32
	bytes       uint64
	highLinkSeq uint32
	lowLinkSeq  uint32 // the first link sequence number seen (for settleLoss)
	seenAny     bool
	lost        uint32
	owdMin      int32 // µs, minimum in the current report period
	probeMin    int32 // µs, the current report period's least probe delay (probeSample)
	owdLast     int32
	owdFloor    int32 // µs, long-term minimum (base one-way delay incl. clock offset)
	floorSet    bool
	lastArrival time.Time
	// repairs: the receiver asks for this link's losses (Session.asksRepairs), so the
	// two fields below are kept; otherwise the per-packet path leaves them alone.
	repairs bool
	peak    queuePeak // the longest queue recently seen (repair.go)
	// repairBudget is what the receiver may still ask the peer to send again on the
	// link, in hundredths of a packet (repair.go).
	repairBudget uint32
}

// account records one authenticated data packet and, with gapLoss, returns the gap
// the link sequence shows just before it: how many packets were lost, and (if the
// receiver asks for repairs) what the packet's queueing says of them (rxGap,
// repair.go). Without gapLoss (a fast path delivers most packets, so the daemon's own
// ones have gaps that are no losses) the loss is settled from the whole link sequence
// span at each feedback (settleLoss). owd is the packet's one-way delay in the
// session's frame (owdFrame.rel).
func (a *rxAccount) account(h *wire.Header, size int, owd int32, now time.Time, gapLoss bool) (gap rxGap) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.packets++
	a.bytes += uint64(size)
	if a.seenAny {
		if gapLoss {
			gap.lost = a.lostBefore(h.LinkSeq)
		}
		if wire.SeqAfter(h.LinkSeq, a.highLinkSeq) {
			a.highLinkSeq = h.LinkSeq
		}
	} else {
		a.highLinkSeq, a.lowLinkSeq, a.seenAny = h.LinkSeq, h.LinkSeq, true
	}
	a.owdSample(owd)
	if a.repairs {
		a.earnRepair()
		gap.queued = a.owdLast - a.owdFloor
		if gap.lost > 0 {
			gap.peak = a.peak.at(now)
		}
		a.peak.note(gap.queued, now)
	}
	a.lastArrival = now
	return gap
}

// behindProbe takes a probe that arrived on the link, carrying the last link sequence
// number the peer had sent on it (Session.watermark), while the receiver asks for
// repairs: the link is FIFO, so what the peer sent before the probe and has not arrived
// is lost, and the gap is returned (with the probe's queueing, owd, as a data packet's
// would be) so that the repair is asked for now. The probe's watermark then proves the
// same numbers lost to the resequencer, which, if the repair were only asked for at the
// next data packet, would give them up first and take the repair for a late copy.
func (a *rxAccount) behindProbe(linkSeq uint32, owd int32, now time.Time) (gap rxGap) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.repairs || !a.seenAny {
		return gap
	}
	if gap.lost = a.lostBefore(linkSeq + 1); gap.lost == 0 {
		return gap
	}
	a.highLinkSeq = linkSeq
	gap.queued = owd - a.owdFloor
	gap.peak = a.peak.at(now)
	return gap
}

// lostBefore counts the link sequence numbers between the highest seen and next as
// lost and returns how many there are (0 if next is not beyond the one after it).
// Caller holds mu.
func (a *rxAccount) lostBefore(next uint32) uint32 {
	d := wire.SeqDiff(next, a.highLinkSeq)
	if d <= 1 {
		return 0
	}
	a.lost += uint32(d - 1)
	return uint32(d - 1)
}

// owdFrame turns the raw one-way delays of a session's packets (our 32-bit microsecond
// clock less the sender's stamp, the clocks' offset included) into the session's own
// frame: relative to the first one, plus owdFrameMargin. The raw values sit wherever
// the clocks' offset puts them in the 32-bit range, and an offset within a second of
// 2^31 (one pair of boots in a few thousand) put a link's delays on both sides of the
// int32 boundary, where the larger ones read as the smallest: its floor, base delay
// and queue went wrong for the whole session. In the frame they sit near the margin,
// for delays that change by anything less than 35 minutes. One frame per session and
// direction, for every link alike (the links' floors are compared), and the peer
// only ever compares delays it reported with each other.
type owdFrame struct {
	ref atomic.Uint64 // 1<<32 | the frame's zero, once set; 0 before the first sample
}

// owdFrameMargin is where the session's first one-way delay sits in its frame (µs):
// a later packet that queued less is still positive, and none is the 0 that stands
// for "no sample" in the reports.
const owdFrameMargin = 1 << 20

// rel returns a raw one-way delay (our clock less the packet's stamp, µs) in the frame.
func (f *owdFrame) rel(raw uint32) int32 {
	v := f.ref.Load()
	if v == 0 {
		f.ref.CompareAndSwap(0, 1<<32|uint64(raw-owdFrameMargin))
		v = f.ref.Load()
	}
	return int32(raw - uint32(v))
}

// owdSample records one one-way-delay sample (µs). Caller holds mu.
func (a *rxAccount) owdSample(owd int32) {
	if a.owdMin == 0 || owd < a.owdMin {
		a.owdMin = owd
	}
	a.owdLast = owd
	if !a.floorSet || owd < a.owdFloor {
		a.owdFloor, a.floorSet = owd, true
	}
}

// probeSample records the one-way delay (µs) of a probe that arrived on the link. A
// report period in which no data arrived reports the least of them (report): a link
// that carries no data still has its base one-way delay measured. Its floor was taken
// from data alone, so a link whose first packets met a queue kept a floor milliseconds
// too high until data came again, and the scheduler, which compares the links' floors,
// sent it none: in the lab's homogeneous upload the headend put every ACK on one link
// for the whole transfer, and probed the other two every interval (their replies were
// 1.6 kB/s of the upload).
func (a *rxAccount) probeSample(owd int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.probeMin == 0 || owd < a.probeMin {
		a.probeMin = owd
	}
}

// addDelivered adds what the fast path delivered on the link since the last look. The
// kernel counts inner bytes; perPacket is what each packet carried besides (the aggd
// header and the outer IP and UDP headers), so that its bytes count as account's do.
func (a *rxAccount) addDelivered(d RxDelta, perPacket uint64, now time.Time) {
	if d.Packets == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.seenAny {
		// The kernel's first packets came before any the daemon saw: the span starts
		// where the kernel's count says it did.
		a.lowLinkSeq, a.highLinkSeq, a.seenAny = d.MaxLinkSeq-uint32(d.Packets)+1, d.MaxLinkSeq, true
	} else if wire.SeqAfter(d.MaxLinkSeq, a.highLinkSeq) {
		a.highLinkSeq = d.MaxLinkSeq
	}
	a.packets += uint32(d.Packets)
	a.bytes += d.Bytes + uint64(d.Packets)*perPacket
	if d.HaveOWD {
		a.owdSample(d.OWD)
	}
	a.lastArrival = now
}

// settleLoss sets the link's loss count to what its sequence span shows (span minus
// packets received, never lower than before) and returns the increase.
func (a *rxAccount) settleLoss() uint32 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.seenAny {
		return 0
	}
	span := a.highLinkSeq - a.lowLinkSeq + 1
	if span <= a.packets || span-a.packets <= a.lost {
		return 0
	}
	inc := span - a.packets - a.lost
	a.lost += inc
	return inc
}

// report snapshots the link for a FEEDBACK message and starts a new report period. Its
// least one-way delay is the data's, or the probes' in a period without data (the peer
// takes that one for the link's floor only: link.onFeedback).
func (a *rxAccount) report(id uint8) wire.LinkReport {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := wire.LinkReport{
		LinkID: id, RxPackets: a.packets, RxBytes: a.bytes,
		HighestLinkSeq: a.highLinkSeq, Lost: a.lost,
		OWDMinMicros: a.owdMin, OWDLastMicros: a.owdLast,
	}
	if r.OWDMinMicros == 0 {
		r.OWDMinMicros = a.probeMin
	}
	a.owdMin, a.probeMin = 0, 0
	return r
}

// owd returns the link's base one-way delay estimate (µs, includes the clocks' offset,
// which cancels between links) and whether data has arrived on it recently.
func (a *rxAccount) owd(now time.Time, recent time.Duration) (floor, last int32, active bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.owdFloor, a.owdLast, a.floorSet && now.Sub(a.lastArrival) < recent
}

// linkState is a link's health as its probes show it:
// probing → up → suspect → down → (a reply) → up.
type linkState uint8

const (
	stateProbing linkState = iota // no reply yet
	stateUp
	stateSuspect // replies stopped for a few probe intervals: still used, but its packets are also copied to another link
	stateDown    // no reply for down_after: out of the schedule
)

func (s linkState) String() string {
	return [...]string{"probing", "up", "suspect", "down"}[s]
}

// inSchedule reports whether the scheduler may send on a link in this state.
func (s linkState) inSchedule() bool { return s == stateUp || s == stateSuspect }

// logger returns the link's logger as it is now (the peer may name the link at any time).
func (l *link) logger() *slog.Logger { return l.logged.Load() }

// onReply records a probe reply: the link is alive and we have an RTT sample. It
// returns the state the link was in (up, for no change, while the peer's reports keep a
// suspicion: a probe reply does not end that).
func (l *link) onReply(now time.Time, rtt time.Duration) (was linkState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastReply = now
	if l.rttNs == 0 {
		l.rttNs = float64(rtt)
	} else {
		l.rttNs += (float64(rtt) - l.rttNs) / 8
	}
	l.m.rtt.Set(l.rttNs / 1e9)
	was = l.state
	if was == stateSuspect && l.quiet.reports > 0 {
		return stateUp // probes pass but data does not (the reports say so): still in doubt
	}
	l.setState(stateUp)
	return was
}

// checkHealth moves a silent link (no probe reply, and no report from the peer of new
// data received on it) to suspect after suspectAfter (or three smoothed RTTs, whichever
// is longer, so that a deep but working queue is not suspected) and to down after
// downAfter (or twice the suspicion time, whichever is longer). A busy link the peer's
// reports show data stopped arriving on (quiet.go) goes suspect at the first such report
// and down at the second, or as soon as its probes have been silent for the suspicion
// time too: two signals agree (a TCP flow that stalled after its losses may send too
// little for a second report). A link the last report found owing data, even if no
// report could be a verdict (the flow stalled right away), is suspect after a third of
// the suspicion time less the margin of silence (80 ms at the defaults: the silence
// counts from the last report with progress, a period before the one that owed, which
// itself showed that period without the link's data) and down after all of it. A
// suspect link the peer reports data from again is up. A link silent together with
// every other link of the session is not suspected for its silence alone (nothing is
// heard from the peer at all, and there is no better link to copy its traffic to:
// quietWatch.bondSilent); it still goes down at downAfter.
//
// Owing is shared (Session.onFeedback, quietWatch.oweTogether), and so is the doubt
// (doubtAround): while another link owes, a primary that misses the answer to a probe
// is suspect as well, and so is a primary silent as long as an owing link while the
// peer copies what it sends (it has a link in doubt itself). Primaries that die
// together then have their traffic copied to a standby link before a TCP flow's first
// retransmission timer fires, not after it, by both ends: the sender of a flow from
// what it owes, its receiver, whose ACKs owe next to nothing, from the sender's copies.
// A healthy link in doubt only for its flow's stall answers its probe within its RTT,
// and is up again at the next tick.
// It returns the new state, whether it changed, and why.
func (l *link) checkHealth(now time.Time, suspectAfter, downAfter time.Duration) (state linkState, changed bool, cause healthCause) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.quiet.mark(now, l.txPkts.Load(), l.sentLinkSeq())
	silent, suspectAfter, downAfter := l.silenceLocked(now, suspectAfter, downAfter)
	quiet := l.quiet.reports
	// A link that owes data and has been silent for about a report period is in doubt
	// already: its packets get copies from then on (a TCP flow that stalled
	// behind its gap retransmits on its timer, and that retransmission must not be
	// lost again). So are the others the doubt takes in (doubtAround).
	owedSilence, owedCause := l.doubtAround(now, silent, suspectAfter)
	old := l.state
	switch {
	case old.inSchedule() && silent > downAfter:
		l.setState(stateDown)
		cause = causeSilence
	case old.inSchedule() && quiet >= 2:
		l.setState(stateDown)
		cause = causeReports
	case old.inSchedule() && quiet >= 1 && silent > suspectAfter:
		l.setState(stateDown)
		cause = causeReportsAndSilence
	case old.inSchedule() && owedSilence && silent > suspectAfter:
		l.setState(stateDown)
		cause = owedCause
	case old == stateUp && silent > suspectAfter && !l.quiet.bondSilent:
		l.setState(stateSuspect)
		cause = causeSilence
	case old == stateUp && quiet >= 1:
		l.setState(stateSuspect)
		cause = causeReports
	case old == stateUp && owedSilence:
		l.setState(stateSuspect)
		cause = owedCause
	case old == stateSuspect && silent <= suspectAfter && quiet == 0 && !owedSilence:
		l.setState(stateUp) // the peer reports our data arriving again, or the doubt lifted
	}
	if l.state == stateSuspect && old != stateSuspect {
		l.suspectedAt = now
	}
	return l.state, l.state != old, cause
}

// liftedBy says, for the log, why a suspect link was just found up (checkHealth): the
// sign of life it showed since it went suspect, if any, or else that the doubt around
// it lifted (doubtAround: nothing owed on it any more, no probe missed while another
// link owes, or every other link silent too), with the state that doubt was read from.
func (l *link) liftedBy(now time.Time) []any {
	l.mu.Lock()
	defer l.mu.Unlock()
	why := "the doubt around it lifted: it no longer owes data and no probe is missed, or every other link is silent too"
	switch {
	case l.lastDelivered.After(l.suspectedAt):
		why = "the peer reports our data arriving on it"
	case l.lastReply.After(l.suspectedAt):
		why = "it answers probes again"
	}
	return []any{"cause", why, "suspect_for", now.Sub(l.suspectedAt), "since_sign", now.Sub(l.lastSignLocked()),
		"owing", l.quiet.owing, "others_silent", l.quiet.othersSilent, "others_owe", l.quiet.othersOwe}
}

// silenceLocked returns how long the link has shown no sign of life (no probe reply,
// no report of new data arriving on it), and the suspicion and down times for it.
// Caller holds mu.
func (l *link) silenceLocked(now time.Time, suspectAfter, downAfter time.Duration) (silent, suspect, down time.Duration) {
	silent = now.Sub(l.lastSignLocked())
	// A slow or deeply queued link answers late without being dead: it is suspected
	// after three of its RTTs at the earliest, and declared down only after it has
	// been suspect for as long again.
	suspect = max(suspectAfter, time.Duration(3*l.rttNs))
	down = max(downAfter, 2*suspect)
	// A link whose unit just shrank (setUnit) gets a fresh silence count. One whose
	// answer on its old scale was overdue then gets only what remains after the
	// suspicion time: it is in doubt at once and down a suspicion time later if it
	// still does not answer (or at down_after of true silence, if that is later).
	grace := now.Sub(l.unitShrunk)
	if l.shrunkOverdue {
		grace += down - suspect
	}
	return min(silent, grace), suspect, down
}

// doubtNow makes an up link suspect if it is in doubt now (doubtAround), and
// reports whether it did and why; it never takes a link down. For the peer's first
// copy (Session.onPeerCopies), which comes between ticks.
func (l *link) doubtNow(now time.Time, suspectAfter, downAfter time.Duration) (healthCause, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != stateUp {
		return 0, false
	}
	silent, suspectAfter, _ := l.silenceLocked(now, suspectAfter, downAfter)
	doubt, cause := l.doubtAround(now, silent, suspectAfter)
	if doubt {
		l.setState(stateSuspect)
		l.suspectedAt = now
	}
	return cause, doubt
}

// doubtAround tells whether a link silent for silent is in doubt, from what the
// others show: it owes data itself, and a third of the suspicion time less the margin
// has passed (about the report period the owing report showed without its data); or
// the peer copies what it sends, and a third of the suspicion time and the margin have
// passed (a busy link's silence before its next report); or another link owes data and
// this one missed the answer to a probe; or a primary that carried traffic beside it
// was found down, and it has shown no sign of life since the doubt about that one began
// (Session.doubtCompanions). Never when every other link is silent too: the peer or the
// path stalled then, not a link. Caller holds mu.
func (l *link) doubtAround(now time.Time, silent, suspectAfter time.Duration) (bool, healthCause) {
	long := silent > suspectAfter/3+quietMargin
	switch {
	case l.quiet.othersSilent:
		return false, 0
	case l.quiet.owing && silent > suspectAfter/3-quietMargin:
		return true, causeOwedAndSilence
	case l.quiet.peerCopies && long:
		return true, causePeerCopies
	case l.quiet.othersOwe && l.missedProbeLocked(now):
		return true, causeMissedInDoubt
	case l.quiet.companionDown.After(l.lastSignLocked()):
		return true, causeCompanionDown
	}
	return false, 0
}

// doubtBegan is when the doubt about the link, now found down, began: when it went
// suspect, if that was after its last sign of life; else now (it went down from up).
func (l *link) doubtBegan(now time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.suspectedAt.After(l.lastSignLocked()) {
		return l.suspectedAt
	}
	return now
}

// missedProbeLocked reports whether a probe sent since the link's last sign has gone
// unanswered for longer than its smoothed RTT and the margin. Caller holds mu.
func (l *link) missedProbeLocked(now time.Time) bool {
	return l.awaiting.After(l.lastSignLocked()) && now.Sub(l.awaiting) > time.Duration(l.rttNs)+quietMargin
}

// sentLinkSeq is the link sequence number of the last data packet sent on the link.
func (l *link) sentLinkSeq() uint32 {
	if l.peekLinkSeq != nil {
		return l.peekLinkSeq() - 1
	}
	return l.txLinkSeq.Load()
}

// lastSign is when the link last showed life: a probe reply, or the peer reporting
// new data from it.
func (l *link) lastSign() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastSignLocked()
}

// aliveSince is when the link last showed life or, if later, when its unit last
// shrank without an answer overdue: from then on it is judged on the shorter scale with a
// fresh silence count (setUnit), and it counts as alive for the others until that runs
// out (Session.markSilentPeers). An idle standby backup answers every few seconds;
// when the primaries went suspect and it took their copies, its last answer was
// seconds old, it counted as silent, and with all links silent the primaries' doubt
// was lifted (the lab's standby scenario: no copies for 100 ms, and the TCP flow's
// packets in that time were lost on the dead primaries).
func (l *link) aliveSince() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	sign := l.lastSignLocked()
	if !l.shrunkOverdue && l.unitShrunk.After(sign) {
		return l.unitShrunk
	}
	return sign
}

func (l *link) lastSignLocked() time.Time { return later(l.lastReply, l.lastDelivered) }

// healthCause says what moved a link to suspect or down.
type healthCause uint8

const (
	causeSilence           healthCause = iota // no probe reply (nor data reported) for the time
	causeReports                              // the peer's reports show its data stopped arriving
	causeReportsAndSilence                    // both, the probes for the suspicion time
	causeOwedAndSilence                       // silence while data sent an RTT before has not arrived
	causePeerCopies                           // silence while the peer copies what it sends
	causeMissedInDoubt                        // a probe unanswered while another link owes data
	causeCompanionDown                        // no sign of life since the doubt about a primary beside it, found down, began
	numCauses
)

// label names the cause in aggd_link_suspicions_total.
func (c healthCause) label() string {
	return [...]string{"silence", "reports", "reports_and_silence", "owed", "peer_copies", "missed_probe", "companion_down"}[c]
}

// SuspicionCauses lists the values of aggd_link_suspicions_total's cause label (the
// metric catalogue that alert rules and dashboards are checked against names them).
func SuspicionCauses() []string {
	var labels []string
	for c := range numCauses {
		labels = append(labels, c.label())
	}
	return labels
}

func (c healthCause) String() string {
	return [...]string{
		"no probe reply",
		"the peer's reports show data sent on it stopped arriving",
		"the peer's reports show data sent on it stopped arriving, and probe replies stopped",
		"no sign of life, and the peer's reports show data sent on it an RTT before has not arrived",
		"no sign of life, and the peer copies what it sends: it has a link in doubt",
		"a probe went unanswered while another link owes data",
		"a primary beside it was found down, and it has shown no sign of life since the doubt about that one began",
	}[c]
}

// quietReports is how many of the peer's reports in a row showed the link's data
// stopped arriving (quiet.go).
func (l *link) quietReports() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.quiet.reports
}

// delivering reports whether r shows new data arriving on the link since its last report.
func (l *link) delivering(r wire.LinkReport) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.prevAt.IsZero() && r.RxPackets != l.prevReport.RxPackets
}

// fellSilent reports whether the link, in the schedule, has shown nothing new arriving
// since a report that showed it delivering at least steadyPackets, and the last report
// owed packets on it (sent an RTT and a margin before it, and not arrived): a link
// that was carrying a good share of the traffic and, as far as the reports tell,
// stopped (Session.publishBondQueue). Packets sent within the RTT are not owed yet,
// so a pause in a sparse stream (a download's ACKs) is no silence, nor is a link the
// scheduler stopped giving packets to once what it was given has arrived.
func (l *link) fellSilent() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.silentAfterBusy && l.state.inSchedule() && l.quiet.behind > 0
}

// noteReport records how many packets a report showed newly arrived. Caller holds mu.
func (l *link) noteReport(n uint32) {
	switch {
	case n > 0:
		l.silentAfterBusy = false
	case l.prevPackets >= steadyPackets:
		l.silentAfterBusy = true
	}
	l.prevPackets = n
}

// arrivalLocked dates the newest arrival a report that came at now shows on the link:
// highest is the highest link sequence number it shows received, lastSent the last one
// sent on the link. While more was sent on the link after that packet, the peer may
// have received it after the report was made, so the link may have carried right up
// to then: now. Once every packet sent on it has arrived, the link carried nothing
// after the last of them, and a report that came a period or more later dates that
// too late. In a run of the lab's standby scenario a
// TCP flow stalled when its ACKs died with the primaries; its last packets arrived
// 12 and 63 ms after the outage, the report that showed them came at 118 ms, and the
// peer's first copies, at 202 ms, found the primaries silent for 84 ms, too short for
// doubt; it came with the next owing report, 128 ms later. The packet went out by the
// first mark that counts it (quietWatch.sentBefore) and arrived about half an RTT
// after; and not before the last report came, since what this one newly shows arrived
// after that one was made, and so after the sign that one gave. Caller holds mu.
func (l *link) arrivalLocked(now time.Time, highest, lastSent uint32) time.Time {
	if highest != lastSent {
		return now
	}
	at, ok := l.quiet.sentBefore(highest)
	if !ok {
		return now
	}
	return earlier(now, later(l.prevAt, at.Add(time.Duration(l.rttNs/2))))
}

// later returns the later of two times.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// earlier returns the earlier of two times.
func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// steadyPackets is how many packets a link must have delivered in one report period
// for its silence after it to make reports no measure of the bond's queue: a
// sample's worth (estimate.MinSamplePackets), about 50 kbit in the 100-ms default
// period. A link that carries that much delivers in every period unless it stalls; a
// 0.2 Mbit/s ADSL upstream, one or two packets a period, may deliver none in one
// without anything being wrong, and its queue is seldom the least.
const steadyPackets = estimate.MinSamplePackets

// setState records a state and its metrics. Caller holds mu.
func (l *link) setState(s linkState) {
	if s != l.state {
		l.m.changed.SetToCurrentTime()
		if l.schedDue != nil {
			l.schedDue.Store(true)
		}
	}
	// However it went down (its health, its uplink's carrier), a link that comes
	// back owes nothing of what was sent on it before.
	switch {
	case s == stateDown && l.state != stateDown:
		l.quiet.reset(l.txPkts.Load())
		l.silentAfterBusy, l.prevPackets = false, 0
	case s != stateDown && l.state == stateDown:
		l.quiet.returning(l.txPkts.Load(), l.sentLinkSeq())
	}
	l.state = s
	l.m.up.Set(boolGauge(s.inSchedule()))
	l.m.suspect.Set(boolGauge(s == stateSuspect))
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// onFeedback turns the peer's cumulative counters for this link into a delivery rate,
// a loss ratio and the link's one-way-delay floor, and returns an estimator sample once
// the reports since the last one add up to one (ok false until then, with the sample so
// far, if one has started). A sample spans
// at least estimate.MinSamplePackets packets or maxSampleSpan: a slow link (an ADSL
// upstream carries one or two packets per report period) is measured over several
// periods instead of never. peerTime is the FEEDBACK's own timestamp, on the peer's
// clock, which times the sample better than our arrival times (feedback travels over
// whichever link is best at the moment). othersDelivered says whether the report shows
// data arriving on another link (quiet.go).
func (l *link) onFeedback(now time.Time, peerTime uint32, r wire.LinkReport, othersDelivered bool) (smp estimate.Sample, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reportMetrics(now, r)
	gap := now.Sub(l.prevAt) // since the link's last report
	lastSent := l.sentLinkSeq()
	progress := r.RxPackets != l.prevReport.RxPackets // data arrived since the last report
	if !l.prevAt.IsZero() {
		if progress {
			l.lastDelivered = l.arrivalLocked(now, r.HighestLinkSeq, lastSent)
		}
		cutoff := quietCutoff(now, time.Duration(l.rttNs), l.est.Rate())
		delivered := now.Add(-time.Duration(l.rttNs))
		if owed := l.quiet.onReport(cutoff, delivered, now.Sub(l.prevAt), progress, othersDelivered, r.HighestLinkSeq); owed > 0 {
			l.logger().Debug("quiet report: no data arrived that was sent an RTT before", "owed_packets", owed,
				"quiet_reports", l.quiet.reports, "cutoff_ago", now.Sub(cutoff), "since_delivered", now.Sub(l.lastDelivered))
		}
	}
	l.quiet.mark(now, l.txPkts.Load(), lastSent)
	if l.smpStarted && !progress {
		l.smpIdle += now.Sub(l.prevAt)
	}
	if !l.prevAt.IsZero() {
		l.noteReport(r.RxPackets - l.prevReport.RxPackets)
	}
	l.prevReport, l.prevAt = r, now
	if r.OWDMinMicros != 0 { // per report period: the data's, or the probes' if none came
		l.updateFloor(now, r.OWDMinMicros)
	}
	// A probe's delay is the link's floor and nothing more: an idle link's samples
	// have no queue (Estimator.Update), and its lone probes are no measure of jitter.
	if r.OWDMinMicros != 0 && progress {
		if !l.smpHaveOWD || r.OWDMinMicros < l.smpMinOWD {
			l.smpMinOWD, l.smpHaveOWD = r.OWDMinMicros, true
		}
		spread := float64(max(0, r.OWDLastMicros-r.OWDMinMicros))
		l.jitterUs += (spread - l.jitterUs) / 8
		l.m.jitter.Set(l.jitterUs / 1e6)
	}
	sent, blocked := l.txData.Load(), l.blockedNs.Load()
	if !l.smpStarted || gap > feedbackOrderSpan {
		// A sample across a long silence of the peer's reports (every link dead)
		// measures the silence, and its span, in the peer's 32-bit microseconds,
		// would be wrong by multiples of 71 minutes: this report starts a new one.
		l.startSample(r, peerTime, sent, blocked)
		return smp, false
	}
	span := time.Duration(peerTime-l.smpPeerTime) * time.Microsecond
	pkts := r.RxPackets - l.smpReport.RxPackets
	smp = estimate.Sample{
		Interval: span, Delivered: r.RxBytes - l.smpReport.RxBytes, Packets: pkts, Sent: sent - l.smpSent,
		Lost:    r.Lost - l.smpReport.Lost,
		Stalled: time.Duration(blocked - l.smpBlocked),
		Jitter:  time.Duration(l.jitterUs) * time.Microsecond,
		Idle:    l.smpIdle,
	}
	if l.smpHaveOWD {
		floor, _ := l.floorLocked()
		smp.Queue, smp.HaveQueue = time.Duration(l.smpMinOWD-floor)*time.Microsecond, true
	}
	if pkts < estimate.MinSamplePackets && span < maxSampleSpan {
		return smp, false // the sample so far, for Estimator.Unsampled
	}
	l.startSample(r, peerTime, sent, blocked)
	return smp, true
}

// maxSampleSpan bounds how long an estimator sample waits for enough packets.
const maxSampleSpan = time.Second

// startSample starts the next estimator sample at this report. Caller holds mu.
func (l *link) startSample(r wire.LinkReport, peerTime uint32, sent, blocked uint64) {
	l.smpStarted, l.smpReport, l.smpPeerTime, l.smpSent, l.smpBlocked = true, r, peerTime, sent, blocked
	l.smpHaveOWD, l.smpIdle = false, 0
}

// reportMetrics turns one report into the link's delivery rate and loss metrics.
// Caller holds mu.
func (l *link) reportMetrics(now time.Time, r wire.LinkReport) {
	if l.prevAt.IsZero() {
		return
	}
	dt := now.Sub(l.prevAt).Seconds()
	dBytes := r.RxBytes - l.prevReport.RxBytes
	dPkts := r.RxPackets - l.prevReport.RxPackets
	dLost := r.Lost - l.prevReport.Lost
	if dt > 0 {
		rate := float64(dBytes) * 8 / dt
		l.peerRate += (rate - l.peerRate) / 4
		l.m.rate.Set(l.peerRate)
	}
	if total := dPkts + dLost; total > 0 {
		loss := float64(dLost) / float64(total)
		l.peerLoss += (loss - l.peerLoss) / 4
		l.m.loss.Set(l.peerLoss)
	}
}

// updateFloor folds one report's smallest one-way delay into the link's floor: two
// 10-second buckets, so the floor follows a path that got longer within 20 s. Caller
// holds mu.
func (l *link) updateFloor(now time.Time, owd int32) {
	if now.Sub(l.owdFloorTurn) > 10*time.Second {
		l.owdFloor[1], l.owdFloorSet[1] = l.owdFloor[0], l.owdFloorSet[0]
		l.owdFloorSet[0] = false
		l.owdFloorTurn = now
	}
	if !l.owdFloorSet[0] || owd < l.owdFloor[0] {
		l.owdFloor[0], l.owdFloorSet[0] = owd, true
	}
}

// estimate folds one period into the link's estimator, publishes the estimates, and
// logs a capacity estimate that moved by a quarter or more since it was last logged.
func (l *link) estimate(smp estimate.Sample) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.est.Update(smp)
	c := l.est.Capacity()
	l.logger().Debug("estimate", "interval", smp.Interval, "delivered_mbit_s", round2(float64(smp.Delivered)*8/smp.Interval.Seconds()/1e6),
		"sent_mbit_s", round2(float64(smp.Sent)*8/smp.Interval.Seconds()/1e6), "packets", smp.Packets, "lost", smp.Lost, "queue", smp.Queue, "have_queue", smp.HaveQueue,
		"least_queue", smp.LeastQueue, "most_queue", smp.MostQueue, "jitter", smp.Jitter, "stalled", smp.Stalled, "phase", l.est.Phase(), "rate_mbit_s", round2(l.est.Rate()/1e6), "capacity_mbit_s", round2(c/1e6))
	l.m.capacity.Set(c)
	l.m.queue.Set(l.est.Queue().Seconds())
	if c > 0 && (l.loggedCap == 0 || c > 1.25*l.loggedCap || c < 0.75*l.loggedCap) {
		l.logger().Info("link capacity estimate", "mbit_s", round2(c/1e6), "was_mbit_s", round2(l.loggedCap/1e6),
			"queue", l.est.Queue().Round(time.Millisecond), "phase", l.est.Phase())
		l.loggedCap = c
	}
}

// unsampled hands the estimator a feedback period that completed no sample of the link
// (Estimator.Unsampled), if the link is in the schedule as a primary: a standby link
// waits for the primaries to fail, and one that is down for its probes.
func (l *link) unsampled(smp estimate.Sample) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.state.inSchedule() || l.isStandbyLocked() {
		return
	}
	was := l.est.Rate()
	l.est.Unsampled(smp)
	if l.est.Rate() != was {
		l.logger().Debug("unmeasured link grows while the bond wants more", "rate_mbit_s", round2(l.est.Rate()/1e6),
			"was_mbit_s", round2(was/1e6), "queue", smp.Queue, "have_queue", smp.HaveQueue,
			"least_queue", smp.LeastQueue, "most_queue", smp.MostQueue, "bond_loaded", smp.BondLoaded)
	}
}

// assumedRate is the rate the scheduler assumes for the link now, bits/s.
func (l *link) assumedRate() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.est.Rate()
}

func round2(x float64) float64 { return float64(int64(x*100+0.5)) / 100 }

// peerOWDFloor is the link's base one-way delay towards the peer, as the peer measures it.
func (l *link) peerOWDFloor() (int32, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.floorLocked()
}

// floorLocked is peerOWDFloor for a caller that holds mu.
func (l *link) floorLocked() (int32, bool) {
	f, ok := l.owdFloor[0], l.owdFloorSet[0]
	if l.owdFloorSet[1] && (!ok || l.owdFloor[1] < f) {
		f, ok = l.owdFloor[1], true
	}
	return f, ok
}

// setPeerPrior records the rate prior and class the peer configured for this link's
// direction towards it (the CPE announces its downstream rates to the headend, once a
// second). A prior that changes from one the peer announced before (its config was
// reloaded) starts the estimate again from it.
func (l *link) setPeerPrior(rate float64, class sched.Class) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.peerAnnounced && (rate != l.peerPrior || class != l.spec.Class) {
		l.logger().Info("peer changed the link's class or rate prior", "class", class, "was_class", l.spec.Class,
			"prior_mbit_s", rate/1e6, "was_prior_mbit_s", l.peerPrior/1e6)
	}
	renewed := l.peerAnnounced && rate != l.peerPrior
	l.peerPrior, l.peerAnnounced = rate, true
	l.spec.Class = class
	if renewed {
		l.restartEstimate()
		return
	}
	l.est.SetPrior(l.prior())
	l.publishCapacity()
}

// restartEstimate starts the estimate again from the link's prior. Caller holds mu.
func (l *link) restartEstimate() {
	l.est.Restart(l.prior())
	l.publishCapacity()
}

// publishCapacity shows the estimator's capacity in the metric. A sample publishes it
// too; this is for the estimate's other sources (a prior, a probe train), which the
// metric otherwise showed only when the link's next sample completed: never on a link
// that stays idle, up to a second later on one that does not. Caller holds mu.
func (l *link) publishCapacity() {
	l.m.capacity.Set(l.est.Capacity())
}

// prior is the estimator's prior and cap: our configured rate, or the peer's announced
// one, the lower if both. Caller holds mu.
func (l *link) prior() (prior, limit float64) {
	rate := l.spec.TxRate
	if l.peerPrior > 0 && (rate == 0 || l.peerPrior < rate) {
		rate = l.peerPrior
	}
	return rate, rate
}

// params is the link as the scheduler should see it now.
func (l *link) params() sched.LinkParams {
	l.mu.Lock()
	defer l.mu.Unlock()
	rate := l.est.Rate()
	l.m.schedRate.Set(rate)
	return sched.LinkParams{
		ID: l.spec.ID, Usable: l.state.inSchedule(), Suspect: l.state == stateSuspect,
		Class: l.spec.Class, RateBps: rate,
		BaseOWD: int64(l.rttNs / 2), PinnedWeight: l.spec.Weight,
		OuterIPv6: l.outerLen() > wire.Overhead-wire.HeaderLen,
	}
}

// isUp reports whether the link is in the schedule (up or suspect).
func (l *link) isUp() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state.inSchedule()
}

// busyProbeEvery is how many probe intervals apart a busy link is probed.
const busyProbeEvery = 4

// probeDue reports whether the tick at now should probe the link: every probe interval
// while it is idle, in doubt or not up yet (every standby interval instead, for an
// idle standby link: its unit, Session.probeUnit); every busyProbeEvery intervals while the
// peer's reports show our data arriving on it. Those reports prove a busy link alive and
// find it dead sooner than its probes (quiet.go), while a probe and the peer's reply to
// the peer's probe, each interval, took about 0.9 % of a 1.5 Mbit/s link in the
// direction of the data: most of what the homogeneous lab scenario missed.
// While some link of the session owes data (doubt), every link is probed every
// interval: a flow stalled behind that link's gap leaves the others without reports of
// new data too, and only their probe replies tell a dead link from a silent peer
// (markSilentPeers; with probes every fourth interval, the lab's failover once waited
// for the full down time).
// An offline link is never due: the probe would go nowhere.
func (l *link) probeDue(now time.Time, interval time.Duration, doubt bool) bool {
	if l.isOffline() {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	every := l.unitLocked(interval)
	switch {
	case doubt:
		every = interval
	case l.busyLocked(now, interval):
		every = busyProbeEvery * interval
	}
	if now.Sub(l.lastProbe) < every-interval/2 {
		return false
	}
	l.probedLocked(now)
	return true
}

// probed notes a probe sent outside the tick (Session.probeAtOnce), so that the tick
// counts its next one from it and a missed answer from it.
func (l *link) probed(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.probedLocked(now)
}

// probeBack reports whether a probe from the peer on the link, at now, is to be
// answered with a probe of our own besides the reply, and notes that probe if so: the
// link is not up on this side (not answered yet, or down), and the tick has not probed
// it within a probe interval. The peer's probe says the link carries again (its carrier
// is back, the path healed); the tick would probe a link that is down only at its next
// turn, and a standby link that is down only every standby interval (2 s), so that
// the link came up on one side seconds before the other. At most one per interval, so
// two sides that hear each other's probes but not their replies do not echo forever;
// none on an offline link.
func (l *link) probeBack(now time.Time, interval time.Duration) bool {
	if l.isOffline() {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state.inSchedule() || now.Sub(l.lastProbe) < interval {
		return false
	}
	l.probedLocked(now)
	return true
}

func (l *link) probedLocked(now time.Time) {
	l.lastProbe = now
	if !l.awaiting.After(l.lastSignLocked()) {
		l.awaiting = now
	}
}

// oweTogether: the peer's last report showed nothing new on any link while they
// together owed data (quietWatch.oweTogether).
func (l *link) oweTogether() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.quiet.oweTogether()
}

// behind is how many packets the peer's last report owed on the link.
func (l *link) behind() uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.quiet.behind
}

// healthy reports whether the link is up, not in doubt, owes nothing and has no probe
// overdue: a place for another link's packets.
func (l *link) healthy(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state == stateUp && !l.quiet.owing && !l.missedProbeLocked(now)
}

// owes reports whether the peer's last report found data owed on the link.
func (l *link) owes() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.quiet.owing
}

// setUnit records the unit the link is probed and judged in from now on. A shorter one
// than before (a standby link whose primaries went away, one that starts carrying
// data, a class raised) probes the link at once and, if the link was up and healthy
// on its old scale, starts its silence count afresh: its last answer may be a standby
// interval old, which the shorter unit would call dead just when the bond needs it.
// A link whose answer on the old scale is overdue (missedAnswer) has shown doubt
// already and gets only a suspicion time of it (checkHealth). A link silent beyond its
// old scale gets no grace at all, so a dead standby link is not kept alive by
// primaries that come and go.
func (l *link) setUnit(u time.Duration, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unit != 0 && u < l.unit {
		if silent := now.Sub(l.lastSignLocked()); l.state == stateUp && silent <= 3*l.unit {
			l.unitShrunk = now
			l.shrunkOverdue = silent > l.answerDueLocked(l.unit, u)
		}
		l.lastProbe = time.Time{}
	}
	l.unit = u
}

// noteSent records whether data went out on the link since the last tick.
func (l *link) noteSent(now time.Time) {
	n := l.txPkts.Load()
	l.mu.Lock()
	defer l.mu.Unlock()
	if n != l.sentSeen {
		l.sentSeen, l.lastSent = n, now
	}
}

// carrying reports whether the link is one of the bond's working links right now
// rather than standing by: data sent on it within the last window, a report of our
// data arriving on it lately, data it owes, or a suspicion to settle.
func (l *link) carrying(now time.Time, interval, window time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return now.Sub(l.lastSent) < window || l.busyLocked(now, interval) || l.quiet.owing || l.state == stateSuspect
}

// missedAnswer reports whether an up link probed every `every` has gone without a sign
// for longer than the answer to its last probe can take: the probe's spacing, three
// probe intervals for the ticks' lateness, and two smoothed RTTs. Only an up link: one
// already suspect is judged in the short unit anyway, and a down one stays on the
// standby scale (a dead metered line is not probed ten times a second).
func (l *link) missedAnswer(now time.Time, every, interval time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state == stateUp && now.Sub(l.lastSignLocked()) > l.answerDueLocked(every, interval)
}

// answerDueLocked is how long after its last sign a link probed every `every` has
// answered its next probe at the latest. Caller holds mu.
func (l *link) answerDueLocked(every, interval time.Duration) time.Duration {
	return every + 3*interval + time.Duration(2*l.rttNs)
}

// probeUnit is the unit setUnit recorded, or fallback (the probe interval) before one.
func (l *link) probeUnit(fallback time.Duration) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unitLocked(fallback)
}

func (l *link) unitLocked(fallback time.Duration) time.Duration {
	if l.unit == 0 {
		return fallback
	}
	return l.unit
}

func (l *link) busyLocked(now time.Time, interval time.Duration) bool {
	return l.state == stateUp && now.Sub(l.lastDelivered) < 2*interval
}

// upPrimary reports whether the link is a primary in the schedule.
func upPrimary(l *link) bool { return l.isUp() && !l.isStandby() }

// isStandby reports whether the link stands by for the primaries: class overflow or
// backup, the user's statement that it costs (a metered line). Ours by its effective
// class (a used-up data cap makes it a backup), the peer's by its LINK_PARAMS.
func (l *link) isStandby() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.isStandbyLocked()
}

// isStandbyLocked is isStandby for a caller that holds mu.
func (l *link) isStandbyLocked() bool { return l.spec.Class >= sched.ClassOverflow }

// isSuspect reports whether the link is in doubt.
func (l *link) isSuspect() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state == stateSuspect
}

func (l *link) rtt() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Duration(l.rttNs)
}
