package handover

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"

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

// packet judges one DATA packet the way aggd_order_judge does.
func (k *kernel) packet(seq uint32, onDeliver func()) action {
	k.mu.Lock()
	defer k.mu.Unlock()
	o := &k.o
	if o.ReqValid {
		if o.Owner != OwnerBPF && o.ReqStamp == uint32(k.divert) {
			o.Owner, o.Next, o.ReqValid = OwnerBPF, o.ReqNext, false
		} else if o.Owner == OwnerBPF {
			o.ReqValid = false
		}
	}
	if o.Owner != OwnerBPF {
		k.divert++
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
	k.divert++
	return gap
}

func newKernel() *kernel { return &kernel{o: Order{Owner: OwnerDaemon}} }

func TestFirstIdlePosts(t *testing.T) {
	k := newKernel()
	d := New(k, 1)
	if err := d.Idle(0, true); err != nil {
		t.Fatal(err)
	}
	if k.o != (Order{Owner: OwnerDaemon, ReqValid: true}) || !d.Pending() {
		t.Errorf("after the first Idle: %+v, pending %v; want a handback at 0 stamped 0", k.o, d.Pending())
	}
	// Nothing more while pending.
	k.o.ReqNext = 99
	if err := d.Idle(5, true); err != nil || k.o.ReqNext != 99 {
		t.Errorf("Idle while pending wrote %+v (%v)", k.o, err)
	}
	if st := d.Stats(); st.Posted != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestNoPostWhileHoldingOrUnchanged(t *testing.T) {
	k := newKernel()
	d := New(k, 1)
	if _, _, err := d.OnData(); err != nil {
		t.Fatal(err)
	}
	if err := d.Idle(3, false); err != nil || k.o.ReqValid {
		t.Fatalf("posted while holding: %+v (%v)", k.o, err)
	}
	if err := d.Idle(3, true); err != nil || !k.o.ReqValid || k.o.ReqStamp != 1 || k.o.ReqNext != 3 {
		t.Fatalf("empty: %+v (%v), want a handback stamped 1 at 3", k.o, err)
	}
	// It dies: a packet passed up after the stamp (divert 2 by now).
	k.divert = 2
	if reset, _, err := d.OnData(); reset || err != nil || d.Pending() {
		t.Fatalf("dead request: reset %v err %v pending %v", reset, err, d.Pending())
	}
	if st := d.Stats(); st.Died != 1 {
		t.Errorf("stats %+v, want one died", st)
	}
	// Reposted with the new count; a second Idle without new packets
	// must not post again after this one dies too.
	if err := d.Idle(3, true); err != nil || k.o.ReqStamp != 2 {
		t.Fatalf("repost: %+v (%v)", k.o, err)
	}
	d.posted = false // as if it had died without a packet (cannot happen; checks the guard)
	k.o.ReqValid = false
	if err := d.Idle(3, true); err != nil || k.o.ReqValid {
		t.Errorf("posted again with nothing consumed: %+v (%v)", k.o, err)
	}
}

func TestAcceptedThenHandedOver(t *testing.T) {
	k := newKernel()
	d := New(k, 1)
	if err := d.Idle(7, true); err != nil {
		t.Fatal(err)
	}
	var delivered []uint32
	if a := k.packet(7, func() { delivered = append(delivered, 7) }); a != deliver {
		t.Fatalf("kernel: %v, want deliver", a)
	}
	if a := k.packet(9, nil); a != gap {
		t.Fatalf("kernel: %v, want gap", a)
	}
	reset, next, err := d.OnData()
	if !reset || next != 8 || err != nil {
		t.Errorf("OnData after the handover: %v %d %v, want reset at 8", reset, next, err)
	}
	if st := d.Stats(); st.Accepted != 1 || d.Consumed() != 1 || d.Pending() {
		t.Errorf("stats %+v consumed %d pending %v", st, d.Consumed(), d.Pending())
	}
	// The handover passed one packet up and the daemon consumed it: the
	// next handback matches.
	if err := d.Idle(10, true); err != nil || k.o.ReqStamp != 1 {
		t.Fatalf("repost: %+v (%v)", k.o, err)
	}
	if a := k.packet(10, func() {}); a != deliver {
		t.Errorf("second handback: %v, want accepted and delivered", a)
	}
}

func TestStrayWhileKernelOwns(t *testing.T) {
	k := newKernel()
	d := New(k, 1)
	if err := d.Idle(0, true); err != nil {
		t.Fatal(err)
	}
	k.packet(0, func() {}) // accepted: the kernel owns
	_, _, err := d.OnData()
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
	if err := d.Idle(0, true); err != nil {
		t.Fatal(err)
	}
	k.readErr = errors.New("map gone")
	if _, _, err := d.OnData(); err == nil || !d.Pending() {
		t.Errorf("read error: %v, pending %v", err, d.Pending())
	}
	if err := New(k, 2).Idle(0, true); err == nil {
		t.Error("Idle with an unreadable map succeeded")
	}
}

func TestIdleRefusesWhenKernelOwnsUnannounced(t *testing.T) {
	k := newKernel()
	k.o.Owner = OwnerBPF
	if err := New(k, 1).Idle(0, true); err == nil {
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
		if err := d.Idle(rs.Next(), rs.Empty()); err != nil {
			t.Error(err)
		}
		for s := range sock {
			reset, next, err := d.OnData()
			if err != nil {
				t.Errorf("OnData: %v", err)
				continue
			}
			if reset {
				rs.Restart(next)
			}
			rs.Push(1, s, 0, []byte{byte(s >> 24), byte(s >> 16), byte(s >> 8), byte(s)}, deliverTo)
			if err := d.Idle(rs.Next(), rs.Empty()); err != nil {
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
