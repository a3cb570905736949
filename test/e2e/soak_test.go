package e2e

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// A deployed bond runs for months through the same events again and again: rekeys,
// an uplink that fails and returns, config reloads, a customer added to the headend and
// removed again. None may leave anything behind in either daemon. After a first cycle
// of them, three more must not add goroutines, threads, file descriptors or metric
// series to either daemon, nor BPF programs or maps to the machine: a leak of one per
// cycle adds three; each count is the least of five reads (soakProc), and one more is
// allowed (two threads). The rekeys (every 10 s) are none of them rejected: the copies
// a CPE sends of each INIT, one per uplink, once each counted as a rejected handshake
// at the headend.
// BenchmarkSoak runs the same cycle with TCP for as long as asked, and measures memory.
func TestNothingGrowsCycleAfterCycle(t *testing.T) {
	n := newTopology(t)
	startIperfServer(t, n)
	bd := startBondWith(t, n, bondOptions{noRates: true, cpe: "rekey_interval: 10s\n", logLevel: "info"})
	start := time.Now()
	var samples []soakSample
	for cycle := 1; cycle <= 4; cycle++ {
		bd.soakCycle(t, cycle, false)
		samples = append(samples, bd.soakSample(t, cycle, start))
	}
	first, end := samples[0], last(samples)
	t.Logf("after cycle 1: cpe %s; headend %s; BPF %d programs, %d maps", first.CPE.line(), first.Headend.line(), first.BPFProgs, first.BPFMaps)
	t.Logf("after cycle 4: cpe %s; headend %s; BPF %d programs, %d maps", end.CPE.line(), end.Headend.line(), end.BPFProgs, end.BPFMaps)
	// One more is allowed for what is under way in all five reads; for threads two:
	// Go's runtime starts one when it needs another and keeps it (in the 20-minute
	// fast-path soak each daemon's went up by one, then stayed).
	grewBy := func(what string, before, after, allowed float64) {
		if after > before+allowed {
			t.Errorf("%s grew from %.0f to %.0f over three cycles", what, before, after)
		}
	}
	grew := func(what string, before, after float64) { grewBy(what, before, after, 1) }
	for _, d := range []struct {
		name       string
		before, at soakProc
	}{{"the CPE's", first.CPE, end.CPE}, {"the headend's", first.Headend, end.Headend}} {
		grew(d.name+" goroutines", d.before.Goroutines, d.at.Goroutines)
		grewBy(d.name+" threads", d.before.Threads, d.at.Threads, 2)
		grew(d.name+" file descriptors", d.before.FDs, d.at.FDs)
		grew(d.name+" metric series", d.before.Series, d.at.Series)
	}
	grew("the machine's BPF programs", float64(first.BPFProgs), float64(end.BPFProgs))
	grew("the machine's BPF maps", float64(first.BPFMaps), float64(end.BPFMaps))
	if rekeys := end.CPE.HandshakesOK - first.CPE.HandshakesOK; rekeys < 3 {
		t.Errorf("%.0f rekeys in three cycles (%.0f s), want at least 3 at one every 10 s", rekeys, end.AtS-first.AtS)
	}
	if end.CPE.HandshakesRejected != 0 || end.Headend.HandshakesRejected != 0 {
		t.Errorf("rejected handshakes: %.0f at the CPE, %.0f at the headend; want none", end.CPE.HandshakesRejected, end.Headend.HandshakesRejected)
	}
}

