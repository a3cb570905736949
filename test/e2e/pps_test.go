package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/aggd/aggd/internal/testnet"
)

// BenchmarkForwardingPPS measures packets per second through the CPE and the headend
// (lan → cpe ═ 3 unshaped veths ═ hub → srv and back) for the kernel fast path (the
// default) against the userspace slow path (--no-bpf) of the same binary, at 64-, 512-
// and 1400-byte inner IP packets, in both directions, together with the CPU it costs.
//
// Each cell runs under one of two loads. "paced": the generator offers the same fixed
// rate to both paths (AGGD_PPS_PACED, default 20000 packets per second, below what
// either path can carry on this machine), so the cell measures what forwarding a
// packet costs, without drops; this is the per-core figure the target is judged on.
// "open": the generator sends as fast as one thread can (open loop), which shows what
// each path does when it is overloaded (drops, and, for the fast path, the receive
// ordering falling back to the daemon on every gap).
//
// A third path, "plain", runs the paced cells with no aggd at all: lan ↔ srv routed over
// uplink 1 with the same two masquerades the daemons install. What a path's forwarding
// cores exceed it by is what the tunnel adds (the ratios' added basis).
//
// For each cell a Go generator in the source namespace sends UDP datagrams with
// sendmmsg for a warm-up second plus the measured window, and a sink in the
// destination namespace counts them with recvmmsg. The window's
// delivered packets are divided by the CPU the whole machine was busy for (from
// /proc/stat: user+nice+system+irq+softirq+steal), which includes the generator and
// the sink themselves; this undercounts the faster path's advantage. Also reported:
// the CPU of each aggd process, "forwarding cores" (aggd processes + all irq/softirq
// time, i.e. without the generator's and sink's own user and system time and without
// unrelated processes), and for the fast path the fraction of data packets each stage
// handled in the kernel (aggd_fastpath_packets_total), which shows which path carried
// the packets.
//
// It runs once whatever b.N is (use -benchtime 1x) and writes results/bench/pps.json.
// Run: make bench (or: go test -run '^$' -bench ForwardingPPS -benchtime 1x -v ./test/e2e).
// AGGD_PPS_SECONDS overrides the measured window per cell (default 5) for quick runs.
// AGGD_PPS_PACED sets the paced cells' offered rate (packets per second). AGGD_PPS_ONLY
// (a regular expression) runs only the cells whose name path/load/direction/size
// matches, e.g. "fast/paced/down". AGGD_PPS_PIN_CPU=n pins the generator's thread to CPU
// n (unpinned, the scheduler moves it; from CPU 1 the downstream fast path's receive
// sees the links' packets out of order: BENCHMARKS.md).
func BenchmarkForwardingPPS(b *testing.B) {
	// AGGD_PPS_OUTER=ipv6: every uplink an IPv6-only line (results in pps-ipv6.json),
	// where the transmit program also computes the outer UDP checksum. There is no plain
	// reference then: the plain routed path would need IPv4 on the uplinks.
	outer := os.Getenv("AGGD_PPS_OUTER")
	var bondOpts bondOptions
	resultName, topoOpts := "pps", topologyOptions{}
	switch outer {
	case "", "ipv4":
		outer = "ipv4"
	case "ipv6":
		bondOpts, resultName, topoOpts.allIPv6 = ipv6BondOptions(1, 2, 3), "pps-ipv6", true
	default:
		b.Fatalf("AGGD_PPS_OUTER=%q: want ipv4 or ipv6", outer)
	}
	n := newTopologyUnshaped(b, topoOpts)
	measure := ppsMeasure
	if s := os.Getenv("AGGD_PPS_SECONDS"); s != "" {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v <= 0 {
			b.Fatalf("AGGD_PPS_SECONDS=%q: want a positive number of seconds", s)
		}
		measure = time.Duration(v * float64(time.Second))
	}
	var only *regexp.Regexp
	if s := os.Getenv("AGGD_PPS_ONLY"); s != "" {
		var err error
		if only, err = regexp.Compile(s); err != nil {
			b.Fatalf("AGGD_PPS_ONLY=%q: %v", s, err)
		}
	}
	pin := -1
	if s := os.Getenv("AGGD_PPS_PIN_CPU"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 || v >= runtime.NumCPU() {
			b.Fatalf("AGGD_PPS_PIN_CPU=%q: want a CPU number below %d", s, runtime.NumCPU())
		}
		pin = v
	}
	paced := float64(ppsPacedDefault)
	if s := os.Getenv("AGGD_PPS_PACED"); s != "" {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v <= 0 {
			b.Fatalf("AGGD_PPS_PACED=%q: want a positive number of packets per second", s)
		}
		paced = v
	}
	res := ppsResult{
		Date:             time.Now().UTC().Format(time.RFC3339),
		Kernel:           strings.TrimSpace(readFileString("/proc/sys/kernel/osrelease")),
		CPUs:             runtime.NumCPU(),
		CPUModel:         cpuModel(),
		GoVersion:        runtime.Version(),
		Commit:           gitCommit(),
		Topology:         "lan → cpe ═ up1..3 (unshaped veth, default qdisc, MTU 1500) ═ hub → srv; NAT on both daemons (startBond config)",
		OuterIP:          outer,
		Generator:        "one Go thread, sendmmsg on a connected UDP socket: paced cells at the offered rate (batches of at most 16, topped up every 100 µs or so), open cells in batches of 64 as fast as it can",
		PacedPPS:         paced,
		Sink:             "one Go thread, recvmmsg batches of 64 (MSG_WAITFORONE), 8 MiB receive buffer",
		WarmupSeconds:    ppsWarmup.Seconds(),
		MeasureSeconds:   measure.Seconds(),
		CPUBasis:         "machine_busy_cores = busy jiffies of all CPUs (user+nice+system+irq+softirq+steal from /proc/stat) / wall seconds; it includes the traffic generator and sink (and anything else running on the machine), which is conservative for the faster path. forwarding_cores = both aggd processes (utime+stime) + all CPUs' irq+softirq time; it excludes the generator's and sink's own user/system time and other processes, but the softirq part still includes the veth hops into the CPE and out to the sink.",
		InnerSizeMeaning: "IP packet size of the inner (routed) packet; UDP payload = size - 28",
	}
	if out, err := exec.Command(aggdBinary, "version").Output(); err == nil {
		res.AggdVersion = strings.TrimSpace(string(out))
	}
	stopStats, err := enableBPFStats()
	if err != nil {
		b.Fatalf("AGGD_PPS_BPF_STATS=1: cannot turn on the kernel's BPF run statistics: %v (needs Linux 5.8 and CAP_SYS_ADMIN)", err)
	}
	if stopStats != nil {
		defer stopStats()
		ppsBPFStats = true
		res.BPFStats = "on: every program run also read the clock twice, so these cells' CPU figures include that cost"
	}

	// The plain reference first: the same hosts, routers and NAT without aggd, paced only.
	// What a path costs above it is what the tunnel adds (added_forwarding_cores).
	plain := ppsPathStatus{Path: "plain", Available: outer == "ipv4"}
	if !plain.Available {
		plain.Reason = "no plain reference over IPv6-only uplinks"
	} else if err := ppsPlainUp(n); err != nil {
		b.Fatalf("plain routed reference: %v", err)
	}
	res.Paths = append(res.Paths, plain)
	// cells runs (or, on a path that did not come up, records as not measured) every
	// cell of path under loads that AGGD_PPS_ONLY selects.
	cells := func(bd *bond, path string, loads []string, reason string) {
		for _, load := range loads {
			for _, dir := range []string{"up", "down"} {
				for _, size := range ppsSizes {
					c := ppsCell{Path: path, Load: load, Direction: dir, Size: size, GeneratorCPU: pin}
					if only != nil && !only.MatchString(c.name()) {
						continue
					}
					if load == "paced" {
						c.OfferedPPS = paced
					}
					if reason == "" {
						runPPSCell(b, bd, &c, measure)
					} else {
						c.Reason = reason
					}
					b.Logf("%s", c.line())
					res.Cells = append(res.Cells, c)
				}
			}
		}
	}
	if plain.Available {
		cells(&bond{Net: n}, "plain", []string{"paced"}, "")
		if err := ppsPlainDown(n); err != nil {
			b.Fatalf("removing the plain routed reference: %v", err)
		}
	}

	// The slow path before the fast one: the fast path is the one that may not come up,
	// and a bond that does not (its daemons are left to the topology's teardown) must
	// not cost the slow-path cells.
	for _, path := range []string{"slow", "fast"} {
		var args []string
		if path == "slow" {
			args = []string{"--no-bpf"}
		} else {
			args = []string{"--fast-path"}
		}
		st := ppsPathStatus{Path: path, DaemonArgs: strings.Join(args, " ")}
		bd, logDir, err := tryStartBond(b, n, bondOpts, args...)
		st.CPELog, st.HeadendLog = bpfLogLines(filepath.Join(logDir, "cpe.log")), bpfLogLines(filepath.Join(logDir, "hub.log"))
		st.CPEFastPathOn, st.HeadendFastPathOn = logHas(logDir, "cpe.log", "BPF fast path on"), logHas(logDir, "hub.log", "BPF fast path on")
		switch {
		case err != nil:
			st.Reason = fmt.Sprintf("the bond did not come up: %v (cpe log: %s; headend log: %s)", err,
				lastLogLine(filepath.Join(logDir, "cpe.log")), lastLogLine(filepath.Join(logDir, "hub.log")))
		case path == "fast" && !st.CPEFastPathOn && !st.HeadendFastPathOn:
			st.Reason = fmt.Sprintf("fast path not on in either daemon, so measuring would measure the slow path again (cpe log: %s; headend log: %s)",
				fastPathLogReason(st.CPELog), fastPathLogReason(st.HeadendLog))
		}
		st.Available = st.Reason == ""
		res.Paths = append(res.Paths, st)
		if !st.Available {
			b.Logf("%s path not measured: %s", path, st.Reason)
		}
		reason := ""
		if !st.Available {
			reason = "path not available (see path_status)"
		}
		cells(bd, path, ppsLoads, reason)
		if bd != nil {
			bd.stop(b)
		}
	}
	res.Ratios = ppsRatios(res.Cells)

	writeJSON(b, resultName+".json", res)
	var tbl strings.Builder
	fmt.Fprintf(&tbl, "forwarding pps, outer %s, %d CPUs, %s, %s, %.0f s per cell after %.0f s warm-up\n", res.OuterIP, res.CPUs, res.Kernel, res.Commit, res.MeasureSeconds, res.WarmupSeconds)
	fmt.Fprintf(&tbl, "%-4s %-5s %-4s %5s %10s %10s %6s %6s %10s %6s %6s %6s %10s %8s %11s\n",
		"path", "load", "dir", "size", "sent_pps", "pps", "loss", "busy", "pps/busy", "aggdC", "aggdH", "fwd", "pps/fwd", "cpu-s/Gb", "fast tx/rx")
	for _, c := range res.Cells {
		fmt.Fprintf(&tbl, "%s\n", c.row())
		if line := c.bpfLine(); line != "" {
			fmt.Fprintf(&tbl, "     %s\n", line)
		}
	}
	fmt.Fprintf(&tbl, "fast/slow ratio of pps per core (target >= 5, forwarding basis):\n")
	fmt.Fprintf(&tbl, "%-5s %-4s %5s %12s %12s %12s  %s\n", "load", "dir", "size", "busy-basis", "fwd-basis", "added-basis", "note")
	for _, r := range res.Ratios {
		fmt.Fprintf(&tbl, "%-5s %-4s %5d %12s %12s %12s  %s\n", r.Load, r.Direction, r.Size, fmtRatio(r.PerBusyCore),
			fmtRatio(r.PerForwardingCore), fmtRatio(r.PerAddedCore), r.Note)
		if r.PerForwardingCore != nil {
			b.ReportMetric(*r.PerForwardingCore, fmt.Sprintf("ratio-%s-%s-%dB", r.Load, r.Direction, r.Size))
		}
	}
	b.Logf("\n%s", tbl.String())
}

