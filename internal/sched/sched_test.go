package sched

import (
	"math"
	"slices"
	"testing"
)

const (
	ms   = int64(1e6)
	us   = int64(1e3)
	mbit = 1e6
)

// offer sends n packets of size bytes, one every interval ns starting at start, and
// counts the picks per link. before, if set, runs before each pick.
func offer(t *testing.T, s *Scheduler, start, interval int64, n, size int, before func(now int64)) map[uint8]int {
	t.Helper()
	counts := map[uint8]int{}
	for i := range n {
		now := start + int64(i)*interval
		if before != nil {
			before(now)
		}
		id, _, _, ok := s.Pick(now, size)
		if !ok {
			t.Fatalf("pick %d at %d: no link", i, now)
		}
		counts[id]++
	}
	return counts
}

// interval returns the packet spacing that offers rate bits/s with size-byte packets.
func interval(rate float64, size int) int64 { return int64(float64(size*8) / rate * 1e9) }

func primary(id uint8, rate float64, owd int64) LinkParams {
	return LinkParams{ID: id, Usable: true, Class: ClassPrimary, RateBps: rate, BaseOWD: owd}
}

func TestSaturationSplitsInProportionToRate(t *testing.T) {
	s := New(Config{})
	s.SetLinks([]LinkParams{
		primary(1, 10*mbit, 5*ms),
		primary(2, 30*mbit, 5*ms),
		primary(3, 60*mbit, 5*ms),
	})
	const n, size = 60000, 1250
	counts := offer(t, s, 0, interval(100*mbit, size), n, size, nil)
	for id, want := range map[uint8]float64{1: 0.10, 2: 0.30, 3: 0.60} {
		got := float64(counts[id]) / n
		if math.Abs(got-want) > 0.01 {
			t.Errorf("link %d got share %.4f, want %.2f ± 0.01 (counts %v)", id, got, want, counts)
		}
	}
}

// An IPv6 link's datagrams are OuterIPv6Extra bytes longer than the IPv4 size Pick is
// given, and its rate counts them: of two links at the same rate, saturated with small
// packets, the IPv6 one carries fewer, in the ratio of the two datagram sizes.
func TestAnIPv6LinkIsChargedItsLongerHeader(t *testing.T) {
	s := New(Config{})
	six := primary(2, 10*mbit, 5*ms)
	six.OuterIPv6 = true
	s.SetLinks([]LinkParams{primary(1, 10*mbit, 5*ms), six})
	const n, size = 33200, 156 // 100-byte inner packets; 176 bytes over IPv6
	counts := offer(t, s, 0, interval(20*mbit, size), n, size, nil)
	for id, want := range map[uint8]float64{1: 176.0 / 332, 2: 156.0 / 332} {
		if got := float64(counts[id]) / n; math.Abs(got-want) > 0.002 {
			t.Errorf("link %d got share %.4f, want %.4f ± 0.002 (counts %v)", id, got, want, counts)
		}
	}
}

func TestLightTrafficRidesTheLowestDelayLink(t *testing.T) {
	s := New(Config{})
	s.SetLinks([]LinkParams{
		primary(1, 20*mbit, 20*ms),
		primary(2, 10*mbit, 5*ms), // slowest but lowest delay
		primary(3, 50*mbit, 30*ms),
	})
	// 1000 bytes every 10 ms is 0.8 Mbit/s: link 2 never builds a queue.
	counts := offer(t, s, 0, 10*ms, 1000, 1000, nil)
	if counts[2] != 1000 {
		t.Fatalf("light traffic spread over %v, want all on link 2", counts)
	}
	// At 25 Mbit/s link 2 alone cannot keep up: its queue grows until link 1's
	// arrival time is as good, then link 1 joins; link 3 joins last.
	counts = offer(t, s, 20*1000*ms, interval(25*mbit, 1000), 20000, 1000, nil)
	if counts[1] == 0 || counts[2] == 0 {
		t.Fatalf("under load got %v, want links 1 and 2 both used", counts)
	}
	if counts[3] > counts[1] {
		t.Errorf("under load got %v: the 30 ms link should carry less than the 20 ms one", counts)
	}
}

