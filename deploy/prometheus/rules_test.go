// Package prometheus tests aggd's alerting rules (aggd.rules.yml) and its Grafana
// dashboard (../grafana/aggd.json) with Prometheus's own rule parser and query engine:
// every rule parses as Prometheus would load it, uses only metrics and labels aggd
// exports (testdata/metrics.txt, which the daemon's TestMetricCatalogue keeps true),
// and fires on series that show its fault and on no series that do not; every
// dashboard query does the same checks and returns data from series shaped like
// aggd's.
//
// It is a module of its own so that the Prometheus server's code and Grafana's SDK,
// test dependencies only, stay out of aggd's go.mod. `make test-alerts` runs it.
package prometheus

import (
	"bufio"
	"context"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
)

const rulesFile = "aggd.rules.yml"

// severities are the values an alert's severity label may take.
var severities = []string{"critical", "warning", "info"}

func loadRules(t *testing.T) []rulefmt.Rule {
	t.Helper()
	groups, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, parser.NewParser(parser.Options{}),
		slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("%s: %v", rulesFile, err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	var rules []rulefmt.Rule
	for _, g := range groups.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules
}

// Each rule is an alert with a severity, a summary and a description, and a unique
// name.
func TestRulesAreAlertsThatSayWhatToDo(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range loadRules(t) {
		if r.Alert == "" {
			t.Errorf("a rule that is not an alert (record %q): this file holds alerts only", r.Record)
			continue
		}
		if seen[r.Alert] {
			t.Errorf("%s: defined twice", r.Alert)
		}
		seen[r.Alert] = true
		if !slices.Contains(severities, r.Labels["severity"]) {
			t.Errorf("%s: severity %q, want one of %v", r.Alert, r.Labels["severity"], severities)
		}
		for _, a := range []string{"summary", "description"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s: no %s annotation", r.Alert, a)
			}
		}
	}
}

// metric is one metric of the catalogue.
type metric struct {
	kind   string
	labels []string
	values map[string][]string // label: the values it takes, where the code lists them
}

func loadCatalogue(t *testing.T) map[string]metric {
	t.Helper()
	f, err := os.Open("testdata/metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cat := map[string]metric{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if fields[0] == "values" { // values name label v1,v2,...
			m, ok := cat[fields[1]]
			if !ok || len(fields) != 4 {
				t.Fatalf("testdata/metrics.txt: %q: values of an unknown metric, or not name, label and values", line)
			}
			if m.values == nil {
				m.values = map[string][]string{}
			}
			m.values[fields[2]] = strings.Split(fields[3], ",")
			cat[fields[1]] = m
			continue
		}
		m := metric{kind: fields[1]}
		if len(fields) > 2 {
			m.labels = strings.Split(fields[2], ",")
		}
		cat[fields[0]] = m
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return cat
}

// targetLabels are the labels Prometheus gives every scraped series.
var targetLabels = []string{"instance", "job"}

// labelsOf is what a selector of name may name: the metric's own labels, the
// target's, and le for a histogram's buckets. ok is false for a name aggd does not
// export.
func labelsOf(cat map[string]metric, name string) (labels []string, ok bool) {
	if m, found := cat[name]; found {
		return append(slices.Clone(m.labels), targetLabels...), true
	}
	for _, suffix := range []string{"_bucket", "_count", "_sum"} {
		base, cut := strings.CutSuffix(name, suffix)
		if m, found := cat[base]; cut && found && m.kind == "histogram" {
			labels = append(slices.Clone(m.labels), targetLabels...)
			if suffix == "_bucket" {
				labels = append(labels, "le")
			}
			return labels, true
		}
	}
	return nil, false
}

var templateLabel = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)

// Every metric a rule selects is one aggd exports, and every label the rule names (in
// its selectors, its by, on and group_left clauses, and its annotations' templates)
// is a label of one of them; a label compared with a value takes that value, where the
// catalogue lists the values.
func TestRulesUseWhatAggdExports(t *testing.T) {
	cat := loadCatalogue(t)
	for _, r := range loadRules(t) {
		var named []string
		for _, a := range r.Annotations {
			for _, m := range templateLabel.FindAllStringSubmatch(a, -1) {
				named = append(named, m[1])
			}
		}
		checkExpr(t, cat, r.Alert, r.Expr, named)
	}
}

