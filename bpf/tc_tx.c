// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * aggd_tc_tx: the transmit fast path on agg0's egress (ARCHITECTURE §2,
 * transmit steps 1-5). agg0 is a TUN device: the skb starts at the inner IP
 * header, there is no MAC header.
 *
 * Per packet:
 *  1. inner IPv4 or IPv6, else slow path (NOT_IP);
 *  2. session: tx_routes (longest prefix of the inner destination) gives the
 *     slot, tx_sessions the session (NO_ROUTE; DISABLED if not enabled);
 *  3. GSO super-packets and packets longer than the session's mtu go to the
 *     slow path (GSO, OVERSIZE): the outer header would be copied onto every
 *     segment, and nothing on the redirect path checks the MTU (§9);
 *  4. scheduler (aggd_sched.h) under the session's tx_sched lock: the link,
 *     and for a SUSPECT link the link of a redundant copy; no usable link is
 *     NO_LINK, a chosen Ethernet link whose gateway is not resolved NO_NEIGH
 *     (decided before the packet is touched, so the slow path gets it whole);
 *  5. numbers from tx_seq (shared with the daemon through mmap, atomic adds);
 *  6. outer IPv4 + UDP + aggd header (aggd_encap.h), tag, and out: Ethernet
 *     links with bpf_redirect_neigh via the gateway, L3 links with
 *     bpf_redirect. The copy leaves first, through bpf_clone_redirect.
 * Every packet is counted in tx_verdicts; packets the fast path sent also
 * per session and link in tx_link_stats, and those without a copy in the
 * link's tx_sent_log (for the daemon's loss notices).
 *
 * The redundant copy, as the Go side's Session.SendData: the original on the
 * chosen link with flags 0, the copy on the other link with
 * AGGD_FLAG_DUPLICATE; both carry the same global sequence number, each the
 * next link sequence of its own link. bpf_clone_redirect sends the clone as
 * it is, so a copy on an Ethernet link needs real MAC addresses: they come
 * from bpf_fib_lookup of the link's gateway restricted to the link's
 * interface (the neighbour table the kernel would use too). If that lookup
 * fails the copy is not sent (its link sequence number is then a gap the
 * receiver counts as one lost packet).
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "aggd_wire.h"
#include "aggd_parse.h"
#include "aggd_auth.h"
#include "aggd_fastpath.h"
#include "aggd_sched.h"
#include "aggd_aqm.h"
#include "aggd_ecn.h"
#include "aggd_encap.h"

#define AGGD_AF_INET 2 /* AF_INET, which no uapi header reachable here defines */

/*
 * How many bytes sit in front of the inner IP header: 0 on agg0 (a TUN
 * device); ETH_HLEN only under BPF_PROG_TEST_RUN, which always hands a
 * sched_cls program an Ethernet frame (it runs eth_type_trans over the first
 * 14 bytes and pushes them back, so data starts at a MAC header and the MAC
 * header is 14 bytes long). The loader leaves it 0; tests set it to 14.
 *
 * It changes two things only: where the inner header is read, and whether
 * the program pushes the 14-byte header in front of the outer headers itself
 * (on a TUN device) or reuses the one test_run provided. From
 * bpf_skb_adjust_room on, both see the same skb layout: a 14-byte MAC header,
 * then the new outer headers (adjust_room with BPF_ADJ_ROOM_MAC inserts
 * behind the MAC header, whatever its length), then the inner packet.
 */
const volatile __u32 in_l2_len = 0;

/*
 * Exported so that the verdict enum's names and values travel in the
 * object's BTF: the Go loader checks its counter names against them.
 */
const volatile enum aggd_fp_tx_verdict tx_verdict_count = AGGD_FP_TX__COUNT;

