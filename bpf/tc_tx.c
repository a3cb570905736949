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
 *     for a SUSPECT link the link of a redundant copy, and while any primary
 *     is SUSPECT a standby link for one more copy; no usable link is
 *     NO_LINK, a chosen Ethernet link whose gateway is not resolved NO_NEIGH
 *     (decided before the packet is touched, so the slow path gets it whole);
 *  5. numbers from tx_seq (shared with the daemon through mmap, atomic adds);
 *  6. outer IPv4 or IPv6 (the link's) + UDP + aggd header (aggd_encap.h),
 *     tag, and out: Ethernet links with bpf_redirect_neigh via the gateway,
 *     L3 links with bpf_redirect. The copies leave first, through
 *     bpf_clone_redirect; where the next packet out goes over the other IP
 *     version, bpf_skb_change_proto resizes the outer header for it.
 *     Over IPv6 the UDP checksum is real (aggd_encap.h), which means summing
 *     the inner packet (tx_inner_sum) before the numbers are taken.
 * Every packet is counted in tx_verdicts; the AQM's drops and marks also
 * per session in tx_session_stats; packets the fast path sent also
 * per session and link in tx_link_stats, and those without a copy in the
 * link's tx_sent_log (for the daemon's loss notices). Each one sent is also
 * kept in the session's tx_kept ring, for the daemon's rescue copies.
 *
 * The redundant copies, as the Go side's Session.SendData: the original on the
 * chosen link with flags 0, each copy on its link with AGGD_FLAG_DUPLICATE;
 * all carry the same global sequence number, each the next link sequence of
 * its own link. bpf_clone_redirect sends the clone as
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

#define AGGD_AF_INET 2   /* AF_INET, which no uapi header reachable here defines */
#define AGGD_AF_INET6 10 /* AF_INET6, likewise */

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

/* Per-CPU counts of what the AQM did to each session's packets, by slot. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AGGD_FP_MAX_SESSIONS);
	__type(key, __u32);
	__type(value, struct aggd_fp_session_counts);
} tx_session_stats SEC(".maps");

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

/*
 * One session's kept packets (struct aggd_fp_kept): the inner map of tx_kept.
 * Sized, not typed: clang emits a type reached only through a map-in-map
 * definition as a forward declaration, which the loader cannot size. The Go
 * side checks the size (bpf.KeptValueSize).
 */
struct tx_kept_ring {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, AGGD_FP_KEPT);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(struct aggd_fp_kept));
};

/* Slot -> the session's kept packets. The daemon creates a session's ring;
 * a session without one keeps nothing. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(max_entries, AGGD_FP_MAX_SESSIONS);
	__type(key, __u32);
	__array(values, struct tx_kept_ring);
} tx_kept SEC(".maps");

/*
 * Scratch for tx_bytes_sum, per CPU: one chunk of the packet, and room for
 * the zero padding behind a last chunk of odd length.
 */
#define TX_SUM_CHUNK 512  /* a power of two, and bpf_csum_diff's largest */
#define TX_SUM_CHUNKS 20 /* 10240 bytes: more than a jumbo frame's 9000 */
struct tx_sum_buf {
	__u8 b[TX_SUM_CHUNK + 4];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tx_sum_buf);
} tx_sum_scratch SEC(".maps");

/* Scratch for a redundant copy's Ethernet addresses (tx_send_copy), per CPU. */
struct tx_macs {
	__u8 b[2 * ETH_ALEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tx_macs);
} tx_copy_macs_scratch SEC(".maps");

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
 * Write the inner packet (len bytes at off) sent with global sequence number
 * seq into element k of its session's ring (struct aggd_fp_kept: the order of
 * the writes is what lets the daemon tell a whole copy from one a CPU was
 * writing). A packet that cannot be kept leaves k with seq_tail naming it and
 * seq_head the older packet: nothing there is taken.
 */
