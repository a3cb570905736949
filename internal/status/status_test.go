package status

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/aggd/aggd/internal/metrics"
)

// serve exposes a metric set as the daemon does, so that the test reads the names the
// daemon really exports (a renamed metric fails here, not in front of a user).
func serve(t *testing.T, m *metrics.Set) string {
	srv := httptest.NewServer(promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

func fetch(t *testing.T, url string) *Snapshot {
	t.Helper()
	s, err := Fetch(context.Background(), http.DefaultClient, url)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// stateClock is the time threeLinks' state changes are stamped against: dsl up
// for 3h05m, lte suspect for 420 ms, cable's change not exported (an older daemon).
var stateClock = time.Unix(1_800_000_000, 0)

// threeLinks sets up a CPE's metrics for peer hub: dsl up, cable up, lte suspect.
func threeLinks(m *metrics.Set) {
	m.Sessions.Set(1)
	for _, l := range []struct {
		name        string
		up, suspect float64
		rtt, queue  float64
		capacity    float64
		base, jit   float64
	}{
		{"dsl", 1, 0, 0.025, 0.002, 0.9e6, 0.0065, 0.0013},
		{"cable", 1, 0, 0.012, 0, 9.5e6, 0, 0.0021},
		{"lte", 1, 1, 0.052, 0.010, 0, 0.0198, 0.0117},
	} {
		m.LinkUp.WithLabelValues("hub", l.name).Set(l.up)
		m.LinkSuspect.WithLabelValues("hub", l.name).Set(l.suspect)
		m.LinkRTT.WithLabelValues("hub", l.name).Set(l.rtt)
		m.LinkQueueDelay.WithLabelValues("hub", l.name).Set(l.queue)
		m.LinkBaseDelay.WithLabelValues("hub", l.name).Set(l.base)
		m.LinkJitter.WithLabelValues("hub", l.name).Set(l.jit)
		m.LinkCapacity.WithLabelValues("hub", l.name).Set(l.capacity)
		m.LinkRatePrior.WithLabelValues("hub", l.name).Set(l.capacity * 0.9)
		m.LinkLoss.WithLabelValues("hub", l.name).Set(0.003)
	}
	m.LinkStateChanged.WithLabelValues("hub", "dsl").Set(float64(stateClock.Add(-3*time.Hour - 5*time.Minute).Unix()))
	m.LinkStateChanged.WithLabelValues("hub", "lte").Set(float64(stateClock.UnixNano())/1e9 - 0.42)
	m.ReorderHeld.WithLabelValues("hub").Add(200)
	m.ReorderHoldNow.WithLabelValues("hub").Set(0.042)
	m.ReorderHold.WithLabelValues("hub").Add(0.6)
	m.AQMDrops.WithLabelValues("hub").Add(12)
	m.AQMMarks.WithLabelValues("hub").Add(3)
}

func TestFetchReadsTheDaemonsMetrics(t *testing.T) {
	m := metrics.New()
	threeLinks(m)
	s := fetch(t, serve(t, m))
	if s.Sessions != 1 || s.Version == "" || s.Fallback {
		t.Fatalf("sessions %v, version %q, fallback %v", s.Sessions, s.Version, s.Fallback)
	}
	hub := s.Peer("hub")
	if hub == nil || len(hub.Links) != 3 {
		t.Fatalf("peer hub with 3 links expected, got %+v", s.Peers)
	}
	for name, want := range map[string]string{"dsl": "up", "cable": "up", "lte": "suspect"} {
		if got := hub.Link(name).State(); got != want {
			t.Errorf("%s: state %s, want %s", name, got, want)
		}
	}
	dsl := hub.Link("dsl")
	if dsl.RTT != 25*time.Millisecond || dsl.QueueDelay != 2*time.Millisecond || dsl.Capacity != 0.9e6 || dsl.Loss != 0.003 ||
		dsl.BaseDelay != 6500*time.Microsecond || dsl.Jitter != 1300*time.Microsecond {
		t.Errorf("dsl read as %+v", dsl)
	}
	if hub.ReorderHeld != 200 || hub.ReorderHoldSeconds != 0.6 || hub.HoldTime != 42*time.Millisecond {
		t.Errorf("reorder figures read as %+v", hub)
	}
	if hub.AQMDrops != 12 || hub.AQMMarks != 3 {
		t.Errorf("AQM figures read as %v drops, %v marks", hub.AQMDrops, hub.AQMMarks)
	}
}

func TestRenderShowsTheSplitBetweenTwoReadings(t *testing.T) {
	m := metrics.New()
	threeLinks(m)
	url := serve(t, m)
	before := fetch(t, url)
	// One second's traffic: cable carries three times what dsl does, lte nothing.
	m.LinkTxBytes.WithLabelValues("hub", "dsl").Add(125_000)   // 1 Mbit/s
	m.LinkTxBytes.WithLabelValues("hub", "cable").Add(375_000) // 3 Mbit/s
	m.LinkRxBytes.WithLabelValues("hub", "cable").Add(12_500)  // 100 kbit/s
	after := fetch(t, url)
	before.At, after.At = stateClock.Add(-time.Second), stateClock

	var out strings.Builder
	if err := Render(&out, before, after); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"peer hub",
		"sending", "share",
		"1.0 Mbit/s", "25.0 %", // dsl
		"3.0 Mbit/s", "75.0 %", // cable
		"100 kbit/s",
		"4.0 Mbit/s",      // all links
		"suspect  420 ms", // lte
		"up       3h05m",  // dsl
		"up       -",      // cable: its daemon does not export the change
		"mean 3.0 ms",     // 0.6 s over 200 held packets
		"12 packets dropped and 3 marked ECN at the bond's entry",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
}

func TestRenderOneReadingHasNoRates(t *testing.T) {
	m := metrics.New()
	threeLinks(m)
	s := fetch(t, serve(t, m))
	var out strings.Builder
	if err := Render(&out, nil, s); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "sending") {
		t.Errorf("a single reading cannot show rates:\n%s", out.String())
	}
	for _, want := range []string{"9.5 Mbit/s", "52 ms", // cable's capacity, lte's RTT
		"6.5 ms", "1.3 ms", // dsl's base delay (above cable's) and jitter
		"20 ms", "12 ms", // lte's
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("estimate %q missing:\n%s", want, out.String())
		}
	}
}

func TestRenderRestartedDaemonShowsNoRate(t *testing.T) {
	before := &Snapshot{At: time.Unix(0, 0), Peers: []*Peer{{Name: "hub", Links: []*Link{{Name: "dsl", TxBytes: 1e6}}}}}
	after := &Snapshot{At: time.Unix(1, 0), Peers: []*Peer{{Name: "hub", Links: []*Link{{Name: "dsl", TxBytes: 10, Up: true}}}}}
	var out strings.Builder
	if err := Render(&out, before, after); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "queue control") {
		t.Errorf("a peer whose traffic the AQM never signalled has no line for it:\n%s", out.String())
	}
	if strings.Contains(out.String(), "Mbit/s") || strings.Contains(out.String(), "kbit/s") {
		t.Errorf("a counter that went back is not a rate:\n%s", out.String())
	}
	if strings.Contains(out.String(), "host (") || strings.Contains(out.String(), "HOST") {
		t.Errorf("a daemon that read nothing has no line for its host:\n%s", out.String())
	}
}

