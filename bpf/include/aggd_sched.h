/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Earliest-expected-arrival scheduling for the transmit fast path
 * (ARCHITECTURE §5), the BPF twin of internal/sched (the reference: keep the
 * two in step).
 *
 * For every usable link i of the allowed classes
 *
 *     arrival(i) = max(now, backlog_end[i]) + size*8e9/rate[i] + base_owd[i]
 *
 * and the packet goes to the link with the smallest arrival; its backlog_end
 * becomes max(now, backlog_end) + size*8e9/rate. Links whose arrival is
 * within AGGD_SCHED_TIE_NS of the smallest are tied and take turns by rate
 * (smooth weighted round-robin on tie_credit, the lowest slot among equal
 * credits; sched.pickEarliest says why). While the earliest link's backlog
 * reaches AGGD_SCHED_OVERFLOW_NS beyond now (the bond is full), an idle link
 * whose base delay alone is no later than the earliest arrival takes the
 * packet instead, the earliest-arriving such link (sched.idleSlowLink: a
 * slow line is used without the others queueing its packet time). Class rules
 * (sched.allowedClasses): primaries; overflow
 * links too once every usable primary's backlog reaches more than
 * AGGD_SCHED_OVERFLOW_NS beyond now; overflow and backup links when no
 * primary is usable. A SUSPECT link's packet also gets a copy on the best
 * other usable link (sched.pickDuplicate: links that are not suspect first,
 * then links whose class is allowed, then the earliest arrival); the copy's
 * link is charged too. While any usable primary is suspect, the packet also
 * gets a copy on a standby link (sched.StandbyCopy, aggd_sched_standby).
 *
 * In three pieces: aggd_sched_prepare reads the session's configuration,
 * aggd_sched_pick decides on the backlogs and credits read without the lock,
 * aggd_sched_charge and aggd_sched_settle_tie update them under the
 * session's bpf_spin_lock (no helper or
 * function calls there; everything is __always_inline).
 *
 * Why prepare and pick are written without branches: every link adds a few
 * conditions, and the verifier walks each combination as its own path. A
 * condition it can decide from a constant (a bit set built up on one path)
 * makes it mark that value precise, so paths that differ in it are never
 * pruned: 6.1 gave up after a million instructions even with the decision
 * in a global function. So the per-link conditions are computed as 0/1
 * values with arithmetic (aggd_nz64, aggd_lt64, aggd_sel64), hidden from
 * clang by a barrier so it does not turn them back into branches, and
 * combined by multiplication rather than with all-ones masks (6.18 forks
 * its state on an AND with a value in [-1, 0]): the verifier walks one
 * path, some 2,000 instructions on 6.18 for the whole decision. The loops
 * over the links stay real bounded loops (unrolled, clang spills so many
 * temporaries that the frame no longer fits the 512-byte stack the program
 * shares with its subprograms).
 *
 * Times are nanoseconds of bpf_ktime_get_ns() and backlogs derived from it;
 * the arithmetic comparisons assume they stay below 2^60 (36 years of
 * uptime).
 */
#ifndef AGGD_SCHED_H
#define AGGD_SCHED_H

#include <linux/types.h>

#include "aggd_wire.h"
#include "aggd_verifier.h"
#include "aggd_fastpath.h"

/* sched.DefaultOverflowQueueDelay: 10 ms of queue on every primary. */
#define AGGD_SCHED_OVERFLOW_NS 10000000ULL

/* tunnel.standbyCopyBacklog: the most virtual queue a standby link may have
 * beyond now for it to take a copy sent while a primary is in doubt. */
#define AGGD_SCHED_STANDBY_COPY_NS 30000000ULL

/* sched.TieWindow: arrivals this close to the earliest are a tie. */
#define AGGD_SCHED_TIE_NS 1000000ULL

/* Link slots are masked with this to give the verifier a bound it can see. */
#define AGGD_FP_SLOT_MASK (AGGD_FP_MAX_LINKS - 1)
_Static_assert((AGGD_FP_MAX_LINKS & (AGGD_FP_MAX_LINKS - 1)) == 0, "link slots are a power of two");
_Static_assert(AGGD_FP_MAX_LINKS <= 32, "link bit sets are 32 bits");

