/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Packet parsing shared by the XDP and tc programs: walk Ethernet (with up to
 * two VLAN tags), IPv4 or IPv6 and UDP with the bounds checks the verifier
 * needs, and locate the aggd header of a datagram aimed at the tunnel port.
 *
 * Everything here works on plain data/data_end pointers, so both XDP
 * (xdp_md) and tc (__sk_buff, direct packet access) callers can use it.
 *
 * No bitfields from <linux/ip.h>: with host (e.g. x86) uapi headers, the
 * iphdr version/ihl bitfields are laid out for the host's byte order and would
 * be wrong in the big-endian object. We read the bytes ourselves instead.
 */
#ifndef AGGD_PARSE_H
#define AGGD_PARSE_H

#include <linux/types.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <bpf/bpf_endian.h>

#include "aggd_wire.h"
#include "aggd_verifier.h"

/* IPv4 fragment field bits (kernel-internal names, not in uapi). */
#define AGGD_IP_MF 0x2000
#define AGGD_IP_OFFSET 0x1fff

/* The maximum number of stacked VLAN tags we look through (802.1ad + 802.1Q). */
#define AGGD_MAX_VLAN 2

struct aggd_vlan_hdr {
	__be16 tci;
	__be16 proto;
};

/* Layout of the fixed part of an IPv4 header, without bitfields. */
struct aggd_ipv4_hdr {
	__u8 ver_ihl;
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__be16 check;
	__be32 saddr;
	__be32 daddr;
};

/* Layout of the fixed IPv6 header. */
struct aggd_ipv6_hdr {
	__be32 ver_tc_flow;
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__u8 saddr[16];
	__u8 daddr[16];
};

struct aggd_udp_hdr {
	__be16 source;
	__be16 dest;
	__be16 len;
	__be16 check;
};

_Static_assert(sizeof(struct aggd_vlan_hdr) == 4, "VLAN tag is 4 bytes");
_Static_assert(sizeof(struct aggd_ipv4_hdr) == 20, "IPv4 header is 20 bytes");
_Static_assert(sizeof(struct aggd_ipv6_hdr) == 40, "IPv6 header is 40 bytes");
_Static_assert(sizeof(struct aggd_udp_hdr) == 8, "UDP header is 8 bytes");

/* A read position in the packet and its end. */
struct aggd_cursor {
	void *pos;
	void *end;
};

/*
 * Skip Ethernet and VLAN tags. On success stores the inner EtherType
 * (network order) and returns 0; returns -1 if the frame is too short to say.
 */
static __always_inline int aggd_parse_eth(struct aggd_cursor *c, __be16 *proto)
{
	struct ethhdr *eth = c->pos;
	__be16 p;

	if ((void *)(eth + 1) > c->end)
		return -1;
	p = eth->h_proto;
	c->pos = eth + 1;

#pragma unroll
	for (int i = 0; i < AGGD_MAX_VLAN; i++) {
		struct aggd_vlan_hdr *vh = c->pos;

		if (p != bpf_htons(ETH_P_8021Q) && p != bpf_htons(ETH_P_8021AD))
			break;
		if ((void *)(vh + 1) > c->end)
			return -1;
		p = vh->proto;
		c->pos = vh + 1;
	}
	*proto = p;
	return 0;
}

/*
 * Check and skip an IPv4 header (including options). Returns the header, or
 * NULL if it is not a well-formed IPv4 header that fits in the frame.
 */
static __always_inline struct aggd_ipv4_hdr *aggd_parse_ipv4(struct aggd_cursor *c)
{
	struct aggd_ipv4_hdr *ip = c->pos;
	__u32 hlen;

	if ((void *)(ip + 1) > c->end)
		return NULL;
	if ((ip->ver_ihl >> 4) != 4)
		return NULL;
	/* ihl is 4 bits, so hlen is in [0, 60]: a bound the verifier can see. */
	hlen = (__u32)(ip->ver_ihl & 0x0f) * 4;
	if (hlen < sizeof(*ip))
		return NULL;
	if (c->pos + hlen > c->end)
		return NULL;
	c->pos += hlen;
	return ip;
}

