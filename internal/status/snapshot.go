// Package status reads a running daemon's state from its Prometheus endpoint and
// prints it for people (`aggd status`): each peer's links with their health, the
// estimates the scheduler works with, and, from two readings, how the traffic is split
// across them right now.
//
// The metrics are the only interface: the daemon exports every estimate and state
// there anyway (docs/architecture.md §8), so a second endpoint would be a second
// truth to keep in step.
package status

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Link is one link of one peer, as its metrics show it.
type Link struct {
	Name string
	// OwnName is what the link's owner calls it, when not Name: on a headend, the
	// CPE's name for the link it calls link0, link1, ... (aggd_link_info).
	OwnName     string
	Up, Suspect bool
	Since       time.Time     // when the link entered its state (zero: the daemon does not say)
	RTT         time.Duration // smoothed, from probes
	QueueDelay  time.Duration // one-way delay above the link's floor
	BaseDelay   time.Duration // base one-way delay as the scheduler adds it (relative to the lowest link's)
	Jitter      time.Duration // usual spread of the one-way delay within a report period
	Loss        float64       // recent loss ratio, as the peer reports it
	Capacity    float64       // bit/s, estimated (0: not measured yet)
	Delivery    float64       // bit/s, measured delivery rate
	SchedRate   float64       // bit/s the scheduler assumes
	TxBytes     float64       // cumulative, outer headers included
	RxBytes     float64
	Lost        float64 // data packets lost on the link, cumulative
}

// Label is how the status names the link: its name, with the owner's own name first
// where that differs ("dsl (link0)" on a headend).
func (l *Link) Label() string {
	if l.OwnName != "" {
		return l.OwnName + " (" + l.Name + ")"
	}
	return l.Name
}

// State names the link's health for people: up, suspect or down (a link that is not
// in the schedule: down, or still probing after start).
func (l *Link) State() string {
	switch {
	case l.Suspect:
		return "suspect"
	case l.Up:
		return "up"
	}
	return "down"
}

// Peer is one tunnel peer (the headend, on a CPE; a CPE, on a headend) with its links.
type Peer struct {
	Name  string
	Links []*Link // by name

	// NoSession: the daemon knows the peer but has no session with it (a headend's
	// CPE that has not connected since it started; a CPE's headend before the first
	// handshake).
	NoSession bool

	HoldTime           time.Duration // how long a gap is waited for now
	ReorderHeld        float64       // packets that waited for an earlier one
	ReorderHoldSeconds float64       // their total wait
	ReorderLost        float64       // sequence numbers given up

	// AQMDrops and AQMMarks count the packets towards the peer that the bond's entry
	// dropped, or marked ECN Congestion Experienced, because every link carrying traffic
	// kept a standing queue above the target: its signals to the senders to slow down.
	AQMDrops, AQMMarks float64
}

// Snapshot is one reading of a daemon's metrics.
type Snapshot struct {
	At       time.Time
	Version  string
	Sessions float64
	Fallback bool // a CPE routes new LAN connections directly (the headend is silent)
	// FastTx and FastRx are the data packets the kernel fast path handled itself, and
	// SlowTx and SlowRx those it handed to the daemon (both 0 without the fast path).
	FastTx, SlowTx, FastRx, SlowRx float64
	Peers                          []*Peer // by name
	Caps                           []*Cap  // the CPE's capped uplinks, by name
	// CookiesSent counts a headend's cookie replies: INITs it answered so because its
	// handshake rate limit was spent (a flood, or many CPEs at once). InitsShed counts
	// the INITs its XDP shield dropped over its own limit, before the daemon read them.
	CookiesSent float64
	InitsShed   float64
	Host        Host
}

// Host is what the daemon's metrics tell of its own host's share of the work: a CPU
// too busy for aggd shows here before it shows as slow or suspect links.
type Host struct {
	// WaitSeconds and Waited are the datagrams aggd read and their total wait on the
	// host before it read them (aggd_socket_receive_wait_seconds, all sockets).
	WaitSeconds, Waited float64
	// SocketDrops counts what the kernel dropped for a full socket buffer, before aggd
	// read it (aggd_socket_receive_drops_total, all sockets).
	SocketDrops float64
	// LateRuns counts the control loop's runs more than lateRunSeconds late
	// (aggd_control_loop_lateness_seconds), late enough to suspect a healthy link.
	LateRuns float64
}

// since is what h (a later reading) added to the earlier reading p. The caller takes it
// only where the wait count did not go back (a restarted daemon); drops and late runs
// that went back add nothing.
func (h Host) since(p Host) Host {
	return Host{WaitSeconds: h.WaitSeconds - p.WaitSeconds, Waited: h.Waited - p.Waited,
		SocketDrops: max(0, h.SocketDrops-p.SocketDrops), LateRuns: max(0, h.LateRuns-p.LateRuns)}
}

// lateRunSeconds is the lateness Host.LateRuns counts: the suspicion time at the
// default probe interval (three intervals of 100 ms), a bucket of the histogram.
const lateRunSeconds = 0.3