/* Class bits of an allowed-class set. */
#define AGGD_SCHED_PRIMARY (1U << AGGD_LINK_CLASS_PRIMARY)
#define AGGD_SCHED_OVERFLOW (1U << AGGD_LINK_CLASS_OVERFLOW)
#define AGGD_SCHED_BACKUP (1U << AGGD_LINK_CLASS_BACKUP)

/* One packet's view of the session's links, computed before the lock. */
struct aggd_sched_links { /* kept small: it lives on a stack shared with the program's */
	__u64 tx_ns[AGGD_FP_MAX_LINKS];  /* the packet's transmission time on the link */
	__u32 owd_us[AGGD_FP_MAX_LINKS]; /* the link's base one-way delay */
	__u8 cls[AGGD_FP_MAX_LINKS];     /* class bit (AGGD_SCHED_*); 0 for an unusable link */
	__u64 usable;   /* bit i: link i may carry data */
	__u64 suspect;  /* bit i: link i is usable and SUSPECT */
	__u64 sendable; /* bit i: link i is usable and the fast path can send on it now
			 * (L3, or Ethernet with its gateway resolved) */
};

/* Larger than any arrival time or sort key: "not a candidate". */
#define AGGD_SCHED_NEVER (1ULL << 62)
/* Below any tie credit (which stays within a few times the sum of the
 * links' rates): "no tied link yet". */
#define AGGD_SCHED_NO_CREDIT ((__u64)(-(1LL << 62)))

/* 1 if x != 0, else 0, without a branch. */
static __always_inline __u64 aggd_nz64(__u64 x)
{
	__u64 n = -x;

	aggd_barrier_var(n);
	return (x | n) >> 63;
}

/* 1 if a < b, else 0, without a branch; a and b below 2^63. */
static __always_inline __u64 aggd_lt64(__u64 a, __u64 b)
{
	__u64 d = a - b;

	aggd_barrier_var(d);
	return d >> 63;
}

/* 1 if a < b as signed values, else 0, without a branch; |a|, |b| below 2^62. */
static __always_inline __u64 aggd_slt64(__u64 a, __u64 b)
{
	return aggd_lt64(a, b);
}

/*
 * c (0 or 1) ? a : b, without a branch. A multiplication, not a mask
 * (-c & a | ~-c & b): 6.18's verifier forks its state on an AND with a
 * value in [-1, 0], which is as bad as a branch.
 */
static __always_inline __u64 aggd_sel64(__u64 c, __u64 a, __u64 b)
{
	aggd_barrier_var(c);
	return b + c * (a - b);
}

/* The transmission time in ns of a packet of size bytes (its outer datagram
 * over IPv4) on link l: an IPv6 link adds the larger header. 0 for a rate of
 * 0 (BPF's division by zero), which makes no link usable anyway. */
static __always_inline __u64 aggd_sched_tx_ns(const struct aggd_fp_tx_link *l, __u32 size)
{
	__u64 v6 = (l->flags / AGGD_FP_LINK_IPV6) & 1;

	return ((__u64)size + v6 * (AGGD_OVERHEAD6 - AGGD_OVERHEAD)) * 8000000000ULL / l->rate_bps;
}

static __always_inline __u64 aggd_sched_start(__u64 now, __u64 backlog_end)
{
	return aggd_sel64(aggd_lt64(now, backlog_end), backlog_end, now);
}

/*
 * Read the session's links for a packet of size bytes (the outer datagram
 * over IPv4: inner packet + AGGD_OVERHEAD, as the Go side charges). An IPv6
 * link's datagram is AGGD_OVERHEAD6 - AGGD_OVERHEAD bytes longer, and its
 * rate counts them (sched.LinkParams.OuterIPv6). size is at most 64 KiB +
 * overhead, so size * 8e9 fits 64 bits with room to spare; a rate of 0 makes
 * the link unusable (and BPF's division by zero yields 0).
 *
 * Usable: within nlinks, ifindex set, state UP or SUSPECT (unknown states,
 * from a newer daemon, count as down: the most conservative reading), rate
 * not 0. Unknown classes are backup, as sched.Class.effective.
 */
static __always_inline void aggd_sched_prepare(const struct aggd_fp_tx_session *s, __u32 size,
					       struct aggd_sched_links *ls)
{
	__u64 n = s->nlinks;

