// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * aggd_xdp_shield: the first thing a tunnel packet meets on an uplink or the
 * headend's public interface (ARCHITECTURE §2, receive step 1).
 *
 * It drops malformed aggd datagrams before the kernel allocates an skb for
 * them and counts every verdict by reason. Traffic that is not a UDP datagram
 * to the tunnel port, over IPv4 or right behind a fixed IPv6 header, is passed
 * untouched and not counted: the shield shares the interface with whatever
 * else runs there.
 *
 * What it checks, in this order (the daemon's order, so both count a datagram
 * with several faults under the same reason):
 *  1. lengths, version, type, flags: the checks that need only the header;
 *  2. for DATA and the control types: the session (sessions map, keyed by
 *     the header's Session field), the key generation (Key ID), the tag.
 *     Control tags cover the body too and are verified with a bounded loop;
 *     a control body longer than AGGD_CTRL_BODY_MAX, or one cut by IPv4
 *     fragmentation, is passed to the daemon unverified (it verifies again).
 * Handshake messages pass, but for INITs beyond a rate (below): the daemon
 * checks their mac and rate-limits them.
 * Bodies (bad_length, bad_body) and replay are left to the later stages.
 *
 * Counted twice: per reason in shield_stats, and per link and reason in
 * shield_link_stats for every datagram whose header is whole and of version
 * 1 (before that, the Link ID byte means nothing).
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "aggd_wire.h"
#include "aggd_parse.h"
#include "aggd_auth.h"

/* The tunnel's UDP port, set by the loader before the program is loaded. */
const volatile __u16 tunnel_port = AGGD_DEFAULT_PORT;

/*
 * Verdict counters, indexed by enum aggd_reason; slot AGGD_REASON_NONE counts
 * the datagrams that passed. Per-CPU so the hot path needs no atomics; the
 * daemon sums the CPUs when it reads.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AGGD_REASON__COUNT);
	__type(key, __u32);
	__type(value, __u64);
} shield_stats SEC(".maps");

/*
 * Exported so that the reason enum's names and values travel in the object's
 * BTF: the Go loader checks its counter names against them instead of trusting
 * a second list to stay in step with aggd_wire.h.
 */
const volatile enum aggd_reason shield_reason_count = AGGD_REASON__COUNT;

/* Link IDs are one byte (255 is reserved but still counted). */
#define SHIELD_MAX_LINKS 256

/* Sessions a shield can hold; memory is allocated per entry in use. */
#define SHIELD_MAX_SESSIONS 65536

/* The per-link counters: one row of per-reason counts per link id. */
struct aggd_link_counts {
	__u64 count[AGGD_REASON__COUNT];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SHIELD_MAX_LINKS);
	__type(key, __u32);
	__type(value, struct aggd_link_counts);
} shield_link_stats SEC(".maps");

/*
 * The receive keys of every session, keyed by the receiver's index as it is
 * on the wire: the key is the header's 4 Session bytes, unconverted (so the
 * daemon writes the index big-endian, whatever the host's byte order).
 * Written by the daemon only.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SHIELD_MAX_SESSIONS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __be32);
	__type(value, struct aggd_session);
} sessions SEC(".maps");

/*
 * INITs without a mac2, admitted at most one per init_interval_ns (0: no
 * limit), with bursts of init_burst_ns ahead of that schedule; set by the
 * loader. Each one the daemon reads costs it a receive, a mac check and, once
 * its own handshake limit is spent, a cookie reply (docs/wire-format.md,
 * "Handshake floods"): beyond a few thousand a second that read loop, which
 * also reads every CPE's data, falls behind. An INIT with a mac2 is not
 * limited here: it proves its source with a cookie only the daemon can check,
 * and the daemon limits each source. (A flooder who sets the flag on forged
 * INITs gets past this gate, and costs the daemon a mac2 check each.)
 */
const volatile __u64 init_interval_ns = 0;
const volatile __u64 init_burst_ns = 0;

/*
 * The gate's schedule (a generic cell rate algorithm): tat is when the next
 * INIT is due. One cell for all CPUs, under a spin lock: a flood spread over
 * the CPUs is held to the rate as a whole.
 */