/* Inner destination prefix -> session slot. Written by the daemon. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, AGGD_FP_MAX_ROUTES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct aggd_fp_route_key);
	__type(value, __u32);
} tx_routes SEC(".maps");

/*
 * Slot -> session. Not preallocated on purpose: an update then allocates a
 * new element and frees the old one after an RCU grace period, so a program
 * that looked up the old value reads it whole (a preallocated hash map may
 * hand the old element to the next update while it is still being read).
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGGD_FP_MAX_SESSIONS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct aggd_fp_tx_session);
} tx_sessions SEC(".maps");

/* Slot -> scheduler state. The daemon creates the entry, BPF updates it
 * under its lock. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGGD_FP_MAX_SESSIONS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct aggd_fp_tx_sched);
} tx_sched SEC(".maps");

/* Slot -> the next sequence numbers; the daemon maps this array and takes
 * numbers from it with atomic adds too. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, AGGD_FP_MAX_SESSIONS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct aggd_fp_tx_seq);
} tx_seq SEC(".maps");

/* Per-CPU verdict counts, indexed by enum aggd_fp_tx_verdict. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AGGD_FP_TX__COUNT);
	__type(key, __u32);
	__type(value, __u64);
} tx_verdicts SEC(".maps");

/* Per-CPU counts of what the fast path sent, slot * AGGD_FP_MAX_LINKS + link. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AGGD_FP_MAX_SESSIONS * AGGD_FP_MAX_LINKS);
	__type(key, __u32);
	__type(value, struct aggd_fp_link_counts);
} tx_link_stats SEC(".maps");

/*
 * Slot * AGGD_FP_MAX_LINKS + link slot -> the link's sent log. The daemon
 * creates an entry per link it programs (and deletes them with the session);
 * BPF only writes into entries that exist.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGGD_FP_MAX_SESSIONS * AGGD_FP_MAX_LINKS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct aggd_fp_sent_log);
} tx_sent_log SEC(".maps");

static __always_inline void tx_count(enum aggd_fp_tx_verdict v)
{
	__u32 key = v;
	__u64 *cnt = bpf_map_lookup_elem(&tx_verdicts, &key);

	if (cnt)
		*cnt += 1;
}

/* Count a hand-up to the slow path: the packet continues into agg0. */
static __always_inline int tx_slow(enum aggd_fp_tx_verdict v)
{
	tx_count(v);
	return TC_ACT_OK;
}

/* The key of a session's link in the per-link maps (tx_link_stats, tx_sent_log). */
static __always_inline __u32 tx_link_key(__u32 slot, int link)
{
	return slot * AGGD_FP_MAX_LINKS + ((__u32)link & AGGD_FP_SLOT_MASK);
}

static __always_inline void tx_count_link(__u32 slot, int link, __u32 inner_len, int copy)
{
	__u32 key = tx_link_key(slot, link);
	struct aggd_fp_link_counts *c = bpf_map_lookup_elem(&tx_link_stats, &key);

	if (!c)
		return;
	c->packets += 1;
	c->bytes += inner_len;
	if (copy)
		c->copies += 1;
}

/* Log that the packet on link carried seq as its link_seq (tx_sent_log). */
static __always_inline void tx_log_sent(__u32 slot, int link, __u32 link_seq, __u32 seq)
{
	__u32 key = tx_link_key(slot, link);
	struct aggd_fp_sent_log *lg = bpf_map_lookup_elem(&tx_sent_log, &key);

	if (lg)
		lg->entry[link_seq & (AGGD_FP_SENT_LOG - 1)] = ((__u64)link_seq << 32) | seq;
}

/*
 * The first need bytes of the inner packet, l2 bytes into the skb, or NULL
 * if the packet is shorter. The inner headers of a forwarded packet are
 * almost always in the linear part; if not, pull them there.
 */
static __always_inline __u8 *tx_inner(struct __sk_buff *skb, __u32 l2, __u32 need)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;

	if (data + l2 + need <= end)
		return data + l2;
	if (bpf_skb_pull_data(skb, l2 + need))
		return NULL;
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	if (data + l2 + need > end)
		return NULL;
	return data + l2;
}