const (
	ppsPacedDefault = 20000
	ppsWarmup       = time.Second
	ppsMeasure      = 5 * time.Second
	ppsBatch        = 64
	ppsPacedBatch   = 16
	ppsPortUp       = 5401
	ppsPortDown     = 5402
	ppsPortPlain    = 10  // added to the ports for the plain reference's cells
	userHZ          = 100 // USER_HZ, the unit of /proc/stat and /proc/<pid>/stat times on Linux
)

var (
	ppsSizes = []int{64, 512, 1400}
	// ppsLoads: paced first, so that an overloaded open cell cannot leave a path in a
	// state (a receive ordering held by the daemon) that the paced cells would inherit.
	ppsLoads = []string{"paced", "open"}
)

// newTopologyUnshaped is newTopology without the TBF shaping: the same namespaces,
// addressing and routes, veths at their natural speed, and its own prefix ("pp") so it
// never clashes with the other end-to-end tests' ("ae").
func newTopologyUnshaped(t testing.TB, opts topologyOptions) *testnet.Net {
	opts.shaped = false
	n := buildTopologyWith(t, "pp", opts)
	wireLikeHosts(n)
	return n
}

// stop ends both daemons (SIGINT, so they remove what they set up) and waits; one
// that does not stop is left to the topology's teardown, which kills it.
func (b *bond) stop(t testing.TB) {
	for _, p := range []*testnet.Proc{b.cpe, b.headend} {
		if !p.Exited() {
			_ = p.Cmd.Process.Signal(os.Interrupt)
		}
		select {
		case <-p.Done:
		case <-time.After(10 * time.Second):
			t.Logf("%s did not stop on SIGINT within 10 s", strings.Join(p.Cmd.Args, " "))
		}
	}
}

