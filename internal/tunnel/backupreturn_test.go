package tunnel

import (
	"testing"
	"time"

	"github.com/aggd/aggd/internal/sched"
)

// standbyLinks is the lab's standby scenario upstream: a 0.2-Mbit/s ADSL and a
// 1.5-Mbit/s cable primary, and a 2.25-Mbit/s LTE backup.
func standbyLinks(dslUp, cableUp bool) []sched.LinkParams {
	return []sched.LinkParams{
		{ID: 0, Usable: dslUp, Class: sched.ClassPrimary, RateBps: 0.2e6, BaseOWD: 15e6},
		{ID: 1, Usable: cableUp, Class: sched.ClassPrimary, RateBps: 1.5e6, BaseOWD: 7e6},
		{ID: 2, Usable: true, Class: sched.ClassBackup, RateBps: 2.25e6, BaseOWD: 23e6},
	}
}

const ms = int64(time.Millisecond)

func TestBackupStaysOverflowForAWhileAfterAPrimaryReturns(t *testing.T) {
	var b backupReturn
	steps := []struct {
		name           string
		at             int64
		dsl, cable     bool
		wantBackupAs   sched.Class
		began, ended   bool
		wantStillGoing bool
	}{
		{"primaries carry the traffic", 0, true, true, sched.ClassBackup, false, false, false},
		{"primaries dead: the backup carries it", 100 * ms, false, false, sched.ClassBackup, false, false, true},
		{"still dead", 10_000 * ms, false, false, sched.ClassBackup, false, false, true},
		{"ADSL back first", 10_050 * ms, true, false, sched.ClassOverflow, true, false, true},
		{"cable back too", 10_230 * ms, true, true, sched.ClassOverflow, false, false, true},
		{"just before the window ends", 11_999 * ms, true, true, sched.ClassOverflow, false, false, true},
		{"the window is over", 12_000 * ms, true, true, sched.ClassBackup, false, true, false},
		{"and stays over", 15_000 * ms, true, true, sched.ClassBackup, false, false, false},
	}
	for _, st := range steps {
		params := standbyLinks(st.dsl, st.cable)
		began, ended := b.apply(params, st.at)
		if got := params[2].Class; got != st.wantBackupAs {
			t.Errorf("%s: backup scheduled as %v, want %v", st.name, got, st.wantBackupAs)
		}
		if params[0].Class != sched.ClassPrimary || params[1].Class != sched.ClassPrimary {
			t.Errorf("%s: a primary's class changed: %v, %v", st.name, params[0].Class, params[1].Class)
		}
		if began != st.began || ended != st.ended {
			t.Errorf("%s: began, ended = %v, %v; want %v, %v", st.name, began, ended, st.began, st.ended)
		}
		if b.pending() != st.wantStillGoing {
			t.Errorf("%s: pending = %v, want %v", st.name, b.pending(), st.wantStillGoing)
		}
	}
}

// Downstream in the lab the primaries are the faster ones (0.5 + 3 Mbit/s against
// LTE's 1.2): the window lasts only until they can take the backup's rate, so a flow
// does not grow into the backup and lose what it grew by when the window ends.
func TestWindowEndsOnceThePrimariesBackCanCarryTheBackupsRate(t *testing.T) {
	downstream := func(dslUp, cableUp bool) []sched.LinkParams {
		p := standbyLinks(dslUp, cableUp)
		p[0].RateBps, p[1].RateBps, p[2].RateBps = 0.5e6, 3e6, 1.2e6
		return p
	}
	var b backupReturn
	b.apply(downstream(true, true), -100*ms) // the primaries were up before
	b.apply(downstream(false, false), 0)
	params := downstream(true, false)
	if began, _ := b.apply(params, 30*ms); !began || params[2].Class != sched.ClassOverflow {
		t.Fatalf("ADSL (0.5 Mbit/s) back alone: backup scheduled as %v, want overflow", params[2].Class)
	}
	params = downstream(true, true)
	if _, ended := b.apply(params, 100*ms); !ended || params[2].Class != sched.ClassBackup || b.pending() {
		t.Fatalf("cable back too (3.5 Mbit/s of primaries against 1.2): backup scheduled as %v, ended %v, pending %v",
			params[2].Class, ended, b.pending())
	}
	// Cable first: the window never begins.
	b.apply(downstream(false, false), 10_000*ms)
	params = downstream(false, true)
	if began, _ := b.apply(params, 10_050*ms); began || params[2].Class != sched.ClassBackup || b.pending() {
		t.Fatalf("cable (3 Mbit/s) back first: backup scheduled as %v, pending %v", params[2].Class, b.pending())
	}
}

