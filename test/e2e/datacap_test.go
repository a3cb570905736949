package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDataCapMakesAnUplinkABackup: up3 (60 Mbit/s, about 0.6 of a flow) has a 16-MiB
// monthly cap. The first transfers use it up; from then on up3 carries no data either
// way (the headend is told: LINK_PARAMS), while the others carry the flows. The count
// is saved in state_dir, so a CPE killed and started again keeps up3 capped from its
// first second; a reload that raises the limit (a top-up) puts it back to work.
func TestDataCapMakesAnUplinkABackup(t *testing.T) {
	// Made before the topology, so removed after it: the daemons save their counts
	// into it as they stop, which is at the topology's teardown.
	stateDir := t.TempDir()
	n := newTopology(t)
	b := startBondWith(t, n, bondOptions{
		uplink: map[int]string{3: "    data_cap:\n      limit: 16MiB\n"},
		cpe:    "state_dir: " + stateDir + "\n",
	})
	startIperfServer(t, n)
	cpeLog := filepath.Join(b.dir, "cpe.log")
	reached := `aggd_uplink_data_cap_reached{link="up3"}`
	if v := b.metric(t, "cpe", reached); v != 0 {
		t.Fatalf("%s = %v before any traffic, want 0", reached, v)
	}
	if v := b.metric(t, "cpe", `aggd_uplink_data_cap_bytes{link="up3"}`); v != 16<<20 {
		t.Errorf("up3's cap is exported as %v bytes, want %d", v, 16<<20)
	}

	// Before the cap: up3 carries its share (and the transfers use its 16 MiB up).
	if share := b.up3Share(t); share < 0.3 {
		t.Fatalf("before its cap was reached up3 carried %.2f of the data; want its share of about 0.6 (the test would prove nothing)", share)
	}
	waitMetric(t, b, "cpe", reached, 1, 10*time.Second)
	used := b.metric(t, "cpe", `aggd_uplink_data_used_bytes{link="up3"}`)
	if used < 16<<20 {
		t.Errorf("up3 is capped with %v bytes used, below its 16 MiB", used)
	}
	line := logLine(t, cpeLog, "uplink used up its data cap")
	if !strings.Contains(line, "link=up3") || !strings.Contains(line, "until=") {
		t.Errorf("the cap's log line does not name the link and the period's end: %q", line)
	}
	out := b.Run("cpe", aggdBinary, "status", "--config", filepath.Join(b.dir, "cpe.yaml"), "--interval", "200ms")
	if !strings.Contains(out, "data caps") || !strings.Contains(out, "CAP REACHED") {
		t.Errorf("aggd status does not show up3's cap as reached:\n%s", out)
	}
	t.Logf("aggd status with up3's cap reached:\n%s", out)
	time.Sleep(1500 * time.Millisecond) // LINK_PARAMS reach the headend
	if share := b.up3Share(t); share > 0.02 {
		t.Errorf("after up3 used up its cap it carried %.3f of the data; want none (probes only)", share)
	}
	if v := b.metricOr0("cpe", `aggd_uplink_data_cap_reached{link="up1"}`); v != 0 {
		t.Errorf("up1, which has no cap, is exported as capped (%v)", v)
	}

	// The count is on disk, for this month.
	st, data := readUsage(t, stateDir)
	if r, ok := st.Uplinks["up3"]; !ok || r.UsedBytes < 16<<20 || r.PeriodStart.Day() != 1 {
		t.Errorf("usage file holds %+v for up3; want at least 16 MiB in a period from the 1st\n%s", r, data)
	}
	if _, ok := st.Uplinks["up1"]; ok {
		t.Errorf("usage file holds up1, which has no cap:\n%s", data)
	}

	// Killed (no final save) and started again: up3 stays capped. While the CPE is
	// down, a few MiB cross up3 outside the bond (the router's own traffic, say): the
	// restarted CPE counts them, from the interface reading saved with the count.
	kill(t, b.cpe)
	savedUsed := savedUsage(t, stateDir, "up3")
	n.Start("hub", filepath.Join(b.dir, "iperf-up3.log"), "iperf3", "-s", "-1", "-B", "10.98.3.1", "-p", "5299")
	time.Sleep(300 * time.Millisecond)
	before := interfaceIPBytes(t, b, "up3")
	n.Run("cpe", "iperf3", "-c", "10.98.3.1", "-p", "5299", "-B", "10.98.3.2", "-n", "4M")
	whileStopped := interfaceIPBytes(t, b, "up3") - before
	if whileStopped < 1<<20 {
		t.Fatalf("up3 carried %d bytes of the direct transfer; want a few MiB (the test would prove nothing)", whileStopped)
	}
	args := append([]string{aggdBinary, "cpe", "--config", filepath.Join(b.dir, "cpe.yaml")},
		strings.Fields(os.Getenv("AGGD_E2E_DAEMON_ARGS"))...)
	restartLog := filepath.Join(b.dir, "cpe-restart.log")
	b.cpe = b.Start("cpe", restartLog, args...)
	b.waitReady(t)
	line = logLine(t, restartLog, "data cap: counting", "link=up3")
	if !strings.Contains(line, "restored=true") {
		t.Errorf("the restarted CPE did not take up3's count from the file: %q", line)
	}
	if used := b.metric(t, "cpe", `aggd_uplink_data_used_bytes{link="up3"}`); used < float64(savedUsed+whileStopped) {
		t.Errorf("after the restart up3 has %v bytes used; want at least the %d saved and the %d it carried while the CPE was down\n%s",
			used, savedUsed, whileStopped, line)
	}
	t.Logf("up3 carried %d bytes while the CPE was down; restarted CPE: %s", whileStopped, line)
	if v := b.metric(t, "cpe", reached); v != 1 {
		t.Errorf("after the restart %s = %v, want 1", reached, v)
	}
	time.Sleep(1500 * time.Millisecond)
	if share := b.up3Share(t); share > 0.02 {
		t.Errorf("after the restart up3 carried %.3f of the data; want none (its cap is still used up)", share)
	}

	// A top-up: the limit raised by a reload puts up3 back to work at once.
	cpeYAML := filepath.Join(b.dir, "cpe.yaml")
	writeFile(t, b.dir, "cpe.yaml", strings.Replace(readFileString(cpeYAML), "limit: 16MiB", "limit: 1GiB", 1))
	if err := b.cpe.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, b, "cpe", reached, 0, 10*time.Second)
	waitLog(t, restartLog, "reload: data caps applied", 5*time.Second) // logged after the metric moved
	if line := logLine(t, restartLog, "reload: data caps applied"); !strings.Contains(line, "up3") {
		t.Errorf("the reload does not name up3: %q", line)
	}
	if logCount(restartLog, "take effect only at a restart") != 0 {
		t.Errorf("the reload calls the new limit a restart's business:\n%s", logLine(t, restartLog, "take effect only at a restart"))
	}
	time.Sleep(1500 * time.Millisecond)
	if share := b.up3Share(t); share < 0.3 {
		t.Errorf("after its cap was raised up3 carried %.2f of the data; want its share of about 0.6", share)
	}
}

