package prometheus

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/promqltest"
)

const dashboardFile = "../grafana/aggd.json"

// The part of Grafana's dashboard model the tests read.
type dashboardModel struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID          int          `json:"id"`
	Type        string       `json:"type"`
	Title       string       `json:"title"`
	Description string       `json:"description"`
	Datasource  *datasource  `json:"datasource"`
	GridPos     gridPos      `json:"gridPos"`
	Targets     []target     `json:"targets"`
	Panels      []panel      `json:"panels"` // a collapsed row's
	FieldConfig *fieldConfig `json:"fieldConfig"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type gridPos struct{ X, Y, W, H int }

type target struct {
	RefID        string      `json:"refId"`
	Expr         string      `json:"expr"`
	LegendFormat string      `json:"legendFormat"`
	Datasource   *datasource `json:"datasource"`
}

type fieldConfig struct {
	Defaults struct {
		Unit string `json:"unit"`
	} `json:"defaults"`
}

type variable struct {
	Name       string      `json:"name"`
	Type       string      `json:"type"`
	Query      any         `json:"query"` // a string, or {"query": ...} for a query variable
	Definition string      `json:"definition"`
	Datasource *datasource `json:"datasource"`
	Multi      bool        `json:"multi"`
	AllValue   string      `json:"allValue"`
}

func loadDashboard(t *testing.T) dashboardModel {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboardModel
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// allPanels lists the dashboard's panels, a collapsed row's included.
func (d dashboardModel) allPanels() []panel {
	var out []panel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	return out
}

// The data source every query goes to: the dashboard's own variable, so that an
// import or a provisioned copy asks for or takes the Prometheus to use.
var ourDatasource = datasource{Type: "prometheus", UID: "${datasource}"}

// panelTypes are the panel types the dashboard may use: Grafana's own, built in since
// Grafana 8.
var panelTypes = []string{"row", "stat", "timeseries", "state-timeline", "bargauge"}

// The dashboard is one Grafana can lay out: panels of known types with unique ids,
// inside the 24-column grid, none on top of another; every panel says what it shows,
// and asks the dashboard's data source.
func TestDashboardLaysOut(t *testing.T) {
	d := loadDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("title %q, uid %q: both needed (the uid keeps links to it stable)", d.Title, d.UID)
	}
	ids := map[int]string{}
	var placed []panel
	for _, p := range d.allPanels() {
		who := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if prev, dup := ids[p.ID]; dup || p.ID == 0 {
			t.Errorf("%s: id taken by %q or missing", who, prev)
		}
		ids[p.ID] = p.Title
		if !slices.Contains(panelTypes, p.Type) {
			t.Errorf("%s: type %q, want one of %v", who, p.Type, panelTypes)
		}
		g := p.GridPos
		if g.W < 1 || g.H < 1 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("%s: gridPos %+v outside the 24-column grid", who, g)
		}
		for _, q := range placed {
			if overlap(g, q.GridPos) {
				t.Errorf("%s at %+v covers panel %d %q at %+v", who, g, q.ID, q.Title, q.GridPos)
			}
		}
		placed = append(placed, p)
		if p.Type == "row" {
			continue
		}
		if p.Title == "" || strings.TrimSpace(p.Description) == "" {
			t.Errorf("%s: a title and a description say what it shows", who)
		}
		if p.FieldConfig == nil || p.FieldConfig.Defaults.Unit == "" {
			t.Errorf("%s: no unit", who)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no query", who)
		}
		if p.Datasource == nil || *p.Datasource != ourDatasource {
			t.Errorf("%s: data source %+v, want %+v", who, p.Datasource, ourDatasource)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("%s: a query's refId %q missing or taken", who, tg.RefID)
			}
			refs[tg.RefID] = true
			if tg.Datasource != nil && *tg.Datasource != ourDatasource {
				t.Errorf("%s, query %s: data source %+v, want %+v", who, tg.RefID, tg.Datasource, ourDatasource)
			}
		}
	}
}

func overlap(a, b gridPos) bool {
	return a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H
}

// sample stands in for what Grafana puts in a query's variables: a daemon, a peer,
// and a rate window.
var sample = strings.NewReplacer(
	"$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h",
	"$instance", "cpe", "$peer", "headend",
)

// asQuery is a target's or variable's query as Prometheus gets it.
func asQuery(t *testing.T, who, q string) string {
	t.Helper()
	out := sample.Replace(q)
	if strings.Contains(out, "$") {
		t.Errorf("%s: a variable the dashboard does not define, in %q", who, q)
	}
	return out
}

var legendLabel = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// labelValues is a query variable's label_values(selector, label).
var labelValues = regexp.MustCompile(`^label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// Every query of the dashboard, its variables' included, uses what aggd exports: the
// checks the alert rules get, with a legend's {{label}} counted as a named label; a
// variable lists the values of a label its metric has; a query names only variables
// the dashboard defines.
func TestDashboardUsesWhatAggdExports(t *testing.T) {
	cat := loadCatalogue(t)
	d := loadDashboard(t)
	defined := map[string]bool{}
	for _, v := range d.Templating.List {
		defined[v.Name] = true
		who := "variable " + v.Name
		switch v.Type {
		case "datasource":
			if v.Query != "prometheus" {
				t.Errorf("%s: lists %v data sources, want prometheus", who, v.Query)
			}
		case "query":
			m := labelValues.FindStringSubmatch(v.Definition)
			if m == nil {
				t.Errorf("%s: %q is not label_values(selector, label)", who, v.Definition)
				continue
			}
			if q, ok := v.Query.(map[string]any); !ok || q["query"] != v.Definition {
				t.Errorf("%s: query %v differs from its definition %q", who, v.Query, v.Definition)
			}
			if v.Datasource == nil || *v.Datasource != ourDatasource {
				t.Errorf("%s: data source %+v, want %+v", who, v.Datasource, ourDatasource)
			}
			checkExpr(t, cat, who, asQuery(t, who, m[1]), []string{m[2]})
			if v.Multi && v.AllValue != ".*" {
				t.Errorf("%s: multi-valued with allValue %q: with .* every peer's series match, even one that came after the page loaded", who, v.AllValue)
			}
		default:
			t.Errorf("%s: type %q, want datasource or query", who, v.Type)
		}
	}
	for _, name := range []string{"datasource", "instance", "peer"} {
		if !defined[name] {
			t.Errorf("no variable %s, which the queries use", name)
		}
	}
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			who := fmt.Sprintf("panel %q, query %s", p.Title, tg.RefID)
			var named []string
			for _, m := range legendLabel.FindAllStringSubmatch(tg.LegendFormat, -1) {
				named = append(named, m[1])
			}
			checkExpr(t, cat, who, asQuery(t, who, tg.Expr), named)
		}
	}
}