// Cap is a CPE uplink's data cap and what it has used of it in this billing period.
type Cap struct {
	Link        string
	Used, Limit float64 // bytes
	Reached     bool
	PeriodEnd   time.Time
}

// Peer returns the named peer, or nil.
func (s *Snapshot) Peer(name string) *Peer {
	for _, p := range s.Peers {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// OnlyPeer returns a copy of s that shows the named peer alone (a headend's operator
// looking at one CPE among many), or an error that lists the peers there are.
func (s *Snapshot) OnlyPeer(name string) (*Snapshot, error) {
	p := s.Peer(name)
	if p == nil {
		names := make([]string, 0, len(s.Peers))
		for _, q := range s.Peers {
			names = append(names, q.Name)
		}
		if len(names) == 0 {
			return nil, fmt.Errorf("no session with peer %q now, nor with any other", name)
		}
		return nil, fmt.Errorf("no session with peer %q now; peers with a session: %s", name, strings.Join(names, ", "))
	}
	only := *s
	only.Peers = []*Peer{p}
	return &only, nil
}

// Link returns the named link of the peer, or nil.
func (p *Peer) Link(name string) *Link {
	for _, l := range p.Links {
		if l.Name == name {
			return l
		}
	}
	return nil
}

// Fetch reads the metrics at url (http://host:port/metrics) into a Snapshot.
func Fetch(ctx context.Context, client *http.Client, url string) (*Snapshot, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", url, resp.Status)
	}
	return Parse(resp.Body, time.Now())
}

// Parse reads the Prometheus text format. It fails if the text is not aggd's metrics
// (no aggd_build_info): a status made of another program's metrics would be empty and
// look like a daemon without links.
func Parse(r io.Reader, at time.Time) (*Snapshot, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("not the Prometheus text format: %w", err)
	}
	build, ok := families["aggd_build_info"]
	if !ok || len(build.GetMetric()) == 0 {
		return nil, fmt.Errorf("these are not aggd's metrics (no aggd_build_info)")
	}
	s := &Snapshot{At: at, Version: label(build.GetMetric()[0], "version")}
	s.Sessions = single(families["aggd_sessions"])
	s.Fallback = single(families["aggd_fallback_direct"]) == 1
	s.CookiesSent = labelled(families["aggd_handshake_cookie_replies_total"], "direction", "sent")
	s.InitsShed = labelled(families["aggd_xdp_packets_total"], "reason", "rate_limited") // the shield limits nothing but INITs
	for _, m := range families["aggd_fastpath_packets_total"].GetMetric() {
		v := value(m)
		fast := label(m, "verdict") == "fast" || label(m, "verdict") == "late_copy" // both delivered by the kernel
		switch label(m, "direction") {
		case "tx":
			s.FastTx, s.SlowTx = addTo(fast, v, s.FastTx, s.SlowTx)
		case "rx":
			if label(m, "verdict") != "drop_old" {
				s.FastRx, s.SlowRx = addTo(fast, v, s.FastRx, s.SlowRx)
			}
		}
	}

	peers := make(map[string]*Peer)
	peer := func(name string) *Peer {
		if p := peers[name]; p != nil {
			return p
		}
		p := &Peer{Name: name}
		peers[name] = p
		return p
	}
	links := make(map[[2]string]*Link)
	for name, set := range linkSetters {
		for _, m := range families[name].GetMetric() {
			p, ln := label(m, "peer"), label(m, "link")
			key := [2]string{p, ln}
			l := links[key]
			if l == nil {
				l = &Link{Name: ln}
				links[key] = l
				pp := peer(p)
				pp.Links = append(pp.Links, l)
			}
			set(l, value(m))
		}
	}
	for _, m := range families["aggd_link_info"].GetMetric() {
		if l := links[[2]string{label(m, "peer"), label(m, "link")}]; l != nil && label(m, "name") != l.Name {
			l.OwnName = label(m, "name")
		}
	}
	for name, set := range peerSetters {
		for _, m := range families[name].GetMetric() {
			set(peer(label(m, "peer")), value(m))
		}
	}
	s.Caps = parseCaps(families)
	s.Host = parseHost(families)
	for _, p := range peers {
		sort.Slice(p.Links, func(i, j int) bool { return p.Links[i].Name < p.Links[j].Name })
		s.Peers = append(s.Peers, p)
	}
	sort.Slice(s.Peers, func(i, j int) bool { return s.Peers[i].Name < s.Peers[j].Name })
	return s, nil
}

// parseHost reads what the daemon tells of its host (Host).
func parseHost(families map[string]*dto.MetricFamily) Host {
	var h Host
	for _, m := range families["aggd_socket_receive_wait_seconds"].GetMetric() {
		h.WaitSeconds += m.GetHistogram().GetSampleSum()
		h.Waited += float64(m.GetHistogram().GetSampleCount())
	}
	for _, m := range families["aggd_socket_receive_drops_total"].GetMetric() {
		h.SocketDrops += value(m)
	}
	for _, m := range families["aggd_control_loop_lateness_seconds"].GetMetric() {
		within := 0.0
		for _, b := range m.GetHistogram().GetBucket() {
			if b.GetUpperBound() == lateRunSeconds {
				within = float64(b.GetCumulativeCount())
			}
		}
		h.LateRuns += float64(m.GetHistogram().GetSampleCount()) - within
	}
	return h
}