// tryStartBond is startBond with its fatal failures (daemons that exit or never bring
// the tunnel up) turned into an error, so a datapath under construction costs only
// its own cells. dir is the daemons' directory (their logs), also on failure.
func tryStartBond(b testing.TB, n *testnet.Net, opts bondOptions, daemonArgs ...string) (bd *bond, dir string, err error) {
	st := &softTB{TB: b}
	done := make(chan struct{})
	go func() {
		defer close(done)
		bd = startBondWith(st, n, opts, daemonArgs...)
	}()
	<-done
	if st.err != "" || bd == nil {
		return nil, st.dir, fmt.Errorf("%s", st.err)
	}
	return bd, st.dir, nil
}

// softTB is a testing.TB whose Fatal ends only the calling goroutine and records the
// message instead of failing the benchmark. TempDir remembers the directory it made.
type softTB struct {
	testing.TB
	err, dir string
}

func (s *softTB) Fatalf(format string, args ...any) { s.stop(fmt.Sprintf(format, args...)) }
func (s *softTB) Fatal(args ...any)                 { s.stop(fmt.Sprint(args...)) }
func (s *softTB) FailNow()                          { s.stop("FailNow") }
func (s *softTB) Helper()                           {}
func (s *softTB) TempDir() string {
	s.dir = s.TB.TempDir()
	return s.dir
}

func (s *softTB) stop(msg string) {
	s.err = msg
	runtime.Goexit()
}

type ppsResult struct {
	Date             string          `json:"date"`
	Kernel           string          `json:"kernel"`
	CPUs             int             `json:"cpus"`
	CPUModel         string          `json:"cpu_model"`
	GoVersion        string          `json:"go_version"`
	Commit           string          `json:"commit"`
	AggdVersion      string          `json:"aggd_version"`
	Topology         string          `json:"topology"`
	Generator        string          `json:"generator"`
	Sink             string          `json:"sink"`
	PacedPPS         float64         `json:"paced_offered_pps"`
	WarmupSeconds    float64         `json:"warmup_seconds"`
	MeasureSeconds   float64         `json:"measure_seconds_per_cell"`
	CPUBasis         string          `json:"cpu_basis"`
	InnerSizeMeaning string          `json:"inner_packet_bytes_meaning"`
	OuterIP          string          `json:"outer_ip"` // the uplinks' version (AGGD_PPS_OUTER)
	Paths            []ppsPathStatus `json:"path_status"`
	Cells            []ppsCell       `json:"cells"`
	Ratios           []ppsRatio      `json:"fast_over_slow"`
	BPFStats         string          `json:"bpf_run_stats,omitempty"` // AGGD_PPS_BPF_STATS=1
}

