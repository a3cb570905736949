/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Auth tag of an aggd header, for the BPF fast path: DATA only, whose tag
 * covers header bytes 0..19 (control types also cover the body and are
 * verified by the daemon).
 */
#ifndef AGGD_AUTH_H
#define AGGD_AUTH_H

#include "aggd_wire.h"
#include "siphash.h"

/* The tag as carried: big-endian in bytes 20..27. */
static __always_inline __u64 aggd_hdr_tag(const struct aggd_hdr *h)
{
	return aggd_load_be64(h->tag);
}

/* The tag a header should carry under key k. */
static __always_inline __u64 aggd_hdr_compute_tag(struct aggd_sipkey k, const struct aggd_hdr *h)
{
	return aggd_siphash24_20(k, (const __u8 *)h);
}

static __always_inline int aggd_hdr_tag_ok(struct aggd_sipkey k, const struct aggd_hdr *h)
{
	return aggd_hdr_compute_tag(k, h) == aggd_hdr_tag(h);
}

#endif /* AGGD_AUTH_H */