// usageFile is what the tests read of the data caps' state file.
type usageFile struct {
	Uplinks map[string]struct {
		PeriodStart time.Time `json:"period_start"`
		UsedBytes   uint64    `json:"used_bytes"`
	} `json:"uplinks"`
}

// readUsage reads the data caps' state file in stateDir, and returns it raw too.
func readUsage(t *testing.T, stateDir string) (usageFile, []byte) {
	t.Helper()
	var st usageFile
	data, err := os.ReadFile(filepath.Join(stateDir, "data-usage.json"))
	if err != nil {
		t.Fatalf("no usage file in state_dir: %v", err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatalf("usage file: %v\n%s", err, data)
	}
	return st, data
}

// savedUsage is the count the state file in stateDir holds for link.
func savedUsage(t *testing.T, stateDir, link string) uint64 {
	t.Helper()
	st, data := readUsage(t, stateDir)
	r, ok := st.Uplinks[link]
	if !ok {
		t.Fatalf("usage file holds no count for %s:\n%s", link, data)
	}
	return r.UsedBytes
}

// TestIdleStandbyLinksCostLittle: standby links (up2 overflow, up3 backup: metered LTE
// lines, say) that carry no traffic are still probed by both sides, so that the bond
// finds them working when it needs them, but every byte on them is billed. What an idle
// bond puts on each, on its interface (both directions, as the provider counts), over
// 20 s: both sides probe it every 2 s and answer each other's probes (4 packets of
// about 80 bytes on the wire), and the CPE announces its links on it twice a minute.
// Probed like a primary (up1), with FEEDBACK copies, it was 6012 bytes/s. `make bench`
// records the figures (BenchmarkIdleLinkCost).
func TestIdleStandbyLinksCostLittle(t *testing.T) {
	n := newTopology(t)
	b := startBondWith(t, n, bondOptions{uplink: standbyUplinks})
	cost := idleLinkCost(t, b, 20*time.Second)
	t.Logf("idle links, bytes/s on their interfaces, both ways: primary %.0f (%.2f GB in 30 days), overflow %.0f (%.2f GB), backup %.0f (%.2f GB)",
		cost.Primary.BytesPerS, cost.Primary.GBPer30Days, cost.Overflow.BytesPerS, cost.Overflow.GBPer30Days,
		cost.Backup.BytesPerS, cost.Backup.GBPer30Days)
	for name, c := range map[string]linkCost{"overflow": cost.Overflow, "backup": cost.Backup} {
		if c.BytesPerS > 400 {
			t.Errorf("an idle %s link carries %.0f bytes/s (%.1f GB in 30 days); want at most 400", name, c.BytesPerS, c.GBPer30Days)
		}
	}
}

// standbyUplinks makes up2 an overflow link and up3 a backup.
var standbyUplinks = map[int]string{2: "    class: overflow\n", 3: "    class: backup\n"}

// BenchmarkIdleLinkCost measures what an idle bond puts on a primary (up1), an
// overflow (up2) and a backup link (up3), on their interfaces, over 30 s, and the CPU
// each daemon takes meanwhile, and writes results/bench/idle-link.json. It runs once
// whatever b.N is (use -benchtime 1x).
func BenchmarkIdleLinkCost(b *testing.B) {
	n := newTopology(b)
	bd := startBondWith(b, n, bondOptions{uplink: standbyUplinks})
	cost := idleLinkCost(b, bd, 30*time.Second)
	startIperfServer(b, n)
	cost.DuringTransfers = transferStandbyCost(b, bd)
	b.ReportMetric(cost.Primary.BytesPerS, "primary-B/s")
	b.ReportMetric(cost.Overflow.BytesPerS, "overflow-B/s")
	b.ReportMetric(cost.Backup.BytesPerS, "backup-B/s")
	b.ReportMetric(cost.CPU.CPE, "cpe-cpu-%")
	b.ReportMetric(cost.CPU.Headend, "headend-cpu-%")
	writeJSON(b, "idle-link.json", cost)
	b.Logf("idle links: primary %.0f bytes/s (%.2f GB in 30 days), overflow %.0f (%.2f GB), backup %.0f (%.2f GB); "+
		"during 10-s TCP transfers on the primary: overflow %.0f bytes/s, backup %.0f; idle CPU: cpe %.2f %%, headend %.2f %% of one CPU",
		cost.Primary.BytesPerS, cost.Primary.GBPer30Days, cost.Overflow.BytesPerS, cost.Overflow.GBPer30Days,
		cost.Backup.BytesPerS, cost.Backup.GBPer30Days, cost.DuringTransfers.OverflowBytesPerS, cost.DuringTransfers.BackupBytesPerS,
		cost.CPU.CPE, cost.CPU.Headend)
}

// transferCost is what the standby links carry while TCP flows (one upload, then one
// download, 10 s each) run over the primary: the FEEDBACK copy a flow puts on one of
// them, and their probes.
type transferCost struct {
	OverflowBytesPerS float64 `json:"overflow_bytes_per_second"`
	BackupBytesPerS   float64 `json:"backup_bytes_per_second"`
}

func transferStandbyCost(b *testing.B, bd *bond) transferCost {
	b2, b3 := interfaceBytes(b, bd, "up2"), interfaceBytes(b, bd, "up3")
	start := time.Now()
	for _, args := range [][]string{nil, {"-R"}} {
		cmd := append([]string{"iperf3", "-c", server, "-t", "10", "--connect-timeout", "3000"}, args...)
		if out, err := bd.Try("lan", cmd...); err != nil {
			b.Fatalf("iperf3 %v: %v\n%s", args, err, out)
		}
	}
	secs := time.Since(start).Seconds()
	return transferCost{OverflowBytesPerS: float64(interfaceBytes(b, bd, "up2")-b2) / secs,
		BackupBytesPerS: float64(interfaceBytes(b, bd, "up3")-b3) / secs}
}

// idleCost is what an idle bond puts on each class of uplink.
type idleCost struct {
	Date     string   `json:"date"`
	CPUs     int      `json:"cpus"`
	Seconds  float64  `json:"seconds"`
	Primary  linkCost `json:"primary"`
	Overflow linkCost `json:"overflow"`
	Backup   linkCost `json:"backup"`
	// CPU is what each idle daemon took over the same time (its probes, replies and
	// reports, its ticks), in percent of one CPU: a router runs it all day.
	CPU daemonCPU `json:"cpu_percent_of_one_cpu"`
	// DuringTransfers: the standby links while TCP flows run on the primary (bench only).
	DuringTransfers transferCost `json:"standby_during_transfers"`
}

type daemonCPU struct {
	CPE     float64 `json:"cpe"`
	Headend float64 `json:"headend"`
}

type linkCost struct {
	BytesPerS   float64 `json:"bytes_per_second"`
	GBPer30Days float64 `json:"gb_per_30_days"`
}

// idleLinkCost measures, on the CPE's interfaces (received and sent, Ethernet headers
// included), what up1, up2 and up3 carry over d while nothing is sent through the
// bond, after the start's announcements and probe trains.
func idleLinkCost(t testing.TB, b *bond, d time.Duration) idleCost {
	t.Helper()
	time.Sleep(3 * time.Second)
	devs := []string{"up1", "up2", "up3"}
	before := make([]uint64, len(devs))
	for i, dev := range devs {
		before[i] = interfaceBytes(t, b, dev)
	}
	cpe, headend := b.cpe.Cmd.Process.Pid, b.headend.Cmd.Process.Pid
	cpeBefore, headendBefore := procJiffies(cpe), procJiffies(headend)
	time.Sleep(d)
	percent := func(pid int, before uint64) float64 {
		return float64(procJiffies(pid)-before) / userHZ / d.Seconds() * 100
	}
	cpu := daemonCPU{CPE: percent(cpe, cpeBefore), Headend: percent(headend, headendBefore)}
	costs := make([]linkCost, len(devs))
	for i, dev := range devs {
		perS := float64(interfaceBytes(t, b, dev)-before[i]) / d.Seconds()
		costs[i] = linkCost{BytesPerS: perS, GBPer30Days: perS * 86400 * 30 / 1e9}
	}
	return idleCost{Date: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), Seconds: d.Seconds(),
		Primary: costs[0], Overflow: costs[1], Backup: costs[2], CPU: cpu}
}