type ppsPathStatus struct {
	Path              string   `json:"path"`
	DaemonArgs        string   `json:"daemon_args"`
	CPEFastPathOn     bool     `json:"cpe_logged_fast_path_on"`
	HeadendFastPathOn bool     `json:"headend_logged_fast_path_on"`
	Available         bool     `json:"measured"`
	Reason            string   `json:"reason,omitempty"`
	CPELog            []string `json:"cpe_bpf_log_lines"`
	HeadendLog        []string `json:"headend_bpf_log_lines"`
}

type ppsCell struct {
	Path       string  `json:"path"`                  // fast (--fast-path) or slow (--no-bpf)
	Load       string  `json:"load"`                  // paced (fixed offered rate) or open (as fast as it can)
	OfferedPPS float64 `json:"offered_pps,omitempty"` // paced cells
	// GeneratorCPU is the CPU the generator's thread was pinned to, -1: not pinned.
	GeneratorCPU int    `json:"generator_cpu"`
	Direction    string `json:"direction"` // up: lan → srv; down: srv → lan
	Size         int    `json:"inner_packet_bytes"`
	Measured     bool   `json:"measured"`
	Reason       string `json:"reason,omitempty"`

	Seconds       float64 `json:"seconds"`
	SentPPS       float64 `json:"sent_pps"`
	DeliveredPPS  float64 `json:"delivered_pps"`
	DeliveredMbit float64 `json:"delivered_inner_mbit_per_s"`
	Loss          float64 `json:"loss_fraction"` // 1 - delivered/sent over the window (approximate: in-flight packets)
	SendErrors    uint64  `json:"send_errors"`
	SinkRcvbufErr uint64  `json:"sink_namespace_udp_rcvbuf_errors"`
	TunTxDropped  uint64  `json:"entry_agg0_tx_dropped"`   // agg0 of the daemon the packets enter by (cpe up, headend down)
	BacklogDrops  uint64  `json:"softnet_backlog_dropped"` // /proc/net/softnet_stat, all CPUs

	BusyCores        float64                       `json:"machine_busy_cores"`
	PPSPerBusyCore   float64                       `json:"pps_per_busy_core"`
	CPUSecPerGbit    float64                       `json:"machine_cpu_seconds_per_gbit"`
	CPECores         float64                       `json:"aggd_cpe_cores"`
	HeadendCores     float64                       `json:"aggd_headend_cores"`
	AggdShare        float64                       `json:"aggd_share_of_machine_busy"`
	BenchCores       float64                       `json:"generator_and_sink_process_cores"`
	IRQSoftirqCores  float64                       `json:"irq_softirq_cores"`
	ForwardingCores  float64                       `json:"forwarding_cores"`
	PPSPerFwdCore    float64                       `json:"pps_per_forwarding_core"`
	FwdCPUSecPerGbit float64                       `json:"forwarding_cpu_seconds_per_gbit"`
	FastTxStage      string                        `json:"fast_tx_stage,omitempty"`
	FastRxStage      string                        `json:"fast_rx_stage,omitempty"`
	FastTxFraction   *float64                      `json:"fast_tx_fraction,omitempty"`
	FastRxFraction   *float64                      `json:"fast_rx_fraction,omitempty"`
	FastPathCounters map[string]map[string]float64 `json:"fastpath_counter_deltas,omitempty"`
	// With AGGD_PPS_BPF_STATS=1: aggd's BPF programs over the window, and the
	// forwarding time per delivered packet they are part of.
	BPFPrograms    []ppsBPFProgram `json:"bpf_programs,omitempty"`
	FwdNsPerPacket float64         `json:"forwarding_ns_per_delivered_packet,omitempty"`
}

type ppsRatio struct {
	Load              string   `json:"load"`
	Direction         string   `json:"direction"`
	Size              int      `json:"inner_packet_bytes"`
	PerBusyCore       *float64 `json:"pps_per_busy_core_ratio"`
	PerForwardingCore *float64 `json:"pps_per_forwarding_core_ratio"`
	// What the tunnel adds to the plain reference's forwarding cores, per path, and the
	// ratio of packets per added core (paced cells with a plain cell only).
	FastAddedCores *float64 `json:"fast_added_forwarding_cores,omitempty"`
	SlowAddedCores *float64 `json:"slow_added_forwarding_cores,omitempty"`
	PerAddedCore   *float64 `json:"pps_per_added_core_ratio,omitempty"`
	MeetsTarget    *bool    `json:"meets_5x_target_forwarding_basis,omitempty"`
	Note           string   `json:"note,omitempty"`
}

// cpuSample is one reading of every CPU counter a cell uses.
type cpuSample struct {
	at                 time.Time
	busy, total, irqSI uint64 // jiffies, all CPUs
	cpe, headend, self uint64 // utime+stime jiffies
	sent, received     uint64
}