/* The tx_routes key for the inner packet's destination, or -1 if the packet
 * is not IPv4 or IPv6. */
static __always_inline int tx_route_key(struct __sk_buff *skb, __u32 l2, struct aggd_fp_route_key *key)
{
	__u8 *ip;

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		ip = tx_inner(skb, l2, 20);
		if (!ip || (ip[0] >> 4) != 4)
			return -1;
		key->prefixlen = 8 + 32;
		key->data[0] = 4;
#pragma unroll
		for (int i = 0; i < 4; i++)
			key->data[1 + i] = ip[16 + i];
		return 0;
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		ip = tx_inner(skb, l2, 40);
		if (!ip || (ip[0] >> 4) != 6)
			return -1;
		key->prefixlen = 8 + 128;
		key->data[0] = 6;
#pragma unroll
		for (int i = 0; i < 16; i++)
			key->data[1 + i] = ip[24 + i];
		return 0;
	}
	return -1;
}

/* The outer headers (and the Ethernet header in front of them) in the
 * packet, or NULL: after the encapsulation they are in the linear part. */
static __always_inline struct ethhdr *tx_outer(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;

	if (data + ETH_HLEN + sizeof(struct aggd_outer) > end)
		return NULL;
	return data;
}

/*
 * Write the headers for link slot `link` of session s into the packet, and
 * for a redundant copy (AGGD_FLAG_DUPLICATE in a->flags) send a clone of the
 * packet out of the link's interface. Returns 0 when done; -1 if the packet
 * is not what the encapsulation left (cannot happen short of a kernel
 * change), or the copy could not be sent.
 *
 * A subprogram rather than inline code: its stack frame (outer headers,
 * SipHash state, FIB lookup) is then not added to aggd_tc_tx's, which is
 * what keeps the program within the 512-byte stack. Called after the lock
 * is released.
 */
static __noinline int tx_emit(struct __sk_buff *skb, const struct aggd_fp_tx_session *s, __u32 link,
			      const struct aggd_encap_args *a)
{
	const struct aggd_fp_tx_link *l = &s->links[link & AGGD_FP_SLOT_MASK];
	int copy = a->flags & AGGD_FLAG_DUPLICATE;
	struct bpf_fib_lookup fib = {};
	const __u8 *dmac = NULL, *smac = NULL;
	struct aggd_outer o;
	struct ethhdr *eth;

	if (copy && (l->flags & AGGD_FP_LINK_ETHERNET)) {
		/* bpf_clone_redirect sends the Ethernet header as it is, so
		 * the copy needs the real addresses: the gateway's neighbour
		 * entry on the link's own interface. OUTPUT restricts the
		 * lookup to that interface (two uplinks may share a subnet),
		 * DIRECT skips the policy rules. */
		fib.family = AGGD_AF_INET;
		fib.ifindex = l->ifindex;
		fib.ipv4_src = l->saddr;
		fib.ipv4_dst = l->gateway ? l->gateway : l->daddr;
		if (bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_DIRECT | BPF_FIB_LOOKUP_OUTPUT) !=
			    BPF_FIB_LKUP_RET_SUCCESS ||
		    fib.ifindex != l->ifindex)
			return -1;
		dmac = fib.dmac;
		smac = fib.smac;
	}

	aggd_encap_build(&o, s, l, aggd_sipkey_from_bytes(s->key), a);
	eth = tx_outer(skb);
	if (!eth)
		return -1;
	aggd_encap_eth(eth, dmac, smac);
	*(struct aggd_outer *)(eth + 1) = o;

	if (copy && bpf_clone_redirect(skb, l->ifindex, 0))
		return -1;
	return 0;
}

/*
 * The scheduling decision for a packet of size bytes (outer datagram) at now
 * (aggd_sched.h), on the session's scheduler state st read without its lock.
 * A global function: the verifier checks it once, on its own, and the caller
 * sees only the result; its stack frame is also not added to tx_emit's. It
 * sees the pointer arguments as possibly NULL, hence the checks.
 */