// interfaceBytes is what an interface of the CPE has received and sent, link-layer
// headers included (what the wire carries).
func interfaceBytes(t testing.TB, b *bond, dev string) uint64 {
	t.Helper()
	return interfaceStat(t, b, dev, "rx_bytes") + interfaceStat(t, b, dev, "tx_bytes")
}

// interfaceIPBytes is interfaceBytes without the 14-byte Ethernet header of each
// packet: what a provider bills, and what a data cap counts. (Compared with the
// interface's bytes, a cap's count of a transfer falls short by the transfer's
// headers, which the bond's own traffic around it made up in most runs, not all.)
func interfaceIPBytes(t testing.TB, b *bond, dev string) uint64 {
	t.Helper()
	packets := interfaceStat(t, b, dev, "rx_packets") + interfaceStat(t, b, dev, "tx_packets")
	return interfaceBytes(t, b, dev) - 14*packets
}

func interfaceStat(t testing.TB, b *bond, dev, stat string) uint64 {
	t.Helper()
	out := strings.TrimSpace(b.Run("cpe", "cat", "/sys/class/net/"+dev+"/statistics/"+stat))
	v, err := strconv.ParseUint(out, 10, 64)
	if err != nil {
		t.Fatalf("%s %s: %q", dev, stat, out)
	}
	return v
}

