package tunnel

// Busy-link silence (docs/architecture.md §5, health). A link that dies while it
// carries traffic shows it long before its probes have gone unanswered for three
// probe intervals: the peer's next FEEDBACK reports none of the packets we sent on it
// an RTT earlier. Waiting for the probes cost the lab's failover scenario about 0.7 s
// between the outage and the move of the link's share, during which a third of every
// TCP window, retransmissions included, went into the dead link.
//
// So each FEEDBACK is also a verdict on every busy link: if we had sent at least
// busyQuietPackets packets on it, one smoothed RTT (plus a margin) before the report
// arrived, beyond what earlier reports already covered (by our count and by the highest
// link sequence number the peer reports), half of them in the span the report newly
// covers (we were still sending), and the report shows nothing new arriving on it but
// data arriving on another link, the report is quiet. One quiet report makes
// the link suspect, a second in a row (about one report period later, and again with
// packets sent into the silence) takes it down. A link that delivers anything at
// all in a report period is never quiet: a slow or deeply queued link still delivers
// steadily, and an idle one has nothing owed; both are left to the probes.

import (
	"time"

	"github.com/aggd/aggd/internal/estimate"
	"github.com/aggd/aggd/internal/wire"
)

// busyQuietPackets is how many data packets a report must owe before its silence
// counts: a link at 1.4 Mbit/s sends that many in about 70 ms, while one that carries
// two packets per report period would have to deliver nothing for 400 ms (a radio
// stalling for two report periods is no verdict).
const busyQuietPackets = 8

// owingPackets is how many packets a report must owe for the link's silence to make it
// suspect at a third of the suspicion time (less quietMargin) and down at all of it,
// rather than at the suspicion time and down_after (fewer do together with the other
// links: togetherPackets). The silence is the evidence here, so a few packets
// do. (A link at 1.4 Mbit/s has about 12 packets in flight when its flow stalls an
// RTT after a death.)
const owingPackets = busyQuietPackets / 2

// togetherPackets is how many packets the links must owe together, in a report that
// shows nothing new on any of them, for each that owes any to owe (oweTogether). Two:
// behind a bond whose AQM keeps the queues short, the lab's upstream TCP flow had one
// packet sent before the report's cutoff on each of its two primaries when they died.
// The silence that must follow keeps a lost packet or two on healthy links from
// counting: they answer their probes.
const togetherPackets = 2

// staleOwed is how long before a report's cutoff a link must have sent data for what
// the report leaves unreceived to be owed (staleLoss): well past the 120-300 ms in
// which owing makes a dead link suspect and down.
const staleOwed = time.Second

// quietMargin is added to the link's smoothed RTT when judging which packets a report
// should cover: the time for the peer's report period to close on them and for jitter.
const quietMargin = 20 * time.Millisecond

// maxQuietMargin bounds the extra margin a slow link gets for its packets' own
// transmission time.
const maxQuietMargin = 500 * time.Millisecond

// quietLapse is how many reports in a row whose span the link hardly carried anything
// in lift a suspicion the reports raised: 0.5 s, by when the probes' own silence has
// taken a dead link suspect (300 ms) and nearly down (600 ms).
const quietLapse = 5

// sentMarks is how many snapshots of a link's sent-packet count are kept, one per tick
// and per report, and one more per report while the link is in doubt (its health is
// checked at once): with the default 100-ms probe interval 1.6 s of history at least,
// more than any RTT the margin would reach back over (a longer one is left to the
// probes).
const sentMarks = 48

// sentMark is how many data packets had been sent on a link at a time, and the link
// sequence number of the last one.
type sentMark struct {
	at      time.Time
	pkts    uint64
	linkSeq uint32
}