func runPPSCell(b *testing.B, bd *bond, c *ppsCell, measure time.Duration) {
	src, dst, port := "lan", "srv", ppsPortUp
	if c.Direction == "down" {
		src, dst, port = "srv", "lan", ppsPortDown
	}
	if c.Path == "plain" {
		port += ppsPortPlain
	}
	payload := make([]byte, c.Size-28)
	copy(payload, "aggd-pps")

	// Sockets: the sink in dst, the generator in src connected to it. Downstream, the
	// sink says hello first so that both daemons' NAT has the flow, as a real reply
	// direction would; the generator then sends to whatever address the hello came from.
	var sinkFD, genFD int
	if err := bd.Do(dst, func() (err error) { sinkFD, err = ppsSocket(port); return err }); err != nil {
		b.Fatalf("sink socket in %s: %v", dst, err)
	}
	defer unix.Close(sinkFD)
	if err := bd.Do(src, func() (err error) { genFD, err = ppsSocket(port); return err }); err != nil {
		b.Fatalf("generator socket in %s: %v", src, err)
	}
	defer unix.Close(genFD)
	if c.Direction == "up" {
		if err := unix.Connect(genFD, &unix.SockaddrInet4{Port: port, Addr: [4]byte{10, 97, 0, 2}}); err != nil {
			b.Fatal(err)
		}
	} else {
		if err := unix.Connect(sinkFD, &unix.SockaddrInet4{Port: port, Addr: [4]byte{10, 97, 0, 2}}); err != nil {
			b.Fatal(err)
		}
		if err := ppsHello(sinkFD, genFD); err != nil {
			c.Reason = fmt.Sprintf("downstream hello from lan to srv: %v", err)
			return
		}
	}

	var stop atomic.Bool
	var sent, received, sendErrs atomic.Uint64
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); ppsSink(sinkFD, &stop, &received) }()
	go func() {
		defer wg.Done()
		ppsGenerate(genFD, payload, c.OfferedPPS, c.GeneratorCPU, &stop, &sent, &sendErrs)
	}()
	defer func() { stop.Store(true); wg.Wait() }()

	time.Sleep(ppsWarmup)
	entry := "cpe"
	if c.Direction == "down" {
		entry = "hub"
	}
	fp0 := ppsFastCounters(bd, c.Path)
	snmp0, tun0 := udpRcvbufErrors(bd, dst), tunTxDropped(bd, entry)
	backlog0 := softnetDropped()
	bpf0 := ppsReadBPFRuns(b)
	s0 := takeCPUSample(b, bd, &sent, &received)
	time.Sleep(measure)
	s1 := takeCPUSample(b, bd, &sent, &received)
	bpf1 := ppsReadBPFRuns(b)
	backlog1 := softnetDropped()
	snmp1, tun1 := udpRcvbufErrors(bd, dst), tunTxDropped(bd, entry)
	fp1 := ppsFastCounters(bd, c.Path)
	stop.Store(true)
	wg.Wait()

	if bd.cpe != nil && (bd.cpe.Exited() || bd.headend.Exited()) {
		c.Reason = fmt.Sprintf("a daemon exited during the cell (cpe: %v, headend: %v)", bd.cpe.Exited(), bd.headend.Exited())
		return
	}
	wall := s1.at.Sub(s0.at).Seconds()
	cores := func(j1, j0 uint64) float64 { return float64(j1-min(j0, j1)) / userHZ / wall }
	c.Measured = true
	c.Seconds = wall
	c.SentPPS = float64(s1.sent-s0.sent) / wall
	c.DeliveredPPS = float64(s1.received-s0.received) / wall
	c.DeliveredMbit = c.DeliveredPPS * float64(c.Size) * 8 / 1e6
	if c.SentPPS > 0 {
		c.Loss = max(0, 1-c.DeliveredPPS/c.SentPPS)
	}
	c.SendErrors = sendErrs.Load()
	c.SinkRcvbufErr = snmp1 - min(snmp0, snmp1)
	c.TunTxDropped = tun1 - min(tun0, tun1)
	c.BacklogDrops = backlog1 - min(backlog0, backlog1)
	if dt := s1.total - s0.total; dt > 0 {
		c.BusyCores = float64(s1.busy-s0.busy) / float64(dt) * float64(runtime.NumCPU())
	}
	c.CPECores, c.HeadendCores = cores(s1.cpe, s0.cpe), cores(s1.headend, s0.headend)
	c.BenchCores = cores(s1.self, s0.self)
	c.IRQSoftirqCores = cores(s1.irqSI, s0.irqSI)
	c.ForwardingCores = c.CPECores + c.HeadendCores + c.IRQSoftirqCores
	if bpf1 != nil {
		c.BPFPrograms = bpfRunDeltas(bpf0, bpf1, s1.received-s0.received)
		if c.DeliveredPPS > 0 {
			c.FwdNsPerPacket = c.ForwardingCores / c.DeliveredPPS * 1e9
		}
	}
	if c.BusyCores > 0 {
		c.AggdShare = (c.CPECores + c.HeadendCores) / c.BusyCores
	}
	if c.DeliveredPPS > 0 {
		gbit := c.DeliveredMbit / 1e3 // Gbit delivered per second of wall time
		c.PPSPerBusyCore = c.DeliveredPPS / c.BusyCores
		c.CPUSecPerGbit = c.BusyCores / gbit
		if c.ForwardingCores > 0 {
			c.PPSPerFwdCore = c.DeliveredPPS / c.ForwardingCores
			c.FwdCPUSecPerGbit = c.ForwardingCores / gbit
		}
	} else {
		c.Reason = "nothing delivered in the window"
	}
	if c.Path == "fast" {
		c.FastPathCounters = map[string]map[string]float64{}
		for k, v1 := range fp1 {
			d := map[string]float64{}
			for verdict, x := range v1 {
				d[verdict] = x - fp0[k][verdict]
			}
			c.FastPathCounters[k] = d
		}
		c.FastTxStage, c.FastRxStage = "cpe tx", "headend rx"
		if c.Direction == "down" {
			c.FastTxStage, c.FastRxStage = "headend tx", "cpe rx"
		}
		c.FastTxFraction = fastFraction(c.FastPathCounters[c.FastTxStage])
		c.FastRxFraction = fastFraction(c.FastPathCounters[c.FastRxStage])
	}
	// Let queues drain before the next cell, and let the receive side see a quiet
	// second: a fast path whose daemon lost a passed-up packet under the last cell's
	// load takes the ordering back only after one (fastResyncQuiet in internal/tunnel).
	time.Sleep(1500 * time.Millisecond)
}

