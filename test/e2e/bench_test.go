package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/testnet"
)

// BenchmarkBondGoodput measures, on the three-link TBF topology of the end-to-end tests:
//   - each uplink's own single-flow TCP goodput, without the tunnel, both directions;
//   - one TCP flow through the bond, both directions, as a ratio of the sum of those;
//   - after an uplink dies mid-transfer, how long until goodput is back to 80% of the
//     remaining links' sum.
//
// It runs once whatever b.N is (use -benchtime 1x) and writes results/bench/bond.json.
// Run: make bench (or: go test -run '^$' -bench BondGoodput -benchtime 1x ./test/e2e).
func BenchmarkBondGoodput(b *testing.B) {
	n := newTopology(b)
	res := benchResult{Date: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), RatesMbit: uplinkRates}

	// Baselines first, before aggd puts any probe traffic on the links.
	for i := range uplinkRates {
		up, down := linkBaseline(b, n, i+1)
		res.BaselineUpMbit = append(res.BaselineUpMbit, up/1e6)
		res.BaselineDownMbit = append(res.BaselineDownMbit, down/1e6)
		res.SumUpMbit += up / 1e6
		res.SumDownMbit += down / 1e6
	}
	bd := startBond(b, n)
	startIperfServer(b, n)
	res.BondUpMbit = iperf(b, n, 10, false) / 1e6
	res.BondDownMbit = iperf(b, n, 10, true) / 1e6
	res.RatioUp = res.BondUpMbit / res.SumUpMbit
	res.RatioDown = res.BondDownMbit / res.SumDownMbit

	remaining := res.SumUpMbit - res.BaselineUpMbit[1]
	// up2 dies twice: its interface goes down (the CPE sees the carrier go), then, once
	// it is back in the bond, it drops everything with its carrier up (a modem whose
	// line died), which only the probes and the peer's reports can show.
	carrier := failoverSeries(b, bd, func() { bd.Run("cpe", "ip", "link", "set", "up2", "down") },
		func() { bd.Run("cpe", "ip", "link", "set", "up2", "up") })
	res.FailoverRecoverySeconds = carrier.recovery(0.8 * remaining)
	res.FailoverRecovery90Seconds = carrier.recovery(0.9 * remaining)
	res.FailoverSeries = carrier.mbit
	bd.waitReady(b)
	silent := failoverSeries(b, bd, func() { cutLinks(bd, true, 2) }, func() { cutLinks(bd, false, 2) })
	res.SilentFailoverRecoverySeconds = silent.recovery(0.8 * remaining)
	res.SilentFailoverRecovery90Seconds = silent.recovery(0.9 * remaining)
	res.SilentFailoverSeries = silent.mbit

	b.ReportMetric(res.RatioUp, "ratio-up")
	b.ReportMetric(res.RatioDown, "ratio-down")
	b.ReportMetric(res.FailoverRecoverySeconds, "failover-s")
	b.ReportMetric(res.SilentFailoverRecoverySeconds, "silent-failover-s")
	writeJSON(b, "bond.json", res)
	b.Logf("up %.1f of %.1f Mbit/s (%.3f), down %.1f of %.1f Mbit/s (%.3f), failover recovery to 80 / 90 %% of the other links: "+
		"carrier lost %.1f / %.1f s, silent %.1f / %.1f s",
		res.BondUpMbit, res.SumUpMbit, res.RatioUp, res.BondDownMbit, res.SumDownMbit, res.RatioDown,
		res.FailoverRecoverySeconds, res.FailoverRecovery90Seconds, res.SilentFailoverRecoverySeconds, res.SilentFailoverRecovery90Seconds)
}

type benchResult struct {
	Date             string    `json:"date"`
	CPUs             int       `json:"cpus"`
	RatesMbit        []int     `json:"link_rates_mbit"`
	BaselineUpMbit   []float64 `json:"baseline_up_mbit"`
	BaselineDownMbit []float64 `json:"baseline_down_mbit"`
	SumUpMbit        float64   `json:"baseline_sum_up_mbit"`
	SumDownMbit      float64   `json:"baseline_sum_down_mbit"`
	BondUpMbit       float64   `json:"bond_up_mbit"`
	BondDownMbit     float64   `json:"bond_down_mbit"`
	RatioUp          float64   `json:"ratio_up"`
	RatioDown        float64   `json:"ratio_down"`
	// Recovery: from the outage until a 100-ms interval is back at 80 % (the _90_
	// figures: 90 %) of the other links' summed baselines, after the dip it causes.
	FailoverRecoverySeconds         float64   `json:"failover_recovery_seconds"`
	FailoverRecovery90Seconds       float64   `json:"failover_recovery_90_seconds"`
	FailoverSeries                  []float64 `json:"failover_series_mbit_per_100ms"`
	SilentFailoverRecoverySeconds   float64   `json:"silent_failover_recovery_seconds"`
	SilentFailoverRecovery90Seconds float64   `json:"silent_failover_recovery_90_seconds"`
	SilentFailoverSeries            []float64 `json:"silent_failover_series_mbit_per_100ms"`
}