// quietWatch judges a link's reports against what was sent on it. Caller holds the
// link's mu.
type quietWatch struct {
	marks     [sentMarks]sentMark
	n         int
	confirmed uint64 // packets sent before the cutoff of the last report that showed progress
	reports   int    // quiet reports in a row since then
	idle      int    // reports in a row whose span we hardly sent in
	// owing: the last report showed nothing new on the link, and its highest link
	// sequence number received lay at least owingPackets behind the last one sent
	// before its cutoff, whether or not it could be a verdict. Alone it is none, but
	// with the link silent (and another link not) it makes the link suspect and then
	// down: a flow that stalled behind the dead link's gap sends too little for a
	// verdict. (The peer's highest number, unlike confirmed, also covers a flow's
	// last packets once they arrived, and passes over old losses.)
	owing bool
	// behind: how many packets the last report owed on the link, that is how far its
	// highest link sequence number received lay behind the last one sent before its
	// cutoff, when it showed nothing new on the link (0 otherwise). Below
	// owingPackets it makes the link owe only together with the others (oweTogether).
	behind uint32
	// othersSilent: no other link of the session has shown a sign of life lately
	// (set by the session each tick); owing then says nothing about this link.
	othersSilent bool
	// bondSilent: no link of the session has shown a sign of life for a suspicion time
	// (three probe units), and it has more than one (set by the session each tick,
	// Session.markSilentPeers). Nothing is heard from the peer at
	// all then: the silence is the peer's, the path's, or this host's (a CPU too busy
	// to read what came), not one link's, and there is no better link to copy to. A
	// link is not suspected for silence alone then; it still goes down at down_after.
	bondSilent bool
	// othersOwe: another link of the session owes data (set by the session each tick);
	// this one is then in doubt too if it misses the answer to a probe (link.checkHealth).
	othersOwe bool
	// peerCopies: the peer copies what it sends, so it has a link in doubt (set by the
	// session each tick); this one is then in doubt after a shorter silence.
	peerCopies bool
	// companionDown: when the doubt began about another primary that carried traffic
	// beside this one and was then found down while a standby link stood by
	// (Session.doubtCompanions). While this link has shown no sign of life since, it is
	// in doubt too (link.doubtAround).
	companionDown time.Time
	// writtenOff, while writeOff: the last link sequence number sent before the link
	// came back from down (returning). What was in flight when it went down never
	// arrives (the peer was sent a loss notice for it, or copies), so a report counts
	// it received: otherwise a returning link owed it until its new packets arrived,
	// and with the kernel's schedule taking the link back a tick after its return, its
	// silence meanwhile made it suspect about 100 ms after it came up.
	writtenOff uint32
	writeOff   bool
}

// mark records the link's sent-packet count and last link sequence number at now.
func (q *quietWatch) mark(now time.Time, pkts uint64, linkSeq uint32) {
	q.marks[q.n%sentMarks] = sentMark{now, pkts, linkSeq}
	q.n++
}

// sentBy returns how many packets had been sent by cutoff, from the newest mark at or
// before it; ok is false if the marks do not reach back that far.
func (q *quietWatch) sentBy(cutoff time.Time) (pkts uint64, ok bool) {
	m, ok := q.markBy(cutoff)
	return m.pkts, ok
}

// markBy returns the newest mark at or before cutoff.
func (q *quietWatch) markBy(cutoff time.Time) (sentMark, bool) {
	for k := range min(q.n, sentMarks) {
		m := q.marks[(q.n-1-k)%sentMarks]
		if !m.at.After(cutoff) {
			return m, true
		}
	}
	return sentMark{}, false
}

// sentBefore returns the time of the oldest mark in the run of newest marks that count
// link sequence number linkSeq as sent: the packet went out at or before it. ok is
// false if the newest mark does not count it yet (it went out since).
func (q *quietWatch) sentBefore(linkSeq uint32) (at time.Time, ok bool) {
	for k := range min(q.n, sentMarks) {
		m := q.marks[(q.n-1-k)%sentMarks]
		if wire.SeqDiff(m.linkSeq, linkSeq) < 0 {
			break
		}
		at, ok = m.at, true
	}
	return at, ok
}

