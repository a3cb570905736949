/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * ECN marking of inner packets on the transmit fast path: the BPF half of
 * internal/ecn. Where the bond's AQM (aggd_aqm.h) would drop a packet that
 * is ECN-capable, it marks it Congestion Experienced instead (RFC 3168), so
 * the sender slows down without losing it. The outer header stays Not-ECT.
 */
#ifndef AGGD_ECN_H
#define AGGD_ECN_H

#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#define AGGD_ECN_CE 0x03 /* also the ECN field's mask */

/* Reads the two bytes at offset l3 that hold the ECN field of an IPv4 or
 * IPv6 packet into b, and where the field sits in b[1] into *shift: bits 0-1
 * of IPv4's TOS byte, bits 4-5 of byte 1 of IPv6 (the low end of its traffic
 * class). Returns -1 when the packet is neither, or its bytes cannot be
 * read: internal/ecn's fieldShift. */
static __always_inline int aggd_ecn_field(struct __sk_buff *skb, __u32 l3, __u8 b[2], __u8 *shift)
{
	if (bpf_skb_load_bytes(skb, l3, b, 2))
		return -1;
	switch (b[0] >> 4) {
	case 4:
		*shift = 0;
		return 0;
	case 6:
		*shift = 4;
		return 0;
	}
	return -1;
}

/* Whether the IPv4 or IPv6 packet at offset l3 is ECN-capable (ECT(0),
 * ECT(1), or CE already): what the AQM counts apart when it drops one
 * (verdict aqm_drop_ect), since with aqm.ecn on it should never have to. */
static __always_inline int aggd_ecn_capable(struct __sk_buff *skb, __u32 l3)
{
	__u8 b[2], shift;

	return !aggd_ecn_field(skb, l3, b, &shift) && ((b[1] >> shift) & AGGD_ECN_CE);
}

/* Sets CE on the IPv4 or IPv6 packet at offset l3 if it is ECN-capable,
 * keeping an IPv4 header's checksum right: internal/ecn's Mark, the same
 * rule. Returns 0 when the packet now carries CE (ECT(0), ECT(1) or CE
 * already), -1 when it is Not-ECT, not IPv4 or IPv6, or a helper failed: the
 * caller drops it then. */
static __always_inline int aggd_ecn_mark_ce(struct __sk_buff *skb, __u32 l3)
{
	__u8 b[2], shift, ecn;
	__u16 before, after;

	if (aggd_ecn_field(skb, l3, b, &shift))
		return -1;
	ecn = (b[1] >> shift) & AGGD_ECN_CE;
	if (!ecn)
		return -1;
	if (ecn == AGGD_ECN_CE)
		return 0;
	__builtin_memcpy(&before, b, sizeof(before));
	b[1] |= AGGD_ECN_CE << shift;
	__builtin_memcpy(&after, b, sizeof(after));
	if (bpf_skb_store_bytes(skb, l3 + 1, &b[1], 1, 0))
		return -1;
	/* IPv4's header checksum covers the TOS byte; IPv6 has none. */
	if (!shift && bpf_l3_csum_replace(skb, l3 + 10, before, after, sizeof(after)))
		return -1;
	return 0;
}

#endif /* AGGD_ECN_H */
