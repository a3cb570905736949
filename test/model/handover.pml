/*
 * handover.pml: a SPIN model of the receive-ordering ownership protocol
 * between the BPF receive program (bpf/tc_rx.c, bpf/include/aggd_order.h)
 * and the daemon (internal/handover), as written down at struct
 * aggd_fp_rx_order in bpf/include/aggd_fastpath.h and in ARCHITECTURE §4.
 * Prose, properties and results: docs/fastpath-ordering.md.
 * Run: test/model/check.sh (or go test ./test/model).
 *
 * What is atomic here, and why (the kernel's real granularity):
 *  - d_step { ... } inside Rx = the section between bpf_spin_lock and
 *    bpf_spin_unlock on the session's rx_order value: the handback check,
 *    the decision and the rx_divert increment (tc_rx.c increments the
 *    divert count while it still holds the lock).
 *  - The pass-up to the daemon's UDP socket (TC_ACT_OK) and the redirect
 *    into agg0 (bpf_redirect, acted on after the program returns) are
 *    separate later steps: the other CPU and the daemon run in between.
 *    (Taking the packet off its link is folded into the locked step: it
 *    touches only that CPU's own input and commutes with everything.)
 *  - The daemon: receiving a packet (and counting it), the lookup that
 *    learns a pending handback's fate, each write() into agg0, and the
 *    handback's read and its write are all separate steps. Its purely local
 *    resequencer bookkeeping is folded into the step before it.
 *  - Finished packets' locals are reset, so they leave no trace in the
 *    state vector (this keeps N=5..6 within seconds).
 *  - The daemon's map lookup and its map update (both BPF_F_LOCK) are each
 *    one atomic step; its read-then-write (posting a handback) is two.
 *  - agg0 is not one queue: a redirect from tc ingress lands in the backlog
 *    of the CPU that ran the program and the daemon's write lands wherever
 *    the daemon's thread runs; the stack drains those queues
 *    independently. The Stack process models that.
 *
 * Scenario (chosen nondeterministically in init, then fixed): packets
 * 0..N-1, each on link 0 or link 1 (FIFO channels, all sent up front: only
 * the arrival interleaving matters, and the receivers take from the two
 * links in every possible interleaving), at most NLOSS copies lost on a link, at most NDUP
 * packets with a redundant copy (on either link), and at most NCANNOT
 * packets that BPF cannot deliver (AGGD_ORDER_CANNOT: it hands over at next
 * instead, a gap of size zero).
 *
 * Switches (spin -D...):
 *  N, NLOSS, NDUP, NCANNOT  scenario bounds (defaults 4, 1, 1, 1)
 *  RPS                      both uplinks processed on one CPU (RPS steering)
 *  DAEMON_SYNC              the daemon's write into agg0 has passed through
 *                           the stack when write() returns (else it sits in
 *                           the daemon CPU's backlog like any other packet)
 *  AGG0_RPS                 agg0's packets are all steered into CPU 0's
 *                           backlog (RPS on agg0): the daemon's writes join
 *                           the same FIFO queue as BPF's redirects
 *  CHECK_OUT_ORDER          assert agg0 receives packets in sequence order
 *  INIT_BPF                 the entry starts owned by BPF (default: by the
 *                           daemon with epoch 0, as internal/handover.New)
 *  Deliberate protocol breakages (each must produce a counterexample):
 *  COUNT_AFTER_UNLOCK       rx_divert incremented after bpf_spin_unlock
 *  REPOST                   the daemon may post again without having
 *                           consumed a packet since its last post
 *  SOCKDROP                 the daemon's socket may drop one passed-up
 *                           packet (receive buffer full)
 *  FIX_RESYNC               (with SOCKDROP) the proposed recovery: an idle
 *                           daemon adopts rx_divert's count once nothing
 *                           counted can still be on its way
 *  FIX_TALLY                (with SOCKDROP) the recovery while traffic
 *                           flows (internal/handover/tally.go): a passed-up
 *                           packet carries the count before it (the kernel
 *                           notes it in rx_order; here it travels with the
 *                           packet); when it reaches the daemon, and nothing
 *                           counted before it is still on its way, the
 *                           daemon may raise its count by what is missing
 *  TALLY_EARLY              (with FIX_TALLY) the tally's window assumption
 *                           broken: it may count a packet still on its way
 *                           as lost; with STRICT=0 that packet may then
 *                           reach the daemon as a stray, or while its
 *                           handback is not yet judged, and it drops it
 *                           (the end-state check allows exactly that loss)
 *  RESYNC_EARLY             (with FIX_RESYNC) the same for the quiet period:
 *                           the resync may come while a packet is on its way
 *  DIED_BY_EPOCH            the daemon's old reading of a pending handback:
 *                           epoch unchanged and owner daemon = died, without
 *                           asking the count whether the request was judged
 *  CLEAR_STALE              hardening: BPF clears a request that does not
 *                           match (a request is judged by one packet only)
 *  OVERCOUNT                the daemon counts one DATA packet BPF never
 *                           counted (e.g. one BPF passed up as MALFORMED)
 *  STRICT=0                 tolerate (as aggd_order.h does) a request found
 *                           while BPF owns, to see what the breakage causes
 *  LIVE_CHECK=0             skip the end-state "handback would succeed"
 *                           check, to look past it for a safety violation
 *  WITNESS=k                assert that situation k never happens, to prove
 *                           the model reaches it: 1 stale request judged,
 *                           2 handback accepted, 3 handover, 4 daemon sees
 *                           the epoch moved, 5 daemon sees its request died,
 *                           6 hold timer skips a lost packet, 7 the
 *                           tally corrects the daemon's count
 */