static __always_inline void tx_keep_in(struct __sk_buff *skb, struct aggd_fp_kept *k, __u32 off, __u32 len, __u32 seq)
{
	/* Bounded on the register that sizes the copy: a 64-bit value (clang
	 * checks a 32-bit one on a zero-extended copy, and may pass the helper
	 * the register it came from), which the barrier keeps clang from
	 * recomputing from the original after the check. The lower bound is an
	 * IP header's 20 bytes, not "not 0": 6.1's verifier learns no lower bound
	 * from a jump on == 0, and refuses a copy that may be 0 bytes long. */
	__u64 n = len;

	__sync_lock_test_and_set(&k->seq_tail, (__u64)seq);
	aggd_barrier_var(n);
	if (n < 20 || n > AGGD_FP_KEPT_BYTES)
		return;
	if (bpf_skb_load_bytes(skb, off, k->data, n))
		return;
	k->len = len;
	__sync_lock_test_and_set(&k->seq_head, (__u64)seq);
}

/* Keep the packet sent with seq (len bytes at off) in the session's ring, if
 * it has one. A subprogram: its frame is not added to aggd_tc_tx's. */
static __noinline void tx_keep(struct __sk_buff *skb, __u32 slot, __u32 off, __u32 len, __u32 seq)
{
	__u32 idx = seq & (AGGD_FP_KEPT - 1);
	void *ring = bpf_map_lookup_elem(&tx_kept, &slot);
	struct aggd_fp_kept *k;

	if (!ring)
		return;
	k = bpf_map_lookup_elem(ring, &idx);
	if (k)
		tx_keep_in(skb, k, off, len, seq);
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

/*
 * The ones' complement sum (aggd_csum.h) of len bytes at off (at most 16 KiB
 * in: the inner packet's start), as 16-bit words from off. Chunks in the linear part are summed where
 * they lie; others (a non-linear packet, the last chunk) are copied out first,
 * as bpf_csum_diff reads memory only. Every chunk but the last is even, so
 * the words line up. Returns the 32-bit partial sum, or -1 if the bytes could
 * not be read or there are more than TX_SUM_CHUNKS chunks.
 *
 * Global functions, this and tx_inner_sum: the verifier checks each once, on
 * its own, instead of its loop again at every call.
 */
__noinline __s64 tx_bytes_sum(struct __sk_buff *skb, __u32 off, __u32 len)
{
	__u32 key = 0;
	struct tx_sum_buf *buf = bpf_map_lookup_elem(&tx_sum_scratch, &key);
	__s64 sum = 0;

	if (!buf || off > 0x3fff)
		return -1;
	for (int i = 0; i < TX_SUM_CHUNKS; i++) {
		__u64 done = (__u64)i * TX_SUM_CHUNK, n, pos;
		void *data = (void *)(long)skb->data;
		void *end = (void *)(long)skb->data_end;
		void *p;

		if (done >= len)
			return sum;
		n = (__u64)len - done;
		/* Bounded for the verifier (the barriers keep clang from
		 * dropping the mask, or from recomputing p for the call). */
		pos = off;
		aggd_barrier_var(pos);
		pos = (pos & 0x3fff) + done; /* + the chunk stays below 64 KiB */
		p = data + pos;
		aggd_barrier_var(p);
		if (n >= TX_SUM_CHUNK && p + TX_SUM_CHUNK <= end) {
			sum = bpf_csum_diff(NULL, 0, p, TX_SUM_CHUNK, (__u32)sum);
			if (sum < 0)
				return -1;
			continue;
		}
		if (n > TX_SUM_CHUNK)
			n = TX_SUM_CHUNK;
		/* 1 to TX_SUM_CHUNK (done < len), in a form the verifier sees on
		 * the register that indexes buf and sizes the copy, 6.1's too;
		 * the barrier keeps clang from dropping the no-op mask. */
		aggd_barrier_var(n);
		n = ((n - 1) & (TX_SUM_CHUNK - 1)) + 1;
		/* The bytes behind an odd tail count as zeros (RFC 1071). */
		*(__u32 *)&buf->b[n & ~3ULL] = 0;
		if (bpf_skb_load_bytes(skb, off + done, buf->b, n))
			return -1;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)buf->b, (n + 3) & ~3ULL, (__u32)sum);
		if (sum < 0)
			return -1;
	}
	return len <= TX_SUM_CHUNKS * TX_SUM_CHUNK ? sum : -1;
}

