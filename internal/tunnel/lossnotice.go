package tunnel

// Reassignment (docs/architecture.md §5). When a link goes down its share moves to the
// other links through the scheduler; in addition the peer is told, in a LOSS_NOTICE,
// which global sequence numbers sent on the dead link will never arrive, so that its
// resequencer releases what it holds behind them at once instead of after the hold time.
//
// The sender knows which numbers those are from two things: a small log per link of
// the global sequence number each recent data packet carried (sentLog, written as the
// packet is sent), and the highest link sequence number the peer reported receiving on
// the link (FEEDBACK). Every packet at or below that report arrived or was counted lost
// by the peer already; the ones after it are the ones the notice names.
//
// Only down links get notices. A suspect link's packets have a redundant copy on
// another link, which is why packets sent with a copy are logged as copies and never
// named: the other copy may still arrive, and a notice must not make the peer give it
// up. (They are logged at all for a rescue: rescue.go.)
//
// With the kernel fast path the kernel takes link sequence numbers from the same
// series and logs its own packets that had no copy in a per-link map (tx_sent_log in
// bpf/tc_tx.c; a packet with a copy is never named, so it need not log those); a
// notice then names the packets of both logs, merged in link order.

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aggd/aggd/internal/clock"
	"github.com/aggd/aggd/internal/wire"
)

// sentLogSize is how many of a link's most recent logged packets the sender remembers:
// more than a link carries between two feedback reports at gigabit rates (a notice
// names only packets sent after the peer's last report).
const sentLogSize = 4096

// maxNoticeRanges is how many ranges one LOSS_NOTICE carries: 9 + 6×200 bytes of body,
// with the aggd, UDP and IPv4 headers 1265 bytes, which fits the smallest MTU any
// IPv6 path has (1280), so a notice is never lost to fragmentation.
const maxNoticeRanges = 200

// SentEntry is one logged data packet: the link and global sequence numbers it
// carried, and whether it was a copy of a packet sent on another link (rescue.go).
type SentEntry struct {
	LinkSeq, Seq uint32
	Copy         bool
}

// sentLog is one link's record of recent data packets, copies marked, in the order
// they were sent, and how far the peer has reported receiving.
type sentLog struct {
	ring  []SentEntry // written under the session's txMu; allocated on first use
	n     uint64      // entries ever written; the newest is at (n-1) % sentLogSize
	acked atomic.Uint32
}

// record logs one data packet (a copy: rescue.go). Caller holds txMu. No allocation
// after the first call.
func (g *sentLog) record(linkSeq, seq uint32, copy bool) {
	if g.ring == nil {
		g.ring = make([]SentEntry, sentLogSize)
	}
	g.ring[g.n%sentLogSize] = SentEntry{linkSeq, seq, copy}
	g.n++
}

// ack raises the highest link sequence number the peer is known to have passed.
// Reports can arrive out of order; an older one never lowers it.
func (g *sentLog) ack(linkSeq uint32) {
	for {
		old := g.acked.Load()
		if !wire.SeqAfter(linkSeq, old) || g.acked.CompareAndSwap(old, linkSeq) {
			return
		}
	}
}

// takeUnacked returns the logged packets sent after the peer's last report, oldest
// first, and whether the log may have forgotten some (more were sent since the report
// than it holds). It then counts everything up to last, the link's newest sequence
// number, as passed, so that the same numbers are not named again. Caller holds txMu.
func (g *sentLog) takeUnacked(last uint32) (sent []SentEntry, incomplete bool) {
	acked := g.acked.Load()
	k := g.countAfter(acked)
	if k == min(g.n, sentLogSize) && g.n > sentLogSize {
		// Every entry is unacknowledged and older ones were overwritten: unless the
		// oldest entry directly follows the report, some packets are not named.
		incomplete = g.ring[(g.n-k)%sentLogSize].LinkSeq != acked+1
	}
	sent = g.newest(k)
	g.ack(last)
	return sent, incomplete
}

// unackedSince returns the logged packets sent after the peer's last report that are
// also among those logged after the first n, oldest first, leaving the log as it is.
// Caller holds txMu.
func (g *sentLog) unackedSince(n uint64) []SentEntry {
	return g.newest(min(g.countAfter(g.acked.Load()), g.n-min(n, g.n)))
}