#ifndef N
#define N 4
#endif
#ifndef NLOSS
#define NLOSS 1
#endif
#ifndef NDUP
#define NDUP 1
#endif
#ifndef NCANNOT
#define NCANNOT 1
#endif
#ifndef WITNESS
#define WITNESS 0
#endif
#ifndef STRICT
#define STRICT 1      /* a request found while BPF owns is a violation */
#endif
#ifndef LIVE_CHECK
#define LIVE_CHECK 1  /* at the end, the next packet would hand back */
#endif
#ifdef CHECK_OUT_ORDER
#define AGG0    /* model agg0's queues (else a redirect is just the decision) */
#endif

#define QCAP (2*N)    /* no channel ever blocks a sender */

#define OWNER_BPF    0   /* AGGD_FP_OWNER_BPF */
#define OWNER_DAEMON 1   /* AGGD_FP_OWNER_DAEMON */

/* The decision's outcome (aggd_order_action, folded). */
#define A_DELIVER 1   /* (0: no packet in hand) */
#define A_DROP    2
#define A_UP      3      /* passed up to the daemon's socket */

/* A reachability witness: with -DWITNESS=k, situation k is asserted never
 * to happen, so the check must fail (see check.sh). */
#define WIT(k) assert(WITNESS != k)

/* ---- shared kernel state ----------------------------------------------- */

/* struct aggd_fp_rx_order (the lock is the d_step). */
typedef RxOrder {
	bit  owner;
	byte next;
	byte epoch;
	bit  req_valid;
	byte req_stamp;
	byte req_next;
};
RxOrder ord;

byte divert;             /* struct aggd_fp_rx_divert .count: BPF only */

/* ---- channels ---------------------------------------------------------- */

chan link0 = [QCAP] of { byte };   /* uplink 0, FIFO */
chan link1 = [QCAP] of { byte };   /* uplink 1, FIFO */
chan sock  = [QCAP] of { byte, byte };   /* the daemon's UDP socket: seq, and the divert count before it (FIX_TALLY; else 0) */
chan bl0   = [QCAP] of { byte };   /* agg0 backlog of the CPU running Rx 0 */
chan bl1   = [QCAP] of { byte };   /* agg0 backlog of the CPU running Rx 1 */
chan bld   = [QCAP] of { byte };   /* agg0 backlog of the daemon's CPU */

/* ---- the daemon's state (global so the end-state check can read it) ---- */

byte d_next;             /* its resequencer's next expected */
bit  d_held[N];          /* held out-of-order packets */
byte d_nheld;
byte d_consumed;         /* DATA packets received (handover.Daemon.consumed) */
bit  d_posted;           /* handback posted, outcome unknown (.posted) */
byte d_epoch;            /* epoch read when it posted (.epoch) */
byte d_stamp;            /* the pending handback's stamp (.postedAt) */

/* ---- ghost state: what really happened -------------------------------- */