// Links of equal delay share even light traffic by rate: each packet finds them all
// idle, so their arrivals tie, and ties go round by rate. A base delay a fraction of
// a millisecond lower (as estimates of equal links differ) does not change that.
func TestLightTrafficOnEqualLinksSharesByRate(t *testing.T) {
	s := New(Config{})
	s.SetLinks([]LinkParams{
		primary(1, 10*mbit, 5*ms),
		primary(2, 30*mbit, 5*ms+300*us),
		primary(3, 60*mbit, 5*ms-200*us),
	})
	const n = 1000
	counts := offer(t, s, 0, 10*ms, n, 1000, nil)
	for id, want := range map[uint8]float64{1: 0.10, 2: 0.30, 3: 0.60} {
		if got := float64(counts[id]) / n; math.Abs(got-want) > 0.002 {
			t.Errorf("link %d got share %.3f, want %.2f ± 0.002 (counts %v)", id, got, want, counts)
		}
	}
}

// A tie shares by rate in every order: the link with the most credit goes first,
// so two equal links alternate and no link waits more than its rate's turn.
func TestTiedLinksAlternate(t *testing.T) {
	s := New(Config{})
	s.SetLinks([]LinkParams{primary(1, 10*mbit, 5*ms), primary(2, 10*mbit, 5*ms)})
	var seq []uint8
	for i := range 6 {
		id, _, _, _ := s.Pick(int64(i)*10*ms, 1000)
		seq = append(seq, id)
	}
	if want := []uint8{1, 2, 1, 2, 1, 2}; !slices.Equal(seq, want) {
		t.Errorf("picks %v, want %v", seq, want)
	}
}

// A link whose arrival is more than TieWindow later is not tied: it gets nothing
// while the earlier link keeps up.
func TestTieWindowBoundsTheSharing(t *testing.T) {
	s := New(Config{})
	s.SetLinks([]LinkParams{primary(1, 10*mbit, 5*ms), primary(2, 10*mbit, 5*ms+TieWindow+us)})
	if counts := offer(t, s, 0, 10*ms, 100, 1000, nil); counts[1] != 100 {
		t.Errorf("got %v, want all on link 1 (link 2 arrives %d ns later)", counts, TieWindow+us)
	}
}

func TestLoadEqualisesExpectedArrival(t *testing.T) {
	s := New(Config{})
	s.SetLinks([]LinkParams{
		primary(1, 10*mbit, 0),
		primary(2, 10*mbit, 5*ms),
	})
	const size = 1250
	tx := interval(10*mbit, size) // one packet's transmission time on either link: 1 ms
	checked := 0
	offer(t, s, 0, interval(20*mbit, size), 20000, size, func(now int64) {
		if now < 100*ms { // let the queues build first
			return
		}
		b1, _ := s.Backlog(now, 1)
		b2, _ := s.Backlog(now, 2)
		// Arrival = backlog + OWD must agree within one packet and the tie
		// window, so link 1 runs 5 ms more queue than link 2.
		if d := (b1 + 0) - (b2 + 5*ms); d > tx+TieWindow || d < -tx-TieWindow {
			t.Fatalf("at %d: backlogs %d and %d, arrival difference %d > %d", now, b1, b2, d, tx+TieWindow)
		}
		checked++
	})
	if checked == 0 {
		t.Fatal("nothing checked")
	}
}

func TestOverflowOnlyWhenPrimariesFull(t *testing.T) {
	s := New(Config{OverflowQueueDelay: 10 * ms})
	s.SetLinks([]LinkParams{
		primary(1, 10*mbit, 20*ms),
		{ID: 2, Usable: true, Class: ClassOverflow, RateBps: 100 * mbit, BaseOWD: 5 * ms},
	})
	const size = 500
	// 4 Mbit/s fits the primary: the faster, closer overflow link stays idle.
	counts := offer(t, s, 0, interval(4*mbit, size), 2000, size, nil)
	if counts[2] != 0 {
		t.Fatalf("light load used the overflow link: %v", counts)
	}
	// 30 Mbit/s does not: the overflow link joins, but only while the primary's
	// backlog is over the threshold.
	var full bool
	for i := range 20000 {
		now := 10_000*ms + int64(i)*interval(30*mbit, size)
		b, _ := s.Backlog(now, 1)
		full = b > 10*ms
		id, _, _, _ := s.Pick(now, size)
		if id == 2 && !full {
			t.Fatalf("pick %d: overflow link used with primary backlog %d ≤ 10 ms", i, b)
		}
		counts[id]++
	}
	if counts[2] == 0 {
		t.Fatalf("overflow link never used at 30 Mbit/s: %v", counts)
	}
}

