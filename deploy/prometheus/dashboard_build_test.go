package prometheus

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/bargauge"
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/statetimeline"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// The dashboard is built here, with Grafana's own dashboard-as-code SDK (its types are
// generated from the schemas Grafana checks dashboards with), and committed as
// ../grafana/aggd.json: `go test -run TestDashboardIsBuilt -update` rewrites it.
var update = flag.Bool("update", false, "rewrite "+dashboardFile+" from buildDashboard")

// The selectors every query starts from: the daemon picked, and its peers picked (on a
// CPE there is one, "headend"; on a headend, its CPEs).
const (
	ofDaemon = `instance="$instance"`
	ofPeers  = `instance="$instance", peer=~"$peer"`
	// byName adds the CPE's own name for each link (a headend's link0, link1, ... say
	// nothing to its operator).
	byName = ` * on (instance, peer, link) group_left (name) aggd_link_info{` + ofPeers + `}`
	// perLink is the legend of a per-link series.
	perLink = "{{peer}} / {{name}}"
)

var promDatasource = common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}

func query(expr, legend string) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().Expr(expr).LegendFormat(legend).Datasource(promDatasource)
}

// graph is a time series panel half the dashboard wide, with a table legend.
func graph(title, description, unit string, queries ...*prometheus.DataqueryBuilder) *timeseries.PanelBuilder {
	p := timeseries.NewPanelBuilder().Title(title).Description(description).Datasource(promDatasource).
		Unit(unit).Height(8).Span(12).
		Legend(common.NewVizLegendOptionsBuilder().DisplayMode(common.LegendDisplayModeTable).
			Placement(common.LegendPlacementBottom).ShowLegend(true).Calcs([]string{"lastNotNull", "max"})).
		Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending))
	for _, q := range queries {
		p.WithTarget(q)
	}
	return p
}

// stacked stacks a graph's series: the parts of a whole, as a split is.
func stacked(p *timeseries.PanelBuilder) *timeseries.PanelBuilder {
	return p.Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal).Group("A")).FillOpacity(40)
}

// single is a stat panel a sixth of the dashboard wide.
func single(title, description, unit string, queries ...*prometheus.DataqueryBuilder) *stat.PanelBuilder {
	p := stat.NewPanelBuilder().Title(title).Description(description).Datasource(promDatasource).
		Unit(unit).Height(4).Span(4).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"})).
		GraphMode(common.BigValueGraphModeNone).ColorMode(common.BigValueColorModeValue).Orientation(common.VizOrientationAuto)
	for _, q := range queries {
		p.WithTarget(q)
	}
	return p
}

// valueNames shows a gauge's values as words, in colours.
func valueNames(names map[string][2]string) []dashboard.ValueMapping {
	options := map[string]dashboard.ValueMappingResult{}
	for value, nc := range names {
		options[value] = dashboard.ValueMappingResult{Text: cog.ToPtr(nc[0]), Color: cog.ToPtr(nc[1])}
	}
	return []dashboard.ValueMapping{{ValueMap: &dashboard.ValueMap{Type: dashboard.MappingTypeValueToText, Options: options}}}
}

// steps are absolute thresholds: green below the first one, then each one's colour
// from its value.
func steps(from ...dashboard.Threshold) *dashboard.ThresholdsConfigBuilder {
	return dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).
		Steps(append([]dashboard.Threshold{{Color: "green"}}, from...))
}

// at is a threshold: color from value up.
func at(value float64, color string) dashboard.Threshold {
	return dashboard.Threshold{Value: &value, Color: color}
}

func queryVariable(name, label, q string) *dashboard.QueryVariableBuilder {
	return dashboard.NewQueryVariableBuilder(name).Label(label).Datasource(promDatasource).
		Query(dashboard.StringOrMap{Map: map[string]any{"query": q, "refId": name}}).Definition(q).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged).Sort(dashboard.VariableSortAlphabeticalAsc)
}

