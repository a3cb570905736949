// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * aggd_tc_rx: the receive fast path on an uplink's tc ingress (ARCHITECTURE
 * §2, receive step 2). The XDP shield has already dropped what fails the
 * header, session or tag checks; this program delivers the DATA packets that
 * arrive in order straight into agg0 and passes everything else up to the
 * daemon's UDP socket.
 *
 * Per packet:
 *  - not a UDP datagram to the tunnel port behind IPv4 or a fixed IPv6
 *    header (or an IPv6 first fragment of one): TC_ACT_OK, not counted;
 *  - aggd header cut off or failing the header checks, or a DATA body the
 *    daemon would reject (wire.CheckData): MALFORMED, passed up untouched
 *    (the daemon counts the reason; it never consumes such a packet, so the
 *    divert count must not include it either);
 *  - control messages: NOT_DATA, passed up;
 *  - DATA of a session without rx_order: NO_SESSION, passed up;
 *  - otherwise the ownership protocol (aggd_order.h) decides, under the
 *    session's spin lock: deliver (FAST), deliver a copy of a number the
 *    daemon gave up out of order (LATE_COPY), drop a duplicate or late packet
 *    (DROP_OLD), or pass up (GAP, DAEMON_OWNS, DECAP_FAILED).
 *
 * Delivering means: remove outer IPv4 (with options) or IPv6 + UDP + aggd
 * header behind the MAC header, set skb->protocol for the inner packet, and
 * bpf_redirect(agg0, BPF_F_INGRESS): the kernel sees the inner packet as
 * received on agg0 (a TUN device; the redirect drops the MAC header itself).
 *
 * An inner packet of the other IP version than the outer header needs
 * skb->protocol changed. bpf_skb_adjust_room's BPF_F_ADJ_ROOM_DECAP_L3_*
 * do that only on 6.3+, and the programs must run on Debian 12's 6.1.
 * bpf_skb_change_proto exists since 4.8: it sets the protocol and inserts
 * (to IPv6) or removes (to IPv4) 20 bytes, the header size difference,
 * behind the MAC header; the shrink then takes that into account. The outer
 * UDP checksum is not verified, over IPv6 either: as the IPv4 one the sender
 * leaves at 0, the link's own CRC stands for it.
 *
 * Decisions and failures. The decision to deliver advances next under the
 * lock, so the packet must not get lost afterwards. Everything that can make
 * delivery impossible is checked before the lock (agg0 configured, protocol
 * and MAC length as adjust_room needs them, no GRO aggregate, the whole
 * datagram present, and bpf_skb_pull_data makes the outer headers linear and
 * writable, which is where adjust_room would otherwise allocate). If any of
 * that fails, the ordering decision is told the packet cannot be delivered:
 * BPF then hands the ordering over at next instead of delivering, and the
 * daemon gets the packet (verdict DECAP_FAILED, or DAEMON_OWNS without
 * agg0). What remains after the decision is an allocation failure inside
 * the helpers, which the pre-checks make all but impossible; then the packet
 * is dropped and counted DECAP_FAILED: a loss as if on the wire. Passing it
 * up instead would hand the daemon a packet whose sequence number BPF has
 * already passed, half rewritten.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "aggd_wire.h"
#include "aggd_parse.h"
#include "aggd_fastpath.h"
#include "aggd_order.h"

/* The tunnel's UDP port, set by the loader before the program is loaded. */
const volatile __u16 tunnel_port = AGGD_DEFAULT_PORT;

/* Exported so the verdict enum's names and values travel in the BTF: the Go
 * loader checks its counter names against them (like shield_reason_count). */
const volatile enum aggd_fp_rx_verdict rx_verdict_count = AGGD_FP_RX__COUNT;

