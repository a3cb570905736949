package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/testnet"
)

// BenchmarkHeadendScale measures what one headend costs per CPE it serves while the
// CPEs are idle, which is most of an operator's day: probes, replies and reports on
// every link of every session, and each session's control loop. CPEs join one headend
// in steps (AGGD_BENCH_CPES, default 1,10,50,100), each CPE in a namespace of its own with
// two uplinks to the headend, as customers' routers would be; at each step, once every
// session and link is up, it measures over 20 s:
//   - the headend's CPU (utime+stime of its process) and memory (RSS), goroutines and
//     threads;
//   - the packets per second the headend's sessions receive and send;
//   - what a scrape of the headend's metrics returns and takes;
//   - how long the step's CPEs took to connect, all started at once;
//   - the CPEs' own CPU, on average.
//
// Then the headend restarts, and it measures how long until every CPE is back.
//
// The CPEs run without BPF (they are the load here); the headend as deployed, with its
// XDP shield on every interface a CPE reaches it through. It runs once whatever b.N
// is and writes results/bench/headend-scale.json.
// Run: make bench (or: go test -run '^$' -bench HeadendScale -benchtime 1x ./test/e2e).
func BenchmarkHeadendScale(b *testing.B) {
	steps := scaleSteps(b)
	most := steps[len(steps)-1]
	n := testnet.New(b, "hs")
	n.AddNS("hub")
	n.Run("hub", "ip", "addr", "add", headendIP+"/32", "dev", "lo")
	dir := b.TempDir()

	var peers, hubIfaces strings.Builder
	hubKey := writeKey(b, dir, "hub.key")
	for i := 1; i <= most; i++ {
		pub := writeKey(b, dir, fmt.Sprintf("cpe%d.key", i))
		fmt.Fprintf(&peers, "  - name: cpe%d\n    public_key: %s\n    tunnel_address: [%s/32]\n", i, pub, scaleTunnelAddr(i))
		cpe := fmt.Sprintf("c%d", i)
		n.AddNS(cpe)
		for k := 1; k <= scaleUplinks; k++ {
			hl := fmt.Sprintf("c%du%d", i, k)
			n.Veth(cpe, fmt.Sprintf("up%d", k), fmt.Sprintf("10.%d.%d.2/24", 200+k, i), "hub", hl, fmt.Sprintf("10.%d.%d.1/24", 200+k, i))
			n.Run(cpe, "ip", "route", "add", headendIP+"/32", "via", fmt.Sprintf("10.%d.%d.1", 200+k, i), "dev", fmt.Sprintf("up%d", k), "metric", strconv.Itoa(100+k))
			hubIfaces.WriteString(hl + ", ")
		}
		writeFile(b, dir, fmt.Sprintf("cpe%d.yaml", i), fmt.Sprintf(`private_key_file: %s
headend:
  endpoint: %s:4242
  public_key: %s
tunnel:
  address: [%s/32]
uplinks:
  - name: up1
    interface: up1
  - name: up2
    interface: up2
log:
  level: info
`, filepath.Join(dir, fmt.Sprintf("cpe%d.key", i)), headendIP, hubKey, scaleTunnelAddr(i)))
	}
	writeFile(b, dir, "hub.yaml", fmt.Sprintf(`private_key_file: %s
listen: "%s:4242"
tunnel:
  address: [100.64.0.1/16]
nat:
  enabled: false
peers:
%slog:
  level: info
bpf:
  pin_dir: %s
  interfaces: [%s]
`, filepath.Join(dir, "hub.key"), headendIP, peers.String(), pinRoot, strings.TrimSuffix(hubIfaces.String(), ", ")))

	hub := &bond{Net: n, dir: dir}
	// AGGD_BENCH_HEADEND_ARGS adds options to the headend's command line (e.g.
	// --cpu-profile DIR, --fast-path).
	startHeadend := func(log string) {
		hub.headend = n.Start("hub", filepath.Join(dir, log), append([]string{aggdBinary, "headend", "--config", filepath.Join(dir, "hub.yaml")},
			strings.Fields(os.Getenv("AGGD_BENCH_HEADEND_ARGS"))...)...)
	}
	startHeadend("hub.log")
	b.Cleanup(func() {
		if b.Failed() {
			data, _ := os.ReadFile(filepath.Join(dir, "hub.log"))
			b.Logf("---- hub.log (last 8 KiB) ----\n%s", tail(data, 8192))
		}
	})
	res := scaleResult{
		Date: time.Now().UTC().Format(time.RFC3339), Commit: gitCommit(), CPUs: runtime.NumCPU(), CPU: cpuModel(),
		Kernel: strings.TrimSpace(readFileString("/proc/sys/kernel/osrelease")), UplinksPerCPE: scaleUplinks,
		Window: scaleWindow.Seconds(),
	}
	var cpes []*testnet.Proc
	for _, step := range steps {
		start := time.Now()
		for i := len(cpes) + 1; i <= step; i++ {
			cpes = append(cpes, n.Start(fmt.Sprintf("c%d", i), filepath.Join(dir, fmt.Sprintf("cpe%d.log", i)),
				aggdBinary, "cpe", "--no-bpf", "--config", filepath.Join(dir, fmt.Sprintf("cpe%d.yaml", i))))
		}
		waitAllLinksUp(b, hub, cpes)
		r := scaleStep{CPEs: step, ConnectSeconds: time.Since(start).Seconds()}
		time.Sleep(3 * time.Second) // the new sessions' probe trains and first reports
		measureScaleStep(b, hub, cpes, &r)
		res.Steps = append(res.Steps, r)
		b.Logf("%3d CPEs: connected in %.1f s; headend %.1f %% of a CPU (%.2f per CPE), %.0f MiB, %d goroutines; %.0f / %.0f packets/s in / out; control loop %.2f ms late, %d suspicions; scrape %d series, %.0f kB, %.0f ms; a CPE %.2f %% of a CPU",
			r.CPEs, r.ConnectSeconds, r.HeadendCPUPercent, r.HeadendCPUPercentPerCPE, r.HeadendRSSMiB, r.Goroutines,
			r.RxPacketsPerSecond, r.TxPacketsPerSecond, r.LoopLatenessMillis, r.Suspicions, r.ScrapeSeries, r.ScrapeBytes/1000, r.ScrapeMillis, r.CPECPUPercent)
	}

	// The headend restarts (an upgrade, a crash): every CPE finds it silent and
	// handshakes again, all at once, into the headend's handshake rate limit.
	stopped := time.Now()
	if err := hub.headend.Cmd.Process.Signal(os.Interrupt); err != nil {
		b.Fatal(err)
	}
	select {
	case <-hub.headend.Done:
	case <-time.After(10 * time.Second):
		b.Fatal("the headend did not stop within 10 s of SIGINT")
	}
	startHeadend("hub-restarted.log")
	waitAllLinksUp(b, hub, cpes)
	res.Restart.CPEs = len(cpes)
	res.Restart.BackSeconds = time.Since(stopped).Seconds()
	m, err := hub.metrics("hub")
	if err != nil {
		b.Fatalf("scrape the restarted headend: %v", err)
	}
	res.Restart.HandshakesRateLimited = int(m[`aggd_drops_total{reason="rate_limited"}`])
	for k, v := range m {
		if strings.HasPrefix(k, "aggd_session_handshakes_total{") && strings.Contains(k, `result="ok"`) {
			res.Restart.HandshakesOK += int(v)
		}
	}
	b.Logf("headend restarted: all %d CPEs' sessions and links up again %.1f s after it stopped; %d handshakes completed, %d packets refused by the handshake rate limit",
		res.Restart.CPEs, res.Restart.BackSeconds, res.Restart.HandshakesOK, res.Restart.HandshakesRateLimited)

	last := res.Steps[len(res.Steps)-1]
	b.ReportMetric(last.HeadendCPUPercentPerCPE, "headend-cpu-%/cpe")
	b.ReportMetric(last.HeadendRSSMiB, "headend-MiB")
	writeJSON(b, "headend-scale.json", res)
}