// TestIdleBackupTakesOverWhenThePrimariesFail: the backup link is probed only every
// probe.standby_interval while idle, yet when both primaries die mid-transfer the flow
// carries on over it, upstream and then downstream (the headend's side of the backup
// is what the downstream needs). The primaries die silently, as a line does behind a
// modem: no carrier change, every packet dropped both ways (cutPrimaries), so each side
// must find the deaths from silence and reports.
func TestIdleBackupTakesOverWhenThePrimariesFail(t *testing.T) {
	n := newTopology(t)
	b := startBondWith(t, n, bondOptions{uplink: map[int]string{3: "    class: backup\n"}})
	startIperfServer(t, n)
	for _, dir := range []struct {
		name string
		args []string
	}{{"upstream", nil}, {"downstream", []string{"-R"}}} {
		out := filepath.Join(b.dir, "failover-"+dir.name+".json")
		flow := b.Start("lan", out, append([]string{"iperf3", "-c", server, "-t", "10", "-i", "1", "-J", "--connect-timeout", "3000"}, dir.args...)...)
		time.Sleep(3 * time.Second)
		before := b.linkTx(t, "cpe", "headend")["up3"] + b.linkTx(t, "hub", "cpe1")["link2"]
		cutPrimaries(b, true)
		select {
		case <-flow.Done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: iperf3 did not finish", dir.name)
		}
		if flow.Err != nil {
			t.Fatalf("%s: the TCP flow broke when the primaries failed: %v\n%s", dir.name, flow.Err, tail([]byte(readFileString(out)), 2000))
		}
		last := lastIntervalBits(t, out)
		carried := b.linkTx(t, "cpe", "headend")["up3"] + b.linkTx(t, "hub", "cpe1")["link2"] - before
		t.Logf("%s: last second %.1f Mbit/s over the backup alone; it sent %.0f packets after the primaries failed at 3 s; "+
			"per second: %s", dir.name, last/1e6, carried, mbitList(intervalBits(t, out)))
		if last < goodputFloor {
			t.Errorf("%s: last second %.1f Mbit/s with only the backup up, below the floor of %.0f", dir.name, last/1e6, goodputFloor/1e6)
		}
		cutPrimaries(b, false)
		deadline := time.Now().Add(20 * time.Second)
		for b.linksUp("cpe", "headend") < 3 || b.linksUp("hub", "cpe1") < 3 {
			if time.Now().After(deadline) {
				t.Fatalf("the primaries are not back up 20 s after they came back to life")
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// TestIdleBackupThatDiesIsFoundDown: an idle backup link is probed only every
// probe.standby_interval (here 4 s), and judged in that unit it went unnoticed for
// 8-12 s when it died silently. The first answer it misses has the CPE probe it at the
// probe interval, so it is found down within about one standby interval and
// down_after; when it comes back it is up again on its next probe.
func TestIdleBackupThatDiesIsFoundDown(t *testing.T) {
	const standby = 4 * time.Second
	n := newTopology(t)
	b := startBondWith(t, n, bondOptions{uplink: map[int]string{3: "    class: backup\n"},
		cpe: fmt.Sprintf("probe:\n  standby_interval: %s\n", standby)})
	// Standing by, probed on its own scale; it dies at a random point between probes.
	time.Sleep(2*standby + rand.N(standby))
	up3 := `aggd_link_up{link="up3",peer="headend"}`
	if b.metricOr0("cpe", up3) != 1 {
		t.Fatalf("the backup up3 is not up before the test")
	}
	cutLinks(b, true, 3)
	died := time.Now()
	var found time.Duration
	for found == 0 && time.Since(died) < 4*standby {
		time.Sleep(50 * time.Millisecond)
		if b.metricOr0("cpe", up3) == 0 {
			found = time.Since(died)
		}
	}
	if found == 0 {
		t.Fatalf("the idle backup was not found down within %v of dying", 4*standby)
	}
	// The missed answer (a standby interval, three probe intervals and two RTTs after
	// the last one), then the suspicion time (three probe intervals) of silence at the
	// probe interval, and a second for ticks and scrapes. Judged in standby intervals
	// it took at least 8 s.
	most := standby + 300*time.Millisecond + 300*time.Millisecond + time.Second
	t.Logf("the idle backup died silently; the CPE found it down after %.2f s (standby_interval %v)", found.Seconds(), standby)
	if found > most {
		t.Errorf("the idle backup was found down %.2f s after it died, want within %v", found.Seconds(), most)
	}
	cutLinks(b, false, 3)
	back := time.Now()
	for b.metricOr0("cpe", up3) != 1 {
		if time.Since(back) > 2*standby+time.Second {
			t.Fatalf("the backup is not up again %v after it came back", 2*standby+time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("back up %.2f s after it came back", time.Since(back).Seconds())
}

func mbitList(bits []float64) string {
	parts := make([]string, len(bits))
	for i, b := range bits {
		parts[i] = strconv.FormatFloat(b/1e6, 'f', 1, 64)
	}
	return strings.Join(parts, " ")
}

// cutPrimaries drops every packet both ways on up1 and up2 (cut), or gives them their
// shaping back.
func cutPrimaries(b *bond, cut bool) { cutLinks(b, cut, 1, 2) }

// cutLinks drops every packet both ways on the uplinks numbered ks (cut), or gives them
// their shaping back. It replaces each end's root qdisc with a TBF whose burst is smaller
// than any packet, so that nothing passes, whatever sent it: nftables' netdev hooks
// would not do, as packets the fast path redirects skip the egress hook and those it
// takes in at tc ingress never reach the ingress one.
func cutLinks(b *bond, cut bool, ks ...int) {
	for _, k := range ks {
		for _, end := range []struct{ ns, dev string }{{"cpe", fmt.Sprintf("up%d", k)}, {"hub", fmt.Sprintf("hl%d", k)}} {
			if cut {
				b.Run(end.ns, "tc", "qdisc", "replace", "dev", end.dev, "root", "tbf", "rate", "8bit", "burst", "40", "latency", "1ms")
			} else {
				b.Shape(end.ns, end.dev, fmt.Sprintf("%dmbit", uplinkRates[k-1]), 40)
			}
		}
	}
}
