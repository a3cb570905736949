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
 * A packet after an interval without any is never dropped (AGGD_AQM_IDLE_US).
 */
#ifndef AGGD_AQM_H
#define AGGD_AQM_H

#include <linux/types.h>

/* A packet that comes this long after the last one the schedule saw is not
 * dropped, and the schedule restarts from it: the sender offered the bond
 * nothing for an interval (the daemon's CoDel interval), so it is not feeding
 * the queue the spacing was set for. The daemon's CoDel does the same
 * (Codel.Idle): it once dropped a TCP flow's tail-loss probe 140 ms into an
 * outage of the links it had used. */
#define AGGD_AQM_IDLE_US 100000

/* Whether the packet sent at now_ns is dropped; updates *next_us and
 * *last_us (when the schedule last saw a packet, 0: none since the spacing
 * was set). Caller holds the session's tx_sched lock. The time is converted
 * only while a spacing is set: nearly every packet meets none. */
static __always_inline int aggd_aqm_drop(__u32 *next_us, __u32 *last_us, __u32 gap_us, __u64 now_ns)
{
	__u32 now_us, last;
	__s32 late;
	int idle;

	if (!gap_us) {
		*next_us = 0;
		*last_us = 0;
		return 0;
	}
	now_us = (__u32)(now_ns / 1000);
	last = *last_us;
	*last_us = now_us ? now_us : 1;
	idle = last && now_us - last >= AGGD_AQM_IDLE_US;
	late = (__s32)(now_us - *next_us);
	if (!idle && *next_us && late < 0)
		return 0;
	/* Due, or spared after an idle spell. The next one a spacing after this
	 * one's schedule, or after now if the schedule fell more than a spacing
	 * behind (no packets came) or restarts from the spared packet. */
	if (idle || !*next_us || late > (__s32)gap_us)
		*next_us = now_us + gap_us;
	else
		*next_us += gap_us;
	if (!*next_us)
		*next_us = 1;
	return !idle;
}

#endif /* AGGD_AQM_H */