/*
 * The sum of the inner packet's len bytes at l2 as they will leave through
 * the uplink (the outer UDP checksum over IPv6 covers them): as they are,
 * except that an inner TCP or UDP checksum still pending counts as filled in.
 * Pending (CHECKSUM_PARTIAL: a local packet, or one forwarded from a veth),
 * the field holds the folded pseudo-header sum (Linux writes
 * ~csum_tcpudp_magic(..., 0)), and the uplink's transmit fills it in behind
 * the outer header whose checksum must already cover it. Filled in, a right
 * checksum makes the segment sum to the complement of its pseudo-header's
 * sum (which is also what a complete one gives now, so a complete checksum
 * that happens to equal that value changes nothing). That spares the pass
 * over the payload: the header's sum and that complement are the whole.
 * Anything else (a UDP datagram without a checksum, a wrong one) is summed as
 * it is.
 * Inner fragments, IPv6 extension headers and other protocols are summed as
 * they are. Returns -1 if the bytes could not be read.
 */
__noinline __s64 tx_inner_sum(struct __sk_buff *skb, __u32 l2, __u32 len)
{
	__u8 ip[40];
	__u32 hlen, l4len, pseudo, check_off;
	__u16 check, p;
	__s64 hs;
	__u8 proto;

	if (len < 20 || bpf_skb_load_bytes(skb, l2, ip, 20))
		return tx_bytes_sum(skb, l2, len);
	if ((ip[0] >> 4) == 4) {
		hlen = (__u32)(ip[0] & 0x0f) * 4;
		/* A fragment (MF or an offset): its segment is not whole. */
		if (hlen < 20 || ((ip[6] & 0x3f) | ip[7]) || ((__u32)ip[2] << 8 | ip[3]) != len)
			return tx_bytes_sum(skb, l2, len);
		proto = ip[9];
		l4len = len - hlen;
		pseudo = aggd_csum_pseudo4(&ip[12], &ip[16], l4len, proto);
	} else if ((ip[0] >> 4) == 6) {
		hlen = 40;
		if (len < 40 || bpf_skb_load_bytes(skb, l2 + 20, &ip[20], 20) ||
		    40 + ((__u32)ip[4] << 8 | ip[5]) != len)
			return tx_bytes_sum(skb, l2, len);
		proto = ip[6];
		l4len = len - hlen;
		pseudo = aggd_csum_pseudo6(&ip[8], &ip[24], l4len, proto);
	} else {
		return tx_bytes_sum(skb, l2, len);
	}
	if (proto == IPPROTO_TCP && l4len >= 20)
		check_off = 16;
	else if (proto == IPPROTO_UDP && l4len >= 8)
		check_off = 6;
	else
		return tx_bytes_sum(skb, l2, len);
	if (bpf_skb_load_bytes(skb, l2 + hlen + check_off, &check, sizeof(check)))
		return -1;
	p = aggd_csum_fold(pseudo);
	if (check != p)
		return tx_bytes_sum(skb, l2, len);
	if (hlen == 20)
		hs = aggd_csum_words(ip, 20);
	else if (hlen == 40 && (ip[0] >> 4) == 6)
		hs = aggd_csum_words(ip, 40);
	else
		hs = tx_bytes_sum(skb, l2, hlen); /* IPv4 options */
	if (hs < 0)
		return -1;
	return aggd_csum_add((__u32)hs, (__u16)~p);
}