func TestOverflowWaitsForEveryPrimary(t *testing.T) {
	s := New(Config{OverflowQueueDelay: 10 * ms})
	s.SetLinks([]LinkParams{
		primary(1, 10*mbit, 0),
		primary(2, 10*mbit, 50*ms), // far away: link 1 queues 50 ms before link 2 is worth it
		{ID: 3, Usable: true, Class: ClassOverflow, RateBps: 100 * mbit},
	})
	const size = 1250
	link1Full := false
	counts := offer(t, s, 0, interval(15*mbit, size), 10000, size, func(now int64) {
		if b, _ := s.Backlog(now, 1); b > 10*ms {
			link1Full = true
		}
	})
	if !link1Full {
		t.Fatal("link 1 never exceeded the threshold; the test proves nothing")
	}
	if counts[3] != 0 {
		t.Fatalf("overflow used while link 2 still had room: %v", counts)
	}
}

func TestBackupOnlyWhenNoPrimaryUsable(t *testing.T) {
	links := []LinkParams{
		primary(1, 10*mbit, 30*ms),
		{ID: 2, Usable: true, Class: ClassOverflow, RateBps: 20 * mbit, BaseOWD: 10 * ms},
		{ID: 3, Usable: true, Class: ClassBackup, RateBps: 100 * mbit, BaseOWD: 1 * ms},
	}
	s := New(Config{})
	s.SetLinks(links)
	const size = 1250
	// Far beyond the primary's rate: overflow joins, backup never does.
	counts := offer(t, s, 0, interval(50*mbit, size), 10000, size, nil)
	if counts[3] != 0 || counts[2] == 0 {
		t.Fatalf("with the primary up got %v, want overflow used and backup idle", counts)
	}

	links[0].Usable = false
	s.SetLinks(links)
	counts = offer(t, s, 10_000*ms, interval(110*mbit, size), 10000, size, nil) // more than the backup alone carries
	if counts[1] != 0 || counts[2] == 0 || counts[3] == 0 {
		t.Fatalf("with the primary down got %v, want overflow and backup both used", counts)
	}
}

func TestPinnedWeightsOverrideArrivalTimes(t *testing.T) {
	s := New(Config{})
	s.SetLinks([]LinkParams{
		{ID: 1, Usable: true, RateBps: 100 * mbit, PinnedWeight: 1},
		{ID: 2, Usable: true, RateBps: 1 * mbit, BaseOWD: 100 * ms, PinnedWeight: 3},
		primary(3, 1000*mbit, 0), // unpinned: the best link by far, but the user pinned the others
	})
	var seq []uint8
	for i := range 400 {
		id, _, _, ok := s.Pick(int64(i)*ms, 1000)
		if !ok {
			t.Fatal("no link")
		}
		seq = append(seq, id)
	}
	for start := 0; start+4 <= len(seq); start += 4 {
		ones := 0
		for _, id := range seq[start : start+4] {
			switch id {
			case 1:
				ones++
			case 3:
				t.Fatalf("unpinned link 3 picked while others are pinned")
			}
		}
		if ones != 1 {
			t.Fatalf("picks %d..%d = %v, want exactly one of link 1 per four", start, start+3, seq[start:start+4])
		}
	}
}

func TestPinnedFallsBackWhenPinnedLinksAreDown(t *testing.T) {
	links := []LinkParams{
		{ID: 1, Usable: true, RateBps: 10 * mbit, PinnedWeight: 1},
		{ID: 2, Usable: true, RateBps: 10 * mbit, PinnedWeight: 1},
		primary(3, 10*mbit, 0),
	}
	s := New(Config{})
	s.SetLinks(links)
	links[0].Usable = false
	s.SetLinks(links)
	if counts := offer(t, s, 0, ms, 10, 100, nil); counts[2] != 10 {
		t.Fatalf("with pinned link 1 down got %v, want all on pinned link 2", counts)
	}
	links[1].Usable = false
	s.SetLinks(links)
	if counts := offer(t, s, 100*ms, ms, 10, 100, nil); counts[3] != 10 {
		t.Fatalf("with all pinned links down got %v, want automatic scheduling on link 3", counts)
	}
}

