package handover

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/reseq"
)

// kernel is an in-memory model of the BPF side (bpf/include/aggd_order.h),
// for tests that need no kernel: the real program is checked against the
// same daemon code in internal/bpf (TestRxDiff).
type kernel struct {
	mu      sync.Mutex
	o       Order
	divert  uint64
	readErr error
}

type action int

const (
	deliver action = iota
	dropOld
	gap
	daemonOwns
)

func (k *kernel) ReadOrder(uint32) (Order, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.o, k.readErr
}

func (k *kernel) WriteOrder(_ uint32, o Order) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.o = o
	return nil
}

// packet judges one DATA packet the way aggd_order_judge does; the packet's link
// sequence number is its sequence number (one link).
func (k *kernel) packet(seq uint32, onDeliver func()) action {
	k.mu.Lock()
	defer k.mu.Unlock()
	o := &k.o
	if o.ReqValid {
		if o.Owner != OwnerBPF && o.ReqStamp == uint32(k.divert) {
			o.Owner, o.Next, o.ReqValid = OwnerBPF, o.ReqNext, false
			o.Skipped, o.SkippedEnd = o.ReqSkipped, o.ReqNext
		} else if o.Owner == OwnerBPF {
			o.ReqValid = false
		}
	}
	if o.Owner != OwnerBPF {
		k.divertOne(seq)
		return daemonOwns
	}
	switch d := int32(seq - o.Next); {
	case d < 0:
		return dropOld
	case d == 0:
		o.Next++
		onDeliver() // under the lock: the delivery happens before any later decision
		return deliver
	}
	o.Owner = OwnerDaemon
	o.Epoch++
	k.divertOne(seq)
	return gap
}

// divertOne counts a packet passed up, noting it as aggd_order_note_diverted does.
func (k *kernel) divertOne(seq uint32) {
	k.o.LastDiverted, k.o.DivertedBefore = PacketID{LinkSeq: seq}, uint32(k.divert)
	k.divert++
}

func (k *kernel) Diverted(uint32) (uint64, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.divert, k.readErr
}

func newKernel() *kernel { return &kernel{o: Order{Owner: OwnerDaemon}} }

