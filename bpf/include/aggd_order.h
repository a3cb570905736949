/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The receive fast path's ordering decision: the BPF half of the ownership
 * protocol written down at struct aggd_fp_rx_order in aggd_fastpath.h, as one
 * pure function over that struct. tc_rx.c calls it with the session's spin
 * lock held and does everything with side effects (the divert count, the
 * decapsulation, the redirect, the counters) around it, so this file is the
 * whole protocol and nothing else.
 *
 * Deviations from the header comment, both on the safe side:
 *  - A handback is accepted only while the daemon owns the ordering. A
 *    request found while BPF owns cannot come from a correct daemon (it
 *    posts only while it owns); accepting it could move next backwards and
 *    deliver packets twice, so it is ignored and cleared.
 *  - BPF also hands over at next, not only on a gap: when the packet is the
 *    next expected but this program cannot deliver it (AGGD_ORDER_CANNOT:
 *    no agg0 configured, a layout the decapsulation does not handle, an IPv4
 *    first fragment) or cannot judge it at all (AGGD_ORDER_AGGREGATE: a GRO
 *    aggregate of several datagrams). From the daemon's point of view this
 *    is a gap of size zero: it restarts at next and the packet it receives
 *    is the first it resequences. next is not advanced, so nothing is lost.
 *
 * Every packet that is passed up while the daemon owns or because of a
 * handover is counted (AGGD_ORDER_DIVERTED): that count is what a handback's
 * stamp is compared with, and the daemon counts exactly these packets. The
 * latest one counted is noted with the count before it, so that the daemon can
 * tell a counted packet lost on the host while traffic flows
 * (aggd_order_note_diverted).
 */
#ifndef AGGD_ORDER_H
#define AGGD_ORDER_H

#include <linux/types.h>

#include "aggd_fastpath.h"

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

/* What the program could do with the packet, known before the lock. */
enum aggd_order_pkt {
	AGGD_ORDER_CAN = 0,       /* decapsulation is prepared: may be delivered */
	AGGD_ORDER_CANNOT = 1,    /* one datagram, but BPF cannot deliver it */
	AGGD_ORDER_AGGREGATE = 2, /* several datagrams in one skb: no single seq to judge */
};

/* The decision. */
enum aggd_order_action {
	AGGD_ORDER_DELIVER = 0,     /* next expected and owner BPF: next advanced, deliver it */
	AGGD_ORDER_DROP_OLD = 1,    /* behind next under owner BPF: drop */
	AGGD_ORDER_GAP = 2,         /* ahead of next: handed over at next, pass up */
	AGGD_ORDER_HANDOVER = 3,    /* next expected but undeliverable: handed over at next, pass up */
	AGGD_ORDER_DAEMON_OWNS = 4, /* the daemon owns: pass up */
	AGGD_ORDER_LATE_COPY = 5,   /* behind next, a copy of a number the daemon gave up: deliver it */
};

/* Set in the returned value when the packet must be counted in rx_divert. */
#define AGGD_ORDER_DIVERTED 0x100
#define AGGD_ORDER_ACTION_MASK 0xff

/*
 * Whether seq, behind next, is a number the daemon gave up whose copy has not
 * been delivered yet (struct aggd_fp_rx_order: late copies); if so, it is
 * taken: a second copy is dropped as old.
 */
static __always_inline int aggd_order_take_skipped(struct aggd_fp_rx_order *o, __u32 seq)
{
	__u32 back = o->skipped_end - 1 - seq;
	__u64 bit;

	if (back >= 64)
		return 0;
	bit = 1ULL << back;
	if (!(o->skipped & bit))
		return 0;
	o->skipped &= ~bit;
	return 1;
}

/*
 * Judge one DATA packet with global sequence seq. o is the session's
 * rx_order value, which the caller has locked; diverted is the low 32 bits
 * of the session's rx_divert count (only ever changed under the same lock,
 * so it is stable here); copy is whether the packet is a redundant copy
 * (AGGD_FLAG_DUPLICATE). Returns an enum aggd_order_action, ORed with
 * AGGD_ORDER_DIVERTED if the packet goes to the daemon.
 */
static __always_inline __u32 aggd_order_judge(struct aggd_fp_rx_order *o, __u32 diverted, __u32 seq,
					      enum aggd_order_pkt pkt, int copy)
{
	__s32 d;

	/* 1. A posted handback. Its stamp equals the divert count only if the
	 * daemon has consumed every packet passed up to it: then none is still
	 * on its way to the daemon, and BPF can continue where the daemon's
	 * (empty) resequencer stands. The count only grows, so a request whose
	 * stamp is behind can never match later. */
	if (o->req_valid) {
		if (o->owner != AGGD_FP_OWNER_BPF && o->req_stamp == diverted) {
			o->owner = AGGD_FP_OWNER_BPF;
			o->next = o->req_next;
			o->req_valid = 0;
			o->skipped = o->req_skipped;
			o->skipped_end = o->req_next;
		} else if (o->owner == AGGD_FP_OWNER_BPF) {
			o->req_valid = 0; /* not the daemon's to post now: ignore */
		}
	}

	/* 2. While the daemon owns, BPF writes nothing: count and pass up. */
	if (o->owner != AGGD_FP_OWNER_BPF)
		return AGGD_ORDER_DAEMON_OWNS | AGGD_ORDER_DIVERTED;

	/* 3. BPF owns. Serial arithmetic (RFC 1982): the difference as a signed
	 * 32-bit number, so next = 0xffffffff is followed by 0. */
	d = (__s32)(seq - o->next);
	if (pkt != AGGD_ORDER_AGGREGATE) {
		if (d < 0 && copy && pkt == AGGD_ORDER_CAN && aggd_order_take_skipped(o, seq))
			return AGGD_ORDER_LATE_COPY; /* its number was given up: late beats never */
		if (d < 0)
			return AGGD_ORDER_DROP_OLD; /* duplicate or late: already passed */
		if (d == 0 && pkt == AGGD_ORDER_CAN) {
			o->next = seq + 1;
			return AGGD_ORDER_DELIVER;
		}
	}

	/* 4. Hand over at next: the daemon resequences from there. */
	o->owner = AGGD_FP_OWNER_DAEMON;
	o->epoch += 1;
	if (pkt == AGGD_ORDER_AGGREGATE || d == 0)
		return AGGD_ORDER_HANDOVER | AGGD_ORDER_DIVERTED;
	return AGGD_ORDER_GAP | AGGD_ORDER_DIVERTED;
}

/*
 * Note in o the packet about to be counted in rx_divert (AGGD_ORDER_DIVERTED;
 * of a GRO aggregate, the first), with diverted, the count before it. Under
 * the same lock as the count, so the note and the count agree.
 */
static __always_inline void aggd_order_note_diverted(struct aggd_fp_rx_order *o, __u32 diverted, __u8 link_id,
						     __u32 link_seq)
{
	o->last_before = diverted;
	o->last_link_seq = link_seq;
	o->last_link = link_id;
}

#endif /* AGGD_ORDER_H */