func TestSuspectLinkGetsDuplicate(t *testing.T) {
	s := New(Config{})
	s.SetLinks([]LinkParams{
		{ID: 1, Usable: true, Suspect: true, RateBps: 100 * mbit, BaseOWD: 1 * ms},
		{ID: 2, Usable: true, Suspect: true, RateBps: 100 * mbit, BaseOWD: 2 * ms},
		primary(3, 10*mbit, 40*ms),
	})
	p, d, hasDup, ok := s.Pick(0, 1000)
	if !ok || p != 1 || !hasDup || d != 3 {
		t.Fatalf("Pick = %d, %d, %v, %v; want primary 1 with a copy on the healthy link 3", p, d, hasDup, ok)
	}
	if b, _ := s.Backlog(0, 3); b != interval(10*mbit, 1000) {
		t.Errorf("duplicate link backlog = %d, want one packet's transmission time", b)
	}
	// A healthy link's packets are not duplicated.
	s.SetLinks([]LinkParams{primary(1, 100*mbit, 1*ms), primary(3, 10*mbit, 40*ms)})
	if _, _, hasDup, _ := s.Pick(ms, 1000); hasDup {
		t.Error("healthy link got a duplicate")
	}
}

func TestSuspectDuplicateMayUseBackup(t *testing.T) {
	s := New(Config{})
	s.SetLinks([]LinkParams{
		{ID: 1, Usable: true, Suspect: true, RateBps: 10 * mbit},
		{ID: 2, Usable: true, Class: ClassBackup, RateBps: 10 * mbit},
	})
	p, d, hasDup, _ := s.Pick(0, 1000)
	if p != 1 || !hasDup || d != 2 {
		t.Fatalf("Pick = %d, %d, %v; want primary 1, copy on backup 2", p, d, hasDup)
	}
	s.SetLinks([]LinkParams{{ID: 1, Usable: true, Suspect: true, RateBps: 10 * mbit}})
	if _, _, hasDup, ok := s.Pick(ms, 1000); !ok || hasDup {
		t.Fatalf("single suspect link: ok=%v hasDup=%v, want the packet sent without a copy", ok, hasDup)
	}
}

// standbyBond: two primaries (fast, slow), an LTE-like backup, and an overflow link.
func standbyBond(suspect ...uint8) []LinkParams {
	links := []LinkParams{
		primary(1, 10*mbit, 6*ms),
		primary(2, 1*mbit, 12*ms),
		{ID: 3, Usable: true, Class: ClassBackup, RateBps: 2 * mbit, BaseOWD: 22 * ms},
		{ID: 4, Usable: true, Class: ClassOverflow, RateBps: 1 * mbit, BaseOWD: 30 * ms},
	}
	for i := range links {
		links[i].Suspect = slices.Contains(suspect, links[i].ID)
	}
	return links
}

func TestStandbyCopyOnlyWhileAPrimaryIsInDoubt(t *testing.T) {
	s := New(Config{})
	s.SetLinks(standbyBond())
	if id, ok := s.StandbyCopy(0, 1000, 30*ms, 0, false); ok {
		t.Fatalf("StandbyCopy with no link in doubt = %d; want none", id)
	}
	if b, _ := s.Backlog(0, 3); b != 0 {
		t.Errorf("backup charged %d ns without a copy", b)
	}
	// The slow primary in doubt: every packet, even one on the healthy-looking fast
	// primary (it may be dying too), gets a copy on the standby link with the earliest
	// arrival, the backup.
	s.SetLinks(standbyBond(2))
	id, ok := s.StandbyCopy(0, 1000, 30*ms, 0, false)
	if !ok || id != 3 {
		t.Fatalf("StandbyCopy(primary 2 in doubt, packet on 1) = %d, %v; want the backup 3", id, ok)
	}
	if b, _ := s.Backlog(0, 3); b != interval(2*mbit, 1000) {
		t.Errorf("backup backlog = %d, want one packet's transmission time", b)
	}
}