func TestNoWindowWithoutAnOutageOfThePrimaries(t *testing.T) {
	var b backupReturn
	// Start-up: nothing is up yet, then the primaries answer before the backup.
	nothing := standbyLinks(false, false)
	nothing[2].Usable = false
	b.apply(nothing, 0)
	params := standbyLinks(true, true)
	if began, _ := b.apply(params, 50*ms); began || params[2].Class != sched.ClassBackup || b.pending() {
		t.Fatalf("a window began without the backup ever standing in: class %v, pending %v", params[2].Class, b.pending())
	}
	// Start-up again: the backup answers a moment before the primaries. It stood in
	// for nothing, so it stays a backup.
	b = backupReturn{}
	b.apply(standbyLinks(false, false), 0)
	params = standbyLinks(true, true)
	if began, _ := b.apply(params, 50*ms); began || params[2].Class != sched.ClassBackup || b.pending() {
		t.Fatalf("a window began at start-up, the backup having answered first: class %v, pending %v", params[2].Class, b.pending())
	}
	// One primary of two dies: the other carries on, the backup stays a backup.
	params = standbyLinks(false, true)
	if began, _ := b.apply(params, 100*ms); began || params[2].Class != sched.ClassBackup || b.pending() {
		t.Fatalf("one primary's outage made the backup an overflow link: class %v", params[2].Class)
	}
}

// The point of the window, through the scheduler: when the slow primary comes back
// first, a 2-Mbit/s flow's packets do not all go to it.
func TestReturningSlowPrimaryGetsOnlyWhatItCanCarry(t *testing.T) {
	const pkt = 1440
	gap := int64(pkt * 8 * 1e9 / 2e6) // a 2-Mbit/s flow: one packet every 5.76 ms
	for _, tc := range []struct {
		name        string
		inWindow    bool
		maxOnDSLPct int
	}{
		{"inside the window", true, 20},
		{"without the window", false, 100},
	} {
		var b backupReturn
		b.apply(standbyLinks(true, true), -100*ms) // the primaries were up before
		b.apply(standbyLinks(false, false), 0)
		params := standbyLinks(true, false) // ADSL back, cable not yet
		at := 50 * ms
		if !tc.inWindow {
			at = 5_000 * ms
		}
		b.apply(params, at)
		s := sched.New(sched.Config{})
		s.SetLinks(params)
		onDSL, n := 0, 20 // the 0.1 s before cable answers too
		for i := 0; i < n; i++ {
			id, _, _, ok := s.Pick(at+int64(i)*gap, pkt)
			if !ok {
				t.Fatalf("%s: no link picked", tc.name)
			}
			if id == 0 {
				onDSL++
			}
		}
		if pct := onDSL * 100 / n; pct > tc.maxOnDSLPct {
			t.Errorf("%s: %d of %d packets went to the 0.2-Mbit/s ADSL (want at most %d %%)", tc.name, onDSL, n, tc.maxOnDSLPct)
		}
		if !tc.inWindow && onDSL != n {
			t.Errorf("%s: the backup took %d packets with a primary up and no window", tc.name, n-onDSL)
		}
	}
}