/*
 * Check and skip a fixed IPv6 header. Returns it, or NULL if it is not an
 * IPv6 header that fits in the frame. Extension headers are not walked: a
 * caller that wants UDP checks nexthdr, so a datagram behind extension headers
 * (a fragment, say) is not recognised as a tunnel packet.
 */
static __always_inline struct aggd_ipv6_hdr *aggd_parse_ipv6(struct aggd_cursor *c)
{
	struct aggd_ipv6_hdr *ip6 = c->pos;

	if ((void *)(ip6 + 1) > c->end)
		return NULL;
	if ((*(__u8 *)ip6 >> 4) != 6)
		return NULL;
	c->pos = ip6 + 1;
	return ip6;
}

/*
 * Check and skip a UDP header aimed at port (host order). Returns it, or NULL
 * if the frame ends inside it or it is for another port.
 */
static __always_inline struct aggd_udp_hdr *aggd_parse_udp_to(struct aggd_cursor *c, __u16 port)
{
	struct aggd_udp_hdr *udp = c->pos;

	if ((void *)(udp + 1) > c->end)
		return NULL;
	if (udp->dest != bpf_htons(port))
		return NULL;
	c->pos = udp + 1;
	return udp;
}

static __always_inline __u32 aggd_ipv4_hlen(const struct aggd_ipv4_hdr *ip)
{
	return (__u32)(ip->ver_ihl & 0x0f) * 4;
}

/* Non-first fragments carry no UDP header. */
static __always_inline int aggd_ipv4_is_later_fragment(const struct aggd_ipv4_hdr *ip)
{
	return (ip->frag_off & bpf_htons(AGGD_IP_OFFSET)) != 0;
}

/*
 * Check and skip an IPv4 header and a UDP header aimed at port: the tunnel
 * traffic the shield and the receive program judge. Returns 0 with both
 * headers stored, or -1 for anything else: not IPv4 UDP to port, or a later
 * fragment (no UDP header, so no port to match; the first fragment was
 * checked, reassembly is the stack's job).
 */
static __always_inline int aggd_parse_ipv4_udp_to(struct aggd_cursor *c, __u16 port,
						  struct aggd_ipv4_hdr **ipp, struct aggd_udp_hdr **udpp)
{
	struct aggd_ipv4_hdr *ip = aggd_parse_ipv4(c);

	if (!ip || ip->protocol != IPPROTO_UDP || aggd_ipv4_is_later_fragment(ip))
		return -1;
	*udpp = aggd_parse_udp_to(c, port);
	if (!*udpp)
		return -1;
	*ipp = ip;
	return 0;
}

static __always_inline int aggd_ipv4_more_fragments(const struct aggd_ipv4_hdr *ip)
{
	return (ip->frag_off & bpf_htons(AGGD_IP_MF)) != 0;
}

/*
 * Length checks for a UDP datagram to the tunnel port, whose UDP header the
 * caller has already bounds-checked (c->pos points right behind it).
 *
 * The datagram's length comes from the headers, not from data_end: short
 * frames carry Ethernet padding behind the datagram (minimum frame 60 bytes),
 * which must not count as aggd bytes. The IPv4, UDP and frame lengths must
 * agree, or the kernel would drop the packet later anyway; we count it here.
 *
 * For a first fragment (MF set) the UDP length covers the whole datagram while
 * this packet carries only a part of it; the header must still be in the part.
 *
 * On success stores the aggd header and the body length (bytes behind the
 * aggd header), and returns AGGD_REASON_NONE. For a first fragment, which
 * does not hold the whole body, the body length is AGGD_BODY_LEN_PARTIAL.
 */
#define AGGD_BODY_LEN_PARTIAL 0xffffffffU

/*
 * The checks both IP versions share. ip_end is where the IP packet ends by its
 * header, in_ip how many datagram bytes (UDP header included) it carries, and
 * first_fragment says it is the first of several (IPv4 MF).
 */
