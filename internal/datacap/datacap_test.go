package datacap

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the zones the tests use, whatever the machine has
)

var berlin = mustLocation("Europe/Berlin")

func mustLocation(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return loc
}

func at(s string) time.Time {
	t, err := time.ParseInLocation("2006-01-02 15:04", s, berlin)
	if err != nil {
		panic(err)
	}
	return t
}

func TestScheduleStart(t *testing.T) {
	for _, c := range []struct {
		s         Schedule
		now, want string
	}{
		{Schedule{Monthly, 1}, "2026-11-26 13:00", "2026-11-01 00:00"},
		{Schedule{Monthly, 1}, "2026-11-01 00:00", "2026-11-01 00:00"},
		{Schedule{Monthly, 15}, "2026-11-14 23:59", "2026-10-15 00:00"},
		{Schedule{Monthly, 15}, "2026-11-15 00:01", "2026-11-15 00:00"},
		{Schedule{Monthly, 28}, "2026-03-01 10:00", "2026-02-28 00:00"},
		{Schedule{Monthly, 20}, "2026-01-05 10:00", "2025-12-20 00:00"},
		// 2026-11-26 is a Thursday.
		{Schedule{Weekly, 1}, "2026-11-26 13:00", "2026-11-23 00:00"},
		{Schedule{Weekly, 4}, "2026-11-26 13:00", "2026-11-26 00:00"},
		{Schedule{Weekly, 5}, "2026-11-26 13:00", "2026-11-20 00:00"},
		{Schedule{Weekly, 7}, "2026-11-26 13:00", "2026-11-22 00:00"},
		{Schedule{Daily, 0}, "2026-11-26 13:00", "2026-11-26 00:00"},
		// Across the change to summer time (29 March 2026 in Berlin): still midnight.
		{Schedule{Daily, 0}, "2026-03-29 12:00", "2026-03-29 00:00"},
	} {
		if got := c.s.Start(at(c.now)); !got.Equal(at(c.want)) {
			t.Errorf("%+v.Start(%s) = %s, want %s", c.s, c.now, got, c.want)
		}
	}
}

func TestScheduleNext(t *testing.T) {
	for _, c := range []struct {
		s           Schedule
		start, want string
	}{
		{Schedule{Monthly, 1}, "2026-12-01 00:00", "2027-01-01 00:00"},
		{Schedule{Monthly, 28}, "2026-01-28 00:00", "2026-02-28 00:00"},
		{Schedule{Weekly, 1}, "2026-11-23 00:00", "2026-11-30 00:00"},
		{Schedule{Daily, 0}, "2026-03-28 00:00", "2026-03-29 00:00"},
		{Schedule{Daily, 0}, "2026-03-29 00:00", "2026-03-30 00:00"},
	} {
		if got := c.s.Next(at(c.start)); !got.Equal(at(c.want)) {
			t.Errorf("%+v.Next(%s) = %s, want %s", c.s, c.start, got, c.want)
		}
	}
}

func TestMeterCountsBothDirectionsFromTheFirstReading(t *testing.T) {
	m := &Meter{Name: "lte", Limit: 1000, Schedule: Schedule{Monthly, 1}}
	now := at("2026-11-26 13:00")
	// The first reading is the interface's whole history: not this run's to count.
	m.Observe(now, Counters{Index: 5, Rx: 1e9, Tx: 2e9}, true)
	if m.Used() != 0 {
		t.Fatalf("after the first reading: used %d, want 0", m.Used())
	}
	m.Observe(now, Counters{Index: 5, Rx: 1e9 + 300, Tx: 2e9 + 200}, true)
	if m.Used() != 500 || m.Reached() {
		t.Fatalf("used %d reached %v, want 500 and not reached", m.Used(), m.Reached())
	}
	m.Observe(now, Counters{Index: 5, Rx: 1e9 + 800, Tx: 2e9 + 200}, true)
	if m.Used() != 1000 || !m.Reached() {
		t.Fatalf("used %d reached %v, want 1000 and reached", m.Used(), m.Reached())
	}
}