func TestStandbyCopyAvoidsWhereThePacketGoesAndDoubt(t *testing.T) {
	s := New(Config{})
	s.SetLinks(standbyBond(1))
	// The packet's copy went to the backup already (pickDuplicate's choice): the next
	// standby link, the overflow one.
	if id, ok := s.StandbyCopy(0, 1000, 30*ms, 3, true); !ok || id != 4 {
		t.Fatalf("StandbyCopy(duplicate on 3) = %d, %v; want the overflow link 4", id, ok)
	}
	// A standby link in doubt itself gets no copy.
	links := standbyBond(1)
	links[2].Suspect, links[3].Suspect = true, true
	s.SetLinks(links)
	if id, ok := s.StandbyCopy(ms, 1000, 30*ms, 0, false); ok {
		t.Fatalf("StandbyCopy with every standby link in doubt = %d; want none", id)
	}
	// A backup in doubt is no primary in doubt: no copies.
	links = standbyBond()
	links[2].Suspect = true
	s.SetLinks(links)
	if id, ok := s.StandbyCopy(ms, 1000, 30*ms, 0, false); ok {
		t.Fatalf("StandbyCopy with only a standby link in doubt = %d; want none", id)
	}
}

func TestStandbyCopyLeavesLinksCarryingOriginals(t *testing.T) {
	// Overflow joins once both primaries are full: it carries originals then, and is
	// no standby refuge.
	s := New(Config{})
	s.SetLinks(standbyBond(2))
	s.Charge(1, 0, 100_000) // 80 ms of backlog on the fast primary
	s.Charge(2, 0, 10_000)  // 80 ms on the slow one
	if id, ok := s.StandbyCopy(0, 1000, 30*ms, 3, true); ok {
		t.Fatalf("StandbyCopy = %d with the overflow link allowed and the duplicate on the backup; want none", id)
	}
	if id, ok := s.StandbyCopy(0, 1000, 30*ms, 0, false); !ok || id != 3 {
		t.Fatalf("StandbyCopy = %d, %v; want the backup 3", id, ok)
	}
}

func TestStandbyCopyStopsAtTheBacklogBound(t *testing.T) {
	// A bond faster than its backup: the copies fill the backup's virtual queue up to
	// the bound, then stop until it drains.
	s := New(Config{})
	s.SetLinks(standbyBond(1)[:3]) // no overflow link
	// 5 ms on the 2-Mbit/s backup.
	const size = 1250
	copies := 0
	for range 20 {
		if id, ok := s.StandbyCopy(0, size, 30*ms, 0, false); ok {
			if id != 3 {
				t.Fatalf("copy on link %d, want the backup 3", id)
			}
			copies++
		}
	}
	if copies != 7 { // backlogs 0, 5, ..., 30 ms admit one more each
		t.Errorf("%d copies at once on a 30-ms bound of 5-ms packets, want 7", copies)
	}
	if _, ok := s.StandbyCopy(10*ms, size, 30*ms, 0, false); !ok {
		t.Error("no copy after the backup drained 10 ms")
	}
}

func TestStandbyCopyDoesNotAllocate(t *testing.T) {
	s := New(Config{})
	s.SetLinks(standbyBond(1))
	now := int64(0)
	if n := testing.AllocsPerRun(1000, func() {
		now += ms
		s.StandbyCopy(now, 1000, 30*ms, 2, true)
	}); n != 0 {
		t.Errorf("StandbyCopy allocates %.1f times per call", n)
	}
}

func TestSetLinksKeepsBacklog(t *testing.T) {
	s := New(Config{})
	s.SetLinks([]LinkParams{primary(1, 10*mbit, 0), primary(2, 10*mbit, 0)})
	for range 10 {
		s.Pick(0, 1250) // 10 ms of queue spread over both links
	}
	b1, _ := s.Backlog(0, 1)
	if b1 == 0 {
		t.Fatal("no backlog built")
	}
	// A parameter update (new rate for 1, 2 removed, 3 added) keeps 1's queue.
	s.SetLinks([]LinkParams{primary(3, 10*mbit, 0), primary(1, 20*mbit, 0)})
	if got, _ := s.Backlog(0, 1); got != b1 {
		t.Errorf("link 1 backlog after SetLinks = %d, want %d", got, b1)
	}
	if _, ok := s.Backlog(0, 2); ok {
		t.Error("removed link 2 still known")
	}
	if got, ok := s.Backlog(0, 3); !ok || got != 0 {
		t.Errorf("new link 3 backlog = %d, %v; want 0, true", got, ok)
	}
	// The kept queue steers the next packet to the idle newcomer.
	if id, _, _, _ := s.Pick(0, 1250); id != 3 {
		t.Errorf("picked %d, want idle link 3", id)
	}
	// A link that leaves and comes back starts idle.
	s.SetLinks([]LinkParams{primary(3, 10*mbit, 0)})
	s.SetLinks([]LinkParams{primary(3, 10*mbit, 0), primary(1, 20*mbit, 0)})
	if got, _ := s.Backlog(0, 1); got != 0 {
		t.Errorf("re-added link 1 backlog = %d, want 0", got)
	}
}