/* The outer headers (and the Ethernet header in front of them) in the
 * packet, or NULL: after the encapsulation they are in the linear part. */
static __always_inline struct ethhdr *tx_outer(struct __sk_buff *skb, int ipv6)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;

	if (ipv6) {
		if (data + ETH_HLEN + sizeof(struct aggd_outer6) > end)
			return NULL;
	} else if (data + ETH_HLEN + sizeof(struct aggd_outer) > end) {
		return NULL;
	}
	return data;
}

static __always_inline int tx_link_ipv6(const struct aggd_fp_tx_link *l)
{
	return (l->flags & AGGD_FP_LINK_IPV6) != 0;
}

static __always_inline int tx_zero_addr6(const __u8 *a)
{
	__u32 w[4];

	__builtin_memcpy(w, a, 16);
	return (w[0] | w[1] | w[2] | w[3]) == 0;
}

static __always_inline int tx_zero_mac(const __u8 *m)
{
	return (m[0] | m[1] | m[2] | m[3] | m[4] | m[5]) == 0;
}

/*
 * The Ethernet addresses a redundant copy on Ethernet link l carries (macs:
 * destination, then source): bpf_clone_redirect sends the Ethernet header as
 * it is. IPv6: the daemon's (aggd_fastpath.h). IPv4: the gateway's neighbour
 * entry on the link's own interface; OUTPUT restricts the lookup to that
 * interface (two uplinks may share a subnet), DIRECT skips the policy rules.
 * Returns 0, or -1 if they are not known (then the copy is not sent).
 *
 * Called from aggd_tc_tx, not from tx_emit: the FIB lookup's frame would
 * otherwise be added to tx_emit's, past the 512-byte stack.
 */
static __noinline int tx_copy_macs(struct __sk_buff *skb, const struct aggd_fp_tx_link *l, __u8 *macs)
{
	struct bpf_fib_lookup fib = {};
	__be32 gw;

	if (tx_link_ipv6(l)) {
		if (tx_zero_mac(l->gw_mac))
			return -1;
		__builtin_memcpy(macs, l->gw_mac, ETH_ALEN);
		__builtin_memcpy(macs + ETH_ALEN, l->src_mac, ETH_ALEN);
		return 0;
	}
	gw = aggd_addr4(l->gateway);
	fib.family = AGGD_AF_INET;
	fib.ifindex = l->ifindex;
	fib.ipv4_src = aggd_addr4(l->saddr);
	fib.ipv4_dst = gw ? gw : aggd_addr4(l->daddr);
	if (bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_DIRECT | BPF_FIB_LOOKUP_OUTPUT) !=
		    BPF_FIB_LKUP_RET_SUCCESS ||
	    fib.ifindex != l->ifindex)
		return -1;
	__builtin_memcpy(macs, fib.dmac, ETH_ALEN);
	__builtin_memcpy(macs + ETH_ALEN, fib.smac, ETH_ALEN);
	return 0;
}

/*
 * Write the headers for link slot `link` of session s into the packet, and
 * for a redundant copy (AGGD_FLAG_DUPLICATE in a->flags) send a clone of the
 * packet out of the link's interface, with the Ethernet addresses macs
 * (tx_copy_macs; NULL on an L3 link, or for the original, whose Ethernet
 * header bpf_redirect_neigh replaces). The packet has room for the link's
 * outer headers (IPv4 or IPv6) behind its MAC header. Returns 0 when done;
 * -1 if the packet is not what the encapsulation left (cannot happen short
 * of a kernel change), or the copy could not be sent.
 *
 * A subprogram rather than inline code: its stack frame (outer headers,
 * SipHash state) is then not added to aggd_tc_tx's, which is what keeps the
 * program within the 512-byte stack. Called after the lock is released.
 */