// BenchmarkSoak runs one bond for a long time through what a deployed one meets again
// and again, and watches both daemons for what must not grow with time: memory,
// goroutines, threads, open files, the kernel's BPF objects, the metrics' series, and
// the log. A router runs for months; a leak of one goroutine per rekey or of one file
// per link failure would not show in any test of a minute.
//
// Each cycle (about 40 s): a TCP flow up, then one down with uplink 2 cut (down, then
// back up), a UDP flow each way, a config reload of both daemons (the headend's adds or
// removes a peer that never connects, as an operator does for a customer), and pings.
// The CPE rekeys every 10 s (rekey_interval's minimum) throughout. Both daemons log at
// info, as deployed. After each cycle it samples both daemons.
//
// AGGD_BENCH_SOAK is how long (a Go duration; default 5m). It runs once whatever b.N is
// and writes results/bench/soak.json: the samples, and per daemon what grew between the
// end of the first cycle (warmed up) and the end of the last.
// Run: go test -run '^$' -bench Soak -benchtime 1x -timeout 0 -v ./test/e2e
func BenchmarkSoak(b *testing.B) {
	length := 5 * time.Minute
	if v := os.Getenv("AGGD_BENCH_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("AGGD_BENCH_SOAK=%q: want a positive Go duration such as 30m", v)
		}
		length = d
	}
	n := newTopology(b)
	startIperfServer(b, n)
	bd := startBondWith(b, n, bondOptions{noRates: true, cpe: "rekey_interval: 10s\n", logLevel: "info"})

	res := soakResult{Length: length.String(), DaemonArgs: os.Getenv("AGGD_E2E_DAEMON_ARGS")}
	start := time.Now()
	res.Samples = append(res.Samples, bd.soakSample(b, 0, start))
	for cycle := 1; time.Since(start) < length; cycle++ {
		res.Cycles = append(res.Cycles, bd.soakCycle(b, cycle, true))
		res.Samples = append(res.Samples, bd.soakSample(b, cycle, start))
		last := res.Samples[len(res.Samples)-1]
		b.Logf("soak: cycle %d at %.0f s: cpe %s; headend %s", cycle, last.AtS, last.CPE.line(), last.Headend.line())
	}
	if len(res.Samples) < 3 {
		b.Fatalf("AGGD_BENCH_SOAK=%s gave %d cycles; the growth is read from the second on, give it at least two (2m)", length, len(res.Samples)-1)
	}
	res.CPE = soakGrowth(res.Samples, func(s soakSample) soakProc { return s.CPE })
	res.Headend = soakGrowth(res.Samples, func(s soakSample) soakProc { return s.Headend })
	res.BPFProgs = [2]int{res.Samples[1].BPFProgs, res.Samples[len(res.Samples)-1].BPFProgs}
	res.BPFMaps = [2]int{res.Samples[1].BPFMaps, res.Samples[len(res.Samples)-1].BPFMaps}
	for _, c := range res.Cycles {
		res.LinkReturns = append(res.LinkReturns, c.LinkBackS)
	}
	writeJSON(b, "soak.json", res)
	b.Logf("soak: %d cycles in %s; rekeys %d ok, %d rejected (CPE), %d rejected (headend)",
		len(res.Cycles), time.Since(start).Round(time.Second), int(last(res.Samples).CPE.HandshakesOK),
		int(last(res.Samples).CPE.HandshakesRejected), int(last(res.Samples).Headend.HandshakesRejected))
	b.Logf("soak: cpe, from cycle 1 to %d: %s", len(res.Cycles), res.CPE.line())
	b.Logf("soak: headend, from cycle 1 to %d: %s", len(res.Cycles), res.Headend.line())
	b.Logf("soak: BPF programs %d -> %d, maps %d -> %d (the whole machine's)", res.BPFProgs[0], res.BPFProgs[1], res.BPFMaps[0], res.BPFMaps[1])
}

// soakResult is what results/bench/soak.json holds.
type soakResult struct {
	Length     string `json:"length"`
	DaemonArgs string `json:"daemon_args,omitempty"`
	// CPE and Headend: what grew from the end of cycle 1 to the end of the last.
	CPE     soakGrowthOf `json:"cpe"`
	Headend soakGrowthOf `json:"headend"`
	// BPFProgs and BPFMaps: the machine's BPF programs and maps at the end of cycle 1
	// and at the end.
	BPFProgs [2]int `json:"bpf_progs"`
	BPFMaps  [2]int `json:"bpf_maps"`
	// LinkReturns: per cycle, seconds from uplink 2's repair until both daemons had it
	// up again.
	LinkReturns []float64    `json:"link_return_s"`
	Cycles      []soakCycle  `json:"cycles"`
	Samples     []soakSample `json:"samples"`
}