// checkExpr checks a PromQL expression against the catalogue: every metric it
// selects is one aggd exports; every label it names, in its selectors, its by, on and
// group_left clauses, or elsewhere (named: templates, legends), is a label of one of
// them; a label compared with a value takes that value, where the catalogue lists the
// values. who names the expression's owner in errors.
func checkExpr(t *testing.T, cat map[string]metric, who, text string, named []string) {
	t.Helper()
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(text)
	if err != nil {
		t.Errorf("%s: %v", who, err)
		return
	}
	var known []string
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			names, ok := labelsOf(cat, n.Name)
			if !ok {
				t.Errorf("%s: selects %s, which aggd does not export (testdata/metrics.txt)", who, n.Name)
			}
			known = append(known, names...)
			for _, m := range n.LabelMatchers {
				if m.Name != model.MetricNameLabel && !slices.Contains(names, m.Name) {
					t.Errorf("%s: %s has no label %q (it has %v)", who, n.Name, m.Name, names)
				}
				values := cat[n.Name].values[m.Name]
				if m.Type == labels.MatchEqual && values != nil && !slices.Contains(values, m.Value) {
					t.Errorf("%s: %s{%s=%q}: the label never takes that value (it takes %v)", who, n.Name, m.Name, m.Value, values)
				}
			}
		case *parser.AggregateExpr:
			named = append(named, n.Grouping...)
		case *parser.BinaryExpr:
			if n.VectorMatching != nil {
				named = append(named, n.VectorMatching.MatchingLabels...)
				named = append(named, n.VectorMatching.Include...)
			}
		}
		return nil
	})
	for _, l := range named {
		if !slices.Contains(known, l) {
			t.Errorf("%s: names the label %q, which none of the metrics it selects has", who, l)
		}
	}
}

// A case is made-up series (promqltest's load notation, one sample a minute from
// time 0) and whether the alert must be firing at the last of them.
type alertCase struct {
	series string
	fires  bool
}

