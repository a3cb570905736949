/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The outer headers the transmit fast path puts in front of an inner packet:
 * IPv4 + UDP + the aggd DATA header (docs/wire-format.md), 56 bytes, or the
 * same behind IPv6, 76 bytes; and the 14-byte Ethernet header in front of
 * them that the redirect helpers need.
 *
 * What the slow path's packets look like (they leave through an unconnected
 * UDP socket) and what we copy from it: IPv4 without options, TOS 0, DF set
 * and IP ID 0 (the kernel writes ID 0 on DF datagrams of unconnected
 * sockets), TTL 64 (the default ip_default_ttl). One difference: the
 * kernel fills in the UDP checksum, we write 0, which IPv4 allows
 * (ARCHITECTURE §9: under GSO a non-zero outer checksum would be copied
 * unchanged onto every segment). The aggd header carries its own tag. Over
 * IPv6: traffic class 0, hop limit 64, and a real UDP checksum (no GSO
 * packet takes the fast path; aggd_encap_build6 says why it must be real),
 * flow label 0 (the daemon's sockets turn the kernel's automatic labels off,
 * so that routers hashing the label route both paths' packets alike).
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
#include "aggd_csum.h"

#define AGGD_ENCAP_TTL 64
#define AGGD_IP_DF 0x4000

/* Everything in front of the inner packet except the Ethernet header. */
struct aggd_outer {
	struct aggd_ipv4_hdr ip;
	struct aggd_udp_hdr udp;
	struct aggd_hdr hdr;
};

/* The same behind IPv6. */
struct aggd_outer6 {
	struct aggd_ipv6_hdr ip;
	struct aggd_udp_hdr udp;
	struct aggd_hdr hdr;
};

_Static_assert(sizeof(struct aggd_outer) == AGGD_OVERHEAD, "outer headers are the wire overhead");
_Static_assert(__builtin_offsetof(struct aggd_outer, hdr) == 28, "aggd header behind IPv4 and UDP");
_Static_assert(sizeof(struct aggd_outer6) == AGGD_OVERHEAD6, "outer headers are the wire overhead");
_Static_assert(__builtin_offsetof(struct aggd_outer6, hdr) == 48, "aggd header behind IPv6 and UDP");

/* The header fields that differ per packet and link. */
struct aggd_encap_args {
	__u32 seq;       /* global sequence (host order; low 32 bits of the counter) */
	__u32 link_seq;  /* the link's sequence */
	__u32 tstamp;    /* CLOCK_MONOTONIC µs, truncated */
	__u32 inner_len; /* bytes of the inner packet */
	__u8 flags;      /* AGGD_FLAG_* */
	__u32 inner_sum; /* IPv6 links: the inner packet's sum as it will leave (aggd_encap_build6) */
};

/* The aggd header for one packet on link l of session s, including the tag
 * under k (header bytes 0..19, stored big-endian in bytes 20..27 as
 * auth.Seal does). */
static __always_inline void aggd_encap_hdr(struct aggd_hdr *h, const struct aggd_fp_tx_session *s,
					   const struct aggd_fp_tx_link *l, struct aggd_sipkey k,
					   const struct aggd_encap_args *a)
{
	h->ver_type = AGGD_VERSION << 4 | AGGD_TYPE_DATA;
	h->flags = a->flags;
	h->link_id = l->link_id;
	h->key_id = s->key_id;
	h->session = s->peer_index;
	h->seq = bpf_htonl(a->seq);
	h->link_seq = bpf_htonl(a->link_seq);
	h->tstamp = bpf_htonl(a->tstamp);
	aggd_store_be64(h->tag, aggd_hdr_compute_tag(k, h));
}

static __always_inline __be32 aggd_addr4(const __u8 *a)
{
	__be32 v;

	__builtin_memcpy(&v, a, sizeof(v));
	return v;
}

/* Fill o for one packet on IPv4 link l of session s. */
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
	o->ip.saddr = aggd_addr4(l->saddr);
	o->ip.daddr = aggd_addr4(l->daddr);
	o->ip.check = aggd_ipv4_csum(&o->ip);

	o->udp.source = l->sport;
	o->udp.dest = l->dport;
	o->udp.len = bpf_htons(udp_len);
	o->udp.check = 0;

	aggd_encap_hdr(&o->hdr, s, l, k, a);
}

/*
 * Fill o6 for one packet on IPv6 link l of session s. IPv6 wants a UDP
 * checksum (RFC 8200 §8.1; a zero one is legal for tunnels only where the
 * receiver allows it, RFC 6935, and stateful firewalls on the way mark it
 * invalid), so this one is real: over the pseudo-header, the UDP and aggd
 * headers, and a->inner_sum, the inner packet's bytes as they will leave
 * (aggd_csum.h, tx_inner_sum).
 */
static __always_inline void aggd_encap_build6(struct aggd_outer6 *o, const struct aggd_fp_tx_session *s,
					      const struct aggd_fp_tx_link *l, struct aggd_sipkey k,
					      const struct aggd_encap_args *a)
{
	__u32 udp_len = sizeof(o->udp) + AGGD_HDR_LEN + a->inner_len;
	__u32 sum;

	o->ip.ver_tc_flow = bpf_htonl(0x60000000);
	o->ip.payload_len = bpf_htons(udp_len);
	o->ip.nexthdr = IPPROTO_UDP;
	o->ip.hop_limit = AGGD_ENCAP_TTL;
	__builtin_memcpy(o->ip.saddr, l->saddr, 16);
	__builtin_memcpy(o->ip.daddr, l->daddr, 16);

	o->udp.source = l->sport;
	o->udp.dest = l->dport;
	o->udp.len = bpf_htons(udp_len);
	o->udp.check = 0;

	aggd_encap_hdr(&o->hdr, s, l, k, a);

	sum = aggd_csum_pseudo6(o->ip.saddr, o->ip.daddr, udp_len, IPPROTO_UDP) +
	      aggd_csum_words(&o->udp, sizeof(o->udp) + AGGD_HDR_LEN);
	sum = aggd_csum_add(sum, a->inner_sum);
	o->udp.check = aggd_csum_udp_final(sum);
}

/*
 * The Ethernet header in front of the outer IP header. bpf_redirect_neigh
 * replaces it (it only needs one to be there, ARCHITECTURE §9), so there it
 * is zeros; bpf_clone_redirect sends it as is, so there it carries the real
 * addresses: macs holds the destination's, then the source's; NULL means
 * zeros.
 */
static __always_inline void aggd_encap_eth(struct ethhdr *eth, const __u8 *macs, int ipv6)
{
	if (macs) {
		__builtin_memcpy(eth->h_dest, macs, 2 * ETH_ALEN);
	} else {
		__builtin_memset(eth->h_dest, 0, 2 * ETH_ALEN);
	}
	eth->h_proto = ipv6 ? bpf_htons(ETH_P_IPV6) : bpf_htons(ETH_P_IP);
}

#endif /* AGGD_ENCAP_H */