byte ncopy[N];           /* copies sent */
byte nlost[N];           /* copies lost on a link (or, SOCKDROP, on the host) */
byte inflight[N];        /* copies that may still reach BPF or the daemon */
byte ndecided[N];        /* "deliver" decisions (BPF under lock, or daemon) */
short last_decided = -1; /* highest seq decided so far */
byte nout[N];            /* copies that came out of agg0 into the stack */
short last_out = -1;
byte cannot_seq = N;    /* the packet BPF cannot deliver (N: none) */
#ifdef SOCKDROP
bit sockdrop_used;
#endif
#ifdef FIX_RESYNC
byte pending_up;         /* counted in rx_divert, not yet consumed or dropped */
#endif
#ifdef FIX_TALLY
bit counted_pending[2*N+1]; /* by divert count: counted, not yet consumed or dropped */
#endif
#if defined(TALLY_EARLY) || defined(RESYNC_EARLY)
#define EARLY
bit stray_dropped[N];    /* a copy reached the daemon as a stray and was dropped */
#endif
#ifdef OVERCOUNT
bit overcount_used;
#endif

/* A deliver decision: exactly once per seq, in increasing seq order. */
inline decide(s) {
	assert(ndecided[s] == 0);           /* no packet delivered twice */
	ndecided[s]++;
	assert(s > last_decided);           /* decisions in sequence order */
	last_decided = s
}

/* A packet leaves agg0's receive path into the stack. */
inline output(s) {
	nout[s]++;
	printf("EV agg0: seq %d enters the stack\n", s);
	assert(nout[s] == 1);
#ifdef CHECK_OUT_ORDER
	assert(s > last_out);               /* what the stack sees is in order */
#endif
	if
	:: s > last_out -> last_out = s
	:: else -> skip
	fi
}

/* ---- BPF receive program: one process per CPU -------------------------- */

/* The locked section for packet s taken off a link: bpf_spin_lock, the
 * handback check and the decision (aggd_order_judge), the rx_divert add,
 * bpf_spin_unlock. Taking the packet off the link is folded into the same
 * step: it touches nothing but this CPU's own input, so it commutes with
 * every other process's step and folding it in loses no interleaving. */
inline judge(s) {
	/* Whether the packet can be delivered at all is known before the
	 * lock (aggd_order_pkt): cannot_seq is AGGD_ORDER_CANNOT, a property
	 * of the packet such as being an IPv4 first fragment. */
	/* 1. a posted handback */
	if
	:: ord.req_valid && ord.owner == OWNER_DAEMON && ord.req_stamp == divert ->
	     ord.owner = OWNER_BPF; ord.next = ord.req_next; ord.req_valid = 0;
	     printf("EV cpu%d: accepts handback (stamp %d == divert), next=%d\n", cpu, ord.req_stamp, ord.next);
	     WIT(2)                                  /* handback accepted */
	:: ord.req_valid && ord.owner == OWNER_DAEMON && ord.req_stamp != divert ->
	     printf("EV cpu%d: stale handback (stamp %d, divert %d)\n", cpu, ord.req_stamp, divert);
#ifdef CLEAR_STALE
	     ord.req_valid = 0;                      /* hardening: a request is judged once */
#endif
	     WIT(1)                                  /* a stale request seen */
	:: ord.req_valid && ord.owner == OWNER_BPF ->
	     /* aggd_order.h ignores and clears such a request. A correct
	      * daemon posts only while it owns, so with STRICT (the
	      * default) reaching this is itself a violation. */
	     printf("EV cpu%d: request found while BPF owns: cleared\n", cpu);
	     assert(!STRICT);
	     ord.req_valid = 0
	:: else -> skip
	fi;
	/* 2..4. the decision */
	if
	:: ord.owner == OWNER_DAEMON ->
	     act = A_UP;
	     printf("EV cpu%d: seq %d: daemon owns, pass up\n", cpu, s)
	:: ord.owner == OWNER_BPF && s < ord.next ->
	     act = A_DROP; inflight[s]--;
	     printf("EV cpu%d: seq %d: behind next=%d, drop\n", cpu, s, ord.next)
	:: ord.owner == OWNER_BPF && s == ord.next && s != cannot_seq ->
	     ord.next++; act = A_DELIVER; inflight[s]--;
	     printf("EV cpu%d: seq %d: DELIVER decided (lock held)\n", cpu, s);
	     decide(s)
	:: else ->                                   /* a gap, or next but undeliverable */
	     ord.owner = OWNER_DAEMON; ord.epoch++; act = A_UP;
	     printf("EV cpu%d: seq %d: hand over at next=%d, epoch=%d, pass up\n", cpu, s, ord.next, ord.epoch);
	     WIT(3)                                  /* a handover */
	fi;
#ifdef FIX_TALLY
	if
	:: act == A_UP -> tg = divert; counted_pending[divert] = 1
	:: else -> skip
	fi;
#endif
#ifndef COUNT_AFTER_UNLOCK
	if
	:: act == A_UP -> divert++
	:: else -> skip
	fi;
#endif
#ifdef FIX_RESYNC
	if
	:: act == A_UP -> pending_up++
	:: else -> skip
	fi;
#endif
	skip
}