// The status says how aggd's host keeps up: the datagrams' mean wait before aggd read
// them, since it started; from two readings, since the first, with a warning when the
// wait is long, the kernel dropped datagrams, or the control loop ran a suspicion time
// late.
func TestRenderShowsTheHostsShare(t *testing.T) {
	m := metrics.New()
	threeLinks(m)
	url := serve(t, m)
	for range 100 {
		m.SocketWait.WithLabelValues("dsl").Observe(0.002)
	}
	m.ControlLoopLate.Observe(0.1) // late, not a suspicion time late
	before := fetch(t, url)
	before.At = stateClock.Add(-time.Second)
	var out strings.Builder
	if err := Render(&out, nil, before); err != nil {
		t.Fatal(err)
	}
	if want := "host (since aggd started): datagrams waited 2.0 ms on average before aggd read them"; !strings.Contains(out.String(), want) ||
		strings.Contains(out.String(), "HOST BEHIND") {
		t.Errorf("a host that keeps up: output lacks %q, or warns:\n%s", want, out.String())
	}

	for range 100 {
		m.SocketWait.WithLabelValues("cable").Observe(0.05)
	}
	m.SocketDrops.WithLabelValues("cable").Add(7)
	m.ControlLoopLate.Observe(0.5)
	m.ControlLoopLate.Observe(0.8)
	after := fetch(t, url)
	after.At = stateClock
	out.Reset()
	if err := Render(&out, before, after); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"HOST BEHIND (since the last reading): the CPU is short for aggd's traffic",
		"datagrams waited 50 ms on average", // the second reading's 100 alone
		"the kernel dropped 7 for a full socket buffer",
		"the control loop ran more than 0.3 s late 2 times",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestParseFastPathAndFallback(t *testing.T) {
	text := `# TYPE aggd_build_info gauge
aggd_build_info{goversion="go1.26",version="v1"} 1
# TYPE aggd_fallback_direct gauge
aggd_fallback_direct 1
# TYPE aggd_fastpath_packets_total counter
aggd_fastpath_packets_total{direction="tx",verdict="fast"} 990
aggd_fastpath_packets_total{direction="tx",verdict="gso"} 10
aggd_fastpath_packets_total{direction="rx",verdict="fast"} 500
aggd_fastpath_packets_total{direction="rx",verdict="gap"} 500
aggd_fastpath_packets_total{direction="rx",verdict="drop_old"} 7
`
	out := renderText(t, text)
	for _, want := range []string{"FALLBACK", "99.0 % of the data sent", "50.0 % of the data received", "no peers: a headend whose peers list is empty"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// A headend answering INITs with cookie replies says so, with their rate, when two
// readings show the count growing; a count that stands still is not load.
func TestRenderShowsHandshakeLoad(t *testing.T) {
	readingShed := func(cookies, shed string, at time.Time) *Snapshot {
		s, err := Parse(strings.NewReader(`# TYPE aggd_build_info gauge
aggd_build_info{goversion="go1.26",version="v1"} 1
# TYPE aggd_handshake_cookie_replies_total counter
aggd_handshake_cookie_replies_total{direction="received"} 7
aggd_handshake_cookie_replies_total{direction="sent"} `+cookies+`
# TYPE aggd_xdp_packets_total counter
aggd_xdp_packets_total{reason="bad_tag"} 3000
aggd_xdp_packets_total{reason="rate_limited"} `+shed+"\n"), at)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	reading := func(cookies string, at time.Time) *Snapshot { return readingShed(cookies, "0", at) }
	t0 := time.Now()
	render := func(prev, cur *Snapshot) string {
		var out strings.Builder
		if err := Render(&out, prev, cur); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	if out := render(reading("1000", t0), reading("6000", t0.Add(time.Second))); !strings.Contains(out, "HANDSHAKE LOAD: answering 5000 INITs a second") {
		t.Errorf("a headend sending 5000 cookie replies a second:\n%s", out)
	}
	if out := render(reading("6000", t0), reading("6000", t0.Add(time.Second))); strings.Contains(out, "HANDSHAKE LOAD") {
		t.Errorf("cookie replies that have stopped shown as load:\n%s", out)
	}
	if out := render(nil, reading("6000", t0)); strings.Contains(out, "HANDSHAKE LOAD") {
		t.Errorf("one reading shown as load:\n%s", out)
	}
	if out := render(reading("6000", t0), reading("11000", t0.Add(time.Second))); strings.Contains(out, "XDP shield") {
		t.Errorf("a shield that dropped no INIT said to:\n%s", out)
	}
	out := render(readingShed("1000", "500", t0), readingShed("6000", "2500", t0.Add(time.Second)))
	if !strings.Contains(out, "answering 5000 INITs a second") || !strings.Contains(out, "the XDP shield drops 2000 more a second") {
		t.Errorf("a headend sending 5000 cookie replies a second while its shield drops 2000 INITs a second:\n%s", out)
	}
}

func TestParseRefusesOtherMetrics(t *testing.T) {
	_, err := Parse(strings.NewReader("# TYPE up gauge\nup 1\n"), time.Now())
	if err == nil || !strings.Contains(err.Error(), "not aggd's metrics") {
		t.Fatalf("want a refusal, got %v", err)
	}
	if _, err := Parse(strings.NewReader("<html>"), time.Now()); err == nil {
		t.Fatal("HTML parsed as metrics")
	}
}

// A headend's links carry their ids as names (link0, ...); aggd_link_info gives the
// CPE's names, which the status shows first. A link whose info names it as itself (a
// CPE's, or one the CPE has not named yet) shows its name alone.
func TestRenderShowsTheCPEsLinkNames(t *testing.T) {
	m := metrics.New()
	for _, l := range []struct{ link, name string }{{"link0", "dsl"}, {"link1", "lte"}, {"link2", "link2"}} {
		m.LinkUp.WithLabelValues("cpe1", l.link).Set(1)
		m.LinkInfo.WithLabelValues("cpe1", l.link, l.name).Set(1)
	}
	s := fetch(t, serve(t, m))
	if got := s.Peer("cpe1").Link("link0").OwnName; got != "dsl" {
		t.Errorf("link0's own name read as %q, want dsl", got)
	}
	var out strings.Builder
	if err := Render(&out, nil, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"dsl (link0)", "lte (link1)", "  link2 "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "(link2)") {
		t.Errorf("a link named as itself shown with its name twice:\n%s", out.String())
	}
}

// A headend lists every CPE it is configured for: one that has not connected shows as
// such, not as missing (aggd_peer_session).
func TestRenderShowsAPeerWithoutSession(t *testing.T) {
	m := metrics.New()
	m.Sessions.Set(1)
	m.PeerSession.WithLabelValues("cpe1").Set(1)
	m.LinkUp.WithLabelValues("cpe1", "link0").Set(1)
	m.PeerSession.WithLabelValues("cpe2").Set(0)
	s := fetch(t, serve(t, m))
	if p := s.Peer("cpe2"); p == nil || !p.NoSession {
		t.Fatalf("cpe2 read as %+v, want a peer with no session", p)
	}
	if s.Peer("cpe1").NoSession {
		t.Error("cpe1, with its session, read as having none")
	}
	var out strings.Builder
	if err := Render(&out, nil, s); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "peer cpe2: NO SESSION") {
		t.Errorf("output does not say cpe2 has no session:\n%s", out.String())
	}
	if strings.Contains(out.String(), "peer cpe1: NO SESSION") || !strings.Contains(out.String(), "  link0 ") {
		t.Errorf("cpe1 not shown with its link:\n%s", out.String())
	}
}

func TestRenderShowsTheDataCaps(t *testing.T) {
	end := time.Date(2026, 12, 1, 0, 0, 0, 0, time.Local)
	text := fmt.Sprintf(`# TYPE aggd_build_info gauge
aggd_build_info{goversion="go1.26",version="v1"} 1
# TYPE aggd_uplink_data_used_bytes gauge
aggd_uplink_data_used_bytes{link="lte"} 2.1e+10
aggd_uplink_data_used_bytes{link="sat"} 1.5e+09
# TYPE aggd_uplink_data_cap_bytes gauge
aggd_uplink_data_cap_bytes{link="lte"} 2e+10
aggd_uplink_data_cap_bytes{link="sat"} 1e+10
# TYPE aggd_uplink_data_cap_reached gauge
aggd_uplink_data_cap_reached{link="lte"} 1
aggd_uplink_data_cap_reached{link="sat"} 0
# TYPE aggd_uplink_data_period_end_timestamp_seconds gauge
aggd_uplink_data_period_end_timestamp_seconds{link="lte"} %d
aggd_uplink_data_period_end_timestamp_seconds{link="sat"} %d
`, end.Unix(), end.Unix())
	out := renderText(t, text)
	lines := strings.Split(out, "\n")
	find := func(link string) string {
		for _, l := range lines {
			if strings.HasPrefix(strings.TrimSpace(l), link+" ") {
				return l
			}
		}
		t.Fatalf("no line for %s:\n%s", link, out)
		return ""
	}
	for link, wants := range map[string][]string{
		"lte": {"21.00 GB of 20.00 GB", "105.0 %", "until 2026-12-01 00:00", "CAP REACHED"},
		"sat": {"1.50 GB of 10.00 GB", "15.0 %", "within its cap"},
	} {
		line := find(link)
		for _, w := range wants {
			if !strings.Contains(line, w) {
				t.Errorf("%s's line lacks %q: %q", link, w, line)
			}
		}
	}
}

// renderText parses metrics text and renders it as one reading.
func renderText(t *testing.T, text string) string {
	t.Helper()
	s, err := Parse(strings.NewReader(text), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := Render(&out, nil, s); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

func TestAgeIsBrief(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                  "0 ms",
		999 * time.Millisecond:             "999 ms",
		1500 * time.Millisecond:            "1.5 s",
		61 * time.Second:                   "1m01s",
		3*time.Hour + 5*time.Minute:        "3h05m",
		49*time.Hour + 30*time.Minute:      "2d01h",
		time.Second - 200*time.Microsecond: "1.0 s", // rounded to the millisecond first
	} {
		if got := age(d); got != want {
			t.Errorf("age(%s) = %q, want %q", d, got, want)
		}
	}
}
