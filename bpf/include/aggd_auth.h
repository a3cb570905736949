/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Auth tags of aggd datagrams for the BPF fast path (docs/wire-format.md,
 * "Auth tag"), and the receive keys a session holds.
 *
 * DATA tags cover header bytes 0..19: a fixed-size hash. Control tags cover
 * header bytes 0..19 followed by the whole body, which starts at byte 28
 * (behind the tag), so the hashed message is not contiguous in the packet;
 * aggd_ctrl_tag_check walks it with a bounded loop.
 */
#ifndef AGGD_AUTH_H
#define AGGD_AUTH_H

#include "aggd_wire.h"
#include "siphash.h"
#include "aggd_verifier.h"

/*
 * The largest control body BPF verifies: what fits behind the outer
 * headers and the aggd header in a 1500-byte packet (1500 - 20 - 8 - 28).
 * Every control message the doc defines fits (it sizes FEEDBACK, LOSS_NOTICE
 * and LINK_PARAMS to this room); longer ones are left to the daemon.
 */
#define AGGD_CTRL_BODY_MAX 1444

/* A mask that keeps every offset into a verified control body. */
#define AGGD_CTRL_OFF_MASK 0x7ff
_Static_assert(AGGD_CTRL_BODY_MAX <= AGGD_CTRL_OFF_MASK, "mask covers the body");

/* Words of a control body behind its first 4 bytes, at most. */
#define AGGD_CTRL_WORDS_MAX ((AGGD_CTRL_BODY_MAX - 4) / 8)

/* Key generations a session accepts at once: the current and the previous. */
#define AGGD_KEY_GENS 2

/* SipHash key size in bytes. */
#define AGGD_KEY_LEN 16

/*
 * One receive key generation. All bytes, so the layout is the same in the
 * bpfel and bpfeb objects and the daemon writes it without byte swapping.
 */
struct aggd_rx_key {
	__u8 id;    /* the header's Key ID this key verifies */
	__u8 valid; /* 0: empty slot */
	__u8 pad[2];
	__u8 key[AGGD_KEY_LEN]; /* k0 = bytes 0..7, k1 = bytes 8..15, little-endian */
};

/* A session's receive keys, the value of the shield's sessions map. */
struct aggd_session {
	struct aggd_rx_key gen[AGGD_KEY_GENS];
};

_Static_assert(sizeof(struct aggd_rx_key) == 20, "rx key is 20 bytes");
_Static_assert(sizeof(struct aggd_session) == 40, "session is 40 bytes");

/* The generation that made a header with this Key ID, or NULL (stale_key). */
static __always_inline const struct aggd_rx_key *aggd_session_rx_key(const struct aggd_session *s,
								     __u8 key_id)
{
	if (s->gen[0].valid && s->gen[0].id == key_id)
		return &s->gen[0];
	if (s->gen[1].valid && s->gen[1].id == key_id)
		return &s->gen[1];
	return NULL;
}

/* The tag as carried: big-endian in bytes 20..27. */
static __always_inline __u64 aggd_hdr_tag(const struct aggd_hdr *h)
{
	return aggd_load_be64(h->tag);
}

/* The tag a DATA header should carry under key k. */
static __always_inline __u64 aggd_hdr_compute_tag(struct aggd_sipkey k, const struct aggd_hdr *h)
{
	return aggd_siphash24_20(k, (const __u8 *)h);
}

static __always_inline int aggd_hdr_tag_ok(struct aggd_sipkey k, const struct aggd_hdr *h)
{
	return aggd_hdr_compute_tag(k, h) == aggd_hdr_tag(h);
}

/*
 * The tag of a control message: header bytes 0..19, then body_len body
 * bytes from byte 28 on. The caller has bounds-checked the header; every
 * body byte is checked against end here (the verifier needs it; a caller
 * that passes a body_len beyond end gets -1, not a wrong answer).
 *
 * Message words: 0..7 and 8..15 come from the header; the third is header
 * bytes 16..19 and body bytes 0..3; after that, body words from body byte 4.
 *
 * Returns 1 if the tag verifies, 0 if not, -1 if BPF cannot tell: the body
 * is longer than AGGD_CTRL_BODY_MAX or not all in the packet.
 */
static __always_inline int aggd_ctrl_tag_check(struct aggd_sipkey k, const struct aggd_hdr *h,
					       __u32 body_len, const void *end)
{
	const __u8 *hb = (const __u8 *)h;
	const __u8 *body = hb + AGGD_HDR_LEN;
	const __u8 *p;
	struct aggd_sipstate s;
	__u32 len, words, rest, tail_off, tail_len;
	__u64 m;

	if (body_len > AGGD_CTRL_BODY_MAX)
		return -1;
	len = AGGD_TAGGED_HDR_LEN + body_len;

	s = aggd_sipinit(k);
	aggd_sipcompress(&s, aggd_load_le64(hb));
	aggd_sipcompress(&s, aggd_load_le64(hb + 8));
	m = aggd_load_le32(hb + 16);

	if (body_len < 4) {
		/* The whole message is 20..23 bytes: the third word is the last. */
#pragma unroll
		for (__u32 j = 0; j < 3; j++) {
			if (j < body_len) {
				if ((const void *)(body + j + 1) > end)
					return -1;
				m |= (__u64)body[j] << (32 + 8 * j);
			}
		}
		return aggd_sipfinal(&s, m, len) == aggd_hdr_tag(h);
	}

	if ((const void *)(body + 4) > end)
		return -1;
	m |= aggd_load_le32(body) << 32;
	aggd_sipcompress(&s, m);

	/*
	 * Body bytes 4.. in 8-byte words, then a tail of 0..7 bytes at tail_off.
	 * The tail's place is fixed before the loop and hidden from the
	 * optimiser, so the code behind the loop does not depend on where the
	 * loop left (p, or words as refined by the exit test): the verifier
	 * can then check that code once instead of once per loop exit. The
	 * mask changes nothing (the offset is at most AGGD_CTRL_BODY_MAX) but
	 * gives the verifier a bound it can see.
	 */
	rest = body_len - 4;
	words = rest / 8;
	tail_off = (4 + (rest & ~7U)) & AGGD_CTRL_OFF_MASK;
	tail_len = rest & 7;
	aggd_barrier_var(tail_off);
	aggd_barrier_var(tail_len);

	/* One iteration per word: the constant bound is what the verifier
	 * checks, words (at most AGGD_CTRL_WORDS_MAX, as body_len is at most
	 * AGGD_CTRL_BODY_MAX) ends the loop. p moves by a constant each time,
	 * which the verifier tracks exactly. */
	p = body + 4;
	for (__u32 i = 0; i < AGGD_CTRL_WORDS_MAX; i++) {
		if (i >= words)
			break;
		aggd_barrier_var(p);
		if ((const void *)(p + 8) > end)
			return -1;
		aggd_sipcompress(&s, aggd_load_le64(p));
		p += 8;
	}

	p = body + tail_off;
	aggd_barrier_var(p);
	m = 0;
#pragma unroll
	for (__u32 j = 0; j < 7; j++) {
		if (j < tail_len) {
			if ((const void *)(p + j + 1) > end)
				return -1;
			m |= (__u64)p[j] << (8 * j);
		}
	}
	return aggd_sipfinal(&s, m, len) == aggd_hdr_tag(h);
}

#endif /* AGGD_AUTH_H */