// soakCycle is one cycle's traffic.
type soakCycle struct {
	Cycle       int     `json:"cycle"`
	UpMbit      float64 `json:"tcp_up_mbit"`
	DownMbit    float64 `json:"tcp_down_mbit_uplink2_cut"`
	UDPLostUp   float64 `json:"udp_up_lost_pct"`
	UDPLostDown float64 `json:"udp_down_lost_pct"`
	LinkBackS   float64 `json:"link_return_s"`
	PingsLost   int     `json:"pings_lost"`
}

// soakSample is both daemons and the machine's BPF objects after a cycle.
type soakSample struct {
	Cycle    int      `json:"cycle"`
	AtS      float64  `json:"at_s"`
	CPE      soakProc `json:"cpe"`
	Headend  soakProc `json:"headend"`
	BPFProgs int      `json:"bpf_progs"`
	BPFMaps  int      `json:"bpf_maps"`
}

// soakProc is one daemon at one moment.
type soakProc struct {
	RSSKiB             float64 `json:"rss_kib"`
	HeapInuseKiB       float64 `json:"heap_inuse_kib"`
	Goroutines         float64 `json:"goroutines"`
	Threads            float64 `json:"threads"`
	FDs                float64 `json:"fds"`
	Series             float64 `json:"series"`
	LogBytes           float64 `json:"log_bytes"`
	CPUSeconds         float64 `json:"cpu_s"`
	HandshakesOK       float64 `json:"handshakes_ok"`
	HandshakesRejected float64 `json:"handshakes_rejected"`
}

func (p soakProc) line() string {
	return fmt.Sprintf("RSS %.0f KiB, heap %.0f KiB, %.0f goroutines, %.0f threads, %.0f fds, %.0f series, log %.0f kB",
		p.RSSKiB, p.HeapInuseKiB, p.Goroutines, p.Threads, p.FDs, p.Series, p.LogBytes/1000)
}