func TestLinkWithoutRateIsNeverPicked(t *testing.T) {
	bad := []LinkParams{
		{ID: 1, Usable: true, RateBps: 0},
		{ID: 2, Usable: true, RateBps: -5 * mbit},
		{ID: 3, Usable: true, RateBps: math.NaN()},
		{ID: 4, Usable: true, RateBps: math.Inf(1)},
		{ID: 5, Usable: true, RateBps: 0, PinnedWeight: 5},
	}
	s := New(Config{})
	s.SetLinks(bad)
	if _, _, _, ok := s.Pick(0, 1000); ok {
		t.Fatal("picked a link without a usable rate")
	}
	s.SetLinks(append(bad, primary(9, 1*mbit, 500*ms)))
	// Even far beyond link 9's capacity, the others stay unused.
	if counts := offer(t, s, 0, us, 1000, 1500, nil); counts[9] != 1000 {
		t.Fatalf("got %v, want every packet on link 9", counts)
	}
}

func TestNoUsableLink(t *testing.T) {
	s := New(Config{})
	if _, _, _, ok := s.Pick(0, 100); ok {
		t.Fatal("picked with no links")
	}
	s.SetLinks([]LinkParams{{ID: 1, Usable: false, RateBps: 10 * mbit}})
	if _, _, _, ok := s.Pick(0, 100); ok {
		t.Fatal("picked an unusable link")
	}
}

func TestParseClass(t *testing.T) {
	for _, c := range []Class{ClassPrimary, ClassOverflow, ClassBackup} {
		got, err := ParseClass(c.String())
		if err != nil || got != c {
			t.Errorf("ParseClass(%q) = %v, %v", c.String(), got, err)
		}
		text, err := c.MarshalText()
		var back Class
		if err != nil || back.UnmarshalText(text) != nil || back != c {
			t.Errorf("text round trip of %v failed: %q, %v", c, text, err)
		}
	}
	if got, err := ParseClass(""); err != nil || got != ClassPrimary {
		t.Errorf(`ParseClass("") = %v, %v; want primary`, got, err)
	}
	if _, err := ParseClass("metered"); err == nil {
		t.Error("ParseClass accepted an unknown name")
	}
	if s := Class(7).String(); s != "class(7)" {
		t.Errorf("Class(7).String() = %q", s)
	}
	if _, err := Class(7).MarshalText(); err == nil {
		t.Error("MarshalText accepted an invalid class")
	}
}

func TestUnknownClassActsAsBackup(t *testing.T) {
	s := New(Config{})
	s.SetLinks([]LinkParams{primary(1, 1*mbit, 100*ms), {ID: 2, Usable: true, Class: 9, RateBps: 100 * mbit}})
	if counts := offer(t, s, 0, us, 1000, 1500, nil); counts[2] != 0 {
		t.Fatalf("unknown class used while a primary is up: %v", counts)
	}
}

func TestPickDoesNotAllocate(t *testing.T) {
	s := New(Config{})
	s.SetLinks(benchLinks(8))
	now := int64(0)
	if a := testing.AllocsPerRun(1000, func() { now += 10 * us; s.Pick(now, 1400) }); a != 0 {
		t.Fatalf("Pick allocates %.1f times per call", a)
	}
}

func benchLinks(n int) []LinkParams {
	links := make([]LinkParams, n)
	for i := range links {
		links[i] = LinkParams{
			ID: uint8(i), Usable: true, Suspect: i == 1, Class: Class(i % 2),
			RateBps: float64(10+10*i) * mbit, BaseOWD: int64(5+3*i) * ms,
		}
	}
	return links
}