func TestMeterFollowsARecreatedInterface(t *testing.T) {
	m := &Meter{Name: "dsl", Limit: 1 << 30, Schedule: Schedule{Monthly, 1}}
	now := at("2026-11-26 13:00")
	m.Observe(now, Counters{Index: 7, Rx: 5000, Tx: 5000}, true)
	m.Observe(now, Counters{Index: 7, Rx: 6000, Tx: 5500}, true) // +1500
	// A reading that fails (netlink did not answer) loses nothing and adds nothing:
	// the next one counts from the last that worked, not the interface's whole life.
	m.Observe(now, Counters{}, false)
	m.Observe(now, Counters{Index: 7, Rx: 6100, Tx: 5500}, true) // +100
	// ppp0 goes away, and a new ppp0 (another index) has carried 700 bytes by the next
	// reading.
	m.Observe(now, Counters{}, false)
	m.Observe(now, Counters{Index: 9, Rx: 400, Tx: 300}, true) // +700
	// Recreated between two readings: another index.
	m.Observe(now, Counters{Index: 11, Rx: 100, Tx: 100}, true)    // +200
	m.Observe(now, Counters{Index: 11, Rx: 300100, Tx: 100}, true) // +300000
	// A reading whose packet count ran a packet ahead of its byte count steps back
	// by a header (IPBytes): nothing to count, and no reset.
	m.Observe(now, Counters{Index: 11, Rx: 300086, Tx: 100}, true)
	// Counters cleared under the same index (a driver reset): all of the new value.
	m.Observe(now, Counters{Index: 11, Rx: 50, Tx: 150}, true) // +50 +50
	if want := uint64(1500 + 100 + 700 + 200 + 300000 + 100); m.Used() != want {
		t.Fatalf("used %d, want %d", m.Used(), want)
	}
}

// Where a change to summer time skips midnight (Havana: 8 March 2026, 00:00 → 01:00)
// a period starts at the day's first hour, and every instant of a period maps to the
// same start: a count is never restarted within its period.
func TestScheduleWhereMidnightIsSkipped(t *testing.T) {
	havana, err := time.LoadLocation("America/Havana") // time/tzdata is linked in: always there
	if err != nil {
		t.Fatal(err)
	}
	in := func(s string) time.Time {
		v, err := time.ParseInLocation("2006-01-02 15:04", s, havana)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		s         Schedule
		now, want string
	}{
		{Schedule{Daily, 0}, "2026-03-08 10:00", "2026-03-08 01:00"},
		{Schedule{Weekly, 1}, "2026-03-08 10:00", "2026-03-02 00:00"},
		{Schedule{Weekly, 7}, "2026-03-08 10:00", "2026-03-08 01:00"},
		{Schedule{Monthly, 8}, "2026-03-08 10:00", "2026-03-08 01:00"},
		{Schedule{Monthly, 8}, "2026-03-05 10:00", "2026-02-08 00:00"},
	} {
		if got := c.s.Start(in(c.now)); !got.Equal(in(c.want)) {
			t.Errorf("%+v.Start(%s) = %s, want %s", c.s, c.now, got, in(c.want))
		}
	}
	for _, s := range []Schedule{{Daily, 0}, {Weekly, 1}, {Weekly, 7}, {Monthly, 8}, {Monthly, 1}} {
		for now := in("2026-02-01 00:00"); now.Before(in("2026-04-15 00:00")); now = now.Add(30 * time.Minute) {
			start := s.Start(now)
			next := s.Next(start)
			if now.Before(start) || !now.Before(next) {
				t.Fatalf("%+v: %s is not in its period [%s, %s)", s, now, start, next)
			}
			if again := s.Start(next.Add(-time.Minute)); !again.Equal(start) {
				t.Fatalf("%+v: the period from %s ends at %s, but its last minute maps to a period from %s", s, start, next, again)
			}
			if !s.Start(next).Equal(next) {
				t.Fatalf("%+v: the period after %s starts at %s by Next, %s by Start", s, start, next, s.Start(next))
			}
		}
	}
}