// parseCaps reads the CPE's data-cap metrics, one Cap per capped uplink.
func parseCaps(families map[string]*dto.MetricFamily) []*Cap {
	byLink := map[string]*Cap{}
	for name, set := range capSetters {
		for _, m := range families[name].GetMetric() {
			ln := label(m, "link")
			c := byLink[ln]
			if c == nil {
				c = &Cap{Link: ln}
				byLink[ln] = c
			}
			set(c, value(m))
		}
	}
	caps := make([]*Cap, 0, len(byLink))
	for _, c := range byLink {
		caps = append(caps, c)
	}
	sort.Slice(caps, func(i, j int) bool { return caps[i].Link < caps[j].Link })
	return caps
}

var capSetters = map[string]func(*Cap, float64){
	"aggd_uplink_data_used_bytes":                   func(c *Cap, v float64) { c.Used = v },
	"aggd_uplink_data_cap_bytes":                    func(c *Cap, v float64) { c.Limit = v },
	"aggd_uplink_data_cap_reached":                  func(c *Cap, v float64) { c.Reached = v == 1 },
	"aggd_uplink_data_period_end_timestamp_seconds": func(c *Cap, v float64) { c.PeriodEnd = time.Unix(int64(v), 0) },
}

func seconds(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }

// unixSeconds reads a Prometheus timestamp gauge; 0 (never set) is the zero time.
func unixSeconds(v float64) time.Time {
	if v <= 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(v*1e9))
}

// linkSetters and peerSetters map each metric the status shows onto its field.
var linkSetters = map[string]func(*Link, float64){
	"aggd_link_up":      func(l *Link, v float64) { l.Up = v == 1 },
	"aggd_link_suspect": func(l *Link, v float64) { l.Suspect = v == 1 },
	"aggd_link_state_change_timestamp_seconds": func(l *Link, v float64) { l.Since = unixSeconds(v) },
	"aggd_link_rtt_seconds":                    func(l *Link, v float64) { l.RTT = seconds(v) },
	"aggd_link_queue_delay_seconds":            func(l *Link, v float64) { l.QueueDelay = seconds(v) },
	"aggd_link_base_delay_seconds":             func(l *Link, v float64) { l.BaseDelay = seconds(v) },
	"aggd_link_jitter_seconds":                 func(l *Link, v float64) { l.Jitter = seconds(v) },
	"aggd_link_loss_ratio":                     func(l *Link, v float64) { l.Loss = v },
	"aggd_link_capacity_bits_per_second":       func(l *Link, v float64) { l.Capacity = v },
	"aggd_link_delivery_rate_bits_per_second":  func(l *Link, v float64) { l.Delivery = v },
	"aggd_link_scheduler_rate_bits_per_second": func(l *Link, v float64) { l.SchedRate = v },
	"aggd_link_transmit_bytes_total":           func(l *Link, v float64) { l.TxBytes = v },
	"aggd_link_receive_bytes_total":            func(l *Link, v float64) { l.RxBytes = v },
	"aggd_link_lost_packets_total":             func(l *Link, v float64) { l.Lost = v },
}

var peerSetters = map[string]func(*Peer, float64){
	"aggd_reorder_held_packets_total": func(p *Peer, v float64) { p.ReorderHeld = v },
	"aggd_reorder_hold_seconds_total": func(p *Peer, v float64) { p.ReorderHoldSeconds = v },
	"aggd_reorder_lost_packets_total": func(p *Peer, v float64) { p.ReorderLost = v },
	"aggd_reorder_hold_time_seconds":  func(p *Peer, v float64) { p.HoldTime = seconds(v) },
	"aggd_peer_session":               func(p *Peer, v float64) { p.NoSession = v == 0 },
	"aggd_aqm_drops_total":            func(p *Peer, v float64) { p.AQMDrops = v },
	"aggd_aqm_ecn_marks_total":        func(p *Peer, v float64) { p.AQMMarks = v },
}

func label(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// value is a counter's, gauge's or untyped sample's value.
func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// single is the value of a family with one unlabelled sample (0 if absent).
func single(f *dto.MetricFamily) float64 {
	if f == nil || len(f.GetMetric()) == 0 {
		return 0
	}
	return value(f.GetMetric()[0])
}

// labelled is the value of a family's sample whose label name is val (0 if none).
func labelled(f *dto.MetricFamily, name, val string) float64 {
	for _, m := range f.GetMetric() {
		if label(m, name) == val {
			return value(m)
		}
	}
	return 0
}

func addTo(fast bool, v, fastSum, slowSum float64) (float64, float64) {
	if fast {
		return fastSum + v, slowSum
	}
	return fastSum, slowSum + v
}