/* One CPU's tc ingress: judge each packet under the lock, then, after the
 * unlock, pass it up or redirect it. la and lb are the uplinks whose
 * packets this CPU processes (with RPS: both). Locals are reset when a
 * packet is done, so finished packets leave no trace in the state. */
proctype Rx(byte cpu; chan la; chan lb; chan backlog) {
	byte s, act, tg;
	xr la;
#ifdef RPS
	xr lb;
#endif
#if defined(AGG0) && !defined(AGG0_RPS)
	xs backlog;
#endif
end:
	do
	:: if
	   :: d_step { la ? s; judge(s); if :: act == A_DROP -> s = 0; act = 0 :: else fi }
#ifdef RPS
	   :: d_step { lb ? s; judge(s); if :: act == A_DROP -> s = 0; act = 0 :: else fi }
#endif
	   fi;
	   /* after bpf_spin_unlock */
	   if
	   :: act == A_DELIVER ->
#ifdef AGG0
	        d_step { backlog ! s; s = 0; act = 0 }    /* bpf_redirect(agg0, BPF_F_INGRESS) */
#else
	        s = 0; act = 0                            /* (agg0 not modelled) */
#endif
	   :: act == A_UP ->
#ifdef COUNT_AFTER_UNLOCK
	        divert++;                                 /* BROKEN: outside the lock */
#endif
	        d_step { sock ! s, tg; s = 0; act = 0; tg = 0 } /* TC_ACT_OK: up to the daemon's socket */
	   :: else -> skip                                /* A_DROP: TC_ACT_SHOT */
	   fi
	od
}

/* ---- the daemon --------------------------------------------------------- */

/* The resequencer's decisions for packet s, made in one step (they touch
 * only the daemon's own state and the ghost record). Released packets are
 * the contiguous range [w_from, w_to); they are written into agg0
 * afterwards, one write() each (write_out). */
inline release_run() {
	do
	:: d_next < N && d_held[d_next] ->
	     d_held[d_next] = 0; d_nheld--;
	     printf("EV daemon: held seq %d released\n", d_next);
	     decide(d_next);
	     d_next++
	:: else -> break
	od;
	w_to = d_next
}

inline reseq(s) {
	if
	:: s < d_next -> skip                        /* duplicate or late: dropped */
	:: s == d_next ->
	     printf("EV daemon: seq %d released\n", s);
	     w_from = s; decide(s); d_next++; release_run()
	:: s > d_next && d_held[s] -> skip           /* duplicate: dropped */
	:: else -> d_held[s] = 1; d_nheld++;         /* held */
	     printf("EV daemon: seq %d held (next %d)\n", s, d_next)
	fi
}

/* The writes of what was released, in order, before the daemon does
 * anything else (write() returns before Idle posts a handback). */
inline write_out() {
	do
	:: w_from < w_to ->
#ifdef AGG0
#if defined(DAEMON_SYNC)
	     d_step { output(w_from); w_from++ }      /* the stack took it before write() returned */
#elif defined(AGG0_RPS)
	     d_step { bl0 ! w_from; printf("EV daemon: write seq %d (CPU 0 backlog, agg0 RPS)\n", w_from); w_from++ }
#else
	     d_step { bld ! w_from; printf("EV daemon: write seq %d (daemon CPU backlog)\n", w_from); w_from++ }
#endif
#else
	     w_from++
#endif
	:: else -> w_from = 0; w_to = 0; break
	od
}