	ls->usable = 0;
	ls->suspect = 0;
	ls->sendable = 0;
#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < AGGD_FP_MAX_LINKS; i++) {
		const struct aggd_fp_tx_link *l = &s->links[i];
		__u64 state = l->state, cls = l->cls, flags = l->flags, rate = l->rate_bps;
		__u64 u, eth, neigh, big;

		u = aggd_lt64(i, n) & aggd_nz64(l->ifindex) & aggd_nz64(rate) &
		    (aggd_nz64((state - AGGD_FP_LINK_UP) & ~1ULL) ^ 1); /* state 1 or 2 */
		eth = (flags / AGGD_FP_LINK_ETHERNET) & 1;
		neigh = (flags / AGGD_FP_LINK_NEIGH_OK) & 1;
		big = aggd_lt64(AGGD_LINK_CLASS_MAX, cls);
		cls = aggd_sel64(big, AGGD_LINK_CLASS_MAX, cls) & 3;

		ls->usable |= u << i;
		ls->suspect |= (u & (aggd_nz64(state - AGGD_FP_LINK_SUSPECT) ^ 1)) << i;
		ls->sendable |= (u & ((eth ^ 1) | neigh)) << i;
		ls->cls[i] = u << cls;
		ls->tx_ns[i] = aggd_sched_tx_ns(l, size);
		ls->owd_us[i] = l->base_owd_us;
	}
}

/* sched.allowedClasses: primaries; overflow too when every usable primary's
 * backlog ends more than AGGD_SCHED_OVERFLOW_NS after now; overflow and
 * backup when no primary is usable. */
static __always_inline __u64 aggd_sched_allowed(const __u64 *backlog_end, const struct aggd_sched_links *ls,
						__u64 now)
{
	__u64 any_primary = 0, any_idle_primary = 0;

#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < AGGD_FP_MAX_LINKS; i++) {
		__u64 primary = ls->cls[i] & AGGD_SCHED_PRIMARY; /* 0 or 1 */

		any_primary |= primary;
		any_idle_primary |= primary & (aggd_lt64(now + AGGD_SCHED_OVERFLOW_NS, backlog_end[i]) ^ 1);
	}
	return (AGGD_SCHED_PRIMARY * any_primary) |
	       (AGGD_SCHED_OVERFLOW * ((any_primary & any_idle_primary) ^ 1)) |
	       (AGGD_SCHED_BACKUP * (any_primary ^ 1));
}

/* What aggd_sched_pick decided. */
struct aggd_sched_choice {
	__s32 link;      /* the link slot, -1: no usable link */
	__s32 dup;       /* the redundant copy's link slot, -1: no copy */
	__s32 standby;   /* the standby copy's link slot, -1: no copy (aggd_sched_standby) */
	__u32 sendable;  /* 1: the fast path can send on link now */
	__u32 tied;      /* bit i: link i was tied with link (aggd_sched_settle_tie) */
};

/* Expected arrival of a packet sent on link i now: the end of its virtual queue
 * (or now), its transmission time, and the link's base one-way delay. */
static __always_inline __u64 aggd_sched_arrival(const __u64 *backlog_end, const struct aggd_sched_links *ls,
						__u32 i, __u64 now)
{
	return aggd_sched_start(now, backlog_end[i]) + ls->tx_ns[i] + (__u64)ls->owd_us[i] * 1000;
}

/*
 * Choose the link for the packet: among the allowed usable links, those
 * whose expected arrival is within AGGD_SCHED_TIE_NS of the earliest are
 * tied, and of them the one whose credit plus rate is the largest (the
 * lowest slot among equals) wins; aggd_sched_settle_tie then books what the
 * tie earned and paid. While the bond is full an idle slow link comes
 * before the tie (sched.idleSlowLink). If the link is suspect, choose
 * the link for its copy: among the other usable links the fast path can send
 * on now (a copy cannot be handed to the slow path apart from its original),
 * links that are not suspect first, then links of an allowed class, then the
 * earliest arrival (sched.pickDuplicate; a copy may use a link the class
 * rules would not). Charges nothing. A link's share of a tie is its rate in
 * the session s the links were prepared from.
 */