// onReport judges one report: progress says whether it shows new data arriving on the
// link, othersDelivered whether it shows some on another link, highest the highest link
// sequence number it shows received; cutoff is the latest send time whose packets it
// should cover, and span how long since the last report. A report
// with progress confirms what was sent up to delivered (an RTT before it came, without
// the margin: generous, so that the next report owes only what followed). It returns
// how many packets the report owed when it is quiet, 0 otherwise.
//
// Two silences are no verdict. A report with nothing new on any link: the peer's
// receiving may have stalled as a whole (a busy CPU), and a bond whose links all died is
// the probes' to find. And a link we hardly sent on in the span the report newly covers:
// what it owes may be an old loss, such as the tail of a burst a full queue dropped
// just before the flow ended (the homogeneous lab scenario took two healthy links down
// five seconds after such a tail, when traffic resumed on the third). quietLapse such
// reports in a row end a suspicion: an idle link's silence says nothing.
func (q *quietWatch) onReport(cutoff, delivered time.Time, span time.Duration, progress, othersDelivered bool, highest uint32) (owed uint64) {
	if q.writeOff {
		if wire.SeqAfter(q.writtenOff, highest) {
			highest = q.writtenOff
		} else {
			q.writeOff = false // the peer has gone past it
		}
	}
	if progress {
		q.reports, q.idle, q.owing, q.behind = 0, 0, false, 0
		if sent, ok := q.sentBy(delivered); ok {
			q.confirmed = max(q.confirmed, sent)
		}
		return 0
	}
	m, ok := q.markBy(cutoff)
	q.behind = 0
	if d := wire.SeqDiff(m.linkSeq, highest); ok && d > 0 && !q.staleLoss(cutoff, m) {
		q.behind = uint32(d)
	}
	// Owing lasts while what was owed has not arrived, however it came to be owed: a
	// link that owed only together with the others (oweTogether) owes as before when
	// the next report shows data arriving elsewhere. When the primaries die together,
	// that data is their own packets' copies on the backup, and a report showing them
	// lifted the doubt about the dead primaries: their packets meanwhile had no copies.
	q.owing = q.behind >= owingPackets || (q.owing && q.behind > 0)
	sent := m.pkts
	before, okBefore := q.sentBy(cutoff.Add(-span))
	if !ok || !okBefore {
		return 0
	}
	if sent-before < busyQuietPackets/2 {
		// Hardly sent on: no verdict. A TCP flow that lost packets on a dying link
		// slows down or waits for its retransmission timer, so the silence may go on
		// past it and the suspicion stands; only a long idle spell lifts it.
		if q.idle++; q.idle >= quietLapse {
			q.reports = 0
		}
		return 0
	}
	q.idle = 0
	if !othersDelivered {
		return 0
	}
	if sent < q.confirmed+busyQuietPackets { // also after reset, when older marks count less than confirmed
		return 0
	}
	if q.behind < busyQuietPackets {
		// The peer's highest number shows the packets arrived: confirmed, taken at the
		// last mark before the previous report's reach, can miss up to a tick of
		// packets that report showed arriving (TestPacketsThePeerReportedAreNotOwed).
		return 0
	}
	q.reports++
	return sent - q.confirmed
}

// staleLoss tells whether what a report leaves unreceived up to mark m (its cutoff's)
// is an old loss: nothing was sent on the link in the staleOwed before the cutoff.
// Such packets are not owed: a flow that stalls behind a dead link does so within
// a few RTTs of sending them, and an idle link that lost its last packet (a standby
// link's last copy, with 0.3 % loss) would owe it for good, keeping the session in
// doubt: every link probed every interval, the idle backup too (2.3 kB/s instead of
// 0.17 on the lab's metered LTE, in two of six standby runs after a failover).
func (q *quietWatch) staleLoss(cutoff time.Time, m sentMark) bool {
	old, ok := q.sentBy(cutoff.Add(-staleOwed))
	return ok && old == m.pkts
}

// oweTogether makes the link owe data if the last report owed anything on it: the
// session calls it when that report showed nothing new on any link while the links
// together owed togetherPackets or more. When the primaries die together, a TCP flow
// through a bond whose AQM keeps the queues short has only a few packets in flight
// on each (one or two on each of the lab's ADSL and cable lines), and no link alone
// owed enough to be in doubt before the probes' silence made it suspect, 300 ms after
// the death: just after the flow's first retransmission timer had fired, so its
// retransmission was lost too (the standby scenario's TCP flow stalled for 0.8 s, and
// came back with its slow-start threshold at two packets).
func (q *quietWatch) oweTogether() {
	if q.behind > 0 {
		q.owing = true
	}
}

// reset forgets what was owed when the link goes down: its packets now go elsewhere.
func (q *quietWatch) reset(sentNow uint64) {
	q.confirmed, q.reports, q.idle, q.owing, q.behind = sentNow, 0, 0, false, 0
}

// returning gives a link that comes back from down a clean slate: what was sent on it
// up to now (sentNow packets, the last numbered linkSeq) was in flight when it went
// down, or sent in the moment before the kernel took it out of its schedule, and never
// arrives.
func (q *quietWatch) returning(sentNow uint64, linkSeq uint32) {
	q.reset(sentNow)
	q.writtenOff, q.writeOff = linkSeq, true
}

// quietCutoff is the latest send time whose packets a report arriving at now should
// cover on a link with smoothed RTT rtt that the scheduler runs at rateBps: an RTT, the
// margin, and two full-size packets' time on the link. Caller holds the link's mu.
func quietCutoff(now time.Time, rtt time.Duration, rateBps float64) time.Time {
	margin := quietMargin
	if rateBps > 0 {
		margin += min(maxQuietMargin, 2*estimate.FullPacketTime(rateBps))
	}
	return now.Add(-rtt - margin)
}