//nolint:staticcheck // the classic dashboard model, which every Grafana imports; the SDK's v2 needs Grafana 12's new dashboard API
func buildDashboard() *dashboard.DashboardBuilder {
	d := dashboard.NewDashboardBuilder("aggd").Uid("aggd").
		Description("aggd's bond: each link's health, estimates and share, the resequencer, the bond's AQM and the daemon "+
			"itself. Pick a daemon (a CPE or a headend) and, on a headend, its CPEs.").
		Tags([]string{"aggd", "networking"}).Editable().Tooltip(dashboard.DashboardCursorSyncCrosshair).
		Refresh("30s").Time("now-1h", "now").Timezone(common.TimeZoneBrowser).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Prometheus").Type("prometheus")).
		WithVariable(queryVariable("instance", "aggd daemon", "label_values(aggd_build_info, instance)")).
		WithVariable(queryVariable("peer", "peer", `label_values(aggd_peer_session{instance="$instance"}, peer)`).
			Multi(true).IncludeAll(true).AllValue(".*"))

	d.WithRow(dashboard.NewRowBuilder("Overview")).
		WithPanel(single("Sessions", "Established sessions: a CPE has one, with its headend; a headend one per connected CPE.", "short",
			query(`aggd_sessions{`+ofDaemon+`}`, "sessions"))).
		WithPanel(single("Peers without a session", "Peers the daemon knows but has no session with: on a headend, listed CPEs "+
			"that have not connected since it started (alert AggdPeerNoSession).", "short",
			query(`count(aggd_peer_session{`+ofDaemon+`} == 0) or vector(0)`, "no session")).
			Thresholds(steps(at(1, "red")))).
		WithPanel(single("Links up", "Links in the schedule (up or suspect), of all links to the peers picked.", "short",
			query(`sum(aggd_link_up{`+ofPeers+`})`, "up"), query(`count(aggd_link_up{`+ofPeers+`})`, "links"))).
		WithPanel(single("Direct fallback", "1 while a CPE sends new LAN connections directly out of an uplink because the "+
			"headend is silent (fallback.enabled).", "short",
			query(`aggd_fallback_direct{`+ofDaemon+`}`, "direct")).
			Mappings(valueNames(map[string][2]string{"0": {"bonded", "green"}, "1": {"DIRECT", "red"}}))).
		WithPanel(single("Bond throughput", "What every link to the peers picked sends and receives, outer headers included.", "bps",
			query(`sum(rate(aggd_link_transmit_bytes_total{`+ofPeers+`}[$__rate_interval])) * 8`, "sending"),
			query(`sum(rate(aggd_link_receive_bytes_total{`+ofPeers+`}[$__rate_interval])) * 8`, "receiving")).Span(8))

	d.WithRow(dashboard.NewRowBuilder("Links")).
		WithPanel(statetimeline.NewPanelBuilder().Title("Link state").
			Description("Each link's health: up, suspect (its probe replies stopped; its traffic is copied to another link) or " +
				"down. Legend: peer / the CPE's name for the link.").
			Datasource(promDatasource).Unit("short").Height(6).Span(24).
			WithTarget(query(`(aggd_link_up{`+ofPeers+`} + aggd_link_suspect{`+ofPeers+`})`+byName, perLink)).
			Mappings(valueNames(map[string][2]string{"0": {"down", "red"}, "1": {"up", "green"}, "2": {"suspect", "orange"}}))).
		WithPanel(stacked(graph("Sent per link (the split)", "What aggd sends on each link, stacked: the scheduler's split "+
			"of the bond's traffic towards the peer.", "bps",
			query(`rate(aggd_link_transmit_bytes_total{`+ofPeers+`}[$__rate_interval]) * 8`+byName, perLink)))).
		WithPanel(stacked(graph("Received per link", "What arrives from the peer on each link, stacked: the peer's split.", "bps",
			query(`rate(aggd_link_receive_bytes_total{`+ofPeers+`}[$__rate_interval]) * 8`+byName, perLink)))).
		WithPanel(graph("Capacity estimate", "Each link's estimated capacity towards the peer (its delivery rate while "+
			"queueing, Kalman-filtered; no configured rates needed).", "bps",
			query(`aggd_link_capacity_bits_per_second{`+ofPeers+`}`+byName, perLink))).
		WithPanel(graph("Scheduler rate", "The rate the scheduler assumes for each link now: the estimate, lowered while "+
			"the link keeps a queue.", "bps",
			query(`aggd_link_scheduler_rate_bits_per_second{`+ofPeers+`}`+byName, perLink))).
		WithPanel(graph("RTT", "Each link's smoothed round-trip time, from probes.", "s",
			query(`aggd_link_rtt_seconds{`+ofPeers+`}`+byName, perLink))).
		WithPanel(graph("Queueing delay", "Each link's one-way delay above its floor: the standing queue aggd keeps small.", "s",
			query(`aggd_link_queue_delay_seconds{`+ofPeers+`}`+byName, perLink))).
		WithPanel(graph("Loss", "Each link's recent loss ratio, as the peer reports it (alert AggdLinkLossHigh above 5 %).", "percentunit",
			query(`aggd_link_loss_ratio{`+ofPeers+`}`+byName, perLink))).
		WithPanel(graph("Suspicions", "How often links went suspect, by cause (silence, reports, owed, peer_copies, "+
			"missed_probe, companion_down): each one copies the link's traffic to another until it is up or down.", "ops",
			query(`sum by (peer, link, cause) (rate(aggd_link_suspicions_total{`+ofPeers+`}[$__rate_interval]))`,
				"{{peer}} / {{link}}: {{cause}}")))

	d.WithRow(dashboard.NewRowBuilder("Ordering and the bond's queue")).
		WithPanel(graph("Resequencer hold", "How long a gap is waited for now, and the mean wait of the packets that waited.", "s",
			query(`aggd_reorder_hold_time_seconds{`+ofPeers+`}`, "{{peer}} hold time"),
			query(`rate(aggd_reorder_hold_seconds_total{`+ofPeers+`}[$__rate_interval]) / rate(aggd_reorder_held_packets_total{`+
				ofPeers+`}[$__rate_interval])`, "{{peer}} mean wait"))).
		WithPanel(graph("Gaps and late packets", "Sequence numbers given up as lost, packets that came after they were given "+
			"up, and gaps skipped because the reorder buffer was full (alert AggdReorderBufferFull).", "pps",
			query(`rate(aggd_reorder_lost_packets_total{`+ofPeers+`}[$__rate_interval])`, "{{peer}} lost"),
			query(`rate(aggd_reorder_late_packets_total{`+ofPeers+`}[$__rate_interval])`, "{{peer}} late"),
			query(`rate(aggd_reorder_overflow_skips_total{`+ofPeers+`}[$__rate_interval])`, "{{peer}} buffer full"))).
		WithPanel(graph("AQM at the bond's entry", "Packets the bond's AQM dropped or ECN-marked so that senders slow down; "+
			"ECN-capable drops should stay at 0 with aqm.ecn on (alert AggdECNCapablePacketsDropped); drops taken back were "+
			"sent after all when the links they were made on died before the flow could answer them.", "pps",
			query(`rate(aggd_aqm_drops_total{`+ofPeers+`}[$__rate_interval])`, "{{peer}} drops"),
			query(`rate(aggd_aqm_ecn_marks_total{`+ofPeers+`}[$__rate_interval])`, "{{peer}} ECN marks"),
			query(`rate(aggd_aqm_ecn_capable_drops_total{`+ofPeers+`}[$__rate_interval])`, "{{peer}} ECN-capable drops"),
			query(`rate(aggd_aqm_drops_taken_back_total{`+ofPeers+`}[$__rate_interval])`, "{{peer}} drops taken back"))).
		WithPanel(graph("Copies and rescues", "Redundant copies sent for links in doubt, and packets in flight on a link that "+
			"went into doubt or down, copied to another.", "pps",
			query(`sum by (peer) (rate(aggd_link_redundant_packets_total{`+ofPeers+`}[$__rate_interval]))`, "{{peer}} redundant copies"),
			query(`rate(aggd_rescued_packets_total{`+ofPeers+`}[$__rate_interval])`, "{{peer}} rescued")))

	d.WithRow(dashboard.NewRowBuilder("Daemon")).
		WithPanel(graph("Control loop lateness (99th percentile)", "How late aggd's control loop ran: a CPU too busy for aggd "+
			"makes healthy links look silent (alert AggdControlLoopLate).", "s",
			query(`histogram_quantile(0.99, sum by (le) (rate(aggd_control_loop_lateness_seconds_bucket{`+ofDaemon+
				`}[$__rate_interval])))`, "p99")).Span(8)).
		WithPanel(graph("Wait on the host", "How long datagrams waited between arriving and aggd reading them, on average, "+
			"by socket: a queue of the host's own, inside every link's queueing delay (alert AggdHostQueue).", "s",
			query(`sum by (socket) (rate(aggd_socket_receive_wait_seconds_sum{`+ofDaemon+`}[$__rate_interval])) / `+
				`sum by (socket) (rate(aggd_socket_receive_wait_seconds_count{`+ofDaemon+`}[$__rate_interval]))`, "{{socket}}")).Span(8)).
		WithPanel(graph("Dropped packets", "Received packets aggd dropped, by reason, and datagrams the kernel dropped because "+
			"aggd fell behind (alert AggdSocketReceiveDrops).", "pps",
			query(`sum by (reason) (rate(aggd_drops_total{`+ofDaemon+`}[$__rate_interval]))`, "{{reason}}"),
			query(`sum by (socket) (rate(aggd_socket_receive_drops_total{`+ofDaemon+`}[$__rate_interval]))`, "socket {{socket}} full")).Span(8)).
		WithPanel(graph("Kernel fast path", "Data packets by the fast path's verdict: fast is carried in the kernel; the rest "+
			"went to the daemon or were dropped (docs/fastpath.md).", "pps",
			query(`sum by (direction, verdict) (rate(aggd_fastpath_packets_total{`+ofDaemon+`}[$__rate_interval]))`,
				"{{direction}} {{verdict}}")).Span(8)).
		WithPanel(graph("Signalling cost", "What the tunnel's own messages (probes, FEEDBACK, loss notices, ...) cost the "+
			"links, by type.", "bps",
			query(`sum by (type) (rate(aggd_control_transmit_bytes_total{`+ofPeers+`}[$__rate_interval])) * 8`, "{{type}}")).Span(8)).
		WithPanel(bargauge.NewPanelBuilder().Title("Data caps").
			Description("A capped uplink's use of its allowance in the current billing period (CPE, uplinks[].data_cap).").
			Datasource(promDatasource).Unit("percentunit").Height(8).Span(8).Min(0).Max(1).
			Thresholds(steps(at(0.9, "orange"), at(1, "red"))).
			ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"})).
			WithTarget(query(`aggd_uplink_data_used_bytes{`+ofDaemon+`} / aggd_uplink_data_cap_bytes{`+ofDaemon+`}`, "{{link}}"))).
		WithPanel(graph("Handshakes", "Handshakes completed and rejected (a key the other side does not list, or someone "+
			"knocking: alert AggdHandshakesRejected), and cookie replies: sent by a headend whose handshake rate limit is "+
			"spent, received by a CPE (a flood, or a restart's herd: alert AggdHandshakeFlood).", "short",
			query(`sum by (peer, result) (increase(aggd_session_handshakes_total{`+ofDaemon+`}[$__rate_interval]))`,
				"{{peer}} {{result}}"),
			query(`sum by (direction) (increase(aggd_handshake_cookie_replies_total{`+ofDaemon+`}[$__rate_interval]))`,
				"cookie replies {{direction}}")).Span(8))
	return d
}

