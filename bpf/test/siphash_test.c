// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Test-only programs for include/siphash.h and include/aggd_auth.h, run with
 * BPF_PROG_TEST_RUN from internal/bpf. XDP is used only as a convenient way
 * to hand the program bytes and get bytes back; nothing here is attached.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "aggd_wire.h"
#include "siphash.h"
#include "aggd_auth.h"

#define KEY_LEN 16

/*
 * In: key (16 bytes) | message (20 bytes) | 8 bytes of room.
 * Out: the room holds SipHash-2-4(key, message), big-endian.
 */
SEC("xdp")
int aggd_test_siphash(struct xdp_md *ctx)
{
	__u8 *p = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;

	if ((void *)(p + KEY_LEN + AGGD_TAGGED_HDR_LEN + AGGD_TAG_LEN) > end)
		return XDP_ABORTED;
	aggd_store_be64(p + KEY_LEN + AGGD_TAGGED_HDR_LEN,
			aggd_siphash24_20(aggd_sipkey_from_bytes(p), p + KEY_LEN));
	return XDP_PASS;
}

/*
 * In: key (16 bytes) | aggd header (28 bytes).
 * Verdict: XDP_PASS if the header's tag verifies under the key, else XDP_DROP.
 */
SEC("xdp")
int aggd_test_tag_verify(struct xdp_md *ctx)
{
	__u8 *p = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct aggd_hdr *h = (void *)(p + KEY_LEN);

	if ((void *)(h + 1) > end)
		return XDP_ABORTED;
	return aggd_hdr_tag_ok(aggd_sipkey_from_bytes(p), h) ? XDP_PASS : XDP_DROP;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
