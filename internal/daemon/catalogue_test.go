package daemon

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aggd/aggd/internal/bpf"
	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/tunnel"
	"github.com/aggd/aggd/internal/wire"
)

var updateCatalogue = flag.Bool("update", false, "rewrite "+cataloguePath)

// cataloguePath lists every metric aggd exports, for the alert rules' test in its own
// module (deploy/prometheus), which checks each metric and label its rules use against
// it without importing the daemon.
const cataloguePath = "../../deploy/prometheus/testdata/metrics.txt"

// The catalogue is the daemon's metrics as they are: change a metric and this test
// fails until the catalogue is rewritten (go test ./internal/daemon -run
// TestMetricCatalogue -update), so the alert rules are checked against what aggd
// really exports.
func TestMetricCatalogue(t *testing.T) {
	got := metricCatalogue(t)
	if *updateCatalogue {
		if err := os.WriteFile(cataloguePath, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(cataloguePath)
	if err != nil {
		t.Fatalf("%v (write it with: go test ./internal/daemon -run TestMetricCatalogue -update)", err)
	}
	if got != string(want) {
		t.Errorf("%s is not the daemon's metrics: rewrite it with go test ./internal/daemon -run TestMetricCatalogue -update, "+
			"then run make test-alerts. The daemon exports:\n%s", cataloguePath, got)
	}
}

// descPattern reads a Desc's name and variable labels from its String(), the only way
// client_golang shows them.
var descPattern = regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*variableLabels: \{([^}]*)\}\}$`)

// metricCatalogue is one line per metric: its name, type and labels.
func metricCatalogue(t *testing.T) string {
	t.Helper()
	var lines []string
	add := func(kind string, c prometheus.Collector) {
		ch := make(chan *prometheus.Desc, 4)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := descPattern.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read the metric description %s", d)
			}
			lines = append(lines, strings.TrimSpace(fmt.Sprintf("%s %s %s", m[1], kind, m[2])))
		}
	}
	for _, c := range metrics.New().Own() {
		add(kindOf(t, c), c)
	}
	// What the daemon adds for its BPF programs: per-verdict counters read from the
	// kernel at scrape time.
	add("counter", shieldCollector{})
	add("counter", fastPathCollector{}) // and the handbacks
	sort.Strings(lines)
	var drops []string
	for _, r := range wire.AllReasons() {
		drops = append(drops, r.String())
	}
	values := []string{
		labelValues("aggd_drops_total", "reason", drops),
		labelValues("aggd_fastpath_packets_total", "direction", []string{"rx", "tx"}),
		labelValues("aggd_fastpath_packets_total", "verdict", append(slices.Clone(bpf.TxVerdicts), bpf.RxVerdicts...)),
		labelValues("aggd_handshake_cookie_replies_total", "direction", metrics.CookieDirections),
		labelValues("aggd_link_suspicions_total", "cause", tunnel.SuspicionCauses()),
		labelValues("aggd_metrics_connections_closed_total", "reason", metrics.ConnsClosedReasons),
		labelValues("aggd_xdp_packets_total", "reason", bpf.Reasons),
	}
	return "# name type labels: every metric aggd exports (internal/daemon TestMetricCatalogue writes this file)\n" +
		strings.Join(lines, "\n") + "\n" +
		"# values name label v1,v2,...: every value a label takes, where the code lists them\n" +
		strings.Join(values, "\n") + "\n"
}

// labelValues is a catalogue line of the values a metric's label takes, each once,
// sorted.
func labelValues(metric, label string, values []string) string {
	values = slices.Clone(values)
	slices.Sort(values)
	return fmt.Sprintf("values %s %s %s", metric, label, strings.Join(slices.Compact(values), ","))
}

// kindOf is a collector's metric type. Gauge comes first: a Gauge has a Counter's
// methods too.
func kindOf(t *testing.T, c prometheus.Collector) string {
	switch c.(type) {
	case *prometheus.GaugeVec, prometheus.Gauge:
		return "gauge"
	case *prometheus.CounterVec, prometheus.Counter:
		return "counter"
	case *prometheus.HistogramVec, prometheus.Histogram:
		return "histogram"
	}
	t.Fatalf("metric collector of unknown kind %T", c)
	return ""
}