static __noinline int tx_emit(struct __sk_buff *skb, const struct aggd_fp_tx_session *s, __u32 link,
			      const struct aggd_encap_args *a, const __u8 *macs)
{
	const struct aggd_fp_tx_link *l = &s->links[link & AGGD_FP_SLOT_MASK];
	int copy = a->flags & AGGD_FLAG_DUPLICATE, v6 = tx_link_ipv6(l);
	struct aggd_sipkey k = aggd_sipkey_from_bytes(s->key);
	union {
		struct aggd_outer v4;
		struct aggd_outer6 v6;
	} o;
	struct ethhdr *eth;

	eth = tx_outer(skb, v6);
	if (!eth)
		return -1;
	aggd_encap_eth(eth, macs, v6);
	if (v6) {
		aggd_encap_build6(&o.v6, s, l, k, a);
		*(struct aggd_outer6 *)(eth + 1) = o.v6;
	} else {
		aggd_encap_build(&o.v4, s, l, k, a);
		*(struct aggd_outer *)(eth + 1) = o.v4;
	}

	if (copy && bpf_clone_redirect(skb, l->ifindex, 0))
		return -1;
	return 0;
}

/*
 * Give the packet an outer header of IP version want (1: IPv6) when the one in
 * it (*v6) is of the other: bpf_skb_change_proto inserts or removes the 20
 * bytes behind the MAC header and sets skb->protocol. Returns 0, or -1 if it
 * could not (the packet is then half encapsulated).
 */
static __always_inline int tx_outer_version(struct __sk_buff *skb, int *v6, int want)
{
	if (want == *v6)
		return 0;
	if (bpf_skb_change_proto(skb, want ? bpf_htons(ETH_P_IPV6) : bpf_htons(ETH_P_IP), 0))
		return -1;
	*v6 = want;
	return 0;
}

/*
 * Send a redundant copy of the packet on link slot `link` (a->flags has
 * AGGD_FLAG_DUPLICATE, a->link_seq the link's number), over the link's IP
 * version (tx_outer_version; *v6 is the outer header's now). Returns 1 if the
 * copy was sent, 0 if not (an Ethernet link whose gateway's address is not
 * known, or the clone failed: its link number is then a gap the receiver
 * counts as one lost packet), -1 if the outer header could not be changed.
 *
 * Inline, with the Ethernet addresses in a per-CPU scratch map: aggd_tc_tx's
 * stack has no room for them, nor for one more frame between it and
 * tx_emit's.
 */
static __always_inline int tx_send_copy(struct __sk_buff *skb, const struct aggd_fp_tx_session *s, __u32 link,
					const struct aggd_encap_args *a, int *v6)
{
	const struct aggd_fp_tx_link *l = &s->links[link & AGGD_FP_SLOT_MASK];
	__u32 zero = 0;
	__u8 *macs;

	if (tx_outer_version(skb, v6, tx_link_ipv6(l)))
		return -1;
	if (!(l->flags & AGGD_FP_LINK_ETHERNET))
		return tx_emit(skb, s, link, a, NULL) == 0;
	macs = bpf_map_lookup_elem(&tx_copy_macs_scratch, &zero);
	if (!macs || tx_copy_macs(skb, l, macs))
		return 0;
	return tx_emit(skb, s, link, a, macs) == 0;
}

/* Room for link l's outer headers behind the MAC header (none on agg0),
 * with the encapsulation flags that set skb->protocol for the outer header.
 * A pending inner checksum (CHECKSUM_PARTIAL, e.g. forwarded from a veth)
 * stays pending: csum_start moves with the inner header, and the uplink's
 * transmit fills it in (a NIC, or the kernel in software on the veth uplinks
 * the daemon turns checksum offload off on). */
