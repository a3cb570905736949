/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The bond's entry AQM on the transmit fast path: the BPF half of
 * internal/aqm (the daemon's CoDel, RFC 8289, applied to the queueing delay
 * the peer measures on the links).
 *
 * The control law stays in the daemon, which sees the queue through the
 * peer's feedback: while CoDel is in its dropping state it writes the
 * spacing between drops (interval/sqrt(count), in microseconds) into the
 * session's aqm_gap_us, and 0 otherwise. The kernel only carries the
 * schedule out: it drops the first packet once a spacing is set, then one
 * packet each spacing later. The next drop time lives in the session's
 * tx_sched value, under its lock, in microseconds of bpf_ktime_get_ns
 * truncated to 32 bits: comparisons are wrap-safe for spans under 35
 * minutes, and the time is cleared whenever the spacing is 0, so a stale
 * one never survives a pause in dropping. 0 means "no drop scheduled yet".
 */
#ifndef AGGD_AQM_H
#define AGGD_AQM_H

#include <linux/types.h>

/* Whether the packet sent at now_ns is dropped; updates *next_us. Caller
 * holds the session's tx_sched lock. The time is converted only while a
 * spacing is set: nearly every packet meets none. */
static __always_inline int aggd_aqm_drop(__u32 *next_us, __u32 gap_us, __u64 now_ns)
{
	__u32 now_us;
	__s32 late;

	if (!gap_us) {
		*next_us = 0;
		return 0;
	}
	now_us = (__u32)(now_ns / 1000);
	late = (__s32)(now_us - *next_us);
	if (*next_us && late < 0)
		return 0;
	/* Due. The next one a spacing after this one's schedule, or after now
	 * if the schedule fell more than a spacing behind (no packets came). */
	if (!*next_us || late > (__s32)gap_us)
		*next_us = now_us + gap_us;
	else
		*next_us += gap_us;
	if (!*next_us)
		*next_us = 1;
	return 1;
}

#endif /* AGGD_AQM_H */