// sampleValues are the values the made-up series give labels whose values the
// catalogue does not list: one daemon, talking to one peer over two links (a join
// that leaves out the link label then fails, as it would on a real bond).
var sampleValues = map[string]string{
	"instance": "cpe", "job": "aggd", "peer": "headend",
	"socket": "listen", "type": "probe", "result": "ok", "cause": "silence", "kind": "carrier_lost",
	"to": "direct", "outcome": "sent", "version": "1.0", "goversion": "go1",
}

// sampleLinks are the links of the made-up series: the link label and the CPE's name
// for it (aggd_link_info's name).
var sampleLinks = [][2]string{{"link0", "dsl"}, {"link1", "lte"}}

// catalogueSeries makes up, for every metric of the catalogue, a series of 31 samples
// a minute apart in promqltest's load notation (one per link, for a metric with a
// link label): counters growing one a second, gauges at 1, a histogram with two
// buckets.
func catalogueSeries(t *testing.T, cat map[string]metric) string {
	t.Helper()
	names := make([]string, 0, len(cat))
	for name := range cat {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		m := cat[name]
		links := sampleLinks[:1]
		if slices.Contains(m.labels, "link") {
			links = sampleLinks
		}
		for _, link := range links {
			values := map[string]string{"link": link[0], "name": link[1]}
			var lbls []string
			for _, l := range append(slices.Clone(m.labels), targetLabels...) {
				v, ok := values[l]
				if !ok {
					v, ok = sampleValues[l]
				}
				if listed := m.values[l]; listed != nil {
					v, ok = listed[0], true
				}
				if !ok {
					t.Fatalf("no sample value for %s's label %s: add one to sampleValues", name, l)
				}
				lbls = append(lbls, fmt.Sprintf("%s=%q", l, v))
			}
			writeSeries(t, &b, name, m.kind, strings.Join(lbls, ","))
		}
	}
	return b.String()
}

func writeSeries(t *testing.T, b *strings.Builder, name, kind, set string) {
	t.Helper()
	switch kind {
	case "counter":
		fmt.Fprintf(b, "%s{%s} 0+60x30\n", name, set)
	case "gauge":
		fmt.Fprintf(b, "%s{%s} 1+0x30\n", name, set)
	case "histogram":
		fmt.Fprintf(b, "%s_bucket{%s,le=\"0.1\"} 0+50x30\n", name, set)
		fmt.Fprintf(b, "%s_bucket{%s,le=\"+Inf\"} 0+60x30\n", name, set)
		fmt.Fprintf(b, "%s_count{%s} 0+60x30\n", name, set)
		fmt.Fprintf(b, "%s_sum{%s} 0+3x30\n", name, set)
	default:
		t.Fatalf("%s: kind %q", name, kind)
	}
}

// Every query of the dashboard returns data from series shaped like aggd's (one of
// each metric, with every label): a join on labels that do not match, a filter no
// healthy daemon passes, or a selector that finds nothing would leave its panel empty.
func TestDashboardQueriesReturnData(t *testing.T) {
	cat := loadCatalogue(t)
	st := promqltest.LoadedStorage(t, loadCommand(catalogueSeries(t, cat)))
	t.Cleanup(func() { _ = st.Close() })
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e6, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	at := time.Unix(30*60, 0)
	for _, p := range loadDashboard(t).allPanels() {
		for _, tg := range p.Targets {
			who := fmt.Sprintf("panel %q, query %s", p.Title, tg.RefID)
			q, err := engine.NewInstantQuery(context.Background(), st, nil, asQuery(t, who, tg.Expr), at)
			if err != nil {
				t.Errorf("%s: %v", who, err)
				continue
			}
			res := q.Exec(context.Background())
			switch v, err := res.Vector(); {
			case res.Err != nil:
				t.Errorf("%s: %v", who, res.Err)
			case err != nil:
				t.Errorf("%s: not an instant vector: %v", who, err)
			case len(v) == 0:
				t.Errorf("%s: no data from series shaped like aggd's: %s", who, tg.Expr)
			}
			q.Close()
		}
	}
}