// numbered gives the built dashboard's panels their ids and their queries their
// letters, which the SDK leaves to Grafana's editor.
//
//nolint:staticcheck // the classic model, as buildDashboard says
func numbered(d *dashboard.Dashboard) {
	for i, p := range d.Panels {
		id := uint32(i + 1)
		if p.RowPanel != nil {
			p.RowPanel.Id = id
			continue
		}
		p.Panel.Id = &id
		for k, q := range p.Panel.Targets {
			if pq, ok := q.(prometheus.Dataquery); ok {
				pq.RefId = cog.ToPtr(string(rune('A' + k)))
				p.Panel.Targets[k] = pq
			}
		}
	}
}

// schemaErrors is what UnmarshalJSONStrict found: its error is a cog.BuildErrors,
// nil-valued but not a nil error when it found nothing.
func schemaErrors(err error) error {
	var found cog.BuildErrors
	if errors.As(err, &found) && len(found) == 0 {
		return nil
	}
	return err
}

// The committed dashboard is what buildDashboard builds.
func TestDashboardIsBuilt(t *testing.T) {
	d, err := buildDashboard().Build()
	if err != nil {
		t.Fatal(err)
	}
	numbered(&d)
	built, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	built = append(built, '\n')
	if *update {
		if err := os.WriteFile(dashboardFile, built, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	committed, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(committed, built) {
		t.Errorf("%s is not what buildDashboard builds: edit buildDashboard, then run `go test -run TestDashboardIsBuilt -update` in deploy/prometheus", dashboardFile)
	}
}

// The committed dashboard passes Grafana's schema, strictly: every field it has is one
// Grafana's dashboard and panel schemas define, with the type they give it, and none
// they require is missing.
//
//nolint:staticcheck // the classic model, as buildDashboard says
func TestDashboardMeetsGrafanasSchema(t *testing.T) {
	plugins.RegisterDefaultPlugins()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard.Dashboard
	if err := schemaErrors(d.UnmarshalJSONStrict(raw)); err != nil {
		t.Errorf("%s against Grafana's schema:\n%v", dashboardFile, err)
	}
	if err := d.Validate(); err != nil {
		t.Errorf("%s: %v", dashboardFile, err)
	}
}
