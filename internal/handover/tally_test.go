package handover

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// flow is an in-order flow through the in-memory kernel, a packet a millisecond, to a
// daemon whose resequencer releases at once whatever reaches it (a gap's hold time is
// not what these tests are about). Each test says what the host does with the packets
// the kernel passes up: lose one, or delay them.
type flow struct {
	t      *testing.T
	k      *kernel
	d      *Daemon
	now    time.Time
	seq    uint32   // the next sequence number to send
	next   uint32   // where the daemon's resequencer stands
	queue  []queued // passed up, not yet at the daemon
	fast   []uint32 // what the kernel delivered
	strays int      // packets that reached the daemon while the kernel owned
	late   int      // packets that reached it after it had counted them lost
	// holdUntil: until then the daemon's resequencer holds something (no handback).
	holdUntil time.Time
}

type queued struct {
	seq uint32
	at  time.Time
}

func newFlow(t *testing.T) *flow {
	k := newKernel()
	return &flow{t: t, k: k, d: New(k, 1), now: time.Unix(1000, 0)}
}

// send sends the next packet, skipping skip numbers first (lost on a link), and lets a
// millisecond pass. If the kernel passes the packet up, it reaches the daemon after
// delay, or never if delay < 0 (lost on the host). Whatever is due reaches the daemon.
func (f *flow) send(skip uint32, delay time.Duration) {
	f.t.Helper()
	f.seq += skip
	seq := f.seq
	f.seq++
	switch f.k.packet(seq, func() { f.fast = append(f.fast, seq) }) {
	case daemonOwns, gap:
		if delay >= 0 {
			f.queue = append(f.queue, queued{seq, f.now.Add(delay)})
		}
	}
	f.now = f.now.Add(time.Millisecond)
	f.receiveDue()
}

// receiveDue hands the daemon every queued packet that is due, in the order they are
// due, as its socket would.
func (f *flow) receiveDue() {
	f.t.Helper()
	slices.SortStableFunc(f.queue, func(a, b queued) int { return a.at.Compare(b.at) })
	for len(f.queue) > 0 && !f.queue[0].at.After(f.now) {
		p := f.queue[0]
		f.queue = f.queue[1:]
		reset, next, err := f.d.OnData(PacketID{LinkSeq: p.seq}, f.now)
		switch {
		case errors.Is(err, ErrKernelOwns):
			f.strays++
			continue
		case errors.Is(err, ErrCountedBefore):
			f.late++
			continue
		}
		if err != nil {
			f.t.Fatal(err)
		}
		if reset {
			f.next = next
		}
		if int32(p.seq-f.next) >= 0 {
			f.next = p.seq + 1
		}
		if err := f.d.Idle(f.next, 0, !f.now.Before(f.holdUntil)); err != nil {
			f.t.Fatal(err)
		}
	}
}

// flowFor sends a packet a millisecond for d, each passed-up one delayed by delay().
func (f *flow) flowFor(d time.Duration, delay func() time.Duration) {
	f.t.Helper()
	for end := f.now.Add(d); f.now.Before(end); {
		f.send(0, delay())
	}
}

func onTime() time.Duration { return 0 }

// A packet passed up is lost on the host while the flow goes on: no quiet period ever
// comes for Resync, but the tally finds the loss, and the kernel takes the ordering back.
func TestTallyFindsAPassUpLostWhileTrafficFlows(t *testing.T) {
	f := newFlow(t)
	f.flowFor(10*time.Millisecond, onTime)
	if len(f.fast) == 0 {
		t.Fatal("the kernel never took the ordering at the start")
	}
	f.send(1, -1) // a gap: the kernel hands over, and the packet it passes up is lost on the host
	handedBack := len(f.fast)
	f.flowFor(time.Second, onTime)

	st := f.d.Stats()
	if st.Tallies != 1 || st.TallyLost != 1 || st.Resyncs != 0 {
		t.Fatalf("tally stats %+v, want one tally of one packet lost", st)
	}
	if f.d.Consumed() != f.k.divert {
		t.Errorf("the daemon counts %d, the kernel %d", f.d.Consumed(), f.k.divert)
	}
	// The window is 200 ms: about 200 packets go through the daemon, the rest not.
	kernel := len(f.fast) - handedBack
	if kernel < 700 {
		t.Errorf("the kernel delivered %d of the last 1000 packets, want the ordering back after the tally's window", kernel)
	}
	if f.k.o.Owner != OwnerBPF {
		t.Errorf("ordering %+v, want the kernel's", f.k.o)
	}
}

