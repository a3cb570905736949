/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Internet checksums (RFC 1071) for the outer headers the transmit fast path
 * writes: the IPv4 header's, and the UDP checksum behind IPv6.
 *
 * Ones' complement sums do not depend on byte order: summing 16-bit words as
 * they lie in memory and storing the result the same way is right on bpfel
 * and bpfeb, as long as every part of a sum is taken that way (addresses as
 * they lie in the packet, lengths and protocols as bpf_htons values).
 */
#ifndef AGGD_CSUM_H
#define AGGD_CSUM_H

#include <linux/types.h>
#include <bpf/bpf_endian.h>

/* a + b with the end-around carry: a partial sum that never loses a bit. */
static __always_inline __u32 aggd_csum_add(__u32 a, __u32 b)
{
	__u32 r = a + b;

	return r + (r < a);
}

/* A partial sum folded to 16 bits (not complemented). */
static __always_inline __u16 aggd_csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)sum;
}

/* The sum of n bytes (n even, a constant) as 16-bit words. */
static __always_inline __u32 aggd_csum_words(const void *p, const int n)
{
	const __u16 *w = p;
	__u32 sum = 0;

#pragma unroll
	for (int i = 0; i < n / 2; i++)
		sum += w[i];
	return sum;
}

/* The IPv6 pseudo-header's sum (RFC 8200 §8.1) for len bytes of proto. */
static __always_inline __u32 aggd_csum_pseudo6(const __u8 *saddr, const __u8 *daddr, __u32 len, __u8 proto)
{
	return aggd_csum_words(saddr, 16) + aggd_csum_words(daddr, 16) + bpf_htons((__u16)len) + bpf_htons(proto);
}

/* The IPv4 pseudo-header's sum (RFC 768) for len bytes of proto. */
static __always_inline __u32 aggd_csum_pseudo4(const __u8 *saddr, const __u8 *daddr, __u32 len, __u8 proto)
{
	return aggd_csum_words(saddr, 4) + aggd_csum_words(daddr, 4) + bpf_htons((__u16)len) + bpf_htons(proto);
}

/* The UDP checksum field for a datagram whose bytes and pseudo-header sum to
 * sum: 0 is sent as 0xffff (RFC 768; over IPv6 0 would mean none). */
static __always_inline __u16 aggd_csum_udp_final(__u32 sum)
{
	__u16 c = (__u16)~aggd_csum_fold(sum);

	return c ? c : 0xffff;
}

/* The RFC 1071 checksum of a 20-byte IPv4 header (its check field 0). */
static __always_inline __u16 aggd_ipv4_csum(const void *ip)
{
	return (__u16)~aggd_csum_fold(aggd_csum_words(ip, 20));
}

#endif /* AGGD_CSUM_H */
