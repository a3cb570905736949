/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * aggd wire format, version 1: the C side of docs/wire-format.md.
 *
 * The Go definition lives in internal/wire; both are checked against the
 * golden vectors in testdata/wire/. Keep this file free of program logic:
 * it only describes bytes on the wire and the reject reasons.
 */
#ifndef AGGD_WIRE_H
#define AGGD_WIRE_H

#include <linux/types.h>

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

/* Default UDP port of the tunnel; the real one is set at load time. */
#define AGGD_DEFAULT_PORT 4242

#define AGGD_VERSION 1

/* Size of the fixed header, and the per-packet cost of the tunnel including
 * the outer IPv4 (20) and UDP (8) headers: agg0's MTU is uplink MTU minus this. */
#define AGGD_HDR_LEN 28
#define AGGD_OVERHEAD 56
#define AGGD_OVERHEAD6 76 /* the same behind an outer IPv6 header */

/* The auth tag covers header bytes 0..19 (plus the body for non-DATA types). */
#define AGGD_TAGGED_HDR_LEN 20
#define AGGD_TAG_LEN 8

/* Message types: low nibble of byte 0. */
#define AGGD_TYPE_DATA 1
#define AGGD_TYPE_HANDSHAKE_INIT 2
#define AGGD_TYPE_HANDSHAKE_RESP 3
#define AGGD_TYPE_PROBE 4
#define AGGD_TYPE_PROBE_REPLY 5
#define AGGD_TYPE_FEEDBACK 6
#define AGGD_TYPE_LOSS_NOTICE 7
#define AGGD_TYPE_LINK_PARAMS 8
#define AGGD_TYPE_LINK_NAMES 9
#define AGGD_TYPE_REPAIR_REQUEST 10
#define AGGD_TYPE_COOKIE_REPLY 11
#define AGGD_TYPE_MIN AGGD_TYPE_DATA
#define AGGD_TYPE_MAX AGGD_TYPE_COOKIE_REPLY

/* Flags byte. Unknown bits must be zero so they can be given meaning later
 * without old receivers misreading them. */
#define AGGD_FLAG_DUPLICATE 0x01
/* A HANDSHAKE_INIT that ends with a mac2 (the sender proves its address with
 * a cookie the headend sent it); on any other type it is bad_flags. */
#define AGGD_FLAG_MAC2 0x02
/* A DATA packet of a sparse flow, which the receiver may deliver ahead of a
 * gap (internal/wire.FlagSparse); on any other type it is bad_flags. The
 * kernel's transmit program never sets it; its receive program hands such a
 * packet to the daemon like any other out of order. */
#define AGGD_FLAG_SPARSE 0x04
#define AGGD_FLAGS_KNOWN (AGGD_FLAG_DUPLICATE | AGGD_FLAG_MAC2 | AGGD_FLAG_SPARSE)

/* Link ID 255 is reserved (never a real uplink). */
#define AGGD_LINK_ID_RESERVED 255

/*
 * LINK_PARAMS body: counter (u64), n (u8), then n entries of 12 bytes: link
 * id (u8), class (u8; AGGD_LINK_PARAM_OFFLINE set above the class while the
 * CPE's uplink cannot carry traffic), MTU (u16, the largest inner packet the
 * link takes, 0 unknown), rate (u64, bits/s, 0 unknown).
 * Slow path only; described here so the C side knows every type's layout.
 */
#define AGGD_LINK_PARAM_LEN 12
#define AGGD_LINK_CLASS_PRIMARY 0
#define AGGD_LINK_CLASS_OVERFLOW 1
#define AGGD_LINK_CLASS_BACKUP 2
#define AGGD_LINK_CLASS_MAX AGGD_LINK_CLASS_BACKUP
#define AGGD_LINK_PARAM_OFFLINE 0x80

/*
 * REPAIR_REQUEST body: counter (u64), n (u8), then n ranges of 8 bytes: link
 * id (u8), reserved (u8, zero), count (u16), first link sequence number (u32).
 * Slow path only.
 */
#define AGGD_LINK_SEQ_RANGE_LEN 8

/*
 * The fixed header. Every multi-byte field is big-endian on the wire.
 *
 * No packed attribute on purpose: the natural layout already has no padding
 * (asserted below), and keeping 4-byte alignment lets clang emit word loads
 * instead of byte-by-byte ones. The tag is a byte array rather than a __be64
 * because a 64-bit member at offset 20 would force 8-byte alignment and pad
 * the struct to 32 bytes. Like every other integer it is big-endian: the
 * SipHash-2-4 result with its most significant byte in tag[0].
 *
 * Alignment in packets: behind Ethernet (14) + IPv4 (20, or 20+4n) + UDP (8)
 * the header starts 2 bytes past a 4-byte boundary, which NET_IP_ALIGN
 * compensates for; the verifier models exactly that, so the word loads pass
 * even on strict-alignment architectures.
 */