func TestMeterStartsAgainInANewPeriod(t *testing.T) {
	m := &Meter{Name: "lte", Limit: 1000, Schedule: Schedule{Monthly, 1}}
	m.Observe(at("2026-11-30 23:00"), Counters{Index: 1, Rx: 0}, true)
	m.Observe(at("2026-11-30 23:59"), Counters{Index: 1, Rx: 2000}, true)
	if !m.Reached() {
		t.Fatal("2000 of 1000 bytes: not reached")
	}
	if want := at("2026-12-01 00:00"); !m.PeriodEnd().Equal(want) {
		t.Errorf("period ends %s, want %s", m.PeriodEnd(), want)
	}
	m.Observe(at("2026-12-01 00:01"), Counters{Index: 1, Rx: 2100}, true)
	if m.Reached() || m.Used() != 100 {
		t.Fatalf("in December: used %d reached %v, want 100 and not reached", m.Used(), m.Reached())
	}
}

func TestStoreKeepsTheCurrentPeriodOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", FileName)
	nov := at("2026-11-26 13:00")
	lte := &Meter{Name: "lte", Limit: 1000, Schedule: Schedule{Monthly, 1}}
	dsl := &Meter{Name: "dsl", Limit: 1000, Schedule: Schedule{Daily, 0}}
	for _, m := range []*Meter{lte, dsl} {
		m.Observe(nov, Counters{Index: 1}, true)
		m.Observe(nov, Counters{Index: 1, Rx: 600, Tx: 600}, true)
	}
	if err := Save(path, []*Meter{lte, dsl}); err != nil {
		t.Fatal(err)
	}
	// A restart the next day: LTE's month goes on, DSL's day is over.
	next := at("2026-11-27 09:00")
	lte2 := &Meter{Name: "lte", Limit: 1000, Schedule: Schedule{Monthly, 1}}
	dsl2 := &Meter{Name: "dsl", Limit: 1000, Schedule: Schedule{Daily, 0}}
	cable := &Meter{Name: "cable", Limit: 1000, Schedule: Schedule{Monthly, 1}}
	restored, err := Load(path, next, []*Meter{lte2, dsl2, cable})
	if err != nil {
		t.Fatal(err)
	}
	if len(restored) != 1 || restored[0] != "lte" {
		t.Fatalf("restored %v, want [lte]", restored)
	}
	if !lte2.Reached() || lte2.Used() != 1200 {
		t.Errorf("lte after the restart: used %d reached %v, want 1200 and reached", lte2.Used(), lte2.Reached())
	}
	if dsl2.Used() != 0 || cable.Used() != 0 {
		t.Errorf("dsl %d, cable %d bytes after the restart; want 0 for both", dsl2.Used(), cable.Used())
	}
	// Nothing but the file itself is left in the directory (no temporary files).
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("state directory holds %d entries, want only %s", len(entries), FileName)
	}
}

func TestStoreRejectsAForeignFile(t *testing.T) {
	dir := t.TempDir()
	m := []*Meter{{Name: "lte", Limit: 1000}}
	if restored, err := Load(filepath.Join(dir, "missing.json"), at("2026-11-26 13:00"), m); err != nil || restored != nil {
		t.Errorf("a missing file: %v, %v; want nothing restored and no error", restored, err)
	}
	for name, content := range map[string]string{
		"garbage.json": "not json",
		"future.json":  `{"version": 2, "uplinks": {}}`,
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Load(path, at("2026-11-26 13:00"), m)
		if err == nil || !strings.Contains(err.Error(), "remove it to count from zero") {
			t.Errorf("%s: error %v, want one that says what to do", name, err)
		}
	}
}