// find returns the logged packet that carried link sequence number linkSeq, if the log
// still holds it (repair.go). Entries are in link order, so the search stops at the
// first older one. Caller holds txMu.
func (g *sentLog) find(linkSeq uint32) (SentEntry, bool) {
	held := min(g.n, sentLogSize)
	for k := uint64(0); k < held; k++ {
		e := g.ring[(g.n-1-k)%sentLogSize]
		if e.LinkSeq == linkSeq {
			return e, true
		}
		if !wire.SeqAfter(e.LinkSeq, linkSeq) {
			break
		}
	}
	return SentEntry{}, false
}

// countAfter counts the newest logged entries whose link sequence number is after from.
func (g *sentLog) countAfter(from uint32) uint64 {
	held := min(g.n, sentLogSize)
	k := uint64(0)
	for k < held && wire.SeqAfter(g.ring[(g.n-1-k)%sentLogSize].LinkSeq, from) {
		k++
	}
	return k
}

// newest returns the k newest logged entries, oldest first.
func (g *sentLog) newest(k uint64) []SentEntry {
	sent := make([]SentEntry, 0, k)
	for i := k; i > 0; i-- {
		sent = append(sent, g.ring[(g.n-i)%sentLogSize])
	}
	return sent
}

// mergeSent merges two logs of one link's packets, each in link order after acked,
// into one in link order.
func mergeSent(a, b []SentEntry, acked uint32) []SentEntry {
	out := make([]SentEntry, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if a[0].LinkSeq-acked < b[0].LinkSeq-acked {
			out, a = append(out, a[0]), a[1:]
		} else {
			out, b = append(out, b[0]), b[1:]
		}
	}
	return append(append(out, a...), b...)
}

// seqsOf returns the global sequence numbers of logged packets, in their order,
// leaving out copies: their original may still arrive.
func seqsOf(sent []SentEntry) []uint32 {
	seqs := make([]uint32, 0, len(sent))
	for _, e := range sent {
		if !e.Copy {
			seqs = append(seqs, e.Seq)
		}
	}
	return seqs
}

// seqRanges merges sequence numbers, in sending order, into ranges of consecutive ones.
func seqRanges(seqs []uint32) []wire.SeqRange {
	var out []wire.SeqRange
	for _, s := range seqs {
		if n := len(out); n > 0 {
			r := &out[n-1]
			if r.Start+uint32(r.Count) == s && r.Count < 0xffff {
				r.Count++
				continue
			}
		}
		out = append(out, wire.SeqRange{Start: s, Count: 1})
	}
	return out
}

// lossNotices is a session's notices waiting to be sent once more.
type lossNotices struct {
	mu     sync.Mutex
	ticks  uint64 // ticks so far (repeatLossNotices)
	repeat []pendingNotice
}

// pendingNotice is a notice sent once, and when: the session's clock and its tick count.
type pendingNotice struct {
	ranges []wire.SeqRange
	sent   int64 // clock.Nanos
	tick   uint64
}

// due reports whether the notice goes again at the tick numbered ticks, at now: half
// a probe interval after it went, or at the second tick since, whichever comes first.
func (n pendingNotice) due(ticks uint64, now int64, half time.Duration) bool {
	return ticks-n.tick >= 2 || now-n.sent >= int64(half)
}

// lostOn returns the global sequence numbers sent on link l, just gone down (and out of
// the schedule: linkDown), that will never arrive: those after the peer's last report,
// copies left out. They are taken: a second call names none of them again.
func (s *Session) lostOn(l *link) []uint32 {
	s.txMu.Lock()
	acked, logged := l.sent.acked.Load(), l.sent.n
	_, last := s.watermark(l)
	sent, incomplete := l.sent.takeUnacked(last)
	s.txMu.Unlock()
	kernel := 0
	if s.fp != nil {
		// The kernel's packets, from its own log. The daemon's log holds only what
		// the daemon sent, so its completeness is the kernel log's.
		k, complete := s.fp.SentOn(l.spec.ID, acked, last)
		kernel, incomplete = len(k), !complete
		sent = mergeSent(sent, k, acked)
	}
	seqs := seqsOf(sent)
	l.logger().Debug("loss notice", "peer_acked_link_seq", acked, "last_link_seq", last, "logged_ever", logged, "named", len(seqs), "from_kernel", kernel)
	if incomplete {
		l.logger().Warn("loss notice incomplete: more packets were in flight on the link than the sender logs; the peer's hold timer resolves the rest",
			"logged", sentLogSize)
	}
	return seqs
}