// ppsPlainUp routes lan ↔ srv over uplink 1 without aggd, with the masquerading the
// bond does (the CPE's LAN behind its uplink address, the headend's traffic behind its
// server-side address), so that a plain cell costs what a bond cell costs minus the
// tunnel.
func ppsPlainUp(n *testnet.Net) error {
	return runEach(n, []nsCommand{
		{"cpe", []string{"sysctl", "-qw", "net.ipv4.ip_forward=1"}},
		{"hub", []string{"sysctl", "-qw", "net.ipv4.ip_forward=1"}},
		{"cpe", []string{"ip", "route", "add", "10.97.0.0/24", "via", "10.98.1.1", "dev", "up1"}},
		{"cpe", []string{"nft", "add table ip ppsplain; add chain ip ppsplain post { type nat hook postrouting priority 100 ; } ; add rule ip ppsplain post oifname up1 masquerade"}},
		{"hub", []string{"nft", "add table ip ppsplain; add chain ip ppsplain post { type nat hook postrouting priority 100 ; } ; add rule ip ppsplain post oifname wan0 masquerade"}},
	})
}

// ppsPlainDown undoes ppsPlainUp (forwarding stays on: the daemons turn it on anyway).
// The plain cells' conntrack entries keep their NAT; the plain cells use their own ports
// (ppsPortPlain) so that no bond cell's flow matches one.
func ppsPlainDown(n *testnet.Net) error {
	return runEach(n, []nsCommand{
		{"cpe", []string{"ip", "route", "del", "10.97.0.0/24", "via", "10.98.1.1", "dev", "up1"}},
		{"cpe", []string{"nft", "delete", "table", "ip", "ppsplain"}},
		{"hub", []string{"nft", "delete", "table", "ip", "ppsplain"}},
	})
}

// nsCommand is a command to run in one of the topology's namespaces.
type nsCommand struct {
	ns   string
	args []string
}

// runEach runs cmds in order and stops at the first that fails.
func runEach(n *testnet.Net, cmds []nsCommand) error {
	for _, c := range cmds {
		if out, err := n.Try(c.ns, c.args...); err != nil {
			return fmt.Errorf("%s: %s: %v %s", c.ns, strings.Join(c.args, " "), err, out)
		}
	}
	return nil
}

// ppsSocket opens a blocking UDP socket bound to port on all addresses of the calling
// thread's namespace, with large buffers and 100 ms timeouts so loops can notice stop.
func ppsSocket(port int) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
	for _, e := range []error{
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1),
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20),
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 4<<20),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv),
		unix.Bind(fd, &unix.SockaddrInet4{Port: port}),
	} {
		if e != nil {
			unix.Close(fd)
			return -1, e
		}
	}
	return fd, nil
}

// ppsHello sends hellos from the (connected) lan sink socket until the srv generator
// socket receives one, then connects the generator to the hello's source address.
func ppsHello(sinkFD, genFD int) error {
	buf := make([]byte, 2048)
	for try := 0; try < 50; try++ {
		if _, err := unix.Write(sinkFD, []byte("aggd-pps hello")); err != nil && err != unix.ECONNREFUSED {
			return err
		}
		_, from, err := unix.Recvfrom(genFD, buf, 0)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		return unix.Connect(genFD, from)
	}
	return fmt.Errorf("no hello arrived in 5 s")
}

// ppsGenerate sends payload on the connected socket fd in sendmmsg batches until stop:
// at pps packets per second if pps > 0 (batches of at most ppsPacedBatch, as many as
// the schedule is behind, checked about every 100 µs), else as fast as it can. cpu >= 0
// pins the generator's thread to that CPU.
func ppsGenerate(fd int, payload []byte, pps float64, cpu int, stop *atomic.Bool, sent, errs *atomic.Uint64) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if cpu >= 0 {
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			errs.Add(1)
		}
	}
	iov := unix.Iovec{Base: &payload[0]}
	iov.SetLen(len(payload))
	msgs := make([]unix.Mmsghdr, ppsBatch)
	for i := range msgs {
		msgs[i].Hdr.Iov = &iov
		msgs[i].Hdr.SetIovlen(1)
	}
	start, done := time.Now(), uint64(0)
	for !stop.Load() {
		n := ppsBatch
		if pps > 0 {
			target := uint64(time.Since(start).Seconds() * pps)
			if target <= done {
				time.Sleep(100 * time.Microsecond)
				continue
			}
			n = int(min(target-done, ppsPacedBatch))
		}
		r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), uintptr(n), 0, 0, 0)
		if e != 0 {
			errs.Add(1)
			continue
		}
		done += uint64(r)
		sent.Add(uint64(r))
	}
	runtime.KeepAlive(payload)
	runtime.KeepAlive(msgs)
}

// ppsSink counts datagrams arriving on fd in recvmmsg batches until stop.
func ppsSink(fd int, stop *atomic.Bool, received *atomic.Uint64) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	bufs := make([]byte, ppsBatch*2048)
	iovs := make([]unix.Iovec, ppsBatch)
	msgs := make([]unix.Mmsghdr, ppsBatch)
	for i := range msgs {
		iovs[i].Base = &bufs[i*2048]
		iovs[i].SetLen(2048)
		msgs[i].Hdr.Iov = &iovs[i]
		msgs[i].Hdr.SetIovlen(1)
	}
	for !stop.Load() {
		r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])), ppsBatch, unix.MSG_WAITFORONE, 0, 0)
		if e != 0 {
			continue // EAGAIN after the 100 ms timeout, EINTR
		}
		received.Add(uint64(r))
	}
	runtime.KeepAlive(bufs)
	runtime.KeepAlive(iovs)
	runtime.KeepAlive(msgs)
}