static __always_inline void aggd_sched_pick(const struct aggd_fp_sched_state *st,
					    const struct aggd_fp_tx_session *s,
					    const struct aggd_sched_links *ls, __u64 allowed, __u64 now,
					    struct aggd_sched_choice *c)
{
	const __u64 *backlog_end = st->backlog_end_ns;
	__u64 best_at = AGGD_SCHED_NEVER, earliest = 0, found;
	__u64 best = 0, best_credit = AGGD_SCHED_NO_CREDIT, tied = 0;
	__u64 slow = 0, slow_at = AGGD_SCHED_NEVER, full, take_slow;
	__u64 d = 0, d_key = AGGD_SCHED_NEVER, d_found = 0, want_dup;

#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < AGGD_FP_MAX_LINKS; i++) {
		__u64 cand = aggd_nz64(ls->cls[i] & allowed);
		__u64 at = aggd_sel64(cand, aggd_sched_arrival(backlog_end, ls, i, now), AGGD_SCHED_NEVER);
		__u64 better = aggd_lt64(at, best_at);

		best_at = aggd_sel64(better, at, best_at);
		earliest = aggd_sel64(better, i, earliest);
	}

	/* sched.idleSlowLink: with the earliest link's backlog AGGD_SCHED_OVERFLOW_NS
	 * or more beyond now, the idle link of the earliest arrival among those whose
	 * base delay is no later than best_at. */
	full = aggd_lt64(backlog_end[earliest & AGGD_FP_SLOT_MASK], now + AGGD_SCHED_OVERFLOW_NS) ^ 1;
#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < AGGD_FP_MAX_LINKS; i++) {
		__u64 cand = aggd_nz64(ls->cls[i] & allowed) & aggd_nz64(i ^ earliest) &
			     (aggd_lt64(now, backlog_end[i]) ^ 1) &
			     (aggd_lt64(best_at, now + (__u64)ls->owd_us[i] * 1000) ^ 1);
		__u64 at = aggd_sel64(cand, aggd_sched_arrival(backlog_end, ls, i, now), AGGD_SCHED_NEVER);
		__u64 better = aggd_lt64(at, slow_at);

		slow_at = aggd_sel64(better, at, slow_at);
		slow = aggd_sel64(better, i, slow);
	}
	take_slow = full & aggd_lt64(slow_at, AGGD_SCHED_NEVER);

	/* The backlogs are read again here, and another CPU may have charged
	 * the earliest link meanwhile: then the tie can come out empty, and
	 * the packet goes to the slow path (no link) rather than to slot 0. */
#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < AGGD_FP_MAX_LINKS; i++) {
		__u64 cand = aggd_nz64(ls->cls[i] & allowed);
		__u64 at = aggd_sched_arrival(backlog_end, ls, i, now);
		__u64 tie = cand & (aggd_lt64(best_at + AGGD_SCHED_TIE_NS, at) ^ 1);
		__u64 credit = (__u64)st->tie_credit[i] + s->links[i].rate_bps;
		__u64 better = tie & aggd_slt64(best_credit, credit);

		tied |= tie << i;
		best_credit = aggd_sel64(better, credit, best_credit);
		best = aggd_sel64(better, i, best);
	}
	/* The idle slow link's turn replaces the tie, which then books nothing. */
	best = aggd_sel64(take_slow, slow, best) & AGGD_FP_SLOT_MASK;
	tied = aggd_sel64(take_slow, 0, tied);
	found = take_slow | aggd_nz64(tied);
	c->tied = (__u32)tied;
	c->link = (__s32)aggd_sel64(found, best, (__u64)-1);
	c->sendable = (ls->sendable >> best) & found;
	want_dup = (ls->suspect >> best) & found;

#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < AGGD_FP_MAX_LINKS; i++) {
		__u64 cand = ((ls->usable & ls->sendable) >> i) & aggd_nz64(i ^ best) & 1;
		__u64 tier = 2 * ((ls->suspect >> i) & 1) + (aggd_nz64(ls->cls[i] & allowed) ^ 1);
		__u64 at = aggd_sched_arrival(backlog_end, ls, i, now);
		/* tier above arrival: one key orders both (arrivals < 2^60). */
		__u64 key = (tier << 60) + at;
		__u64 better = aggd_lt64(aggd_sel64(cand, key, AGGD_SCHED_NEVER), d_key);

		d_key = aggd_sel64(better, key, d_key);
		d = aggd_sel64(better, i, d);
		d_found |= better;
	}
	d_found &= want_dup;
	c->dup = (__s32)aggd_sel64(d_found, d & AGGD_FP_SLOT_MASK, (__u64)-1);
}