// linkBaseline measures one uplink alone: TCP from the CPE namespace to an iperf3
// server on the headend side of that link, up and down.
func linkBaseline(b testing.TB, n *testnet.Net, k int) (up, down float64) {
	port := strconv.Itoa(5210 + k)
	addr := fmt.Sprintf("10.98.%d.1", k)
	n.Start("hub", filepath.Join(b.TempDir(), "iperf-base.log"), "iperf3", "-s", "-B", addr, "-p", port)
	time.Sleep(300 * time.Millisecond)
	run := func(reverse bool) float64 {
		args := []string{"iperf3", "-c", addr, "-p", port, "-t", "5", "-J", "-B", fmt.Sprintf("10.98.%d.2", k)}
		if reverse {
			args = append(args, "-R")
		}
		// iperf3 3.12's server sometimes resets the control connection of a test that
		// follows right after another; a second attempt is a fresh test, not a retry of
		// a measurement that went wrong.
		var last string
		for attempt := 0; attempt < 3; attempt++ {
			out, err := n.Try("cpe", args...)
			var r iperfResult
			if jerr := json.Unmarshal([]byte(out), &r); jerr == nil && err == nil && r.Error == "" {
				return r.End.SumReceived.BitsPerSecond
			}
			last = fmt.Sprintf("%v %s", err, r.Error)
			time.Sleep(500 * time.Millisecond)
		}
		b.Fatalf("baseline %v: %s", args, last)
		return 0
	}
	return run(false), run(true)
}

// outageAt is when, in a failover run's flow, the link is made to die.
const outageAt = 4 * time.Second

// failover is one failover run's upstream goodput, per 100-ms iperf3 interval.
type failover struct {
	start, mbit []float64 // each interval's start (s, iperf3's clock) and rate
}

// failoverSeries runs a 10-s upstream flow, calls cut outageAt into it and restore
// once it has ended, and returns the flow's goodput series.
func failoverSeries(b testing.TB, bd *bond, cut, restore func()) failover {
	out := filepath.Join(b.TempDir(), "failover.json")
	flow := bd.Start("lan", out, "iperf3", "-c", server, "-t", "10", "-i", "0.1", "-J")
	time.Sleep(outageAt)
	cut()
	<-flow.Done
	restore()
	data, err := os.ReadFile(out)
	if err != nil {
		b.Fatal(err)
	}
	var r struct {
		Intervals []struct {
			Sum struct {
				Start         float64 `json:"start"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum"`
		} `json:"intervals"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		b.Fatalf("failover iperf3 output: %v\n%s", err, tail(data, 2000))
	}
	var f failover
	for _, iv := range r.Intervals {
		f.start = append(f.start, iv.Sum.Start)
		f.mbit = append(f.mbit, iv.Sum.BitsPerSecond/1e6)
	}
	return f
}

// recovery is how long after the outage the goodput was first back at target
// (Mbit/s): the end of the first interval at target after the dip the outage causes;
// no dip at all counts as 0, no return as -1. (iperf3's clock starts a few ms after the
// flow's, at connect.)
func (f failover) recovery(target float64) float64 {
	at := outageAt.Seconds()
	dipped := false
	for i, mbit := range f.mbit {
		switch {
		case f.start[i] < at-0.05:
		case mbit < target:
			dipped = true
		case dipped:
			return f.start[i] + 0.1 - at
		}
	}
	if !dipped {
		return 0
	}
	return -1
}

func writeJSON(b testing.TB, name string, v any) {
	dir := os.Getenv("AGGD_RESULTS")
	if dir == "" {
		dir = "../../results/bench"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	data, _ := json.MarshalIndent(v, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
		b.Fatal(err)
	}
}