func takeCPUSample(b *testing.B, bd *bond, sent, received *atomic.Uint64) cpuSample {
	var s cpuSample
	s.at = time.Now()
	s.sent, s.received = sent.Load(), received.Load()
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal guest guest_nice
	if len(f) < 9 || f[0] != "cpu" {
		b.Fatalf("unexpected /proc/stat: %q", line)
	}
	v := make([]uint64, len(f))
	for i := 1; i < len(f); i++ {
		v[i], _ = strconv.ParseUint(f[i], 10, 64)
	}
	user, nice, system, idle, iowait, irq, softirq, steal := v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]
	s.busy = user + nice + system + irq + softirq + steal
	s.total = s.busy + idle + iowait
	s.irqSI = irq + softirq
	if bd.cpe != nil { // nil: the plain reference, no daemons
		s.cpe = procJiffies(bd.cpe.Cmd.Process.Pid)
		s.headend = procJiffies(bd.headend.Cmd.Process.Pid)
	}
	s.self = procJiffies(os.Getpid())
	return s
}

// procJiffies is utime+stime of a whole process (all threads) from /proc/<pid>/stat.
func procJiffies(pid int) uint64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return ut + st
}

// udpRcvbufErrors reads Udp RcvbufErrors of a namespace (datagrams its sockets dropped).
func udpRcvbufErrors(bd *bond, ns string) uint64 {
	var data []byte
	_ = bd.Do(ns, func() (err error) { data, err = os.ReadFile("/proc/thread-self/net/snmp"); return err })
	var hdr []string
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(line, "Udp: ") {
			continue
		}
		f := strings.Fields(line)
		if hdr == nil {
			hdr = f
			continue
		}
		for i, h := range hdr {
			if h == "RcvbufErrors" && i < len(f) {
				v, _ := strconv.ParseUint(f[i], 10, 64)
				return v
			}
		}
	}
	return 0
}