struct shield_init_gate {
	struct bpf_spin_lock lock;
	__u64 tat;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct shield_init_gate);
} shield_init_gate SEC(".maps");

/* Whether an INIT may go on to the daemon: 1, or 0 when over the rate. */
static __always_inline int shield_init_admitted(const struct aggd_hdr *hdr)
{
	struct shield_init_gate *g;
	__u32 key = 0;
	__u64 now, tat;
	int ok;

	if (!init_interval_ns || (hdr->flags & AGGD_FLAG_MAC2))
		return 1;
	g = bpf_map_lookup_elem(&shield_init_gate, &key);
	if (!g)
		return 1;
	now = bpf_ktime_get_ns();
	bpf_spin_lock(&g->lock);
	tat = g->tat > now ? g->tat : now;
	ok = tat - now <= init_burst_ns;
	if (ok)
		g->tat = tat + init_interval_ns;
	bpf_spin_unlock(&g->lock);
	return ok;
}

static __always_inline void shield_count(enum aggd_reason reason, const struct aggd_hdr *hdr)
{
	struct aggd_link_counts *row;
	__u32 key = reason;
	__u64 *cnt = bpf_map_lookup_elem(&shield_stats, &key);

	if (cnt)
		*cnt += 1;

	if (!hdr || aggd_hdr_version(hdr) != AGGD_VERSION || reason >= AGGD_REASON__COUNT)
		return;
	key = hdr->link_id;
	row = bpf_map_lookup_elem(&shield_link_stats, &key);
	if (row)
		row->count[reason] += 1;
}

/*
 * Session, key generation and tag of a datagram that passed the header
 * checks. body_len is the body's length, or AGGD_BODY_LEN_PARTIAL.
 */
static __always_inline enum aggd_reason shield_auth(const struct aggd_hdr *hdr, __u32 body_len,
						    const void *end)
{
	const struct aggd_session *sess;
	const struct aggd_rx_key *rk;
	struct aggd_sipkey k;
	__u8 type = aggd_hdr_type(hdr);
	__be32 index = hdr->session;
	int ok;

	if (aggd_type_sessionless(type))
		return AGGD_REASON_NONE;
	sess = bpf_map_lookup_elem(&sessions, &index);
	if (!sess)
		return AGGD_REASON_UNKNOWN_SESSION;
	rk = aggd_session_rx_key(sess, hdr->key_id);
	if (!rk)
		return AGGD_REASON_STALE_KEY;
	k = aggd_sipkey_from_bytes(rk->key);
	if (type == AGGD_TYPE_DATA)
		ok = aggd_hdr_tag_ok(k, hdr);
	else if (body_len == AGGD_BODY_LEN_PARTIAL)
		ok = -1;
	else
		ok = aggd_ctrl_tag_check(k, hdr, body_len, end);
	if (ok < 0)
		return AGGD_REASON_NONE; /* not decidable here: the daemon verifies */
	return ok ? AGGD_REASON_NONE : AGGD_REASON_BAD_TAG;
}

SEC("xdp")
int aggd_xdp_shield(struct xdp_md *ctx)
{
	struct aggd_cursor c = {
		.pos = (void *)(long)ctx->data,
		.end = (void *)(long)ctx->data_end,
	};
	struct aggd_hdr *hdr = NULL;
	enum aggd_reason reason = AGGD_REASON_NONE;
	__u32 body_len = 0;
	struct aggd_tunnel_ip ip;

	if (aggd_locate_tunnel(&c, tunnel_port, 0, &hdr, &body_len, &reason, &ip) < 0)
		return XDP_PASS;
	if (reason == AGGD_REASON_NONE)
		reason = hdr ? aggd_hdr_check(hdr) : AGGD_REASON_TRUNCATED;
	if (reason == AGGD_REASON_NONE && hdr)
		reason = shield_auth(hdr, body_len, c.end);
	if (reason == AGGD_REASON_NONE && hdr && aggd_hdr_type(hdr) == AGGD_TYPE_HANDSHAKE_INIT &&
	    !shield_init_admitted(hdr))
		reason = AGGD_REASON_RATE_LIMITED;

	shield_count(reason, hdr);
	return reason == AGGD_REASON_NONE ? XDP_PASS : XDP_DROP;
}
