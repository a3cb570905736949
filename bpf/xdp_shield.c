// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * aggd_xdp_shield: the first thing a tunnel packet meets on an uplink or the
 * headend's public interface (ARCHITECTURE §2, receive step 1).
 *
 * It drops malformed aggd datagrams before the kernel allocates an skb for
 * them and counts every verdict by reason. Traffic that is not an IPv4 UDP
 * datagram to the tunnel port is passed untouched and not counted: the shield
 * shares the interface with whatever else runs there.
 *
 * What it checks today: lengths, version, type, flags (the checks that need
 * only the packet). Session lookup, auth tag and replay come later, with the
 * session maps.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "aggd_wire.h"
#include "aggd_parse.h"

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

static __always_inline void shield_count(enum aggd_reason reason)
{
	__u32 key = reason;
	__u64 *cnt = bpf_map_lookup_elem(&shield_stats, &key);

	if (cnt)
		*cnt += 1;
}

SEC("xdp")
int aggd_xdp_shield(struct xdp_md *ctx)
{
	struct aggd_cursor c = {
		.pos = (void *)(long)ctx->data,
		.end = (void *)(long)ctx->data_end,
	};
	struct aggd_ipv4_hdr *ip;
	struct aggd_udp_hdr *udp;
	struct aggd_hdr *hdr = NULL;
	enum aggd_reason reason;
	__be16 proto;

	/* Frames we cannot even classify are not ours to judge: the stack
	 * drops what is really malformed. */
	if (aggd_parse_eth(&c, &proto) < 0 || proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	ip = aggd_parse_ipv4(&c);
	if (!ip || ip->protocol != IPPROTO_UDP)
		return XDP_PASS;
	/* A later fragment has no UDP header, so no port to match; the first
	 * fragment was checked, reassembly is the stack's job. */
	if (aggd_ipv4_is_later_fragment(ip))
		return XDP_PASS;
	udp = c.pos;
	if ((void *)(udp + 1) > c.end)
		return XDP_PASS;
	if (udp->dest != bpf_htons(tunnel_port))
		return XDP_PASS;
	c.pos = udp + 1;

	reason = aggd_locate_hdr(&c, ip, udp, &hdr);
	if (reason == AGGD_REASON_NONE)
		reason = hdr ? aggd_hdr_check(hdr) : AGGD_REASON_TRUNCATED;

	shield_count(reason);
	return reason == AGGD_REASON_NONE ? XDP_PASS : XDP_DROP;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