/*
 * sched.StandbyCopy: while some usable primary is suspect, one more copy of
 * the packet on a standby link. Primaries die together (one power cut, one
 * street cabinet), but rarely at the same instant: until the second is
 * suspect too, the first one's copies go to it (pick prefers a link not in
 * doubt), and its own packets get none. The standby link is the one left if
 * they do die together.
 *
 * The link: among the usable links the fast path can send on now that are
 * not suspect, not of an allowed class (so not carrying originals, and not
 * the original's link), not the duplicate's link, and whose virtual queue
 * ends at most AGGD_SCHED_STANDBY_COPY_NS beyond now (copies of a faster
 * bond must not fill a slow backup's queue, where they would delay what it
 * carries once it is alone), the one of the earliest arrival. Charges
 * nothing.
 */
static __always_inline void aggd_sched_standby(const struct aggd_fp_sched_state *st,
					       const struct aggd_sched_links *ls, __u64 allowed, __u64 now,
					       struct aggd_sched_choice *c)
{
	const __u64 *backlog_end = st->backlog_end_ns;
	__u64 has_dup = aggd_lt64((__u64)(__s64)c->dup, AGGD_FP_MAX_LINKS);
	__u64 dup = (__u64)c->dup & AGGD_FP_SLOT_MASK;
	__u64 doubt = 0, sb = 0, sb_at = AGGD_SCHED_NEVER, found;

#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < AGGD_FP_MAX_LINKS; i++) {
		__u64 suspect = (ls->suspect >> i) & 1;
		__u64 cand = ((ls->usable & ls->sendable) >> i) & 1 & (suspect ^ 1) &
			     (aggd_nz64(ls->cls[i] & allowed) ^ 1) &
			     ((has_dup & (aggd_nz64(i ^ dup) ^ 1)) ^ 1) &
			     (aggd_lt64(now + AGGD_SCHED_STANDBY_COPY_NS, backlog_end[i]) ^ 1);
		__u64 at = aggd_sel64(cand, aggd_sched_arrival(backlog_end, ls, i, now), AGGD_SCHED_NEVER);
		__u64 better = aggd_lt64(at, sb_at);

		doubt |= suspect & aggd_nz64(ls->cls[i] & AGGD_SCHED_PRIMARY);
		sb_at = aggd_sel64(better, at, sb_at);
		sb = aggd_sel64(better, i, sb);
	}
	found = doubt & aggd_lt64(sb_at, AGGD_SCHED_NEVER);
	c->standby = (__s32)aggd_sel64(found, sb & AGGD_FP_SLOT_MASK, (__u64)-1);
}

/* Book a tie (sched.pickEarliest): every link of the tied set earns its
 * rate in credit, and link, the one picked, pays what they earned together.
 * Caller holds the lock of the tx_sched value tie_credit belongs to. */
static __always_inline void aggd_sched_settle_tie(__s64 *tie_credit, const struct aggd_fp_tx_session *s,
						  __u32 tied, __u32 link)
{
	__u64 earned = 0;

#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < AGGD_FP_MAX_LINKS; i++) {
		__u64 w = ((tied >> i) & 1) * s->links[i].rate_bps;

		tie_credit[i] += w;
		earned += w;
	}
	tie_credit[link & AGGD_FP_SLOT_MASK] -= earned;
}

/* Append a packet of size bytes (over IPv4, as aggd_sched_prepare's) to link
 * slot i's virtual queue. Caller holds the lock of the tx_sched value
 * backlog_end belongs to. The transmission time is computed here again
 * rather than carried over from the decision: aggd_tc_tx's stack has no room
 * for it. */
static __always_inline void aggd_sched_charge(__u64 *backlog_end, const struct aggd_fp_tx_session *s, __u32 i,
					      __u32 size, __u64 now)
{
	i &= AGGD_FP_SLOT_MASK;
	backlog_end[i] = aggd_sched_start(now, backlog_end[i]) + aggd_sched_tx_ns(&s->links[i], size);
}

#endif /* AGGD_SCHED_H */