static __always_inline enum aggd_reason
aggd_locate_in_ip(struct aggd_cursor *c, void *ip_end, __u32 in_ip, int first_fragment,
		  struct aggd_udp_hdr *udp, struct aggd_hdr **hdrp, __u32 *body_lenp)
{
	struct aggd_hdr *hdr = c->pos;
	__u32 udp_len = aggd_bound16(bpf_ntohs(udp->len));
	__u32 present;

	if (udp_len < sizeof(*udp))
		return AGGD_REASON_TRUNCATED;
	/* The frame must hold the whole IP packet. */
	if (ip_end > c->end)
		return AGGD_REASON_TRUNCATED;
	if (first_fragment) {
		present = in_ip;
	} else {
		/* UDP claiming more than IP carries is a cut-off datagram. */
		if (udp_len > in_ip)
			return AGGD_REASON_TRUNCATED;
		present = udp_len;
	}
	if (present < sizeof(*udp) + AGGD_HDR_LEN)
		return AGGD_REASON_TRUNCATED;
	/* Implied by the checks above; repeated in the form the verifier tracks. */
	if ((void *)(hdr + 1) > c->end)
		return AGGD_REASON_TRUNCATED;
	*hdrp = hdr;
	*body_lenp = first_fragment ? AGGD_BODY_LEN_PARTIAL : present - sizeof(*udp) - AGGD_HDR_LEN;
	return AGGD_REASON_NONE;
}

static __always_inline enum aggd_reason
aggd_locate_hdr(struct aggd_cursor *c, struct aggd_ipv4_hdr *ip, struct aggd_udp_hdr *udp,
		struct aggd_hdr **hdrp, __u32 *body_lenp)
{
	__u32 ip_len = aggd_bound16(bpf_ntohs(ip->tot_len));
	__u32 hlen = aggd_ipv4_hlen(ip);

	if (ip_len < hlen + sizeof(*udp))
		return AGGD_REASON_TRUNCATED;
	return aggd_locate_in_ip(c, (void *)ip + ip_len, ip_len - hlen, aggd_ipv4_more_fragments(ip),
				 udp, hdrp, body_lenp);
}

/* The same for a datagram right behind a fixed IPv6 header (no fragments:
 * those have an extension header, and aggd_parse_ipv6's callers pass them). */
static __always_inline enum aggd_reason
aggd_locate_hdr6(struct aggd_cursor *c, struct aggd_ipv6_hdr *ip6, struct aggd_udp_hdr *udp,
		 struct aggd_hdr **hdrp, __u32 *body_lenp)
{
	__u32 payload = aggd_bound16(bpf_ntohs(ip6->payload_len));

	if (payload < sizeof(*udp))
		return AGGD_REASON_TRUNCATED;
	return aggd_locate_in_ip(c, (void *)(ip6 + 1) + payload, payload, 0, udp, hdrp, body_lenp);
}

/* The IPv6 fragment header (RFC 8200 §4.5). */
struct aggd_ipv6_frag_hdr {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off; /* offset in 8-byte units << 3 | M */
	__be32 id;
};

#define AGGD_IPPROTO_FRAGMENT 44
#define AGGD_IP6_OFFSET 0xfff8

/*
 * The first fragment of a datagram behind a fixed IPv6 header and a fragment
 * header, aimed at port: the receive program must count it as one DATA packet
 * the daemon consumes, as an IPv4 first fragment (the stack reassembles it for
 * the daemon's socket). Returns 0 with the UDP header stored and the cursor
 * behind it, -1 for anything else (a later fragment has no UDP header).
 */
static __always_inline int aggd_parse_ipv6_first_fragment_to(struct aggd_cursor *c, struct aggd_ipv6_hdr *ip6,
							     __u16 port, struct aggd_udp_hdr **udpp)
{
	struct aggd_ipv6_frag_hdr *fh = c->pos;

	if (ip6->nexthdr != AGGD_IPPROTO_FRAGMENT || (void *)(fh + 1) > c->end)
		return -1;
	if (fh->nexthdr != IPPROTO_UDP || (fh->frag_off & bpf_htons(AGGD_IP6_OFFSET)))
		return -1;
	c->pos = fh + 1;
	*udpp = aggd_parse_udp_to(c, port);
	return *udpp ? 0 : -1;
}

