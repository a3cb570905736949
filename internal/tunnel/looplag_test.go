package tunnel

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// A run's lateness is its gap from the run before beyond the interval; the runs late
// by a suspicion time are logged, at most once per lateWarnEvery, with the count of
// those that were not.
func TestLoopLagMeasuresAndLogsLateRuns(t *testing.T) {
	hist := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "late", Buckets: []float64{0.05, 0.3}})
	var logged bytes.Buffer
	lag := newLoopLag(100*time.Millisecond, hist, slog.New(slog.NewTextHandler(&logged, nil)))
	t0 := time.Unix(1000, 0)
	runs := []struct {
		at   time.Duration
		late time.Duration
	}{
		{0, 0}, // the first run has nothing to be late against
		{102 * time.Millisecond, 2 * time.Millisecond}, // on time, but for the ticker's jitter
		{622 * time.Millisecond, 420 * time.Millisecond},
		{722 * time.Millisecond, 0},
		{time.Second + 122*time.Millisecond, 300 * time.Millisecond}, // late again, within lateWarnEvery
		{12 * time.Second, 10*time.Second + 778*time.Millisecond},
	}
	for _, r := range runs {
		if got := lag.observe(t0.Add(r.at)); got != r.late {
			t.Errorf("run at %v: late %v, want %v", r.at, got, r.late)
		}
	}
	var m dto.Metric
	if err := hist.Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetHistogram().GetSampleCount(); n != 5 {
		t.Errorf("%d runs observed, want 5 (all but the first)", n)
	}
	if over := m.GetHistogram().GetSampleCount() - m.GetHistogram().GetBucket()[1].GetCumulativeCount(); over != 2 {
		t.Errorf("%d runs observed later than 0.3 s, want 2", over)
	}
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("logged %d lines, want 2 (the 420-ms run, and the 10.8-s one after lateWarnEvery):\n%s", len(lines), logged.String())
	}
	if !strings.Contains(lines[0], "late=420ms") || !strings.Contains(lines[1], "late_runs_not_logged=1") {
		t.Errorf("the warnings do not say how late and how many were not logged:\n%s", logged.String())
	}
}