/* Ordering state per session (aggd_fastpath.h); its presence enables the
 * session. Key: the header's Session field, as on the wire. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGGD_FP_MAX_SESSIONS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __be32);
	__type(value, struct aggd_fp_rx_order);
} rx_order SEC(".maps");

/* Packets passed up to the daemon per session (the handback's stamp is
 * compared with it). Written by BPF only, under the session's rx_order lock. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGGD_FP_MAX_SESSIONS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __be32);
	__type(value, struct aggd_fp_rx_divert);
} rx_divert SEC(".maps");

/* Where in-order packets go (key 0). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct aggd_fp_rx_config);
} rx_config SEC(".maps");

/* Verdict counters, indexed by enum aggd_fp_rx_verdict; per-CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AGGD_FP_RX__COUNT);
	__type(key, __u32);
	__type(value, __u64);
} rx_verdicts SEC(".maps");

/* What arrived per session and link, delivered by BPF or dropped as a late
 * twin; entries are created by BPF on a link's first such packet and deleted
 * by the daemon with the session. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGGD_FP_MAX_SESSIONS * AGGD_FP_MAX_LINKS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct aggd_fp_rx_link_key);
	__type(value, struct aggd_fp_rx_link_stats);
} rx_link_stats SEC(".maps");

/* Inner header bytes the DATA body check reads (IPv6's payload length ends
 * at byte 6; every acceptable body is longer). */
#define RX_INNER_PEEK 6

/* Bytes of the outer IPv4 header (with options), UDP and aggd headers. */
#define RX_OUTER_FIXED (sizeof(struct aggd_udp_hdr) + AGGD_HDR_LEN)

static __always_inline int rx_count(enum aggd_fp_rx_verdict v)
{
	__u32 key = v;
	__u64 *cnt = bpf_map_lookup_elem(&rx_verdicts, &key);

	if (cnt)
		*cnt += 1;
	return 0;
}

/*
 * The DATA body check of docs/wire-format.md ("DATA body"), the same as
 * wire.CheckData: the daemon drops what fails it before it counts the packet
 * as consumed, so BPF must neither deliver nor count it. b holds the body's
 * first RX_INNER_PEEK bytes (body_len is at least 20). Returns 0 if
 * the body is a well-formed IPv4 or IPv6 packet, and stores its family.
 */
static __always_inline int rx_check_body(const __u8 *b, __u32 body_len, int *is_v6)
{
	__u32 ver, ihl, total;

	if (body_len == 0)
		return -1;
	ver = b[0] >> 4;
	if (ver == 4) {
		if (body_len < 20)
			return -1;
		total = ((__u32)b[2] << 8) | b[3];
		if (total != body_len)
			return -1;
		ihl = (__u32)(b[0] & 0x0f) * 4;
		if (ihl < 20 || ihl > body_len)
			return -1;
		*is_v6 = 0;
		return 0;
	}
	if (ver == 6) {
		if (body_len < 40)
			return -1;
		total = ((__u32)b[4] << 8) | b[5];
		if (40 + total != body_len)
			return -1;
		*is_v6 = 1;
		return 0;
	}
	return -1;
}

/* Count a packet that arrived on its link (delivered, or dropped as a late
 * twin) for its session and link. Several CPUs may
 * deliver for the same link at once: the sums are atomic; the latest-packet
 * fields are plain stores, so with a race either packet's values win. */
static __always_inline void rx_link_account(__be32 session, __u8 link_id, __u32 link_seq, __u32 tstamp,
					    __u32 inner_len)
{
	struct aggd_fp_rx_link_key key = {.session = session, .link_id = link_id};
	struct aggd_fp_rx_link_stats *st = bpf_map_lookup_elem(&rx_link_stats, &key);
	__u64 now = bpf_ktime_get_ns();

	if (!st) {
		struct aggd_fp_rx_link_stats init = {
			.packets = 1,
			.bytes = inner_len,
			.max_link_seq = link_seq,
			.last_tstamp = tstamp,
			.last_arrival_ns = now,
		};

		/* Another CPU may have created it meanwhile: then add to it. */
		if (bpf_map_update_elem(&rx_link_stats, &key, &init, BPF_NOEXIST) == 0)
			return;
		st = bpf_map_lookup_elem(&rx_link_stats, &key);
		if (!st)
			return; /* map full: the daemon's totals miss this packet */
	}
	__sync_fetch_and_add(&st->packets, 1);
	__sync_fetch_and_add(&st->bytes, inner_len);
	if ((__s32)(link_seq - st->max_link_seq) > 0)
		st->max_link_seq = link_seq;
	st->last_tstamp = tstamp;
	st->last_arrival_ns = now;
}