/* One BPF_F_LOCK lookup of the whole value. */
inline read_order(r) {
	r.owner = ord.owner; r.next = ord.next; r.epoch = ord.epoch;
	r.req_valid = ord.req_valid; r.req_stamp = ord.req_stamp; r.req_next = ord.req_next
}

inline clear_r(r) {
	r.owner = 0; r.next = 0; r.epoch = 0; r.req_valid = 0; r.req_stamp = 0; r.req_next = 0
}

/* One BPF_F_LOCK update of the whole value: what was read in r, with a
 * handback request. */
inline post(r) {
	ord.owner = r.owner; ord.next = r.next; ord.epoch = r.epoch;
	ord.req_valid = 1; ord.req_stamp = d_consumed; ord.req_next = d_next;
	d_stamp = d_consumed
}

proctype Daemon() {
	byte s, tg, cnt, w_from, w_to;
	bit stray;
#ifdef FIX_TALLY
	byte i, missing;
	bit early;
#endif
	RxOrder r;
	xr sock;
#if defined(AGG0) && !defined(DAEMON_SYNC) && !defined(AGG0_RPS)
	xs bld;
#endif
end:
	do
	/* A DATA packet from the socket (session.go receive -> OnData, then
	 * the resequencer). Counted as consumed on receipt. */
	:: d_step {
	     sock ? s, tg ->
#ifdef FIX_TALLY
	     /* The tally's sample: the kernel counted tg packets before this
	      * one, the daemon has consumed d_consumed. Abstract window: the
	      * sample may count only once nothing counted before this packet
	      * is still on its way (a packet on its way arrives within the
	      * window; one lost never does). */
	     counted_pending[tg] = 0;
	     early = 0; i = 0;
	     do
	     :: i < tg -> early = early | counted_pending[i]; i++
	     :: else -> break
	     od;
#ifdef TALLY_EARLY
	     early = 0;
#endif
	     if
	     :: !early && tg > d_consumed -> missing = tg - d_consumed
	     :: else -> missing = 0
	     fi;
	     i = 0; early = 0;
#endif
	     d_consumed++; inflight[s]--; tg = 0;
#ifdef FIX_RESYNC
	     pending_up--;
#endif
	     printf("EV daemon: receives seq %d, consumed=%d\n", s, d_consumed);
	     if
	     :: !d_posted -> reseq(s); s = 0
	     :: else
	     fi
	   };
#ifdef FIX_TALLY
	   /* The window may close now or after later samples (then this one
	    * is forgotten, and a later one shows the same loss). */
	   if
	   :: missing > 0 ->
	        d_step {
	          printf("EV daemon: tally: %d counted packets missing, consumed %d -> %d\n",
	                 missing, d_consumed, d_consumed + missing);
	          d_consumed = d_consumed + missing; missing = 0;
	          WIT(7)
	        }
	   :: missing > 0 -> missing = 0
	   :: else -> skip
	   fi;
#endif
	   if
	   :: d_posted ->
	      /* A handback is pending: handover.OnData looks up rx_divert's
	       * count, then (a separate BPF_F_LOCK lookup) the ordering state,
	       * which tell the request's fate; then the packet goes into the
	       * resequencer. */
#ifndef DIED_BY_EPOCH
	      d_step { cnt = divert };
#endif
	      d_step {
	        read_order(r);
	        if
	        :: r.epoch != d_epoch ->
	             /* accepted, and BPF has handed over again at r.next:
	              * restart the (empty) resequencer there */
	             assert(r.owner == OWNER_DAEMON);
	             assert(d_nheld == 0);
	             d_next = r.next; d_epoch = r.epoch;
	             printf("EV daemon: epoch moved to %d: restart at %d\n", r.epoch, r.next);
	             WIT(4)
#ifndef DIED_BY_EPOCH
	        :: r.owner == OWNER_DAEMON && cnt == d_stamp ->
	             /* Nothing counted since the post (up to the count's
	              * lookup), nothing accepted (up to the state's): no packet
	              * has judged the request, and this one was counted before
	              * it was posted. The daemon's count already holds it (a
	              * tally or a resync took it for lost): dropped without
	              * being counted again (handover.ErrCountedBefore), the
	              * request stays pending. Impossible unless the window or
	              * quiet-period assumption failed. */
	             printf("EV daemon: seq %d came before its handback was judged: dropped\n", s);
	             assert(!STRICT);
	             d_consumed--; stray = 1;
#ifdef EARLY
	             stray_dropped[s] = 1
#endif
#endif
	        :: r.owner == OWNER_DAEMON ->
	             /* the request died; the daemon still owns */
	             printf("EV daemon: epoch unchanged (%d): request died\n", r.epoch);
	             WIT(5)
	        :: else ->
	             /* BPF owns and never passed this packet up: a stray
	              * (handover.ErrKernelOwns). The protocol must make this
	              * impossible; with STRICT=0 the daemon does what
	              * internal/handover documents: uncount it, drop it, and
	              * keep the request pending. */
	             printf("EV daemon: seq %d is a stray (BPF owns, epoch %d)\n", s, r.epoch);
	             assert(!STRICT);
	             d_consumed--; stray = 1;
#ifdef EARLY
	             stray_dropped[s] = 1
#endif
	        fi;
	        if
	        :: stray -> stray = 0; clear_r(r); s = 0
	        :: else ->
	             d_posted = 0; clear_r(r);
	             reseq(s); s = 0
	        fi;
	        cnt = 0
	      }
	   :: else -> skip
	   fi;
	   write_out()

	/* The hold timer fires. Abstract timer: longer than any packet can be
	 * on its way, so it fires only once the missing packet can no longer
	 * arrive (no copy left on a link, at a CPU or in the socket). That
	 * packet must then really have been lost on a link: if the protocol
	 * let BPF deliver or drop a packet the daemon waits for, this fails. */
	:: d_step {
	     d_nheld > 0 && inflight[d_next] == 0 ->
	     printf("EV daemon: hold timer skips seq %d\n", d_next);
#ifdef EARLY
	     assert(nlost[d_next] == ncopy[d_next] || stray_dropped[d_next]);
#else
	     assert(nlost[d_next] == ncopy[d_next]);
#endif
	     WIT(6);
	     d_next++; w_from = d_next; release_run()
	   };
	   write_out()

	/* Empty, and a packet consumed since the last post (handover Idle):
	 * post a handback. Read, then write back what was read with the
	 * request fields set: two separate BPF_F_LOCK accesses, BPF may run
	 * in between. Before them Idle looks up rx_divert's count: a stamp
	 * above it could match later, when the daemon has given the request
	 * up, so a count of its own above the kernel's (a tally or resync that
	 * took a packet for lost which came after all) comes down to it. */
	:: d_step { d_nheld == 0 && !d_posted ->
	     if
	     :: d_consumed > divert ->
	          printf("EV daemon: consumed %d above the count %d: down to it\n", d_consumed, divert);
	          d_consumed = divert
	     :: else -> skip
	     fi
	   };
	   d_step { read_order(r) };
	   d_step {
	     assert(r.owner == OWNER_DAEMON);      /* Idle's "changed by someone else" */
	     post(r);
	     printf("EV daemon: posts handback stamp=%d next=%d (epoch %d)\n", d_consumed, d_next, r.epoch);
	     d_epoch = r.epoch; d_posted = 1; clear_r(r)
	   }
#ifdef REPOST
	/* BROKEN: post again although the last request may still be accepted
	 * (no packet consumed since). */
	:: d_step { d_nheld == 0 && d_posted -> read_order(r) };
	   d_step { post(r); printf("EV daemon: RE-posts stamp=%d next=%d, owner %d as read\n", d_consumed, d_next, r.owner); clear_r(r) }
#endif
#ifdef SOCKDROP
	/* The socket's receive buffer overflows: a counted packet vanishes on
	 * the host (recorded as lost, so the timer may skip it). */
	:: d_step { !sockdrop_used && nempty(sock) -> sock ? s, tg; sockdrop_used = 1; inflight[s]--; nlost[s]++;
#ifdef FIX_TALLY
	               counted_pending[tg] = 0;
#endif
	               tg = 0;
#ifdef FIX_RESYNC
	               pending_up--;
#endif
	               printf("EV socket: drops seq %d (counted in rx_divert)\n", s); s = 0 }
#endif
#ifdef FIX_RESYNC
	/* Proposed fix for SOCKDROP: idle, nothing held, a request pending
	 * and no packet for longer than anything passed up can take to reach
	 * the socket (abstractly: nothing counted is still on its way): what
	 * is missing was dropped on the host. Read rx_order (the outcome of
	 * the pending request, as on a packet) and rx_divert, adopt the count
	 * as consumed, and let Idle post again. */
	:: d_step {
#ifdef RESYNC_EARLY
	     d_nheld == 0 && d_posted && d_consumed != divert ->
#else
	     d_nheld == 0 && d_posted && pending_up == 0 && d_consumed != divert ->
#endif
	     read_order(r);
	     if
	     :: r.epoch != d_epoch -> assert(r.owner == OWNER_DAEMON); d_next = r.next; d_epoch = r.epoch
	     :: else -> assert(r.owner == OWNER_DAEMON)
	     fi;
	     printf("EV daemon: resync consumed %d -> divert %d, next %d\n", d_consumed, divert, d_next);
	     d_consumed = divert; d_posted = 0; clear_r(r)
	   }
#endif
#ifdef OVERCOUNT
	/* The daemon counts a packet BPF did not count. */
	:: d_step { !overcount_used -> overcount_used = 1; d_consumed++;
	               printf("EV daemon: counts a packet BPF did not count, consumed=%d\n", d_consumed) }
#endif
	od
}

