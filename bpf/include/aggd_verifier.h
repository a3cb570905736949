/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Helpers that keep code in a shape the verifier can follow, on the newest
 * kernels and on the oldest we support (Debian 12's 6.1).
 */
#ifndef AGGD_VERIFIER_H
#define AGGD_VERIFIER_H

#include <linux/types.h>

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

/*
 * Hide a value from the optimiser: clang can no longer derive it from, or
 * fold it into, the code around it. Used where clang would otherwise turn
 * bounds checks into arithmetic on the packet end pointer, or drop a mask
 * it can prove redundant but the verifier cannot.
 */
#define aggd_barrier_var(v) asm volatile("" : "+r"(v))

/*
 * A 16-bit value (such as a byte-swapped header length) with bounds the
 * verifier sees. Kernels before ~6.10 forget all bounds of a register after
 * a byte swap (BPF_END), so bpf_ntohs(x) looks unbounded to them, and packet
 * pointer arithmetic with it is rejected. The mask is a no-op that clang
 * would drop without the barrier.
 */
static __always_inline __u32 aggd_bound16(__u32 v)
{
	aggd_barrier_var(v);
	return v & 0xffff;
}

#endif /* AGGD_VERIFIER_H */