SEC("tc")
int aggd_tc_rx(struct __sk_buff *skb)
{
	struct aggd_cursor c = {
		.pos = (void *)(long)skb->data,
		.end = (void *)(long)skb->data_end,
	};
	const struct aggd_fp_rx_config *cfg;
	struct aggd_fp_rx_divert *divert;
	struct aggd_fp_rx_order *order;
	struct aggd_tunnel_ip outer;
	struct aggd_hdr *hdr = NULL;
	enum aggd_reason reason;
	enum aggd_order_pkt pkt = AGGD_ORDER_CAN;
	__u8 inner[RX_INNER_PEEK] = {};
	__u32 body_len = 0, l2, iphl, ip_len, outer_len, inner_off, seq, link_seq, tstamp;
	__u32 agg0 = 0, key0 = 0, res, action, segs = 1, diverted;
	__u8 link_id;
	__be32 session;
	__be16 proto;
	int is_v6 = 0, copy;
	long err;

	/* --- 1. Ours? The shield's classification, and IPv6 first fragments
	 * (which the shield leaves to the daemon). --- */
	if (aggd_locate_tunnel(&c, tunnel_port, 1, &hdr, &body_len, &reason, &outer) < 0)
		return TC_ACT_OK;
	l2 = outer.l2;
	iphl = outer.hlen;
	ip_len = outer.len;
	proto = outer.v6 ? bpf_htons(ETH_P_IPV6) : bpf_htons(ETH_P_IP);

	/* --- 2. A whole, valid header; DATA only. --- */
	if (reason != AGGD_REASON_NONE || !hdr || aggd_hdr_check(hdr) != AGGD_REASON_NONE)
		return rx_count(AGGD_FP_RX_MALFORMED), TC_ACT_OK;
	if (aggd_hdr_type(hdr) != AGGD_TYPE_DATA)
		return rx_count(AGGD_FP_RX_NOT_DATA), TC_ACT_OK;

	/* Copy what the rest needs: the helpers below invalidate every packet
	 * pointer. */
	session = hdr->session;
	seq = bpf_ntohl(hdr->seq);
	link_seq = bpf_ntohl(hdr->link_seq);
	tstamp = bpf_ntohl(hdr->tstamp);
	link_id = hdr->link_id;
	copy = !!(hdr->flags & AGGD_FLAG_DUPLICATE);
	outer_len = iphl + RX_OUTER_FIXED;
	inner_off = l2 + outer_len;

	/* --- 3. The body: what the daemon would reject is not ours to count. --- */
	if (body_len != AGGD_BODY_LEN_PARTIAL) {
		/* Shorter than any IPv4 header: bad_length or bad_body. */
		if (body_len < 20)
			return rx_count(AGGD_FP_RX_MALFORMED), TC_ACT_OK;
		/* bpf_skb_load_bytes also reads non-linear data. */
		if (bpf_skb_load_bytes(skb, inner_off, inner, sizeof(inner)) < 0 ||
		    rx_check_body(inner, body_len, &is_v6) < 0)
			return rx_count(AGGD_FP_RX_MALFORMED), TC_ACT_OK;
	} else {
		/* A first fragment: the stack reassembles it for the daemon,
		 * which will consume one DATA packet. */
		pkt = AGGD_ORDER_CANNOT;
	}

	order = bpf_map_lookup_elem(&rx_order, &session);
	divert = bpf_map_lookup_elem(&rx_divert, &session);
	if (!order || !divert)
		return rx_count(AGGD_FP_RX_NO_SESSION), TC_ACT_OK;

	/* --- 4. Everything that could make delivery fail, before the lock. --- */
	cfg = bpf_map_lookup_elem(&rx_config, &key0);
	if (cfg)
		agg0 = cfg->agg0_ifindex;
	if (skb->gso_segs > 1) {
		/* A GRO aggregate of several datagrams (UDP GRO forwarding on
		 * the uplink): the daemon gets them one by one. */
		pkt = AGGD_ORDER_AGGREGATE;
		segs = skb->gso_segs;
	} else if (pkt == AGGD_ORDER_CAN) {
		/* adjust_room removes bytes at the MAC header's end and needs an
		 * IP protocol: a VLAN tag still in the packet (the stack strips
		 * the tags it knows before tc) or trailing bytes behind the
		 * datagram (in the frame or in the IPv4 packet) would make the
		 * result wrong. */
		if (agg0 == 0 || l2 != ETH_HLEN || skb->protocol != proto || skb->len != l2 + ip_len ||
		    ip_len != outer_len + body_len)
			pkt = AGGD_ORDER_CANNOT;
		/* Linear and writable up to the inner header's first bytes:
		 * then the shrink below has nothing left to allocate. */
		else if (bpf_skb_pull_data(skb, inner_off + (is_v6 ? 40 : 20)) < 0)
			pkt = AGGD_ORDER_CANNOT;
	}

	/* --- 5. The ordering decision (aggd_order.h), under the lock. No helper
	 * calls while it is held. The divert count is only changed here, so
	 * a plain read is stable; the add is atomic anyway, so a reader on
	 * another CPU never sees a torn value. --- */
	bpf_spin_lock(&order->lock);
	diverted = (__u32)divert->count;
	res = aggd_order_judge(order, diverted, seq, pkt, copy);
	if (res & AGGD_ORDER_DIVERTED) {
		aggd_order_note_diverted(order, diverted, link_id, link_seq);
		__sync_fetch_and_add(&divert->count, segs);
	}
	bpf_spin_unlock(&order->lock);

	action = res & AGGD_ORDER_ACTION_MASK;
	switch (action) {
	case AGGD_ORDER_DELIVER:
	case AGGD_ORDER_LATE_COPY:
		break;
	case AGGD_ORDER_DROP_OLD:
		/* Mostly the later of a suspect link's packet and its copy: it
		 * did cross its link, and the link's accounting must say so, or
		 * the sender sees nothing arrive on a link whose copies win every
		 * race and keeps it suspect (internal/tunnel/quiet.go). */
		rx_link_account(session, link_id, link_seq, tstamp, body_len);
		return rx_count(AGGD_FP_RX_DROP_OLD), TC_ACT_SHOT;
	case AGGD_ORDER_GAP:
		return rx_count(AGGD_FP_RX_GAP), TC_ACT_OK;
	case AGGD_ORDER_HANDOVER:
		/* Without agg0 the daemon delivers everything: that is its
		 * ownership, not a failure. */
		return rx_count(agg0 ? AGGD_FP_RX_DECAP_FAILED : AGGD_FP_RX_DAEMON_OWNS), TC_ACT_OK;
	default:
		return rx_count(AGGD_FP_RX_DAEMON_OWNS), TC_ACT_OK;
	}

	/* --- 6. Deliver. next has moved past seq: from here a failure is a
	 * loss (see the top of the file). --- */
	if (is_v6 == outer.v6) {
		err = bpf_skb_adjust_room(skb, -(__s32)outer_len, BPF_ADJ_ROOM_MAC, 0);
	} else if (is_v6) {
		/* Inserts 20 bytes behind the MAC header. */
		err = bpf_skb_change_proto(skb, bpf_htons(ETH_P_IPV6), 0);
		if (!err)
			err = bpf_skb_adjust_room(skb, -(__s32)(outer_len + 20), BPF_ADJ_ROOM_MAC, 0);
	} else {
		/* Removes 20 bytes behind the MAC header. */
		err = bpf_skb_change_proto(skb, bpf_htons(ETH_P_IP), 0);
		if (!err)
			err = bpf_skb_adjust_room(skb, -(__s32)(outer_len - 20), BPF_ADJ_ROOM_MAC, 0);
	}
	if (err)
		return rx_count(AGGD_FP_RX_DECAP_FAILED), TC_ACT_SHOT;

	rx_link_account(session, link_id, link_seq, tstamp, body_len);
	rx_count(action == AGGD_ORDER_LATE_COPY ? AGGD_FP_RX_LATE_COPY : AGGD_FP_RX_FAST);
	return bpf_redirect(agg0, BPF_F_INGRESS);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
