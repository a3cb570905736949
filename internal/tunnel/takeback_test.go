package tunnel

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/aqm"
	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/sched"
	"github.com/aggd/aggd/internal/wire"
)

// takeBackRig is a CPE's session in the lab's standby shape: two primaries, DSL (0.2
// Mbit/s) and cable (1.5), and an LTE backup at lteRate, all up, whose AQM drops on a
// 50-ms queue above a 1-ms target. The packets it sends carry a marker byte each.
type takeBackRig struct {
	s               *Session
	dsl, cable, lte *link
	mu              sync.Mutex
	carried         map[uint8][]byte // markers each link carried, in order
	next            byte
}

func newTakeBackRig(t *testing.T, lteRate float64) *takeBackRig {
	t.Helper()
	r := &takeBackRig{carried: map[uint8][]byte{}}
	r.s = newSession(testSession(), metrics.New(), discard, 1, func([]byte) {})
	r.s.installKeys(&keyGen{id: 1, created: time.Now()}, true)
	add := func(id uint8, name string, class sched.Class, rate float64) *link {
		l := r.s.addLink(LinkSpec{ID: id, Name: name, Class: class, TxRate: rate}, func(_ *link, pkt []byte) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.carried[id] = append(r.carried[id], pkt[len(pkt)-1])
			return nil
		})
		l.setState(stateUp)
		return l
	}
	r.dsl = add(1, "dsl", sched.ClassPrimary, 0.2e6)
	r.cable = add(2, "cable", sched.ClassPrimary, 1.5e6)
	r.lte = add(3, "lte", sched.ClassBackup, lteRate)
	r.s.aqm = aqm.New(int64(time.Millisecond), int64(time.Millisecond))
	r.s.bondQueue.Store(int64(50 * time.Millisecond))
	r.s.bondQueueGen.Add(1)
	r.s.refreshSchedule()
	return r
}

// send sends one packet (an IPv4 header that is not ECN-capable, so the AQM drops it
// rather than marks it) whose last byte is the next marker, and returns the marker.
func (r *takeBackRig) send() byte {
	r.next++
	buf := make([]byte, wire.HeaderLen+40)
	buf[wire.HeaderLen] = 0x45
	buf[len(buf)-1] = r.next
	r.s.SendData(buf)
	return r.next
}

// on returns the links that carried the packet with marker m.
func (r *takeBackRig) on(m byte) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, l := range []*link{r.dsl, r.cable, r.lte} {
		if slices.Contains(r.carried[l.spec.ID], m) {
			out = append(out, l.spec.Name)
		}
	}
	return out
}

// aqmDrop sends packets 2 ms apart until the AQM drops one, and returns its marker.
func (r *takeBackRig) aqmDrop(t *testing.T) byte {
	t.Helper()
	for range 10 {
		m := r.send()
		if len(r.on(m)) == 0 {
			return m
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatal("setup: the AQM dropped none of 10 packets on a 50-ms queue above a 1-ms target")
	return 0
}

// primariesDie puts both primaries in doubt, with their last signs of life after
// signAfter from now, and refreshes the schedule as a state change does.
func (r *takeBackRig) primariesDie(signAfter time.Duration) {
	time.Sleep(signAfter)
	for _, l := range []*link{r.dsl, r.cable} {
		l.mu.Lock()
		l.lastDelivered = time.Now()
		l.mu.Unlock()
		l.setState(stateSuspect)
	}
	r.s.refreshSchedule()
}

// Both primaries die right after an AQM drop, onto a backup faster than the two
// together: the dropped packet goes out after all, once, on the backup.
func TestAFailoverOntoMoreTakesBackTheLastDrop(t *testing.T) {
	r := newTakeBackRig(t, 2.2e6)
	m := r.aqmDrop(t)
	r.primariesDie(0)
	if on := r.on(m); !slices.Contains(on, "lte") {
		t.Fatalf("the packet the AQM dropped just before the primaries died went out on %v, want on lte", on)
	}
	if got := gauge(r.s.pm.aqmTakenBack); got != 1 {
		t.Errorf("aqm_drops_taken_back_total = %v, want 1", got)
	}
	before := len(r.on(m))
	r.s.refreshSchedule()
	r.cable.setState(stateDown)
	r.s.refreshSchedule()
	if after := len(r.on(m)); after != before {
		t.Errorf("the taken-back packet went out again at a later refresh (%d copies, then %d)", before, after)
	}
}

// A drop the dying links could have carried the flow's answer to (they showed life
// for longer than the reaction time after it, the 20-ms probe interval here), stands.
func TestADropTheFlowCouldAnswerStands(t *testing.T) {
	r := newTakeBackRig(t, 2.2e6)
	m := r.aqmDrop(t)
	r.primariesDie(60 * time.Millisecond)
	if on := r.on(m); len(on) != 0 {
		t.Errorf("a drop 60 ms before the primaries' last sign of life (reaction 20 ms) went out on %v, want nowhere", on)
	}
}

// Where the links left carry less than those that carried the flow at the drop (a
// backup slower than the primaries), the flow must shrink anyway: the drop stands.
func TestAFailoverOntoLessLeavesTheDrop(t *testing.T) {
	r := newTakeBackRig(t, 1e6)
	m := r.aqmDrop(t)
	r.primariesDie(0)
	if on := r.on(m); len(on) != 0 {
		t.Errorf("with a 1-Mbit/s backup for 1.7 Mbit/s of primaries, the dropped packet went out on %v, want nowhere", on)
	}
}

// The primaries go into doubt one at a time: while DSL still stands the links left
// carry less than the flow had, and the drop waits; once both are in doubt the backup
// is what is left, and it carries more.
func TestTheTakeBackWaitsForTheDoubtToSpread(t *testing.T) {
	r := newTakeBackRig(t, 2.2e6)
	m := r.aqmDrop(t)
	r.cable.mu.Lock()
	r.cable.lastDelivered = time.Now()
	r.cable.mu.Unlock()
	r.cable.setState(stateSuspect)
	r.s.refreshSchedule()
	if on := r.on(m); len(on) != 0 {
		t.Fatalf("cable in doubt, DSL (0.2 Mbit/s) left: the drop went out on %v, want it kept", on)
	}
	r.primariesDie(0)
	if on := r.on(m); !slices.Contains(on, "lte") {
		t.Errorf("both primaries in doubt: the drop went out on %v, want on lte", on)
	}
}