const (
	// scaleUplinks is how many uplinks each CPE of BenchmarkHeadendScale has.
	scaleUplinks = 2
	// scaleWindow is how long each step is measured.
	scaleWindow = 20 * time.Second
)

// scaleSteps reads AGGD_BENCH_CPES ("1,10,50,100"): how many CPEs the headend serves at
// each step, rising, at most 250 (the uplinks' addresses are 10.20k.<cpe>.0/24).
func scaleSteps(b *testing.B) []int {
	spec := os.Getenv("AGGD_BENCH_CPES")
	if spec == "" {
		spec = "1,10,50,100"
	}
	var steps []int
	for _, f := range strings.Split(spec, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 || v > 250 {
			b.Fatalf("AGGD_BENCH_CPES=%q: each step must be a number of CPEs from 1 to 250, e.g. 1,10,50", spec)
		}
		steps = append(steps, v)
	}
	if !slices.IsSorted(steps) || len(slices.Compact(slices.Clone(steps))) != len(steps) {
		b.Fatalf("AGGD_BENCH_CPES=%q: the steps must rise, e.g. 1,10,50", spec)
	}
	return steps
}

// scaleTunnelAddr is CPE i's tunnel address, in the headend's 100.64.0.0/16.
func scaleTunnelAddr(i int) string { return fmt.Sprintf("100.64.%d.%d", 1+i/200, 2+i%200) }