// A restart counts what the interface carried while aggd was stopped: in the same
// boot, from the reading the count was saved with; after a reboot, everything the
// interface counted since (its counters started again from zero); from an interface
// created anew, all of its counters. A file from before readings were saved, or a
// meter that knows no boot ID, counts from the first reading, as before.
func TestRestartCountsWhatTheLineCarriedWhileStopped(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	now := at("2026-11-26 13:00")
	lte := &Meter{Name: "lte", Limit: 1 << 30, Schedule: Schedule{Monthly, 1}, Boot: "boot-a"}
	lte.Observe(now, Counters{Index: 4, Rx: 10000, Tx: 5000}, true)
	lte.Observe(now, Counters{Index: 4, Rx: 10600, Tx: 5400}, true) // +1000
	if err := Save(path, []*Meter{lte}); err != nil {
		t.Fatal(err)
	}
	later := at("2026-11-26 14:00")
	for _, c := range []struct {
		what  string
		boot  string
		first Counters
		want  uint64
	}{
		{"the same boot", "boot-a", Counters{Index: 4, Rx: 11600, Tx: 5900}, 1000 + 1500},
		{"the same boot, the interface created anew", "boot-a", Counters{Index: 6, Rx: 300, Tx: 200}, 1000 + 500},
		{"after a reboot", "boot-b", Counters{Index: 4, Rx: 700, Tx: 100}, 1000 + 800},
		{"no boot ID known", "", Counters{Index: 4, Rx: 11600, Tx: 5900}, 1000},
	} {
		m := &Meter{Name: "lte", Limit: 1 << 30, Schedule: Schedule{Monthly, 1}, Boot: c.boot}
		if restored, err := Load(path, later, []*Meter{m}); err != nil || len(restored) != 1 {
			t.Fatalf("%s: restored %v, %v", c.what, restored, err)
		}
		m.Observe(later, c.first, true)
		if m.Used() != c.want {
			t.Errorf("%s: used %d after the first reading, want %d", c.what, m.Used(), c.want)
		}
	}

	// Files of older versions: one written before readings were kept, and one whose
	// reading counts link-layer bytes (before readings counted IP bytes), which is not
	// comparable with this run's. Either way the first reading is a baseline.
	for _, c := range []struct{ what, record string }{
		{"a file without a reading", `"used_bytes": 1000`},
		{"a reading in link-layer bytes", `"used_bytes": 1000, "last_reading": {"boot_id": "boot-a", "ifindex": 4, "rx_bytes": 12000, "tx_bytes": 6000}`},
	} {
		old := filepath.Join(t.TempDir(), FileName)
		file := `{"version": 1, "uplinks": {"lte": {"period_start": "2026-11-01T00:00:00+01:00", ` + c.record + `}}}`
		if err := os.WriteFile(old, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		m := &Meter{Name: "lte", Limit: 1 << 30, Schedule: Schedule{Monthly, 1}, Boot: "boot-a"}
		if _, err := Load(old, later, []*Meter{m}); err != nil {
			t.Fatal(err)
		}
		m.Observe(later, Counters{Index: 4, Rx: 11600, Tx: 5900}, true)
		if m.Used() != 1000 {
			t.Errorf("from %s: used %d after the first reading, want 1000", c.what, m.Used())
		}
	}

	// In another period the saved count is spent, and so is the gap: its split
	// between the periods is unknown.
	dec := &Meter{Name: "lte", Limit: 1 << 30, Schedule: Schedule{Monthly, 1}, Boot: "boot-a"}
	if restored, err := Load(path, at("2026-12-02 09:00"), []*Meter{dec}); err != nil || len(restored) != 0 {
		t.Fatalf("in December: restored %v, %v; want nothing", restored, err)
	}
	dec.Observe(at("2026-12-02 09:00"), Counters{Index: 4, Rx: 11600, Tx: 5900}, true)
	if dec.Used() != 0 {
		t.Errorf("in December: used %d after the first reading, want 0", dec.Used())
	}
}

// IP bytes are the interface's bytes less a header per packet, never below zero.
func TestIPBytes(t *testing.T) {
	for _, c := range []struct{ bytes, packets, hdr, want uint64 }{
		{10 * 1514, 10, EthernetHeaderLen, 10 * 1500},
		{0, 0, EthernetHeaderLen, 0},
		{5000, 3, 0, 5000},
		{20, 3, EthernetHeaderLen, 0}, // counters read between a packet's two counts
	} {
		if got := IPBytes(c.bytes, c.packets, c.hdr); got != c.want {
			t.Errorf("IPBytes(%d, %d, %d) = %d, want %d", c.bytes, c.packets, c.hdr, got, c.want)
		}
	}
}