func TestFirstIdlePosts(t *testing.T) {
	k := newKernel()
	d := New(k, 1)
	if err := d.Idle(0, 0, true); err != nil {
		t.Fatal(err)
	}
	if k.o != (Order{Owner: OwnerDaemon, ReqValid: true}) || !d.Pending() {
		t.Errorf("after the first Idle: %+v, pending %v; want a handback at 0 stamped 0", k.o, d.Pending())
	}
	// Nothing more while pending.
	k.o.ReqNext = 99
	if err := d.Idle(5, 0, true); err != nil || k.o.ReqNext != 99 {
		t.Errorf("Idle while pending wrote %+v (%v)", k.o, err)
	}
	if st := d.Stats(); st.Posted != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestNoPostWhileHoldingOrUnchanged(t *testing.T) {
	k := newKernel()
	d := New(k, 1)
	k.packet(2, nil) // passed up: the daemon owns
	if _, _, err := d.OnData(PacketID{}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := d.Idle(3, 0, false); err != nil || k.o.ReqValid {
		t.Fatalf("posted while holding: %+v (%v)", k.o, err)
	}
	if err := d.Idle(3, 0b10, true); err != nil || !k.o.ReqValid || k.o.ReqStamp != 1 || k.o.ReqNext != 3 ||
		k.o.ReqSkipped != 0b10 {
		t.Fatalf("empty: %+v (%v), want a handback stamped 1 at 3, with 1 given up", k.o, err)
	}
	// It dies: a packet passed up after the stamp (divert 2 by now).
	k.divert = 2
	if reset, _, err := d.OnData(PacketID{}, time.Time{}); reset || err != nil || d.Pending() {
		t.Fatalf("dead request: reset %v err %v pending %v", reset, err, d.Pending())
	}
	if st := d.Stats(); st.Died != 1 {
		t.Errorf("stats %+v, want one died", st)
	}
	// Reposted with the new count; a second Idle without new packets
	// must not post again after this one dies too.
	if err := d.Idle(3, 0, true); err != nil || k.o.ReqStamp != 2 {
		t.Fatalf("repost: %+v (%v)", k.o, err)
	}
	d.posted = false // as if it had died without a packet (cannot happen; checks the guard)
	k.o.ReqValid = false
	if err := d.Idle(3, 0, true); err != nil || k.o.ReqValid {
		t.Errorf("posted again with nothing consumed: %+v (%v)", k.o, err)
	}
}

func TestAcceptedThenHandedOver(t *testing.T) {
	k := newKernel()
	d := New(k, 1)
	if err := d.Idle(7, 0, true); err != nil {
		t.Fatal(err)
	}
	var delivered []uint32
	if a := k.packet(7, func() { delivered = append(delivered, 7) }); a != deliver {
		t.Fatalf("kernel: %v, want deliver", a)
	}
	if a := k.packet(9, nil); a != gap {
		t.Fatalf("kernel: %v, want gap", a)
	}
	reset, next, err := d.OnData(PacketID{}, time.Time{})
	if !reset || next != 8 || err != nil {
		t.Errorf("OnData after the handover: %v %d %v, want reset at 8", reset, next, err)
	}
	if st := d.Stats(); st.Accepted != 1 || d.Consumed() != 1 || d.Pending() {
		t.Errorf("stats %+v consumed %d pending %v", st, d.Consumed(), d.Pending())
	}
	// The handover passed one packet up and the daemon consumed it: the
	// next handback matches.
	if err := d.Idle(10, 0, true); err != nil || k.o.ReqStamp != 1 {
		t.Fatalf("repost: %+v (%v)", k.o, err)
	}
	if a := k.packet(10, func() {}); a != deliver {
		t.Errorf("second handback: %v, want accepted and delivered", a)
	}
}

// A packet the kernel passed up and counted is lost on the host (the
// daemon's socket buffer was full): every later handback is stale, until a
// quiet period's Resync adopts the kernel's count.
func TestResyncAfterAPassUpLostOnTheHost(t *testing.T) {
	k := newKernel()
	d := New(k, 1)
	k.packet(0, nil) // the daemon owns: both passed up
	k.packet(1, nil)
	if _, _, err := d.OnData(PacketID{}, time.Time{}); err != nil { // seq 0 arrives; seq 1 is dropped at the socket
		t.Fatal(err)
	}
	next := uint32(1)
	for round := range 5 {
		if err := d.Idle(next, 0, true); err != nil {
			t.Fatal(err)
		}
		if a := k.packet(next+1, nil); a != daemonOwns {
			t.Fatalf("round %d: kernel %v, want the packet passed up (the handback is stale)", round, a)
		}
		if _, _, err := d.OnData(PacketID{}, time.Time{}); err != nil || d.Pending() {
			t.Fatalf("round %d: OnData %v, pending %v; want the request dead", round, err, d.Pending())
		}
		next += 1 // the hold timer skipped seq 1, the resequencer released the rest
	}
	if err := d.Idle(next, 0, true); err != nil {
		t.Fatal(err)
	}
	// Quiet: nothing counted can still be on its way.
	reset, _, err := resyncAfterQuiet(d)
	if reset || err != nil || d.Pending() || d.Consumed() != k.divert {
		t.Fatalf("Resync: reset %v err %v pending %v consumed %d, want the kernel's count %d and nothing pending",
			reset, err, d.Pending(), d.Consumed(), k.divert)
	}
	if err := d.Idle(next, 0, true); err != nil {
		t.Fatal(err)
	}
	var delivered []uint32
	if a := k.packet(next, func() { delivered = append(delivered, next) }); a != deliver {
		t.Fatalf("after the resync: kernel %v, want the handback accepted and seq %d delivered", a, next)
	}
	if st := d.Stats(); st.Resyncs != 1 || len(delivered) != 1 {
		t.Errorf("stats %+v, delivered %v", st, delivered)
	}
}

// quiet is the quiet period the tests resynchronise after.
const quiet = time.Second

// resyncAfterQuiet calls Resync as a session's tick would after a quiet period: once to
// see the kernel's count, and again a quiet period later.
func resyncAfterQuiet(d *Daemon) (reset bool, next uint32, err error) {
	t0 := time.Unix(1000, 0)
	if reset, next, err = d.Resync(t0, quiet); reset || err != nil {
		return reset, next, err
	}
	return d.Resync(t0.Add(quiet), quiet)
}

// The kernel passes up a packet at the end of a quiet period (it had delivered the flow
// itself, and hands the ordering over at a gap), and a resync comes before the packet
// reaches the daemon: the count has just moved, so the packet is still on its way, not
// lost. Resync waits; the packet arrives and is resequenced, not dropped as late. Were
// it lost, Resync adopts the count once it has stood still for the quiet period.
func TestResyncWaitsForWhatWasJustPassedUp(t *testing.T) {
	k := newKernel()
	d := New(k, 1)
	if err := d.Idle(0, 0, true); err != nil {
		t.Fatal(err)
	}
	k.packet(0, func() {}) // accepted: the kernel owns and delivers
	if a := k.packet(2, nil); a != gap {
		t.Fatalf("kernel %v, want a gap: seq 2 passed up", a)
	}
	t0 := time.Unix(1000, 0)
	for _, at := range []time.Duration{0, quiet / 2} {
		if _, _, err := d.Resync(t0.Add(at), quiet); err != nil || d.Stats().Resyncs != 0 || d.Consumed() != 0 {
			t.Fatalf("Resync %v after the count moved: %v, %+v, consumed %d; want nothing done", at, err, d.Stats(), d.Consumed())
		}
	}
	if _, _, err := d.OnData(PacketID{LinkSeq: 2}, t0.Add(quiet/2)); err != nil {
		t.Fatalf("the passed-up packet arrives: %v, want it taken", err)
	}
	if st := d.Stats(); st.Late != 0 || st.Resyncs != 0 {
		t.Errorf("stats %+v, want nothing late and no resync", st)
	}

	if a := k.packet(3, nil); a != daemonOwns {
		t.Fatalf("kernel %v, want seq 3 passed up", a)
	}
	// seq 3 never reaches the daemon; its handback, stamped before it, is stale.
	if err := d.Idle(3, 0, true); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Resync(t0.Add(2*quiet), quiet); err != nil || d.Stats().Resyncs != 0 {
		t.Fatalf("first Resync after seq 3 was lost: %v, %+v; want the count only noted", err, d.Stats())
	}
	if _, _, err := d.Resync(t0.Add(3*quiet), quiet); err != nil || d.Stats().Resyncs != 1 || d.Consumed() != k.divert {
		t.Errorf("Resync a quiet period later: %v, %+v, consumed %d; want the kernel's count %d adopted",
			err, d.Stats(), d.Consumed(), k.divert)
	}
}

// The lost packets were those of a handover that followed an accepted
// handback: Resync reports where the kernel handed over, as OnData would.
func TestResyncAfterAHandoverLostOnTheHost(t *testing.T) {
	k := newKernel()
	d := New(k, 1)
	if err := d.Idle(4, 0, true); err != nil {
		t.Fatal(err)
	}
	k.packet(4, func() {}) // accepted, delivered
	if a := k.packet(6, nil); a != gap {
		t.Fatalf("kernel %v, want a gap", a)
	}
	// seq 6 never reaches the daemon.
	reset, next, err := resyncAfterQuiet(d)
	if !reset || next != 5 || err != nil {
		t.Fatalf("Resync: reset %v next %d err %v, want a restart at 5", reset, next, err)
	}
	if d.Consumed() != 1 || d.Pending() || d.Stats().Accepted != 1 {
		t.Errorf("consumed %d pending %v stats %+v", d.Consumed(), d.Pending(), d.Stats())
	}
}

// A Resync whose quiet period was too short: a counted packet was still on its way, and
// arrives after the daemon posted the handback that the resync made possible, before
// any packet judged it. It is dropped (the kernel may take the ordering at the stamp,
// which already holds it), and the handback stays pending and is accepted. Before the
// daemon asked the count, it took the request for dead, resequenced the packet and
// went on owning while the kernel could take over (the SPIN model's resync-early run).
func TestResyncWrongAboutAPacketDropsIt(t *testing.T) {
	k := newKernel()
	d := New(k, 1)
	k.packet(0, nil) // passed up, both; seq 1 is still on its way
	k.packet(1, nil)
	if _, _, err := d.OnData(PacketID{}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := d.Idle(1, 0, true); err != nil { // stamped 1: stale
		t.Fatal(err)
	}
	if _, _, err := resyncAfterQuiet(d); err != nil || d.Consumed() != 2 {
		t.Fatalf("Resync: %v, consumed %d; want the kernel's 2", err, d.Consumed())
	}
	if err := d.Idle(2, 0, true); err != nil || k.o.ReqStamp != 2 {
		t.Fatalf("Idle: %v, %+v; want a handback stamped 2", err, k.o)
	}
	_, _, err := d.OnData(PacketID{LinkSeq: 1}, time.Time{}) // seq 1 after all
	if !errors.Is(err, ErrCountedBefore) || !d.Pending() || d.Consumed() != 2 || d.Stats().Late != 1 {
		t.Fatalf("late packet: %v, pending %v, consumed %d, %+v; want it dropped, the handback pending",
			err, d.Pending(), d.Consumed(), d.Stats())
	}
	if a := k.packet(2, func() {}); a != deliver {
		t.Errorf("kernel %v, want the handback accepted and seq 2 delivered", a)
	}
}

// With nothing lost, Resync leaves a live request alone, and does nothing
// without one.
func TestResyncLeavesALiveRequest(t *testing.T) {
	k := newKernel()
	d := New(k, 1)
	if reset, _, err := resyncAfterQuiet(d); reset || err != nil || d.Stats().Resyncs != 0 {
		t.Fatalf("Resync with nothing posted: %v %v %+v", reset, err, d.Stats())
	}
	if err := d.Idle(0, 0, true); err != nil {
		t.Fatal(err)
	}
	if reset, _, err := resyncAfterQuiet(d); reset || err != nil || !d.Pending() || d.Stats().Resyncs != 0 {
		t.Errorf("Resync with a live request: reset %v err %v pending %v %+v", reset, err, d.Pending(), d.Stats())
	}
	k.packet(0, func() {}) // accepted: the kernel owns, counts agree
	if reset, _, err := resyncAfterQuiet(d); reset || err != nil || d.Stats().Resyncs != 0 {
		t.Errorf("Resync while the kernel owns: reset %v err %v %+v", reset, err, d.Stats())
	}
}

func TestStrayWhileKernelOwns(t *testing.T) {
	k := newKernel()
	d := New(k, 1)
	if err := d.Idle(0, 0, true); err != nil {
		t.Fatal(err)
	}
	k.packet(0, func() {}) // accepted: the kernel owns
	_, _, err := d.OnData(PacketID{}, time.Time{})
	if !errors.Is(err, ErrKernelOwns) {
		t.Fatalf("OnData while the kernel owns: %v, want ErrKernelOwns", err)
	}
	if d.Consumed() != 0 || !d.Pending() || d.Stats().Strays != 1 {
		t.Errorf("a stray counted: consumed %d pending %v %+v", d.Consumed(), d.Pending(), d.Stats())
	}
}

func TestReadErrorKeepsPending(t *testing.T) {
	k := newKernel()
	d := New(k, 1)
	if err := d.Idle(0, 0, true); err != nil {
		t.Fatal(err)
	}
	k.readErr = errors.New("map gone")
	if _, _, err := d.OnData(PacketID{}, time.Time{}); err == nil || !d.Pending() {
		t.Errorf("read error: %v, pending %v", err, d.Pending())
	}
	if err := New(k, 2).Idle(0, 0, true); err == nil {
		t.Error("Idle with an unreadable map succeeded")
	}
}

func TestIdleRefusesWhenKernelOwnsUnannounced(t *testing.T) {
	k := newKernel()
	k.o.Owner = OwnerBPF
	if err := New(k, 1).Idle(0, 0, true); err == nil {
		t.Error("Idle posted over a kernel-owned state")
	}
}

// The kernel and the daemon run concurrently, the daemon behind a socket
// (a channel) that it reads at its own pace. Every packet that arrived
// must be delivered exactly once and in order, whoever delivers it. Run
// with -race.
func TestConcurrentHandover(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { concurrentRun(t, seed) })
	}
}

func concurrentRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	start := uint32(0xffffff00) + uint32(rng.IntN(512))
	const n = 2000
	// Arrival order: reordered within a window, some duplicates, some loss.
	var arrivals []uint32
	var at []int
	arrived := map[uint32]bool{}
	for i := range n {
		s := start + uint32(i)
		if seed%2 == 1 && rng.IntN(200) == 0 {
			continue // lost
		}
		copies := 1 + rng.IntN(4)/3
		for range copies {
			arrivals = append(arrivals, s)
			at = append(at, i+rng.IntN(6))
		}
		arrived[s] = true
	}
	idx := make([]int, len(arrivals))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return at[idx[a]] < at[idx[b]] })

	k := newKernel()
	d := New(k, 1)
	rs := reseq.New(reseq.Config{MaxHold: 1 << 62}, start)

	var mu sync.Mutex // the delivery log: agg0
	var log []uint32
	record := func(s uint32) {
		mu.Lock()
		log = append(log, s)
		mu.Unlock()
	}
	sock := make(chan uint32, 64)
	done := make(chan struct{})
	go func() { // the daemon
		defer close(done)
		deliverTo := func(p []byte) { record(uint32(p[0])<<24 | uint32(p[1])<<16 | uint32(p[2])<<8 | uint32(p[3])) }
		if err := d.Idle(rs.Next(), rs.Skipped(), rs.Empty()); err != nil {
			t.Error(err)
		}
		for s := range sock {
			reset, next, err := d.OnData(PacketID{}, time.Time{})
			if err != nil {
				t.Errorf("OnData: %v", err)
				continue
			}
			if reset {
				rs.Restart(next)
			}
			rs.Push(1, s, 0, []byte{byte(s >> 24), byte(s >> 16), byte(s >> 8), byte(s)}, deliverTo)
			if err := d.Idle(rs.Next(), rs.Skipped(), rs.Empty()); err != nil {
				t.Error(err)
			}
		}
		// The end: the hold timer gives up what never came.
		rs.Expire(1<<62+2, deliverTo)
	}()
	for _, i := range idx { // the kernel
		s := arrivals[i]
		if k.packet(s, func() { record(s) }) >= gap {
			sock <- s
		}
	}
	close(sock)
	<-done

	want := make([]uint32, 0, len(arrived))
	for s := range arrived {
		want = append(want, s)
	}
	sort.Slice(want, func(a, b int) bool { return int32(want[a]-start) < int32(want[b]-start) })
	if len(log) != len(want) {
		t.Fatalf("delivered %d packets, %d arrived", len(log), len(want))
	}
	for i := range want {
		if log[i] != want[i] {
			t.Fatalf("delivery %d is %#x, want %#x (log around: %x)", i, log[i], want[i], log[max(i-3, 0):min(i+3, len(log))])
		}
	}
	st := d.Stats()
	t.Logf("posted %d accepted %d died %d", st.Posted, st.Accepted, st.Died)
}