// waitAllLinksUp waits until the headend has a session with every running CPE and
// every link of each is up.
func waitAllLinksUp(b *testing.B, hub *bond, cpes []*testnet.Proc) {
	b.Helper()
	want := len(cpes) * scaleUplinks
	deadline := time.Now().Add(30*time.Second + time.Duration(len(cpes))*200*time.Millisecond)
	for {
		for i, p := range cpes {
			if p.Exited() {
				data, _ := os.ReadFile(filepath.Join(hub.dir, fmt.Sprintf("cpe%d.log", i+1)))
				b.Fatalf("cpe%d's aggd exited: %v\n%s", i+1, p.Err, tail(data, 4096))
			}
		}
		if hub.headend.Exited() {
			b.Fatalf("the headend's aggd exited: %v", hub.headend.Err)
		}
		m, err := hub.metrics("hub")
		up := int(seriesSum(m, "aggd_link_up")) // 1 per link up, 0 per other
		if up == want && m["aggd_sessions"] == float64(len(cpes)) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d CPEs: the headend has %v sessions and %d links up, want %d and %d (scrape error: %v)",
				len(cpes), m["aggd_sessions"], up, len(cpes), want, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// measureScaleStep fills r over scaleWindow with the CPEs idle.
func measureScaleStep(b *testing.B, hub *bond, cpes []*testnet.Proc, r *scaleStep) {
	b.Helper()
	cpeJiffies := func() (sum uint64) {
		for _, p := range cpes {
			sum += procJiffies(p.Cmd.Process.Pid)
		}
		return sum
	}
	counters := func() map[string]float64 {
		m, err := hub.metrics("hub")
		if err != nil {
			b.Fatalf("scrape the headend: %v", err)
		}
		return map[string]float64{
			"rx": seriesSum(m, "aggd_link_receive_packets_total"), "tx": seriesSum(m, "aggd_link_transmit_packets_total"),
			"suspicions": seriesSum(m, "aggd_link_suspicions_total"),
			"late_sum":   m["aggd_control_loop_lateness_seconds_sum"], "late_count": m["aggd_control_loop_lateness_seconds_count"],
		}
	}
	pid := hub.headend.Cmd.Process.Pid
	hub0, cpe0 := procJiffies(pid), cpeJiffies()
	c0 := counters()
	t0 := time.Now()
	time.Sleep(scaleWindow)
	c1 := counters()
	wall := time.Since(t0).Seconds()
	hub1, cpe1 := procJiffies(pid), cpeJiffies()
	delta := func(k string) float64 { return c1[k] - c0[k] }

	r.HeadendCPUPercent = 100 * float64(hub1-hub0) / userHZ / wall
	r.HeadendCPUPercentPerCPE = r.HeadendCPUPercent / float64(len(cpes))
	r.CPECPUPercent = 100 * float64(cpe1-cpe0) / userHZ / wall / float64(len(cpes))
	r.RxPacketsPerSecond, r.TxPacketsPerSecond = delta("rx")/wall, delta("tx")/wall
	r.Suspicions = int(delta("suspicions"))
	if n := delta("late_count"); n > 0 {
		r.LoopLatenessMillis = 1000 * delta("late_sum") / n
	}
	r.HeadendRSSMiB = float64(procStatusKiB(b, pid, "VmRSS")) / 1024
	m, err := hub.metrics("hub")
	if err != nil {
		b.Fatalf("scrape the headend: %v", err)
	}
	r.Goroutines, r.Threads = int(m["go_goroutines"]), int(m["go_threads"])

	// A scrape, as Prometheus makes it: the median of five.
	var times []float64
	var body string
	for range 5 {
		s := time.Now()
		if body, err = hub.HTTPGet("hub", "http://127.0.0.1:9469/metrics"); err != nil {
			b.Fatalf("scrape the headend: %v", err)
		}
		times = append(times, float64(time.Since(s).Microseconds())/1000)
	}
	slices.Sort(times)
	r.ScrapeMillis = times[len(times)/2]
	r.ScrapeBytes = float64(len(body))
	for _, line := range strings.Split(body, "\n") {
		if line != "" && line[0] != '#' {
			r.ScrapeSeries++
		}
	}
}

// procStatusKiB reads a "kB" field of /proc/<pid>/status (VmRSS, VmHWM).
func procStatusKiB(b *testing.B, pid int, field string) int {
	for _, line := range strings.Split(readFileString(fmt.Sprintf("/proc/%d/status", pid)), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kib, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err == nil {
				return kib
			}
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

type scaleResult struct {
	Date          string      `json:"date"`
	Commit        string      `json:"commit"`
	CPUs          int         `json:"cpus"`
	CPU           string      `json:"cpu_model"`
	Kernel        string      `json:"kernel"`
	UplinksPerCPE int         `json:"uplinks_per_cpe"`
	Window        float64     `json:"window_s"`
	Steps         []scaleStep `json:"steps"`
	// Restart: the headend stopped and started again with every CPE running.
	Restart struct {
		CPEs                  int     `json:"cpes"`
		BackSeconds           float64 `json:"all_back_s"` // from the stop to every session and link up
		HandshakesOK          int     `json:"handshakes_completed"`
		HandshakesRateLimited int     `json:"handshake_packets_rate_limited"`
	} `json:"restart"`
}

type scaleStep struct {
	CPEs                    int     `json:"cpes"`
	ConnectSeconds          float64 `json:"connect_s"`
	HeadendCPUPercent       float64 `json:"headend_cpu_percent"`
	HeadendCPUPercentPerCPE float64 `json:"headend_cpu_percent_per_cpe"`
	HeadendRSSMiB           float64 `json:"headend_rss_mib"`
	Goroutines              int     `json:"headend_goroutines"`
	Threads                 int     `json:"headend_threads"`
	RxPacketsPerSecond      float64 `json:"headend_rx_packets_per_s"`
	TxPacketsPerSecond      float64 `json:"headend_tx_packets_per_s"`
	ScrapeSeries            int     `json:"scrape_series"`
	ScrapeBytes             float64 `json:"scrape_bytes"`
	ScrapeMillis            float64 `json:"scrape_ms"`
	CPECPUPercent           float64 `json:"cpe_cpu_percent_each"`
	// LoopLatenessMillis is the headend's control loop's mean lateness: the loop ticks
	// every session in turn, so it grows with the sessions it serves.
	LoopLatenessMillis float64 `json:"headend_loop_lateness_ms_mean"`
	// Suspicions counts the headend's links suspected in the window: none is down.
	Suspicions int `json:"headend_link_suspicions"`
}