/* aggd_locate_hdr6 for such a first fragment: the body length is
 * AGGD_BODY_LEN_PARTIAL. */
static __always_inline enum aggd_reason
aggd_locate_hdr6_first_fragment(struct aggd_cursor *c, struct aggd_ipv6_hdr *ip6, struct aggd_udp_hdr *udp,
				struct aggd_hdr **hdrp, __u32 *body_lenp)
{
	__u32 payload = aggd_bound16(bpf_ntohs(ip6->payload_len));
	__u32 frag = sizeof(struct aggd_ipv6_frag_hdr);

	if (payload < frag + sizeof(*udp))
		return AGGD_REASON_TRUNCATED;
	return aggd_locate_in_ip(c, (void *)(ip6 + 1) + payload, payload - frag, 1, udp, hdrp, body_lenp);
}

/* Where a tunnel datagram lies in its IP packet (aggd_locate_tunnel). */
struct aggd_tunnel_ip {
	__u32 l2;   /* bytes in front of the IP header: Ethernet and VLAN tags */
	__u32 hlen; /* IP header bytes: IPv4 with options, or the fixed IPv6 header */
	__u32 len;  /* the IP packet's length by its header */
	int v6;     /* outer IPv6 */
};

/*
 * Finds the aggd header of a UDP datagram to port behind IPv4 or a fixed IPv6
 * header (with frag6, also an IPv6 first fragment: the receive program counts
 * one for the daemon; the shield leaves fragments to the daemon). Returns -1
 * for anything else (not ours: pass, uncounted), else 0 with the length
 * checks' verdict in *reason, and the IP header's layout in *ip.
 */
static __always_inline int aggd_locate_tunnel(struct aggd_cursor *c, __u16 port, int frag6, struct aggd_hdr **hdr,
					      __u32 *body_len, enum aggd_reason *reason, struct aggd_tunnel_ip *ip)
{
	struct aggd_ipv4_hdr *ip4;
	struct aggd_ipv6_hdr *ip6;
	struct aggd_udp_hdr *udp;
	void *start = c->pos;
	__be16 proto;

	/* Frames we cannot even classify are not ours to judge: the stack
	 * drops what is really malformed. */
	if (aggd_parse_eth(c, &proto) < 0)
		return -1;
	ip->l2 = c->pos - start;
	if (proto == bpf_htons(ETH_P_IP)) {
		if (aggd_parse_ipv4_udp_to(c, port, &ip4, &udp) < 0)
			return -1;
		*reason = aggd_locate_hdr(c, ip4, udp, hdr, body_len);
		ip->hlen = aggd_ipv4_hlen(ip4);
		ip->len = aggd_bound16(bpf_ntohs(ip4->tot_len));
		ip->v6 = 0;
		return 0;
	}
	if (proto != bpf_htons(ETH_P_IPV6))
		return -1;
	ip6 = aggd_parse_ipv6(c);
	if (!ip6)
		return -1;
	if (ip6->nexthdr == IPPROTO_UDP) {
		udp = aggd_parse_udp_to(c, port);
		if (!udp)
			return -1;
		*reason = aggd_locate_hdr6(c, ip6, udp, hdr, body_len);
	} else if (frag6 && aggd_parse_ipv6_first_fragment_to(c, ip6, port, &udp) == 0) {
		*reason = aggd_locate_hdr6_first_fragment(c, ip6, udp, hdr, body_len);
	} else {
		return -1; /* behind other extension headers: the daemon judges */
	}
	ip->hlen = sizeof(*ip6);
	ip->len = sizeof(*ip6) + aggd_bound16(bpf_ntohs(ip6->payload_len));
	ip->v6 = 1;
	return 0;
}

#endif /* AGGD_PARSE_H */