struct aggd_hdr {
	__u8 ver_type; /* version << 4 | type */
	__u8 flags;
	__u8 link_id;
	__u8 key_id;
	__be32 session;  /* the receiver's index for the session */
	__be32 seq;      /* global sequence (DATA) or watermark (PROBE) */
	__be32 link_seq; /* per-link sequence */
	__be32 tstamp;   /* sender CLOCK_MONOTONIC in µs, truncated to 32 bits */
	__u8 tag[AGGD_TAG_LEN];
};

_Static_assert(sizeof(struct aggd_hdr) == AGGD_HDR_LEN, "aggd header must be 28 bytes");
_Static_assert(__builtin_offsetof(struct aggd_hdr, session) == 4, "session at byte 4");
_Static_assert(__builtin_offsetof(struct aggd_hdr, seq) == 8, "sequence at byte 8");
_Static_assert(__builtin_offsetof(struct aggd_hdr, link_seq) == 12, "link sequence at byte 12");
_Static_assert(__builtin_offsetof(struct aggd_hdr, tstamp) == 16, "timestamp at byte 16");
_Static_assert(__builtin_offsetof(struct aggd_hdr, tag) == AGGD_TAGGED_HDR_LEN, "tag at byte 20");
_Static_assert(AGGD_OVERHEAD == 20 + 8 + AGGD_HDR_LEN, "overhead = IPv4 + UDP + aggd");
_Static_assert(AGGD_OVERHEAD6 == 40 + 8 + AGGD_HDR_LEN, "overhead = IPv6 + UDP + aggd");

static __always_inline __u8 aggd_hdr_version(const struct aggd_hdr *h)
{
	return h->ver_type >> 4;
}

static __always_inline __u8 aggd_hdr_type(const struct aggd_hdr *h)
{
	return h->ver_type & 0x0f;
}

/*
 * Reject reasons: the codes and names of the doc's table, the same values as
 * wire.Reason in Go (the Go names are the lower-case suffixes). Values index
 * the per-reason counter arrays the daemon reads; 0 is "not dropped", so
 * counter arrays use slot 0 for accepted packets. AGGD_REASON__COUNT is the
 * array size, not a reason. Append new reasons before it; never renumber.
 *
 * oversize (> 65535 bytes) cannot occur behind an IPv4/UDP header, whose
 * length fields are 16 bits; it exists for the other parsers.
 */
enum aggd_reason {
	AGGD_REASON_NONE = 0,
	AGGD_REASON_TRUNCATED = 1,
	AGGD_REASON_BAD_VERSION = 2,
	AGGD_REASON_BAD_TYPE = 3,
	AGGD_REASON_BAD_FLAGS = 4,
	AGGD_REASON_BAD_LENGTH = 5,
	AGGD_REASON_OVERSIZE = 6,
	AGGD_REASON_UNKNOWN_SESSION = 7,
	AGGD_REASON_BAD_TAG = 8,
	AGGD_REASON_REPLAY = 9,
	AGGD_REASON_STALE_KEY = 10,
	AGGD_REASON_BAD_BODY = 11,
	/* Counted by the headend's handshake handling, never by BPF today. */
	AGGD_REASON_RATE_LIMITED = 12,
	AGGD_REASON_HANDSHAKE_FAILED = 13,
	AGGD_REASON__COUNT,
};

/*
 * The checks that need nothing but the header bytes (step 2 of the doc's
 * check order: byte 0, then byte 1). Every implementation checks in that
 * order, so a packet wrong in several ways is counted under the same reason
 * by the fast path and the slow path.
 */
static __always_inline enum aggd_reason aggd_hdr_check(const struct aggd_hdr *h)
{
	__u8 type = aggd_hdr_type(h);

	if (aggd_hdr_version(h) != AGGD_VERSION)
		return AGGD_REASON_BAD_VERSION;
	if (type < AGGD_TYPE_MIN || type > AGGD_TYPE_MAX)
		return AGGD_REASON_BAD_TYPE;
	if (h->flags & ~AGGD_FLAGS_KNOWN)
		return AGGD_REASON_BAD_FLAGS;
	if ((h->flags & AGGD_FLAG_MAC2) && type != AGGD_TYPE_HANDSHAKE_INIT)
		return AGGD_REASON_BAD_FLAGS;
	if ((h->flags & AGGD_FLAG_SPARSE) && type != AGGD_TYPE_DATA)
		return AGGD_REASON_BAD_FLAGS;
	return AGGD_REASON_NONE;
}

/*
 * The messages sent before there is a session, tagged with a mac key derived
 * from a static public key: the handshake's two and the headend's cookie
 * reply. No session key checks them: the daemon does.
 */
static __always_inline int aggd_type_sessionless(__u8 type)
{
	return type == AGGD_TYPE_HANDSHAKE_INIT || type == AGGD_TYPE_HANDSHAKE_RESP ||
	       type == AGGD_TYPE_COOKIE_REPLY;
}

#endif /* AGGD_WIRE_H */