/* ---- agg0's receive path: per-CPU backlogs drained independently ------- */

proctype Stack() {
	byte s;
	xr bl0;
	xr bl1;
	xr bld;
end:
	do
	:: d_step { bl0 ? s -> output(s) }
	:: d_step { bl1 ? s -> output(s) }
	:: d_step { bld ? s -> output(s) }
	od
}

/* ---- the end state: nothing can move any more -------------------------- */

proctype Check() {
	byte i;
	timeout ->
	d_step {
	  /* nothing the daemon holds stays held */
	  assert(d_nheld == 0);
	  i = 0;
	  do
	  :: i < N ->
	       /* no loss: delivered exactly once, unless every copy was lost */
#ifdef EARLY
	       assert(ndecided[i] == 1 ||
	              (ndecided[i] == 0 && (nlost[i] == ncopy[i] || stray_dropped[i])));
#else
	       assert(ndecided[i] == 1 ||
	              (ndecided[i] == 0 && nlost[i] == ncopy[i]));
#endif
#ifdef AGG0
	       assert(nout[i] == ndecided[i]);
#endif
	       assert(inflight[i] == 0);
	       i++
	  :: else -> break
	  od;
	  /* the fast path takes over on the next packet: BPF owns, or a
	   * request that matches the divert count is posted */
	  assert(!LIVE_CHECK || ord.owner == OWNER_BPF ||
	         (ord.req_valid && ord.req_stamp == divert))
	}
}