// alertCases holds, for each alert in the file, series on which it must fire and
// series on which it must not. An alert fires when its expression has had a result at
// every evaluation over its `for` time (evaluated here every 30 s).
var alertCases = map[string][]alertCase{
	"AggdLinkDown": {
		{fires: true, series: `
			aggd_link_up{instance="cpe",peer="headend",link="lte"} 1 1 0 0 0 0
			aggd_link_info{instance="cpe",peer="headend",link="lte",name="lte"} 1 1 1 1 1 1`},
		// Down for less than its 2 minutes.
		{fires: false, series: `
			aggd_link_up{instance="cpe",peer="headend",link="lte"} 1 1 1 1 0 0
			aggd_link_info{instance="cpe",peer="headend",link="lte",name="lte"} 1 1 1 1 1 1`},
	},
	"AggdPeerUnreachable": {
		{fires: true, series: `
			aggd_link_up{instance="hub",peer="cpe1",link="link0"} 1 0 0 0
			aggd_link_up{instance="hub",peer="cpe1",link="link1"} 1 0 0 0`},
		// One link of two still up.
		{fires: false, series: `
			aggd_link_up{instance="hub",peer="cpe1",link="link0"} 1 0 0 0
			aggd_link_up{instance="hub",peer="cpe1",link="link1"} 1 1 1 1`},
	},
	"AggdLinkFlapping": {
		{fires: true, series: `
			aggd_link_state_change_timestamp_seconds{instance="hub",peer="cpe1",link="link0"} 0+60x15
			aggd_link_info{instance="hub",peer="cpe1",link="link0",name="dsl"} 1+0x15`},
		{fires: false, series: `
			aggd_link_state_change_timestamp_seconds{instance="cpe",peer="headend",link="dsl"} 0 0 60 60 60 60 120 120 120 120 120 120 120 120 120 120
			aggd_link_info{instance="cpe",peer="headend",link="dsl",name="dsl"} 1+0x15`},
	},
	"AggdLinkLossHigh": {
		{fires: true, series: `
			aggd_link_loss_ratio{instance="cpe",peer="headend",link="lte"} 0.08+0x12
			aggd_link_info{instance="cpe",peer="headend",link="lte",name="lte"} 1+0x12`},
		{fires: false, series: `
			aggd_link_loss_ratio{instance="cpe",peer="headend",link="lte"} 0.01+0x12
			aggd_link_info{instance="cpe",peer="headend",link="lte",name="lte"} 1+0x12`},
	},
	"AggdPeerNoSession": {
		// A headend's CPE that never connected; a CPE whose headend did, late.
		{fires: true, series: `
			aggd_peer_session{instance="hub",peer="cpe1"} 1+0x6
			aggd_peer_session{instance="hub",peer="cpe2"} 0+0x6`},
		{fires: false, series: `aggd_peer_session{instance="cpe",peer="headend"} 0 0 1 1 1 1 1`},
	},
	"AggdHandshakesRejected": {
		{fires: true, series: `aggd_session_handshakes_total{instance="hub",peer="unknown",result="rejected"} 0+1x10`},
		{fires: false, series: `
			aggd_session_handshakes_total{instance="hub",peer="unknown",result="rejected"} 0 0 1 1 1 1 1 1 1 1 1
			aggd_session_handshakes_total{instance="hub",peer="cpe1",result="ok"} 0+5x10`},
	},
	"AggdHandshakeFlood": {
		{fires: true, series: `aggd_handshake_cookie_replies_total{instance="hub",direction="sent"} 0+3000x10`},
		// A restart's herd: cookie replies for a few seconds, then none.
		{fires: false, series: `aggd_handshake_cookie_replies_total{instance="hub",direction="sent"} 0 400 400 400 400 400 400 400 400 400 400`},
		{fires: false, series: `aggd_handshake_cookie_replies_total{instance="cpe",direction="received"} 0+3x10`},
	},
	"AggdFallbackDirect": {
		{fires: true, series: `aggd_fallback_direct{instance="cpe"} 0 1 1 1`},
		{fires: false, series: `aggd_fallback_direct{instance="cpe"} 0 0 0 1`},
	},
	"AggdSocketReceiveDrops": {
		{fires: true, series: `aggd_socket_receive_drops_total{instance="hub",socket="listen"} 0+600x20`},
		{fires: false, series: `aggd_socket_receive_drops_total{instance="hub",socket="listen"} 0+6x20`},
	},
	"AggdHostQueue": {
		// 1000 datagrams a minute over two sockets, waiting 30 ms on average; then 2 ms.
		{fires: true, series: `
			aggd_socket_receive_wait_seconds_sum{instance="cpe",socket="dsl"} 0+20x25
			aggd_socket_receive_wait_seconds_count{instance="cpe",socket="dsl"} 0+500x25
			aggd_socket_receive_wait_seconds_sum{instance="cpe",socket="lte"} 0+10x25
			aggd_socket_receive_wait_seconds_count{instance="cpe",socket="lte"} 0+500x25`},
		{fires: false, series: `
			aggd_socket_receive_wait_seconds_sum{instance="cpe",socket="dsl"} 0+1x25
			aggd_socket_receive_wait_seconds_count{instance="cpe",socket="dsl"} 0+500x25
			aggd_socket_receive_wait_seconds_sum{instance="cpe",socket="lte"} 0+1x25
			aggd_socket_receive_wait_seconds_count{instance="cpe",socket="lte"} 0+500x25`},
	},
	"AggdControlLoopLate": {
		// Every minute 600 runs, 5 of them more than 0.3 s late.
		{fires: true, series: `
			aggd_control_loop_lateness_seconds_count{instance="cpe"} 0+600x25
			aggd_control_loop_lateness_seconds_bucket{instance="cpe",le="0.3"} 0+595x25`},
		{fires: false, series: `
			aggd_control_loop_lateness_seconds_count{instance="cpe"} 0+600x25
			aggd_control_loop_lateness_seconds_bucket{instance="cpe",le="0.3"} 0+600x25`},
	},
	"AggdReorderBufferFull": {
		{fires: true, series: `aggd_reorder_overflow_skips_total{instance="hub",peer="cpe1"} 0 0 0 4 4`},
		{fires: false, series: `aggd_reorder_overflow_skips_total{instance="hub",peer="cpe1"} 4+0x20`},
	},
	"AggdECNCapablePacketsDropped": {
		{fires: true, series: `
			aggd_aqm_ecn_capable_drops_total{instance="cpe",peer="headend"} 0 0 1 1
			aggd_aqm_ecn_marks_total{instance="cpe",peer="headend"} 0 5 10 20`},
		// aqm.ecn off: ECN-capable packets are dropped, and none is marked.
		{fires: false, series: `
			aggd_aqm_ecn_capable_drops_total{instance="cpe",peer="headend"} 0 5 10 20
			aggd_aqm_ecn_marks_total{instance="cpe",peer="headend"} 0 0 0 0`},
		// aqm.ecn on, marks and no ECN-capable drop.
		{fires: false, series: `
			aggd_aqm_ecn_capable_drops_total{instance="cpe",peer="headend"} 0 0 0 0
			aggd_aqm_ecn_marks_total{instance="cpe",peer="headend"} 0 5 10 20`},
	},
	"AggdForgedPackets": {
		{fires: true, series: `
			aggd_xdp_packets_total{instance="hub",reason="bad_tag"} 0+3000x20
			aggd_xdp_packets_total{instance="hub",reason="pass"} 0+60000x20`},
		{fires: false, series: `
			aggd_xdp_packets_total{instance="hub",reason="bad_tag"} 0+30x20
			aggd_xdp_packets_total{instance="hub",reason="pass"} 0+60000x20`},
	},
	"AggdDataCapReached": {
		{fires: true, series: `aggd_uplink_data_cap_reached{instance="cpe",link="lte"} 0 0 1`},
		{fires: false, series: `aggd_uplink_data_cap_reached{instance="cpe",link="lte"} 0 0 0`},
	},
	"AggdDataCapNearlyUsed": {
		{fires: true, series: `
			aggd_uplink_data_used_bytes{instance="cpe",link="lte"} 18.5e9
			aggd_uplink_data_cap_bytes{instance="cpe",link="lte"} 20e9
			aggd_uplink_data_cap_reached{instance="cpe",link="lte"} 0`},
		// Used up: AggdDataCapReached says so instead.
		{fires: false, series: `
			aggd_uplink_data_used_bytes{instance="cpe",link="lte"} 20e9
			aggd_uplink_data_cap_bytes{instance="cpe",link="lte"} 20e9
			aggd_uplink_data_cap_reached{instance="cpe",link="lte"} 1`},
		{fires: false, series: `
			aggd_uplink_data_used_bytes{instance="cpe",link="lte"} 5e9
			aggd_uplink_data_cap_bytes{instance="cpe",link="lte"} 20e9
			aggd_uplink_data_cap_reached{instance="cpe",link="lte"} 0`},
	},
}

