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
	res.FailoverRecoverySeconds, res.FailoverSeries = failoverRecovery(b, bd, 0.8*remaining)

	b.ReportMetric(res.RatioUp, "ratio-up")
	b.ReportMetric(res.RatioDown, "ratio-down")
	b.ReportMetric(res.FailoverRecoverySeconds, "failover-s")
	writeJSON(b, "bond.json", res)
	b.Logf("up %.1f of %.1f Mbit/s (%.3f), down %.1f of %.1f Mbit/s (%.3f), failover recovery %.1f s",
		res.BondUpMbit, res.SumUpMbit, res.RatioUp, res.BondDownMbit, res.SumDownMbit, res.RatioDown, res.FailoverRecoverySeconds)
}

type benchResult struct {
	Date                    string    `json:"date"`
	CPUs                    int       `json:"cpus"`
	RatesMbit               []int     `json:"link_rates_mbit"`
	BaselineUpMbit          []float64 `json:"baseline_up_mbit"`
	BaselineDownMbit        []float64 `json:"baseline_down_mbit"`
	SumUpMbit               float64   `json:"baseline_sum_up_mbit"`
	SumDownMbit             float64   `json:"baseline_sum_down_mbit"`
	BondUpMbit              float64   `json:"bond_up_mbit"`
	BondDownMbit            float64   `json:"bond_down_mbit"`
	RatioUp                 float64   `json:"ratio_up"`
	RatioDown               float64   `json:"ratio_down"`
	FailoverRecoverySeconds float64   `json:"failover_recovery_seconds"`
	FailoverSeries          []float64 `json:"failover_series_mbit_per_100ms"`
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

// failoverRecovery runs an upstream flow, kills up2 at 4 s, and returns how long after
// that the 100 ms goodput first reaches target (Mbit/s), with the series for the plot.
func failoverRecovery(b testing.TB, bd *bond, target float64) (float64, []float64) {
	out := filepath.Join(b.TempDir(), "failover.json")
	flow := bd.Start("lan", out, "iperf3", "-c", server, "-t", "10", "-i", "0.1", "-J")
	time.Sleep(4 * time.Second)
	bd.Run("cpe", "ip", "link", "set", "up2", "down")
	<-flow.Done
	bd.Run("cpe", "ip", "link", "set", "up2", "up")
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
	// The outage starts 4 s after iperf3 started (its clock starts a few ms later, at
	// connect). Recovery is the end of the first interval back at target after the dip
	// the outage causes; no dip at all counts as 0.
	series := make([]float64, 0, len(r.Intervals))
	recovered, dipped := -1.0, false
	for _, iv := range r.Intervals {
		mbit := iv.Sum.BitsPerSecond / 1e6
		series = append(series, mbit)
		if iv.Sum.Start < 3.95 || recovered >= 0 {
			continue
		}
		if mbit < target {
			dipped = true
		} else if dipped {
			recovered = iv.Sum.Start + 0.1 - 4.0
		}
	}
	if !dipped {
		recovered = 0
	}
	return recovered, series
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
