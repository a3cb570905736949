package e2e

// The kernel's own account of aggd's BPF programs during a pps cell: how often each
// ran and for how long (BPF_ENABLE_STATS, the run_cnt/run_time_ns that bpftool prog
// shows). The forwarding-core basis of the cells cannot tell the programs' cost from
// the rest of the kernel's work on the way (veth hops, routing, NAT, the sink's socket);
// these counters can, to the nanosecond, because the kernel times each program run.
//
// Off unless AGGD_PPS_BPF_STATS=1: with the statistics on, every program run also reads
// the clock twice, which makes the fast path dearer than it is, so the ratios of a run
// with them are not the ones to quote.

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ppsBPFProgram is one of aggd's programs (all its instances, e.g. one per uplink)
// over a cell's measured window.
type ppsBPFProgram struct {
	Name  string `json:"name"`
	Runs  uint64 `json:"runs"`
	Nanos uint64 `json:"run_time_ns"`
	// NsPerRun is the average time of one run (run_time_ns / runs).
	NsPerRun float64 `json:"ns_per_run"`
	// NsPerDelivered divides the program's time by the packets the sink counted: what
	// this program costs per packet forwarded end to end.
	NsPerDelivered float64 `json:"ns_per_delivered_packet"`
}

// bpfRun is a program's cumulative run count and time, summed over its instances.
type bpfRun struct{ runs, nanos uint64 }

// enableBPFStats turns the kernel's BPF run statistics on if AGGD_PPS_BPF_STATS=1, and
// returns what turns them off again (nil when off).
func enableBPFStats() (func(), error) {
	if os.Getenv("AGGD_PPS_BPF_STATS") != "1" {
		return nil, nil
	}
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, err
	}
	return func() { _ = c.Close() }, nil
}

// aggdBPFRuns reads the run statistics of every loaded program whose name starts with
// "aggd_", summed by name. Programs that go away while it walks the list are skipped.
func aggdBPFRuns() (map[string]bpfRun, error) {
	runs := make(map[string]bpfRun)
	for id := ebpf.ProgramID(0); ; {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return runs, nil
		}
		if err != nil {
			return nil, err
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue
		}
		info, ierr := p.Info()
		st, serr := p.Stats()
		_ = p.Close()
		if ierr != nil || serr != nil || !strings.HasPrefix(info.Name, "aggd_") {
			continue
		}
		r := runs[info.Name]
		r.runs += st.RunCount
		r.nanos += uint64(st.Runtime)
		runs[info.Name] = r
	}
}

// bpfRunDeltas turns two readings into the cell's per-program figures, by name.
func bpfRunDeltas(before, after map[string]bpfRun, delivered uint64) []ppsBPFProgram {
	var out []ppsBPFProgram
	for name, a := range after {
		b := before[name]
		if a.runs < b.runs || a.nanos < b.nanos || a.runs == b.runs {
			continue // restarted in between, or did not run
		}
		p := ppsBPFProgram{Name: name, Runs: a.runs - b.runs, Nanos: a.nanos - b.nanos}
		p.NsPerRun = float64(p.Nanos) / float64(p.Runs)
		if delivered > 0 {
			p.NsPerDelivered = float64(p.Nanos) / float64(delivered)
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ppsBPFStats is set while the benchmark has the run statistics on.
var ppsBPFStats bool

// ppsReadBPFRuns is aggdBPFRuns for a cell: nil when the statistics are off.
func ppsReadBPFRuns(b testing.TB) map[string]bpfRun {
	if !ppsBPFStats {
		return nil
	}
	runs, err := aggdBPFRuns()
	if err != nil {
		b.Fatalf("reading the BPF programs' run statistics: %v", err)
	}
	return runs
}

// bpfLine sums up a cell's programs in one line: each program's time per run and
// runs per delivered packet, then all of them per packet against the forwarding time
// per packet. Empty when the cell has no program figures.
func (c ppsCell) bpfLine() string {
	if len(c.BPFPrograms) == 0 {
		return ""
	}
	var parts []string
	total := 0.0
	delivered := c.DeliveredPPS * c.Seconds
	for _, p := range c.BPFPrograms {
		perPkt := 0.0
		if delivered > 0 {
			perPkt = float64(p.Runs) / delivered
		}
		parts = append(parts, fmt.Sprintf("%s %.0f ns x %.2f", p.Name, p.NsPerRun, perPkt))
		total += p.NsPerDelivered
	}
	return fmt.Sprintf("bpf per packet: %s = %.0f ns of %.0f ns forwarding", strings.Join(parts, ", "), total, c.FwdNsPerPacket)
}
