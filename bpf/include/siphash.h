/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * SipHash-2-4 (Aumasson & Bernstein) for the aggd auth tag: the keyed hash
 * over the first 20 bytes of an aggd header, and the pieces to extend it over a
 * control message's body (docs/wire-format.md, "Auth tag").
 *
 * The DATA tag covers a fixed 20-byte message, so that hash is fully
 * unrolled: no loops for the verifier to bound. The pieces (init, compress,
 * final) are exposed too, for aggd_auth.h's control-message tag, whose
 * message is the header plus a body of variable length.
 *
 * Byte order, per the doc: the key's k0/k1 and the message words are read
 * little-endian (as SipHash defines them), the 64-bit result is stored
 * big-endian in the header. Everything is assembled from single bytes, so
 * it is the same on bpfel and bpfeb and needs no alignment.
 */
#ifndef AGGD_SIPHASH_H
#define AGGD_SIPHASH_H

#include <linux/types.h>

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

static __always_inline __u64 aggd_rotl64(__u64 x, int b)
{
	return (x << b) | (x >> (64 - b));
}

static __always_inline __u64 aggd_load_le64(const __u8 *p)
{
	return (__u64)p[0] | (__u64)p[1] << 8 | (__u64)p[2] << 16 | (__u64)p[3] << 24 |
	       (__u64)p[4] << 32 | (__u64)p[5] << 40 | (__u64)p[6] << 48 | (__u64)p[7] << 56;
}

static __always_inline __u64 aggd_load_le32(const __u8 *p)
{
	return (__u64)p[0] | (__u64)p[1] << 8 | (__u64)p[2] << 16 | (__u64)p[3] << 24;
}

static __always_inline __u64 aggd_load_be64(const __u8 *p)
{
	return (__u64)p[0] << 56 | (__u64)p[1] << 48 | (__u64)p[2] << 40 | (__u64)p[3] << 32 |
	       (__u64)p[4] << 24 | (__u64)p[5] << 16 | (__u64)p[6] << 8 | (__u64)p[7];
}

static __always_inline void aggd_store_be64(__u8 *p, __u64 v)
{
	p[0] = v >> 56;
	p[1] = v >> 48;
	p[2] = v >> 40;
	p[3] = v >> 32;
	p[4] = v >> 24;
	p[5] = v >> 16;
	p[6] = v >> 8;
	p[7] = v;
}

/* A SipHash key as the two 64-bit words the rounds use. */
struct aggd_sipkey {
	__u64 k0;
	__u64 k1;
};

/* The 16 key bytes as the SipHash reference reads them. */
static __always_inline struct aggd_sipkey aggd_sipkey_from_bytes(const __u8 *key)
{
	struct aggd_sipkey k = {
		.k0 = aggd_load_le64(key),
		.k1 = aggd_load_le64(key + 8),
	};
	return k;
}

struct aggd_sipstate {
	__u64 v0, v1, v2, v3;
};

static __always_inline void aggd_sipround(struct aggd_sipstate *s)
{
	s->v0 += s->v1;
	s->v1 = aggd_rotl64(s->v1, 13);
	s->v1 ^= s->v0;
	s->v0 = aggd_rotl64(s->v0, 32);
	s->v2 += s->v3;
	s->v3 = aggd_rotl64(s->v3, 16);
	s->v3 ^= s->v2;
	s->v0 += s->v3;
	s->v3 = aggd_rotl64(s->v3, 21);
	s->v3 ^= s->v0;
	s->v2 += s->v1;
	s->v1 = aggd_rotl64(s->v1, 17);
	s->v1 ^= s->v2;
	s->v2 = aggd_rotl64(s->v2, 32);
}

/* One message word: two compression rounds ("2" of 2-4). */
static __always_inline void aggd_sipcompress(struct aggd_sipstate *s, __u64 m)
{
	s->v3 ^= m;
	aggd_sipround(s);
	aggd_sipround(s);
	s->v0 ^= m;
}

static __always_inline struct aggd_sipstate aggd_sipinit(struct aggd_sipkey k)
{
	struct aggd_sipstate s = {
		/* "somepseudorandomlygeneratedbytes" */
		.v0 = k.k0 ^ 0x736f6d6570736575ULL,
		.v1 = k.k1 ^ 0x646f72616e646f6dULL,
		.v2 = k.k0 ^ 0x6c7967656e657261ULL,
		.v3 = k.k1 ^ 0x7465646279746573ULL,
	};
	return s;
}

/*
 * The last block (the 0..7 bytes left over, little-endian, in `tail`, and
 * the message length mod 256 in the top byte), then finalisation: four
 * rounds ("4" of 2-4).
 */
static __always_inline __u64 aggd_sipfinal(struct aggd_sipstate *s, __u64 tail, __u32 len)
{
	aggd_sipcompress(s, ((__u64)(len & 0xff) << 56) | tail);
	s->v2 ^= 0xff;
	aggd_sipround(s);
	aggd_sipround(s);
	aggd_sipround(s);
	aggd_sipround(s);
	return s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
}

/*
 * SipHash-2-4 of the 20 bytes at msg. The caller has bounds-checked all 20
 * (for packet data: msg + 20 <= data_end).
 */
static __always_inline __u64 aggd_siphash24_20(struct aggd_sipkey k, const __u8 *msg)
{
	struct aggd_sipstate s = aggd_sipinit(k);

	aggd_sipcompress(&s, aggd_load_le64(msg));
	aggd_sipcompress(&s, aggd_load_le64(msg + 8));
	/* Last block: the 4 remaining bytes. */
	return aggd_sipfinal(&s, aggd_load_le32(msg + 16), 20);
}

#endif /* AGGD_SIPHASH_H */