// tunTxDropped is agg0's transmit drop counter in a namespace (packets the kernel could
// not queue to the daemon or the transmit program dropped), 0 if unreadable.
func tunTxDropped(bd *bond, ns string) uint64 {
	out, err := bd.Try(ns, "ip", "-s", "-j", "link", "show", "dev", "agg0")
	if err != nil {
		return 0
	}
	var links []struct {
		Stats struct {
			TX struct {
				Dropped uint64 `json:"dropped"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	if json.Unmarshal([]byte(out), &links) != nil || len(links) == 0 {
		return 0
	}
	return links[0].Stats.TX.Dropped
}

// softnetDropped sums the "dropped" column (input backlog full) of
// /proc/net/softnet_stat over all CPUs.
func softnetDropped() uint64 {
	var sum uint64
	for _, line := range strings.Split(readFileString("/proc/net/softnet_stat"), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			v, _ := strconv.ParseUint(f[1], 16, 64)
			sum += v
		}
	}
	return sum
}

// ppsFastCounters returns aggd_fastpath_packets_total of both daemons as
// "cpe tx" / "headend rx" / ... → verdict → value, and aggd_fastpath_handbacks_total as
// "cpe handbacks" / "headend handbacks" → outcome → value (nil for the slow path).
func ppsFastCounters(bd *bond, path string) map[string]map[string]float64 {
	if path != "fast" {
		return nil
	}
	out := map[string]map[string]float64{}
	for _, d := range []struct{ ns, name string }{{"cpe", "cpe"}, {"hub", "headend"}} {
		m, err := bd.metrics(d.ns)
		if err != nil {
			continue
		}
		for k, v := range m {
			var key, verdict string
			switch {
			case strings.HasPrefix(k, "aggd_fastpath_packets_total{"):
				key, verdict = d.name+" "+promLabel(k, "direction"), promLabel(k, "verdict")
			case strings.HasPrefix(k, "aggd_fastpath_handbacks_total{"):
				key, verdict = d.name+" handbacks", promLabel(k, "outcome")
			default:
				continue
			}
			if out[key] == nil {
				out[key] = map[string]float64{}
			}
			out[key][verdict] += v
		}
	}
	return out
}

func promLabel(series, label string) string {
	_, rest, ok := strings.Cut(series, label+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// fastFraction is the share of a stage's judged packets with verdict "fast" (nil when
// the stage judged nothing, e.g. the program is not there).
func fastFraction(verdicts map[string]float64) *float64 {
	var total float64
	for _, v := range verdicts {
		total += v
	}
	if total <= 0 {
		return nil
	}
	f := verdicts["fast"] / total
	return &f
}

func ppsRatios(cells []ppsCell) []ppsRatio {
	find := func(path, load, dir string, size int) *ppsCell {
		for i := range cells {
			if c := &cells[i]; c.Path == path && c.Load == load && c.Direction == dir && c.Size == size {
				return c
			}
		}
		return nil
	}
	var out []ppsRatio
	for _, load := range ppsLoads {
		for _, dir := range []string{"up", "down"} {
			for _, size := range ppsSizes {
				out = append(out, ppsRatioOf(load, dir, size, find("fast", load, dir, size), find("slow", load, dir, size),
					find("plain", load, dir, size)))
			}
		}
	}
	return out
}

// ppsRatioOf compares the fast and the slow cell of one load, direction and size. The
// ratio is given only if the fast path really carried the fast cell's packets; the
// target is judged on the forwarding basis (at equal paced load, the generator's and
// sink's own CPU is the same in both cells and says nothing about the paths). With a
// plain cell of the same load (paced), it also compares what each path adds to it.
func ppsRatioOf(load, dir string, size int, f, s, plain *ppsCell) ppsRatio {
	r := ppsRatio{Load: load, Direction: dir, Size: size}
	switch {
	case f == nil || s == nil || !f.Measured || !s.Measured || f.PPSPerBusyCore == 0 || s.PPSPerBusyCore == 0:
		r.Note = "not available: a cell was not measured or delivered nothing"
	case f.FastTxFraction == nil || f.FastRxFraction == nil || *f.FastTxFraction < 0.95 || *f.FastRxFraction < 0.95:
		r.Note = fmt.Sprintf("not available: the fast path did not carry the fast cell's packets (fast share tx %s, rx %s)",
			fmtFrac(f.FastTxFraction), fmtFrac(f.FastRxFraction))
	default:
		busy := f.PPSPerBusyCore / s.PPSPerBusyCore
		r.PerBusyCore = &busy
		if f.PPSPerFwdCore > 0 && s.PPSPerFwdCore > 0 {
			fwd := f.PPSPerFwdCore / s.PPSPerFwdCore
			r.PerForwardingCore = &fwd
			meets := fwd >= 5
			r.MeetsTarget = &meets
		}
		if plain != nil && plain.Measured && plain.ForwardingCores > 0 {
			fa, sa := f.ForwardingCores-plain.ForwardingCores, s.ForwardingCores-plain.ForwardingCores
			r.FastAddedCores, r.SlowAddedCores = &fa, &sa
			if fa > 0 && sa > 0 {
				added := (f.DeliveredPPS / fa) / (s.DeliveredPPS / sa)
				r.PerAddedCore = &added
			}
		}
	}
	return r
}

func (c ppsCell) name() string {
	return fmt.Sprintf("%s/%s/%s/%d", c.Path, c.Load, c.Direction, c.Size)
}

func (c ppsCell) line() string {
	if !c.Measured {
		return fmt.Sprintf("%s %s %s %dB: not measured: %s", c.Path, c.Load, c.Direction, c.Size, c.Reason)
	}
	return fmt.Sprintf("%s %s %s %dB: %.0f pps delivered (%.0f sent), %.2f busy cores → %.0f pps/core; aggd cpe %.2f + headend %.2f cores; fast share tx %s rx %s",
		c.Path, c.Load, c.Direction, c.Size, c.DeliveredPPS, c.SentPPS, c.BusyCores, c.PPSPerBusyCore, c.CPECores, c.HeadendCores,
		fmtFrac(c.FastTxFraction), fmtFrac(c.FastRxFraction))
}

func (c ppsCell) row() string {
	if !c.Measured {
		return fmt.Sprintf("%-4s %-5s %-4s %5d  not measured: %s", c.Path, c.Load, c.Direction, c.Size, c.Reason)
	}
	fast := "-"
	if c.Path == "fast" {
		fast = fmtFrac(c.FastTxFraction) + "/" + fmtFrac(c.FastRxFraction)
	}
	return fmt.Sprintf("%-4s %-5s %-4s %5d %10.0f %10.0f %6.3f %6.2f %10.0f %6.2f %6.2f %6.2f %10.0f %8.1f %11s",
		c.Path, c.Load, c.Direction, c.Size, c.SentPPS, c.DeliveredPPS, c.Loss, c.BusyCores, c.PPSPerBusyCore,
		c.CPECores, c.HeadendCores, c.ForwardingCores, c.PPSPerFwdCore, c.CPUSecPerGbit, fast)
}

func fmtFrac(f *float64) string {
	if f == nil {
		return "n/a"
	}
	return strconv.FormatFloat(*f, 'f', 3, 64)
}

func fmtRatio(f *float64) string {
	if f == nil {
		return "n/a"
	}
	return strconv.FormatFloat(*f, 'f', 2, 64)
}

// bpfLogLines are a daemon log's lines about BPF, the XDP shield and the fast path.
func bpfLogLines(path string) []string {
	data, _ := os.ReadFile(path)
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		l := strings.ToLower(line)
		if strings.Contains(l, "bpf") || strings.Contains(l, "fast path") || strings.Contains(l, "xdp") {
			out = append(out, line)
		}
	}
	return out
}

// fastPathLogReason is the message of the first log line that says why the fast path
// is off, or a note that the daemon said nothing about it.
func fastPathLogReason(lines []string) string {
	for _, line := range lines {
		l := strings.ToLower(line)
		if strings.Contains(l, "fast path") && !strings.Contains(line, "BPF fast path on") {
			if i := strings.Index(line, "msg="); i >= 0 {
				return line[i:]
			}
			return line
		}
	}
	return "no line about the fast path"
}

// lastLogLine is the message of a log's last line (what the daemon did last).
func lastLogLine(path string) string {
	lines := strings.Split(strings.TrimSpace(readFileString(path)), "\n")
	line := lines[len(lines)-1]
	if i := strings.Index(line, "msg="); i >= 0 {
		return line[i:]
	}
	if line == "" {
		return "(empty)"
	}
	return line
}

func logHas(dir, file, s string) bool {
	data, _ := os.ReadFile(filepath.Join(dir, file))
	return bytes.Contains(data, []byte(s))
}

func readFileString(path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}

func cpuModel() string {
	for _, line := range strings.Split(readFileString("/proc/cpuinfo"), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// gitCommit is the short HEAD commit, with "+dirty" when the work tree has changes
// (the aggd binary under test is built from the work tree).
func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		c += "+dirty"
	}
	return c
}