// Packets on their way to the daemon for a few milliseconds each (another CPU, a busy
// daemon) show as missing in some samples but not in all: the tally corrects nothing,
// and the counts agree once the flow ends.
func TestTallyLeavesPacketsOnTheirWay(t *testing.T) {
	for seed := range uint64(10) {
		f := newFlow(t)
		rng := rand.New(rand.NewPCG(seed, 1))
		jitter := func() time.Duration { return time.Duration(rng.IntN(4000)) * time.Microsecond }
		for range 20 {
			f.send(1, jitter()) // a gap now and then: the daemon owns again
			f.flowFor(100*time.Millisecond, jitter)
		}
		f.now = f.now.Add(time.Second)
		f.receiveDue()
		st := f.d.Stats()
		if st.Tallies != 0 || f.strays != 0 {
			t.Errorf("seed %d: tallies %d (%d packets), strays %d; want none, nothing was lost", seed, st.Tallies, st.TallyLost, f.strays)
		}
		if f.d.Consumed() != f.k.divert {
			t.Errorf("seed %d: the daemon counts %d, the kernel %d", seed, f.d.Consumed(), f.k.divert)
		}
		if st.Died == 0 || st.Accepted == 0 {
			t.Errorf("seed %d: handbacks %+v; the test needs both outcomes", seed, st)
		}
	}
}

// Two passed-up packets take longer than the window to reach the daemon: the tally
// takes them for lost. They are then dropped if they arrive while the kernel owns
// (strays) or before a packet has judged the handback the daemon posted since (it may
// still be accepted: ErrCountedBefore). If they arrive while the daemon holds packets
// and offers nothing, the daemon counts them a second time, and its next handback
// brings its count down to the kernel's.
func TestTallyWrongAboutAPacketLosesNoneTwice(t *testing.T) {
	for _, c := range []struct {
		name          string
		handOverFirst bool // the kernel hands over again just before the late packet arrives
		hold          bool // and the daemon holds packets then
		strays, late  int
		overcounts    uint64
	}{
		{"arrive while the kernel owns", false, false, 2, 0, 0},
		{"arrive before and after the handback is judged", true, false, 1, 1, 0},
		{"arrive while the daemon holds packets", true, true, 0, 0, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFlow(t)
			f.flowFor(10*time.Millisecond, onTime) // the kernel owns
			sent := f.now
			f.send(1, 500*time.Millisecond)         // a gap: the kernel hands over, and the packet it passes up is late
			f.send(0, 500*time.Millisecond)         // the next one too
			f.flowFor(300*time.Millisecond, onTime) // the tally counts it lost; the kernel takes over
			if f.k.o.Owner != OwnerBPF || f.d.Stats().Tallies != 1 {
				t.Fatalf("after 300 ms: ordering %+v, stats %+v; want the kernel's, after one tally", f.k.o, f.d.Stats())
			}
			if c.handOverFirst {
				f.flowFor(sent.Add(499*time.Millisecond).Sub(f.now), onTime)
				if c.hold {
					f.holdUntil = f.now.Add(10 * time.Millisecond)
				}
				f.send(1, 0) // the late packets arrive with this one
			}
			f.flowFor(time.Second, onTime)

			st := f.d.Stats()
			if f.strays != c.strays || f.late != c.late || st.Overcounts != c.overcounts || st.Tallies != 1 || st.TallyLost != 2 {
				t.Errorf("strays %d, late %d, stats %+v; want %d strays, %d late, %d overcounts, one tally of 2",
					f.strays, f.late, st, c.strays, c.late, c.overcounts)
			}
			if f.d.Consumed() != f.k.divert {
				t.Errorf("the daemon counts %d, the kernel %d", f.d.Consumed(), f.k.divert)
			}
			if f.k.o.Owner != OwnerBPF {
				t.Errorf("ordering %+v, want the kernel's", f.k.o)
			}
		})
	}
}