__noinline int tx_schedule(const struct aggd_fp_tx_session *s, const struct aggd_fp_sched_state *st,
			   struct aggd_sched_choice *c, __u32 size, __u64 now)
{
	struct aggd_sched_links ls;

	if (!s || !st || !c)
		return -1;
	aggd_sched_prepare(s, size, &ls);
	aggd_sched_pick(st, s, &ls, now, c);
	return 0;
}

SEC("tc")
int aggd_tc_tx(struct __sk_buff *skb)
{
	/* Exactly 0 or ETH_HLEN, so every offset below has a known bound. */
	__u32 l2 = in_l2_len ? ETH_HLEN : 0;
	struct aggd_fp_route_key key = {};
	const struct aggd_fp_tx_session *sess;
	const struct aggd_fp_tx_link *la;
	struct aggd_fp_tx_sched *sched;
	struct aggd_fp_tx_seq *seqv;
	struct aggd_sched_choice c = {};
	struct aggd_encap_args args = {};
	__u32 slot, inner_len, seq = 0, seq_a = 0, seq_d = 0;
	__u64 now;
	int best, dup = -1, sent_copy = 0, drop;
	long ret;

	if (tx_route_key(skb, l2, &key))
		return tx_slow(AGGD_FP_TX_NOT_IP);
	inner_len = skb->len - l2;

	{
		__u32 *slotp = bpf_map_lookup_elem(&tx_routes, &key);

		if (!slotp)
			return tx_slow(AGGD_FP_TX_NO_ROUTE);
		slot = *slotp;
	}
	sess = bpf_map_lookup_elem(&tx_sessions, &slot);
	if (!sess)
		return tx_slow(AGGD_FP_TX_NO_ROUTE);
	if (!(sess->flags & AGGD_FP_SESSION_ENABLED))
		return tx_slow(AGGD_FP_TX_DISABLED);
	if (skb->gso_size || skb->gso_segs > 1)
		return tx_slow(AGGD_FP_TX_GSO);
	if (inner_len > sess->mtu)
		return tx_slow(AGGD_FP_TX_OVERSIZE);

	/* Everything the locked section touches is looked up before it. A
	 * session without its scheduler entry is one the daemon has not
	 * finished setting up. */
	sched = bpf_map_lookup_elem(&tx_sched, &slot);
	seqv = bpf_map_lookup_elem(&tx_seq, &slot);
	if (!sched || !seqv)
		return tx_slow(AGGD_FP_TX_DISABLED);
	now = bpf_ktime_get_ns();

	/*
	 * Decide on the backlogs and tie credits read without the lock, then
	 * charge them and take the numbers under it (no calls may happen while
	 * it is held, and the decision is a call). Another CPU may charge the
	 * session meanwhile, even while the decision reads: each value is read
	 * whole (aligned 8 bytes), the charge starts from the backlog it finds,
	 * so the accounting stays exact and only this one decision used a
	 * slightly stale view. (A copy taken under the lock would be no
	 * fresher by the time of the charge, and its 128 bytes do not fit the
	 * stack beside the decision's.)
	 */
	bpf_spin_lock(&sched->lock);
	drop = aggd_aqm_drop(&sched->aqm_next_us, &sched->aqm_last_us, sess->aqm_gap_us, now);
	bpf_spin_unlock(&sched->lock);
	if (drop) {
		/* An ECN-capable packet is marked instead, and sent on. */
		if (!(sess->flags & AGGD_FP_SESSION_ECN) || aggd_ecn_mark_ce(skb, l2)) {
			if (aggd_ecn_capable(skb, l2))
				tx_count(AGGD_FP_TX_AQM_DROP_ECT);
			tx_count(AGGD_FP_TX_AQM_DROP);
			return TC_ACT_SHOT;
		}
		tx_count(AGGD_FP_TX_AQM_MARK);
	}

	if (tx_schedule(sess, &sched->st, &c, inner_len + AGGD_OVERHEAD, now) || c.link < 0)
		return tx_slow(AGGD_FP_TX_NO_LINK);
	if (!c.sendable)
		return tx_slow(AGGD_FP_TX_NO_NEIGH);
	best = c.link & AGGD_FP_SLOT_MASK;
	dup = c.dup;
	if (dup >= 0)
		dup &= AGGD_FP_SLOT_MASK;

	/*
	 * The numbers are taken under the lock too (the verifier allows
	 * atomics there; only calls are refused): so within the fast path a
	 * link's packets carry global sequence numbers in the order of their
	 * link sequence numbers. The daemon takes numbers without the lock,
	 * from the same memory.
	 */
	bpf_spin_lock(&sched->lock);
	aggd_sched_charge(sched->st.backlog_end_ns, best, c.link_tx_ns, now);
	aggd_sched_settle_tie(sched->st.tie_credit, sess, c.tied, best);
	if (dup >= 0)
		aggd_sched_charge(sched->st.backlog_end_ns, dup, c.dup_tx_ns, now);
	seq = __sync_fetch_and_add(&seqv->next_seq, 1);
	seq_a = __sync_fetch_and_add(&seqv->link_seq[best], 1);
	if (dup >= 0)
		seq_d = __sync_fetch_and_add(&seqv->link_seq[dup], 1);
	bpf_spin_unlock(&sched->lock);

	la = &sess->links[best & AGGD_FP_SLOT_MASK];

	/* Room for the outer headers behind the MAC header (none on agg0).
	 * On failure nothing has changed: the slow path sends the packet.
	 * A pending inner checksum (CHECKSUM_PARTIAL, e.g. forwarded from a
	 * veth) stays pending: csum_start moves with the inner header, and the
	 * uplink's transmit fills it in (a NIC, or the kernel in software on the
	 * veth uplinks the daemon turns checksum offload off on). */
	ret = bpf_skb_adjust_room(skb, AGGD_OVERHEAD, BPF_ADJ_ROOM_MAC,
				  BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP |
					  BPF_F_ADJ_ROOM_ENCAP_L2(AGGD_HDR_LEN) | BPF_F_ADJ_ROOM_FIXED_GSO);
	if (ret)
		return tx_slow(AGGD_FP_TX_ENCAP_FAILED);
	/* Both redirect helpers need a MAC header in front of the network
	 * header: bpf_redirect_neigh drops the packet without one (§9) and
	 * replaces it, bpf_redirect to an L3 device strips it. */
	if (!l2 && bpf_skb_change_head(skb, ETH_HLEN, 0)) {
		tx_count(AGGD_FP_TX_ENCAP_FAILED);
		return TC_ACT_SHOT; /* half encapsulated: cannot go to the slow path */
	}

	args.seq = seq;
	args.tstamp = (__u32)(now / 1000);
	args.inner_len = inner_len;
	if (dup >= 0) {
		args.flags = AGGD_FLAG_DUPLICATE;
		args.link_seq = seq_d;
		sent_copy = tx_emit(skb, sess, dup, &args) == 0;
	}
	args.flags = 0;
	args.link_seq = seq_a;
	if (tx_emit(skb, sess, best, &args)) {
		tx_count(AGGD_FP_TX_ENCAP_FAILED);
		return TC_ACT_SHOT;
	}

	tx_count(AGGD_FP_TX_FAST);
	tx_count_link(slot, best, inner_len, 0);
	if (sent_copy)
		tx_count_link(slot, dup, inner_len, 1);
	if (dup < 0)
		tx_log_sent(slot, best, seq_a, seq);

	if (la->flags & AGGD_FP_LINK_ETHERNET) {
		struct bpf_redir_neigh nh = {
			.nh_family = AGGD_AF_INET,
			.ipv4_nh = la->gateway ? la->gateway : la->daddr,
		};

		return bpf_redirect_neigh(la->ifindex, &nh, sizeof(nh), 0);
	}
	return bpf_redirect(la->ifindex, 0);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