func BenchmarkPick(b *testing.B) {
	for _, n := range []int{3, 8} {
		b.Run(map[int]string{3: "3links", 8: "8links"}[n], func(b *testing.B) {
			s := New(Config{})
			s.SetLinks(benchLinks(n))
			step := interval(200*mbit, 1400)
			now := int64(0)
			b.ReportAllocs()
			for b.Loop() {
				now += step
				s.Pick(now, 1400)
			}
		})
	}
}

// A packet the caller places itself is charged to that link's backlog only, and the
// next pick sees it.
func TestChargeQueuesOnTheNamedLink(t *testing.T) {
	s := New(Config{})
	s.SetLinks([]LinkParams{primary(1, 10*mbit, 10*ms), primary(2, 10*mbit, 10*ms)})
	for range 3 {
		s.Charge(1, 0, 1000)
	}
	s.Charge(9, 0, 1000) // unknown: ignored
	if b, _ := s.Backlog(0, 1); b != 3*interval(10*mbit, 1000) {
		t.Errorf("link 1 backlog = %d after three charged packets, want %d", b, 3*interval(10*mbit, 1000))
	}
	if b, _ := s.Backlog(0, 2); b != 0 {
		t.Errorf("link 2 backlog = %d, want 0: nothing was charged to it", b)
	}
	if p, _, _, _ := s.Pick(0, 1000); p != 2 {
		t.Errorf("Pick = link %d, want 2: link 1 is queued with the charged packets", p)
	}
}

// soho is the lab's scaled SOHO upstream: an ADSL line that takes 58 ms to send a
// full packet, beside cable and LTE that take 7.7 and 5.1.
func soho() []LinkParams {
	return []LinkParams{
		primary(1, 0.2*mbit, 12500*us),
		primary(2, 1.5*mbit, 6*ms),
		primary(3, 2.25*mbit, 22500*us),
	}
}

// A slow link is used whenever it is idle and the bond is full, not only when the
// others' queues are as long as its packet time: at saturation it carries its share
// while the fast links queue little more than the overflow threshold and a packet.
// (By arrival time alone, they queue some 60 ms before the ADSL line gets a packet.)
func TestSlowLinkTakesAPacketWhenIdleAndTheBondIsFull(t *testing.T) {
	s := New(Config{})
	s.SetLinks(soho())
	const size, n = 1444, 20000
	var worst int64
	counts := offer(t, s, 0, interval(3.9*mbit, size), n, size, func(now int64) {
		if now < 2000*ms {
			return
		}
		for _, id := range []uint8{2, 3} {
			b, _ := s.Backlog(now, id)
			worst = max(worst, b)
		}
	})
	if got := float64(counts[1]) / n; math.Abs(got-0.2/3.9) > 0.01 {
		t.Errorf("the ADSL line got a share of %.3f, want %.3f ± 0.01 (counts %v)", got, 0.2/3.9, counts)
	}
	// Half the ADSL line's packet time; by arrival time alone they reach all of it.
	if most := interval(0.2*mbit, size) / 2; worst > most {
		t.Errorf("the fast links queued up to %.1f ms, want at most %.1f", float64(worst)/1e6, float64(most)/1e6)
	}
}

// Below saturation the slow link gets nothing: its packet would hold the ones sent
// after it at the receiver for no gain.
func TestSlowLinkStaysIdleWhileTheOthersKeepUp(t *testing.T) {
	s := New(Config{})
	s.SetLinks(soho())
	if counts := offer(t, s, 0, interval(3*mbit, 1444), 10000, 1444, nil); counts[1] != 0 {
		t.Errorf("at 3 Mbit/s of 3.75 the ADSL line got %d packets, want none (counts %v)", counts[1], counts)
	}
}

// An idle link far away is not a slow link: with the bond full, a 300-ms satellite
// link still waits for the others' arrivals to reach its own.
func TestIdleDistantLinkWaitsForItsArrival(t *testing.T) {
	s := New(Config{})
	s.SetLinks([]LinkParams{
		primary(1, 10*mbit, 300*ms),
		primary(2, 10*mbit, 5*ms),
	})
	counts := offer(t, s, 0, interval(11*mbit, 1250), 2000, 1250, nil) // 1.8 s: link 2 queues up to 180 ms
	if counts[1] != 0 {
		t.Errorf("the 300-ms link got %d packets while link 2's queue stayed under 300 ms, want none", counts[1])
	}
}