static __always_inline long tx_make_room(struct __sk_buff *skb, int ipv6)
{
	if (ipv6)
		return bpf_skb_adjust_room(skb, AGGD_OVERHEAD6, BPF_ADJ_ROOM_MAC,
					   BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP |
						   BPF_F_ADJ_ROOM_ENCAP_L2(AGGD_HDR_LEN) | BPF_F_ADJ_ROOM_FIXED_GSO);
	return bpf_skb_adjust_room(skb, AGGD_OVERHEAD, BPF_ADJ_ROOM_MAC,
				   BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP |
					   BPF_F_ADJ_ROOM_ENCAP_L2(AGGD_HDR_LEN) | BPF_F_ADJ_ROOM_FIXED_GSO);
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
	__u64 allowed;

	if (!s || !st || !c)
		return -1;
	aggd_sched_prepare(s, size, &ls);
	/* The classes allowed now, for the original's link and the standby copy's
	 * alike: nothing is charged between the two choices. */
	allowed = aggd_sched_allowed(st->backlog_end_ns, &ls, now);
	aggd_sched_pick(st, s, &ls, allowed, now, c);
	aggd_sched_standby(st, &ls, allowed, now, c);
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
	__u32 slot, inner_len, seq = 0, seq_a = 0, seq_d = 0, seq_s = 0;
	__u64 now;
	int best, dup = -1, standby = -1, sent_dup = 0, sent_standby = 0, drop, v6_best, v6_first, v6_any, v6;

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
		struct aggd_fp_session_counts *sc = bpf_map_lookup_elem(&tx_session_stats, &slot);

		/* An ECN-capable packet is marked instead, and sent on. */
		if (!(sess->flags & AGGD_FP_SESSION_ECN) || aggd_ecn_mark_ce(skb, l2)) {
			int ect = aggd_ecn_capable(skb, l2);

			if (ect)
				tx_count(AGGD_FP_TX_AQM_DROP_ECT);
			tx_count(AGGD_FP_TX_AQM_DROP);
			if (sc) {
				sc->aqm_drops += 1;
				sc->aqm_drops_ect += ect ? 1 : 0;
			}
			return TC_ACT_SHOT;
		}
		tx_count(AGGD_FP_TX_AQM_MARK);
		if (sc)
			sc->aqm_marks += 1;
	}

	if (tx_schedule(sess, &sched->st, &c, inner_len + AGGD_OVERHEAD, now) || c.link < 0)
		return tx_slow(AGGD_FP_TX_NO_LINK);
	if (!c.sendable)
		return tx_slow(AGGD_FP_TX_NO_NEIGH);
	best = c.link & AGGD_FP_SLOT_MASK;
	if (c.dup >= 0)
		dup = c.dup & AGGD_FP_SLOT_MASK;
	if (c.standby >= 0)
		standby = c.standby & AGGD_FP_SLOT_MASK;
	la = &sess->links[best & AGGD_FP_SLOT_MASK];
	v6_best = tx_link_ipv6(la);
	/* The copies leave first, the duplicate before the standby copy: the
	 * room made is for the first packet out. */
	v6_first = v6_best;
	v6_any = v6_best;
	if (standby >= 0) {
		v6_first = tx_link_ipv6(&sess->links[standby & AGGD_FP_SLOT_MASK]);
		v6_any |= v6_first;
	}
	if (dup >= 0) {
		v6_first = tx_link_ipv6(&sess->links[dup & AGGD_FP_SLOT_MASK]);
		v6_any |= v6_first;
	}

	/* An outer IPv6 header needs the inner packet's sum: taken before
	 * anything is charged, so a failure leaves the packet to the slow path. */
	if (v6_any) {
		__s64 sum = tx_inner_sum(skb, l2, inner_len);

		if (sum < 0)
			return tx_slow(AGGD_FP_TX_ENCAP_FAILED);
		args.inner_sum = (__u32)sum;
	}

	/*
	 * The numbers are taken under the lock too (the verifier allows
	 * atomics there; only calls are refused): so within the fast path a
	 * link's packets carry global sequence numbers in the order of their
	 * link sequence numbers. The daemon takes numbers without the lock,
	 * from the same memory.
	 */
	bpf_spin_lock(&sched->lock);
	aggd_sched_charge(sched->st.backlog_end_ns, sess, best, inner_len + AGGD_OVERHEAD, now);
	aggd_sched_settle_tie(sched->st.tie_credit, sess, c.tied, best);
	if (dup >= 0)
		aggd_sched_charge(sched->st.backlog_end_ns, sess, dup, inner_len + AGGD_OVERHEAD, now);
	if (standby >= 0)
		aggd_sched_charge(sched->st.backlog_end_ns, sess, standby, inner_len + AGGD_OVERHEAD, now);
	seq = __sync_fetch_and_add(&seqv->next_seq, 1);
	seq_a = __sync_fetch_and_add(&seqv->link_seq[best], 1);
	if (dup >= 0)
		seq_d = __sync_fetch_and_add(&seqv->link_seq[dup], 1);
	if (standby >= 0)
		seq_s = __sync_fetch_and_add(&seqv->link_seq[standby], 1);
	bpf_spin_unlock(&sched->lock);

	/* Room for the first packet's outer headers. On failure nothing has
	 * changed: the slow path sends the packet. */
	if (tx_make_room(skb, v6_first))
		return tx_slow(AGGD_FP_TX_ENCAP_FAILED);
	v6 = v6_first;
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
	args.flags = AGGD_FLAG_DUPLICATE;
	if (dup >= 0) {
		args.link_seq = seq_d;
		sent_dup = tx_send_copy(skb, sess, dup, &args, &v6);
	}
	if (standby >= 0 && sent_dup >= 0) {
		args.link_seq = seq_s;
		sent_standby = tx_send_copy(skb, sess, standby, &args, &v6);
	}
	/* The original over its own IP version (a copy may have left over the
	 * other). */
	if (sent_dup < 0 || sent_standby < 0 || tx_outer_version(skb, &v6, v6_best)) {
		tx_count(AGGD_FP_TX_ENCAP_FAILED);
		return TC_ACT_SHOT; /* half encapsulated: cannot go to the slow path */
	}
	args.flags = 0;
	args.link_seq = seq_a;
	if (tx_emit(skb, sess, best, &args, NULL)) {
		tx_count(AGGD_FP_TX_ENCAP_FAILED);
		return TC_ACT_SHOT;
	}

	tx_count(AGGD_FP_TX_FAST);
	tx_count_link(slot, best, inner_len, 0);
	if (sent_dup)
		tx_count_link(slot, dup, inner_len, 1);
	if (sent_standby)
		tx_count_link(slot, standby, inner_len, 1);
	/* Sent with a copy, a packet may still arrive: no loss notice may name it. */
	if (dup < 0 && standby < 0)
		tx_log_sent(slot, best, seq_a, seq);
	/* Kept for the daemon, which may have to send it again: the inner
	 * packet, behind the MAC header and the original's outer headers. Here,
	 * with little left to carry across the call: higher up, the spills it
	 * cost took the program past its 512 bytes of stack. */
	tx_keep(skb, slot, ETH_HLEN + (v6_best ? AGGD_OVERHEAD6 : AGGD_OVERHEAD), inner_len, seq);

	if (la->flags & AGGD_FP_LINK_ETHERNET) {
		struct bpf_redir_neigh nh = {};

		if (v6_best) {
			const __u8 *hop = tx_zero_addr6(la->gateway) ? la->daddr : la->gateway;

			nh.nh_family = AGGD_AF_INET6;
			__builtin_memcpy(nh.ipv6_nh, hop, 16);
		} else {
			__be32 gw = aggd_addr4(la->gateway);

			nh.nh_family = AGGD_AF_INET;
			nh.ipv4_nh = gw ? gw : aggd_addr4(la->daddr);
		}
		return bpf_redirect_neigh(la->ifindex, &nh, sizeof(nh), 0);
	}
	return bpf_redirect(la->ifindex, 0);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
