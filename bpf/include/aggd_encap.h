/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The outer headers the transmit fast path puts in front of an inner packet:
 * IPv4 + UDP + the aggd DATA header (docs/wire-format.md), 56 bytes, and the
 * 14-byte Ethernet header in front of them that the redirect helpers need.
 *
 * What the slow path's packets look like (they leave through an unconnected
 * UDP socket) and what we copy from it: IPv4 without options, TOS 0, DF set
 * and IP ID 0 (the kernel writes ID 0 on DF datagrams of unconnected
 * sockets), TTL 64 (the default ip_default_ttl). One difference: the
 * kernel fills in the UDP checksum, we write 0, which IPv4 allows
 * (ARCHITECTURE §9: under GSO a non-zero outer checksum would be copied
 * unchanged onto every segment). The aggd header carries its own tag.
 *
 * The headers are built on the stack and copied into the packet in one go,
 * so the checksum and the tag are computed over bytes the program owns.
 */
#ifndef AGGD_ENCAP_H
#define AGGD_ENCAP_H

#include <linux/types.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <bpf/bpf_endian.h>

#include "aggd_wire.h"
#include "aggd_parse.h"
#include "aggd_auth.h"
#include "aggd_fastpath.h"

#define AGGD_ENCAP_TTL 64
#define AGGD_IP_DF 0x4000

/* Everything in front of the inner packet except the Ethernet header. */
struct aggd_outer {
	struct aggd_ipv4_hdr ip;
	struct aggd_udp_hdr udp;
	struct aggd_hdr hdr;
};

_Static_assert(sizeof(struct aggd_outer) == AGGD_OVERHEAD, "outer headers are the wire overhead");
_Static_assert(__builtin_offsetof(struct aggd_outer, hdr) == 28, "aggd header behind IPv4 and UDP");

/* The header fields that differ per packet and link. */
struct aggd_encap_args {
	__u32 seq;       /* global sequence (host order; low 32 bits of the counter) */
	__u32 link_seq;  /* the link's sequence */
	__u32 tstamp;    /* CLOCK_MONOTONIC µs, truncated */
	__u32 inner_len; /* bytes of the inner packet */
	__u8 flags;      /* AGGD_FLAG_* */
};

/* RFC 1071 checksum of a 20-byte IPv4 header. One's-complement sums do not
 * depend on byte order, so summing the 16-bit words as they lie in memory
 * and storing the result the same way is right on bpfel and bpfeb. */
static __always_inline __u16 aggd_ipv4_csum(const struct aggd_ipv4_hdr *ip)
{
	const __u16 *w = (const __u16 *)ip;
	__u32 sum = 0;

#pragma unroll
	for (int i = 0; i < (int)(sizeof(*ip) / 2); i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/*
 * Fill o for one packet on link l of session s, including the tag under k
 * (header bytes 0..19, stored big-endian in bytes 20..27 as auth.Seal does).
 */
static __always_inline void aggd_encap_build(struct aggd_outer *o, const struct aggd_fp_tx_session *s,
					     const struct aggd_fp_tx_link *l, struct aggd_sipkey k,
					     const struct aggd_encap_args *a)
{
	__u32 udp_len = sizeof(o->udp) + AGGD_HDR_LEN + a->inner_len;

	o->ip.ver_ihl = 0x45;
	o->ip.tos = 0;
	o->ip.tot_len = bpf_htons(sizeof(o->ip) + udp_len);
	o->ip.id = 0;
	o->ip.frag_off = bpf_htons(AGGD_IP_DF);
	o->ip.ttl = AGGD_ENCAP_TTL;
	o->ip.protocol = IPPROTO_UDP;
	o->ip.check = 0;
	o->ip.saddr = l->saddr;
	o->ip.daddr = l->daddr;
	o->ip.check = aggd_ipv4_csum(&o->ip);

	o->udp.source = l->sport;
	o->udp.dest = l->dport;
	o->udp.len = bpf_htons(udp_len);
	o->udp.check = 0;

	o->hdr.ver_type = AGGD_VERSION << 4 | AGGD_TYPE_DATA;
	o->hdr.flags = a->flags;
	o->hdr.link_id = l->link_id;
	o->hdr.key_id = s->key_id;
	o->hdr.session = s->peer_index;
	o->hdr.seq = bpf_htonl(a->seq);
	o->hdr.link_seq = bpf_htonl(a->link_seq);
	o->hdr.tstamp = bpf_htonl(a->tstamp);
	aggd_store_be64(o->hdr.tag, aggd_hdr_compute_tag(k, &o->hdr));
}

/*
 * The Ethernet header in front of the outer IPv4 header. bpf_redirect_neigh
 * replaces it (it only needs one to be there, ARCHITECTURE §9), so there it
 * is zeros; bpf_clone_redirect sends it as is, so there it carries the real
 * addresses. mac NULL means zeros.
 */
static __always_inline void aggd_encap_eth(struct ethhdr *eth, const __u8 *dmac, const __u8 *smac)
{
#pragma unroll
	for (int i = 0; i < ETH_ALEN; i++) {
		eth->h_dest[i] = dmac ? dmac[i] : 0;
		eth->h_source[i] = smac ? smac[i] : 0;
	}
	eth->h_proto = bpf_htons(ETH_P_IP);
}

#endif /* AGGD_ENCAP_H */