/* ---- the scenario and the processes ------------------------------------ */

init {
	byte s, c, losses, dups;
	atomic {
#ifdef INIT_BPF
	  /* BPF owns from the start; the daemon learns its first handover
	   * point like a handback's fate: it reads the value on its first
	   * packet (as if it had posted in epoch 0). */
	  ord.owner = OWNER_BPF;
	  d_posted = 1;
#else
	  ord.owner = OWNER_DAEMON;  /* internal/handover.New: created daemon-owned, epoch 0 */
#endif
	  s = 0;
	  do
	  :: s < N ->
	       ncopy[s] = 1;
	       if
	       :: dups < NDUP -> dups++; ncopy[s] = 2
	       :: true
	       fi;
	       c = 0;
	       do
	       :: c < ncopy[s] ->
	            if
	            :: link0 ! s; inflight[s]++
	            :: link1 ! s; inflight[s]++
	            :: losses < NLOSS -> losses++; nlost[s]++
	            fi;
	            c++
	       :: else -> break
	       od;
	       s++
	  :: else -> break
	  od;
	  /* which packet (if any: s == N) BPF cannot deliver */
	  s = 0;
	  do
	  :: NCANNOT > 0 && s < N -> s++
	  :: true -> cannot_seq = s; break
	  od;
	  run Daemon();
#ifdef AGG0
	  run Stack();
#endif
	  run Check();
#ifdef RPS
	  run Rx(0, link0, link1, bl0)    /* one CPU runs tc ingress for both uplinks */
#else
	  run Rx(0, link0, link0, bl0);   /* uplink 0's packets on CPU 0 */
	  run Rx(1, link1, link1, bl1)    /* uplink 1's packets on CPU 1 */
#endif
	}
}