// noticeLost tells the peer that the global sequence numbers seqs will never arrive,
// now and once more later in case this notice is lost.
func (s *Session) noticeLost(seqs []uint32) {
	if len(seqs) == 0 {
		return
	}
	ranges := seqRanges(seqs)
	s.sendLossNotice(ranges)
	s.notices.mu.Lock()
	s.notices.repeat = append(s.notices.repeat, pendingNotice{ranges, clock.Nanos(), s.notices.ticks})
	s.notices.mu.Unlock()
}

// repeatLossNotices sends the notices sent at least half a probe interval ago once
// more, at a tick. Not sooner: what lost the first (most often the queue a link's
// rescue copies filled, linkDown) would take the second as well, and a tick can come
// a millisecond after the notice. Two ticks since are always enough: with a real
// clock they are an interval, and a test's virtual clock moves only the ticks.
// Resolving a number twice is harmless at the peer (reseq.Skip ignores what is
// already resolved).
func (s *Session) repeatLossNotices() {
	now := clock.Nanos()
	var due []wire.SeqRange
	s.notices.mu.Lock()
	s.notices.ticks++
	s.notices.repeat = slices.DeleteFunc(s.notices.repeat, func(n pendingNotice) bool {
		if !n.due(s.notices.ticks, now, s.cfg.Probe/2) {
			return false
		}
		due = append(due, n.ranges...)
		return true
	})
	s.notices.mu.Unlock()
	if len(due) > 0 {
		s.sendLossNotice(due)
	}
}

// sendLossNotice sends ranges on the refuge link, in as many messages as they need.
// With no link up there is nowhere to send them: the peer's hold timer resolves the
// numbers.
func (s *Session) sendLossNotice(ranges []wire.SeqRange) {
	via := s.refuge(nil)
	if via == nil {
		return
	}
	n := 0
	for len(ranges) > 0 {
		chunk := ranges[:min(len(ranges), maxNoticeRanges)]
		ranges = ranges[len(chunk):]
		body := wire.LossNoticeBody{Counter: s.txCtrl.Add(1), Ranges: chunk}
		s.sendControl(via, wire.TypeLossNotice, 0, 0, body.Append(nil))
		n += rangeTotal(chunk)
	}
	s.pm.lossNoticeSent.Add(float64(n))
}

// refuge is where what cannot wait for a link in doubt goes (loss notices, copies of
// a dead link's packets in flight): the first of refuges, nil if there is none.
func (s *Session) refuge(except *link) *link {
	if r := s.refuges(except); len(r) > 0 {
		return r[0]
	}
	return nil
}

// refuges lists the links in the schedule but except, best refuge first: healthy links
// (link.healthy) before the others, then the lowest RTT. A suspect link comes last:
// when the primaries die together the first to be found down would otherwise send its
// notice into the other.
func (s *Session) refuges(except *link) []*link {
	type cand struct {
		l       *link
		healthy bool
		rtt     time.Duration
	}
	var cs []cand
	now := time.Now()
	for _, l := range s.allLinks() {
		if l != except && l.isUp() {
			cs = append(cs, cand{l, l.healthy(now), l.rtt()})
		}
	}
	slices.SortStableFunc(cs, func(a, b cand) int {
		if a.healthy != b.healthy {
			if a.healthy {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.rtt, b.rtt)
	})
	out := make([]*link, len(cs))
	for i, c := range cs {
		out[i] = c.l
	}
	return out
}

// ackSent records the highest link sequence numbers the peer reports receiving.
func (s *Session) ackSent(reports []wire.LinkReport) {
	for _, r := range reports {
		if l := s.link(r.LinkID); l != nil {
			l.sent.ack(r.HighestLinkSeq)
		}
	}
}

// onLossNotice resolves the sequence numbers the peer says will never arrive.
func (s *Session) onLossNotice(body wire.LossNoticeBody) {
	s.rxMu.Lock()
	if s.kernelMayOwn() {
		s.deferSkips(body.Ranges)
	} else {
		s.skipRanges(body.Ranges)
	}
	s.armHoldTimer(clock.Nanos())
	s.rxMu.Unlock()
	s.pm.lossNoticeReceived.Add(float64(rangeTotal(body.Ranges)))
}

// skipRanges hands the resequencer sequence numbers that will never arrive. Caller
// holds rxMu.
func (s *Session) skipRanges(ranges []wire.SeqRange) {
	for _, r := range ranges {
		s.reseq.Skip(r.Start, r.Count, s.deliver)
	}
}

func rangeTotal(ranges []wire.SeqRange) int {
	n := 0
	for _, r := range ranges {
		n += int(r.Count)
	}
	return n
}