// soakCycle runs one cycle's failure, reloads and traffic; TCP flows (8 s each way)
// only if tcp.
func (b *bond) soakCycle(t testing.TB, cycle int, tcp bool) soakCycle {
	c := soakCycle{Cycle: cycle}
	if tcp {
		c.UpMbit = iperf(t, b.Net, 8, false) / 1e6
	}
	cutLinks(b, true, 2)
	if tcp {
		c.DownMbit = iperf(t, b.Net, 8, true) / 1e6
	} else {
		time.Sleep(2 * time.Second) // down_after is 600 ms
	}
	cutLinks(b, false, 2)
	repaired := time.Now()
	for b.linksUp("cpe", "headend") < len(uplinkRates) || b.linksUp("hub", "cpe1") < len(uplinkRates) {
		if time.Since(repaired) > 20*time.Second {
			t.Fatalf("cycle %d: uplink 2 not back up on both sides 20 s after its repair", cycle)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.LinkBackS = time.Since(repaired).Seconds()

	c.UDPLostUp, _ = udpFlow(t, b.Net, "20M", 3, false)
	c.UDPLostDown, _ = udpFlow(t, b.Net, "20M", 3, true)

	b.soakReload(t, cycle)
	out, _ := b.Try("lan", "ping", "-q", "-c", "50", "-i", "0.1", "-W", "1", server)
	c.PingsLost = 50 - pingsReceived(out)
	return c
}

// soakReload reloads both daemons: the headend's config gains a peer that never
// connects in odd cycles and loses it in even ones; the CPE's is unchanged.
func (b *bond) soakReload(t testing.TB, cycle int) {
	hubYAML := filepath.Join(b.dir, "hub.yaml")
	if cycle%2 == 1 {
		b.addHubPeer(t, "ghost", fmt.Sprintf("ghost%d.key", cycle), "100.64.0.9/32")
	} else {
		cfg, err := os.ReadFile(hubYAML)
		if err != nil {
			t.Fatal(err)
		}
		before, rest, ok := strings.Cut(string(cfg), "  - name: ghost\n")
		_, after, ok2 := strings.Cut(rest, "\nlog:\n")
		if !ok || !ok2 {
			t.Fatalf("hub.yaml has no ghost peer to remove:\n%s", cfg)
		}
		writeFile(t, b.dir, "hub.yaml", before+"log:\n"+after)
		if err := b.headend.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.cpe.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
}

// pingsReceived reads "N received" from ping -q's summary (0 if absent).
func pingsReceived(out string) int {
	for _, f := range strings.Split(out, ",") {
		if v, ok := strings.CutSuffix(strings.TrimSpace(f), " received"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// soakSample reads both daemons and the machine's BPF objects.
func (b *bond) soakSample(t testing.TB, cycle int, start time.Time) soakSample {
	s := soakSample{Cycle: cycle, AtS: time.Since(start).Seconds()}
	s.CPE = b.soakProc(t, "cpe", b.cpe.Cmd.Process.Pid, "cpe.log", "headend")
	s.Headend = b.soakProc(t, "hub", b.headend.Cmd.Process.Pid, "hub.log", "")
	s.BPFProgs = bpfObjects(t, "programs", ebpf.ProgramGetNextID)
	s.BPFMaps = bpfObjects(t, "maps", ebpf.MapGetNextID)
	return s
}

// soakProc reads one daemon. Its goroutines, threads and open files are each the least
// of five reads 200 ms apart: a handshake, a reload or the last scrape's connection
// under way adds one for a moment (the 40-minute soak's goroutines, read once, ranged
// over 25-27 with nothing growing), where a leak stays in every read.
func (b *bond) soakProc(t testing.TB, ns string, pid int, logName, peer string) soakProc {
	p := b.soakRead(t, ns, pid, logName, peer)
	for range 4 {
		time.Sleep(200 * time.Millisecond)
		q := b.soakRead(t, ns, pid, logName, peer)
		p.Goroutines, p.Threads, p.FDs = min(p.Goroutines, q.Goroutines), min(p.Threads, q.Threads), min(p.FDs, q.FDs)
	}
	return p
}

// soakRead reads one daemon once.
func (b *bond) soakRead(t testing.TB, ns string, pid int, logName, peer string) soakProc {
	m, err := b.metrics(ns)
	if err != nil {
		t.Fatalf("scrape %s: %v", ns, err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("the %s daemon is gone: %v", ns, err)
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	logInfo, err := os.Stat(filepath.Join(b.dir, logName))
	if err != nil {
		t.Fatal(err)
	}
	p := soakProc{
		RSSKiB:       procStatusField(status, "VmRSS"),
		Threads:      procStatusField(status, "Threads"),
		HeapInuseKiB: m["go_memstats_heap_inuse_bytes"] / 1024,
		Goroutines:   m["go_goroutines"],
		FDs:          float64(len(fds)),
		Series:       float64(len(m)),
		LogBytes:     float64(logInfo.Size()),
		CPUSeconds:   float64(procJiffies(pid)) / 100, // USER_HZ
	}
	for k, v := range m {
		if !strings.HasPrefix(k, "aggd_session_handshakes_total{") || (peer != "" && !strings.Contains(k, `peer="`+peer+`"`)) {
			continue
		}
		switch {
		case strings.Contains(k, `result="ok"`):
			p.HandshakesOK += v
		case strings.Contains(k, `result="rejected"`):
			p.HandshakesRejected += v
		}
	}
	return p
}

// procStatusField reads a number from /proc/PID/status ("VmRSS:   1234 kB" gives 1234).
func procStatusField(status []byte, name string) float64 {
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				x, _ := strconv.ParseFloat(f[0], 64)
				return x
			}
		}
	}
	return math.NaN()
}

// bpfObjects counts the machine's BPF programs or maps by walking their IDs with next
// (ebpf.ProgramGetNextID or ebpf.MapGetNextID), as bpftool does.
func bpfObjects[ID ~uint32](t testing.TB, what string, next func(ID) (ID, error)) int {
	count := 0
	for id := ID(0); ; count++ {
		var err error
		if id, err = next(id); errors.Is(err, os.ErrNotExist) {
			return count
		} else if err != nil {
			t.Fatalf("listing BPF %s: %v", what, err)
		}
	}
}

// soakGrowthOf is what grew in one daemon between the end of cycle 1 and the end.
type soakGrowthOf struct {
	Goroutines   [2]float64 `json:"goroutines"`
	Threads      [2]float64 `json:"threads"`
	FDs          [2]float64 `json:"fds"`
	Series       [2]float64 `json:"series"`
	RSSKiB       [2]float64 `json:"rss_kib"`
	HeapInuseKiB [2]float64 `json:"heap_inuse_kib"`
	// RSSSlopeKiBPerHour and HeapSlopeKiBPerHour: least-squares slopes over the samples
	// from cycle 1 on (one sample of a garbage-collected heap says little).
	RSSSlopeKiBPerHour  float64 `json:"rss_slope_kib_per_hour"`
	HeapSlopeKiBPerHour float64 `json:"heap_slope_kib_per_hour"`
	LogBytesPerHour     float64 `json:"log_bytes_per_hour"`
	CPUPercent          float64 `json:"cpu_percent"`
}

func (g soakGrowthOf) line() string {
	return fmt.Sprintf("goroutines %.0f -> %.0f, threads %.0f -> %.0f, fds %.0f -> %.0f, series %.0f -> %.0f, "+
		"RSS %.0f -> %.0f KiB (slope %+.0f KiB/h), heap %.0f -> %.0f KiB (slope %+.0f KiB/h), log %.0f kB/h, CPU %.1f %%",
		g.Goroutines[0], g.Goroutines[1], g.Threads[0], g.Threads[1], g.FDs[0], g.FDs[1], g.Series[0], g.Series[1],
		g.RSSKiB[0], g.RSSKiB[1], g.RSSSlopeKiBPerHour, g.HeapInuseKiB[0], g.HeapInuseKiB[1], g.HeapSlopeKiBPerHour,
		g.LogBytesPerHour/1000, g.CPUPercent)
}

func soakGrowth(samples []soakSample, of func(soakSample) soakProc) soakGrowthOf {
	first, end := of(samples[1]), of(last(samples))
	hours := (last(samples).AtS - samples[1].AtS) / 3600
	g := soakGrowthOf{
		Goroutines:      [2]float64{first.Goroutines, end.Goroutines},
		Threads:         [2]float64{first.Threads, end.Threads},
		FDs:             [2]float64{first.FDs, end.FDs},
		Series:          [2]float64{first.Series, end.Series},
		RSSKiB:          [2]float64{first.RSSKiB, end.RSSKiB},
		HeapInuseKiB:    [2]float64{first.HeapInuseKiB, end.HeapInuseKiB},
		LogBytesPerHour: (end.LogBytes - first.LogBytes) / hours,
		CPUPercent:      100 * (end.CPUSeconds - first.CPUSeconds) / (hours * 3600),
	}
	var at, rss, heap []float64
	for _, s := range samples[1:] {
		at = append(at, s.AtS/3600)
		rss = append(rss, of(s).RSSKiB)
		heap = append(heap, of(s).HeapInuseKiB)
	}
	g.RSSSlopeKiBPerHour = slope(at, rss)
	g.HeapSlopeKiBPerHour = slope(at, heap)
	return g
}

// slope is the least-squares slope of y over x.
func slope(x, y []float64) float64 {
	var mx, my float64
	for i := range x {
		mx += x[i]
		my += y[i]
	}
	mx /= float64(len(x))
	my /= float64(len(y))
	var num, den float64
	for i := range x {
		num += (x[i] - mx) * (y[i] - my)
		den += (x[i] - mx) * (x[i] - mx)
	}
	if den == 0 {
		return 0
	}
	return num / den
}

func last[T any](s []T) T { return s[len(s)-1] }
