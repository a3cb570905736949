/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The forwarding fast path's shared state: the layouts of the maps that the
 * tc programs (tc_tx.c on agg0's egress, tc_rx.c on the uplinks' ingress) and
 * the daemon (internal/bpf, internal/daemon) exchange. Only layouts and
 * constants live here; each map is declared in the program that owns it.
 *
 * Every struct is laid out without implicit padding (asserted below) and has
 * the same size and offsets in the bpfel and bpfeb objects. Fields marked
 * "wire order" hold bytes as they appear in packets (big-endian); all others
 * are host-order integers.
 *
 * Who writes what (so no update ever loses another writer's change):
 *  - *_cfg maps: the daemon only, one whole-value update at a time (hash maps
 *    replace an element atomically, so BPF sees the old value or the new one).
 *  - tx_seq: both. It is an mmap-able array; BPF and the daemon take numbers
 *    with atomic adds, so a session's global and per-link sequence numbers stay
 *    one series whichever path sends a packet.
 *  - tx_sched: BPF only (under its spin lock); the daemon creates the entry.
 *  - tx_kept: BPF writes the rings; the daemon creates and deletes them, and
 *    reads (see struct aggd_fp_kept for how a read is known whole).
 *  - rx_order: both, under its spin lock, by the ownership protocol below.
 *  - rx_divert, *_stats, *_verdicts: BPF only; the daemon reads.
 */
#ifndef AGGD_FASTPATH_H
#define AGGD_FASTPATH_H

#include <linux/types.h>
#include <linux/bpf.h> /* struct bpf_spin_lock */

/* Links per session the fast path schedules over (the config allows at most
 * this many uplinks per CPE). */
#define AGGD_FP_MAX_LINKS 8

/* Sessions the fast path serves; a session is identified by its slot
 * (0 .. AGGD_FP_MAX_SESSIONS-1), chosen by the daemon. */
#define AGGD_FP_MAX_SESSIONS 1024

/* Inner-destination prefixes the headend routes (tx_routes). */
#define AGGD_FP_MAX_ROUTES 16384

/* ---- transmit (tc egress on agg0) ------------------------------------------ */

/* tx_routes key: an LPM trie key. data[0] is the family (4 or 6), data[1..]
 * the address in wire order; prefixlen counts the family byte's 8 bits. */
struct aggd_fp_route_key {
	__u32 prefixlen;
	__u8 data[17];
	__u8 pad[3];
};

/* Link states as the scheduler sees them. */
#define AGGD_FP_LINK_DOWN 0    /* not scheduled */
#define AGGD_FP_LINK_UP 1      /* scheduled */
#define AGGD_FP_LINK_SUSPECT 2 /* scheduled, each packet also copied to the best other link */

/* aggd_fp_tx_link.flags */
#define AGGD_FP_LINK_ETHERNET 0x01 /* redirect with bpf_redirect_neigh via gateway; else bpf_redirect (L3 uplink) */
#define AGGD_FP_LINK_NEIGH_OK 0x02 /* the daemon saw the gateway's neighbour entry resolved */
#define AGGD_FP_LINK_IPV6 0x04     /* outer IPv6 (16-byte addresses); else IPv4, in the addresses' first 4 bytes */

/* One uplink of a session, as the daemon configures it. */
struct aggd_fp_tx_link {
	__u32 ifindex;  /* 0: slot unused */
	__u8 link_id;   /* the header's Link ID */
	__u8 state;     /* AGGD_FP_LINK_* */
	__u8 cls;       /* AGGD_LINK_CLASS_* (aggd_wire.h) */
	__u8 flags;     /* AGGD_FP_LINK_ETHERNET | AGGD_FP_LINK_NEIGH_OK | AGGD_FP_LINK_IPV6 */
	__be16 sport;   /* outer UDP source port (wire order) */
	__be16 dport;   /* outer UDP destination port (wire order) */
	/* An IPv6 Ethernet link's next hop's and own MAC addresses, as the daemon
	 * last saw them: what a redundant copy (bpf_clone_redirect, which sends
	 * the Ethernet header as it is) carries. An IPv4 link's copy asks
	 * bpf_fib_lookup instead; for IPv6 that refuses link-local next hops,
	 * which IPv6 default routes mostly are. All zeros: no copies. */
	__u8 gw_mac[6];
	__u8 src_mac[6];
	__u8 saddr[16];   /* outer source (wire order) */
	__u8 daddr[16];   /* outer destination (wire order) */
	__u8 gateway[16]; /* next hop for bpf_redirect_neigh (wire order); all zeros: daddr is on-link */
	__u64 rate_bps; /* the rate the scheduler assumes, bits/s; 0 = link unusable */
	__u32 base_owd_us; /* base one-way delay relative to the session's fastest link */
	__u32 pad;
};

/* aggd_fp_tx_session.flags */
#define AGGD_FP_SESSION_ENABLED 0x01 /* 0: every packet of the session goes to the slow path */
#define AGGD_FP_SESSION_ECN 0x02     /* the AQM marks ECN-capable packets CE instead of dropping them */

/* tx_sessions value (key: __u32 slot). */
struct aggd_fp_tx_session {
	__u32 flags;        /* AGGD_FP_SESSION_* */
	__be32 peer_index;  /* the header's Session field: the receiver's index (wire order) */
	__u8 key_id;        /* the header's Key ID for the send key */
	__u8 nlinks;        /* links[0 .. nlinks-1] are looked at */
	__u16 mtu;          /* largest inner packet the fast path sends; larger non-GSO ones go slow */
	__u8 key[16];       /* SipHash send key, layout as aggd_rx_key.key */
	__u32 aqm_gap_us;   /* the daemon's CoDel drop spacing, 0: not dropping (aggd_aqm.h) */
	struct aggd_fp_tx_link links[AGGD_FP_MAX_LINKS];
};

/* tx_seq value (mmap-able array indexed by slot): the next numbers to take.
 * Taken with atomic fetch-and-add by BPF and by the daemon; the low 32 bits
 * go on the wire. */
struct aggd_fp_tx_seq {
	__u64 next_seq;
	__u64 link_seq[AGGD_FP_MAX_LINKS]; /* indexed like aggd_fp_tx_session.links */
};

/*
 * tx_sent_log value (key: slot * AGGD_FP_MAX_LINKS + link slot): which global
 * sequence number each recent packet on the link carried, for the loss notice
 * the daemon sends when the link goes down. Entry link_seq % AGGD_FP_SENT_LOG
 * holds (link_seq << 32) | seq, written in one 8-byte store, so the daemon
 * reads an entry whole and knows from its link_seq whether it is current.
 * Packets sent with a redundant copy are not written (the copy may arrive).
 */
#define AGGD_FP_SENT_LOG 1024 /* a power of two */
struct aggd_fp_sent_log {
	__u64 entry[AGGD_FP_SENT_LOG];
};

/*
 * tx_kept (hash of maps, key: slot): the session's ring of the packets the
 * fast path sent, for the daemon's rescue copies when a link goes into doubt
 * (internal/tunnel/rescue.go; the daemon keeps its own packets itself). An
 * array of AGGD_FP_KEPT values; the packet with global sequence number seq is
 * in element seq % AGGD_FP_KEPT, as long as no newer one took its place. The
 * daemon creates a session's ring (389 kB) once the kernel has sent for the
 * session, and deletes it with the session.
 *
 * Written without a lock, read by the daemon while CPUs may write: seq_tail
 * is set first, then the packet, then seq_head, both with an atomic exchange
 * (ordered). The daemon copies an element from its start to its end, and
 * takes it only if both numbers are the one it asked for: a writer that began
 * before the copy ended has changed seq_tail by then.
 * Packets longer than AGGD_FP_KEPT_BYTES are not kept (nor a jumbo frame's
 * rescue: TCP recovers it as it would without).
 */
#define AGGD_FP_KEPT 256 /* a power of two: as many as the daemon keeps (rescueSlots) */
#define AGGD_FP_KEPT_BYTES 1500
struct aggd_fp_kept {
	__u64 seq_head; /* written last; 64 bits for the atomic exchange */
	__u32 len;      /* of the inner packet in data */
	__u8 data[AGGD_FP_KEPT_BYTES];
	__u64 seq_tail; /* written first */
};

/* The scheduler's bookkeeping (aggd_sched.h): written under the tx_sched
 * value's lock, read without it for the decision. */
struct aggd_fp_sched_state {
	__u64 backlog_end_ns[AGGD_FP_MAX_LINKS]; /* when the link's virtual queue drains */
	__s64 tie_credit[AGGD_FP_MAX_LINKS];     /* round-robin credit among tied links, bits/s */
};

/* tx_sched value (key: slot): the earliest-expected-arrival bookkeeping,
 * BPF only. */
struct aggd_fp_tx_sched {
	struct bpf_spin_lock lock;
	__u32 aqm_next_us; /* when the next AQM drop is due (aggd_aqm.h), 0: none scheduled */
	__u32 aqm_last_us; /* when the AQM's schedule last saw a packet (aggd_aqm.h), 0: none */
	__u32 pad;
	struct aggd_fp_sched_state st;
};

/* tx_link_stats value (per-CPU array indexed by slot * AGGD_FP_MAX_LINKS + link). */
struct aggd_fp_link_counts {
	__u64 packets;
	__u64 bytes;   /* inner bytes */
	__u64 copies;  /* redundant copies sent on this link for a suspect one */
	__u64 pad;
};

/* tx_session_stats value (per-CPU array indexed by slot): what the bond's AQM
 * did to the session's packets in the kernel, for the daemon's per-peer
 * counts (the verdict counts are the whole program's). */
struct aggd_fp_session_counts {
	__u64 aqm_drops;     /* dropped (AGGD_FP_TX_AQM_DROP) */
	__u64 aqm_drops_ect; /* of aqm_drops, the ECN-capable */
	__u64 aqm_marks;     /* marked CE and sent (AGGD_FP_TX_AQM_MARK) */
	__u64 pad;
};

/* tx_verdicts / rx_verdicts index: what happened to a packet, per-CPU counts.
 * FAST is the fast path's own work; every other verdict is a hand-up to the
 * slow path (TX: the daemon reads it from agg0; RX: from its UDP socket) or,
 * for *_DROP_*, a drop. Append new verdicts before __COUNT. */
enum aggd_fp_tx_verdict {
	AGGD_FP_TX_FAST = 0,        /* encapsulated and redirected */
	AGGD_FP_TX_NOT_IP = 1,      /* neither IPv4 nor IPv6 */
	AGGD_FP_TX_NO_ROUTE = 2,    /* no session for the inner destination */
	AGGD_FP_TX_DISABLED = 3,    /* session not enabled for the fast path */
	AGGD_FP_TX_GSO = 4,         /* GSO super-packet */
	AGGD_FP_TX_OVERSIZE = 5,    /* longer than the session's mtu */
	AGGD_FP_TX_NO_LINK = 6,     /* no usable link */
	AGGD_FP_TX_NO_NEIGH = 7,    /* chosen link's gateway not resolved */
	AGGD_FP_TX_ENCAP_FAILED = 8,/* a helper refused (room, headroom) */
	AGGD_FP_TX_AQM_DROP = 9,    /* dropped by the bond's AQM (aggd_aqm.h) */
	AGGD_FP_TX_AQM_MARK = 10,   /* marked CE by the bond's AQM (aggd_ecn.h), then sent: also counted by its fate */
	AGGD_FP_TX_AQM_DROP_ECT = 11, /* of AQM_DROP, the ECN-capable (aqm.ecn off, or a mark failed): also counted there */
	AGGD_FP_TX__COUNT,
};

enum aggd_fp_rx_verdict {
	AGGD_FP_RX_FAST = 0,         /* in order: decapsulated into agg0 */
	AGGD_FP_RX_NOT_DATA = 1,     /* control message: to the daemon */
	AGGD_FP_RX_NO_SESSION = 2,   /* session not enabled for the fast path */
	AGGD_FP_RX_GAP = 3,          /* ahead of the next expected: ownership to the daemon */
	AGGD_FP_RX_DAEMON_OWNS = 4,  /* the daemon owns ordering: to the daemon */
	AGGD_FP_RX_DROP_OLD = 5,     /* behind the next expected (duplicate or late): dropped */
	AGGD_FP_RX_DECAP_FAILED = 6, /* a helper refused: to the daemon */
	AGGD_FP_RX_MALFORMED = 7,    /* not a whole aggd header: to the daemon, which counts the reason */
	AGGD_FP_RX_LATE_COPY = 8,    /* a copy of a number the daemon gave up: delivered, out of order */
	AGGD_FP_RX__COUNT,
};

/* ---- receive (tc ingress on uplinks) ---------------------------------------- */

/*
 * rx_order value (key: the session's receive index in wire order, as the
 * header's Session field and the shield's sessions map). Its presence enables
 * the fast path's receive side for the session.
 *
 * Ownership protocol (docs/fastpath.md, model in test/model/handover.pml):
 *  - owner BPF: a DATA packet with seq == next is delivered by BPF (next++);
 *    seq behind next is dropped (DROP_OLD); seq ahead of next is a gap: BPF
 *    sets owner = DAEMON, epoch++, leaves next as the handover point, counts
 *    the packet in rx_divert and passes it up. BPF writes owner/next/epoch
 *    only while it owns, and when it accepts a handback.
 *  - owner DAEMON: every DATA packet is counted in rx_divert and passed up.
 *    The daemon counts the session's DATA packets it receives ("consumed").
 *    When its resequencer is empty it posts a handback: req_valid = 1,
 *    req_stamp = consumed, req_next = its next expected, other fields as it
 *    read them (it writes the whole value with BPF_F_LOCK; BPF changes nothing
 *    but on acceptance while the daemon owns, so nothing is lost).
 *  - BPF accepts a handback, on the next DATA packet, iff req_valid and
 *    req_stamp == rx_divert's count: nothing was diverted that the daemon has
 *    not consumed. Then owner = BPF, next = req_next, req_valid = 0, and the
 *    packet is judged as under owner BPF. A stale request (stamp behind the
 *    count) can never match again: the count only grows.
 *  - After posting, the daemon reads rx_divert's count and then rx_order when
 *    its next DATA packet arrives: epoch moved means BPF accepted and has
 *    since handed over again at next; epoch unchanged with the count beyond
 *    the stamp means the request died (the daemon still owns); with the count
 *    at the stamp, no packet has judged it yet, and the packet in hand is one
 *    the daemon's count already held (it had taken it for lost): dropped.
 *  - A passed-up packet lost on the host leaves the counts apart: the daemon
 *    finds it by the note BPF keeps of the last packet it counted
 *    (last_before and the packet's link and link sequence number), or after a
 *    quiet second, and corrects its count (docs/fastpath-ordering.md 4.4).
 *  - Late copies. Only the daemon gives sequence numbers up (BPF hands over at
 *    a gap instead), and a redundant copy (AGGD_FLAG_DUPLICATE) of a number
 *    it gave up is to be delivered when it comes, out of order (the daemon's
 *    reseq.PushCopy): a dead link's packets are given up as soon as the
 *    links left show nothing more can come, and their rescue copies follow a
 *    moment later. So the handback carries req_skipped: bit i set means the
 *    daemon gave up req_next - 1 - i and has not delivered it. On acceptance
 *    BPF takes it as skipped, with skipped_end = req_next. Under owner BPF a
 *    copy behind next whose bit is set is delivered and its bit cleared (one
 *    delivery per number); it is not counted in rx_divert (it never reaches
 *    the daemon), and next does not move.
 */
#define AGGD_FP_OWNER_BPF 0
#define AGGD_FP_OWNER_DAEMON 1

struct aggd_fp_rx_order {
	struct bpf_spin_lock lock;
	__u32 owner;     /* AGGD_FP_OWNER_* */
	__u32 next;      /* owner BPF: next expected seq; owner DAEMON: where BPF handed over */
	__u32 epoch;     /* BPF -> daemon handovers so far */
	__u32 req_valid; /* 1: a handback request is posted */
	__u32 req_stamp; /* low 32 bits of the daemon's consumed count */
	__u32 req_next;  /* where BPF continues if it accepts */
	/* The latest DATA packet counted in rx_divert: the count before it, and
	 * its link and link sequence number. BPF writes them under the lock as it
	 * counts; the daemon only reads them, and writes back what it read when it
	 * posts (an older note, but as true: a packet and the count before it).
	 * When that packet reaches the daemon, it compares the count with its
	 * own: what stays missing was lost on the host (the tally,
	 * internal/handover). */
	__u32 last_before;
	__u32 last_link_seq;
	__u32 last_link;
	/* Late copies (above): the numbers the daemon gave up below skipped_end,
	 * as the accepted handback's req_skipped. BPF clears a bit as it
	 * delivers that number's copy. */
	__u32 skipped_end;
	__u32 pad;
	__u64 req_skipped;
	__u64 skipped;
};

/* rx_divert value (key as rx_order): DATA packets passed up to the daemon
 * while it owned ordering (low 32 bits compared with req_stamp). BPF only. */
struct aggd_fp_rx_divert {
	__u64 count;
};

/* rx_config value (array, key 0): where in-order packets go. */
struct aggd_fp_rx_config {
	__u32 agg0_ifindex; /* 0: deliver nothing (every DATA packet goes up) */
	__u32 pad;
};

/* rx_link_stats key and value: what BPF delivered per session and link (the
 * daemon adds it to its own counts for feedback and metrics). */
struct aggd_fp_rx_link_key {
	__be32 session; /* wire order, as rx_order's key */
	__u32 link_id;
};

struct aggd_fp_rx_link_stats {
	__u64 packets;
	__u64 bytes;     /* inner bytes */
	__u32 max_link_seq;
	__u32 last_tstamp; /* the header's timestamp of the latest packet */
	__u64 last_arrival_ns; /* bpf_ktime_get_ns() of the latest packet */
};

_Static_assert(sizeof(struct aggd_fp_route_key) == 24, "route key is 24 bytes");
_Static_assert(sizeof(struct aggd_fp_tx_link) == 88, "tx link is 88 bytes");
_Static_assert(__builtin_offsetof(struct aggd_fp_tx_link, saddr) == 24, "addresses 4-aligned");
_Static_assert(__builtin_offsetof(struct aggd_fp_tx_link, rate_bps) == 72, "rate 8-aligned");
_Static_assert(sizeof(struct aggd_fp_tx_session) == 32 + 88 * AGGD_FP_MAX_LINKS, "tx session layout");
_Static_assert(__builtin_offsetof(struct aggd_fp_tx_session, links) == 32, "links at 32");
_Static_assert(sizeof(struct aggd_fp_tx_seq) == 8 + 8 * AGGD_FP_MAX_LINKS, "tx seq layout");
_Static_assert((AGGD_FP_SENT_LOG & (AGGD_FP_SENT_LOG - 1)) == 0, "sent log size is a power of two");
_Static_assert((AGGD_FP_KEPT & (AGGD_FP_KEPT - 1)) == 0, "kept ring size is a power of two");
_Static_assert(sizeof(struct aggd_fp_kept) == 12 + AGGD_FP_KEPT_BYTES + 8, "kept packet layout");
_Static_assert(__builtin_offsetof(struct aggd_fp_kept, seq_tail) == 12 + AGGD_FP_KEPT_BYTES, "kept tail unpadded");
_Static_assert(sizeof(struct aggd_fp_tx_sched) == 16 + 2 * 8 * AGGD_FP_MAX_LINKS, "tx sched layout");
_Static_assert(sizeof(struct aggd_fp_session_counts) == 32, "session counts are 32 bytes");
_Static_assert(sizeof(struct aggd_fp_rx_order) == 64, "rx order is 64 bytes");
_Static_assert(__builtin_offsetof(struct aggd_fp_rx_order, req_skipped) == 48, "skipped bits 8-aligned");
_Static_assert(sizeof(struct aggd_fp_rx_link_stats) == 32, "rx link stats is 32 bytes");

#endif /* AGGD_FASTPATH_H */