// loadCommand is promqltest's command that loads series, one sample a minute.
func loadCommand(series string) string {
	cmd := "load 1m\n"
	for _, line := range strings.Split(series, "\n") {
		if line = strings.TrimSpace(line); line != "" {
			cmd += "  " + line + "\n"
		}
	}
	return cmd
}

var samples = regexp.MustCompile(`\} (.*)$`)

// lastMinute is the time of a case's last sample: its longest series' length, each
// `a+bxN` counting N+1 samples.
func lastMinute(series string) int {
	last := 0
	for _, line := range strings.Split(strings.TrimSpace(series), "\n") {
		m := samples.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		n := 0
		for _, v := range strings.Fields(m[1]) {
			if _, times, ok := strings.Cut(v, "x"); ok {
				k, err := strconv.Atoi(times)
				if err != nil {
					panic("series " + line + ": " + err.Error())
				}
				n += k + 1
			} else {
				n++
			}
		}
		last = max(last, n-1)
	}
	return last
}

// Each alert fires on series that show its fault, and not on series that do not; and
// every alert in the file has such cases.
func TestAlertsFireOnTheirFaultOnly(t *testing.T) {
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e6, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	rules := loadRules(t)
	for _, r := range rules {
		cases, ok := alertCases[r.Alert]
		if !ok {
			t.Errorf("%s: no cases in alertCases", r.Alert)
			continue
		}
		for i, c := range cases {
			st := promqltest.LoadedStorage(t, loadCommand(c.series))
			end := time.Unix(int64(lastMinute(c.series))*60, 0)
			firing := true
			for at := end.Add(-time.Duration(r.For)); !at.After(end); at = at.Add(30 * time.Second) {
				q, err := engine.NewInstantQuery(context.Background(), st, nil, r.Expr, at)
				if err != nil {
					t.Fatalf("%s: %v", r.Alert, err)
				}
				res := q.Exec(context.Background())
				if res.Err != nil {
					t.Fatalf("%s, case %d: %v", r.Alert, i, res.Err)
				}
				v, err := res.Vector()
				if err != nil {
					t.Fatalf("%s, case %d: %v", r.Alert, i, err)
				}
				q.Close()
				if len(v) == 0 {
					firing = false
					break
				}
			}
			if firing != c.fires {
				t.Errorf("%s, case %d: firing %v at %s, want %v; series:%s", r.Alert, i, firing, end.UTC().Format("15:04"), c.fires, c.series)
			}
			if err := st.Close(); err != nil {
				t.Error(err)
			}
		}
	}
	for name := range alertCases {
		if !slices.ContainsFunc(rules, func(r rulefmt.Rule) bool { return r.Alert == name }) {
			t.Errorf("alertCases has %s, which %s does not define", name, rulesFile)
		}
	}
}
