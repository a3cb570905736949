// Package metrics defines aggd's Prometheus metrics in one place, following the Prometheus
// naming conventions (base units, _total for counters), and serves them over HTTP.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/aggd/aggd/internal/buildinfo"
)

// Set holds every metric the daemon exports. Per-link and per-session children are
// resolved once, when the link or session appears, never per packet.
type Set struct {
	Registry *prometheus.Registry

	LinkTxBytes      *prometheus.CounterVec
	LinkTxPackets    *prometheus.CounterVec
	LinkRxBytes      *prometheus.CounterVec
	LinkRxPackets    *prometheus.CounterVec
	LinkLost         *prometheus.CounterVec
	LinkRTT          *prometheus.GaugeVec
	LinkLoss         *prometheus.GaugeVec
	LinkRate         *prometheus.GaugeVec
	LinkRatePrior    *prometheus.GaugeVec
	LinkUp           *prometheus.GaugeVec
	LinkSuspect      *prometheus.GaugeVec
	LinkStateChanged *prometheus.GaugeVec
	LinkSuspicions   *prometheus.CounterVec
	LinkDuplicate    *prometheus.CounterVec
	LinkCapacity     *prometheus.GaugeVec
	LinkQueueDelay   *prometheus.GaugeVec
	LinkBaseDelay    *prometheus.GaugeVec
	LinkJitter       *prometheus.GaugeVec
	LinkInfo         *prometheus.GaugeVec
	LinkMTU          *prometheus.GaugeVec

	Sessions       prometheus.Gauge
	PeerSession    *prometheus.GaugeVec
	Handshakes     *prometheus.CounterVec
	CookieReplies  *prometheus.CounterVec
	ReorderHeld    *prometheus.CounterVec
	ReorderHold    *prometheus.CounterVec
	ReorderHoldNow *prometheus.GaugeVec
	ReorderLost    *prometheus.CounterVec
	Duplicates     *prometheus.CounterVec
	LatePackets    *prometheus.CounterVec
	LateCopies     *prometheus.CounterVec
	SparseSent     *prometheus.CounterVec
	SparseAhead    *prometheus.CounterVec
	ReorderSkips   *prometheus.CounterVec
	AQMDrops       *prometheus.CounterVec
	AQMMarks       *prometheus.CounterVec
	AQMTakenBack   *prometheus.CounterVec
	AQMECTDrops    *prometheus.CounterVec
	SocketDrops    *prometheus.CounterVec
	SocketWait     *prometheus.HistogramVec
	Drops          *prometheus.CounterVec
	TunnelTxPacket *prometheus.CounterVec

	ReorderStretches   *prometheus.CounterVec
	ControlTxBytes     *prometheus.CounterVec
	ControlTxPackets   *prometheus.CounterVec
	LossNoticeSent     *prometheus.CounterVec
	LossNoticeReceived *prometheus.CounterVec
	Rescued            *prometheus.CounterVec
	RepairRequested    *prometheus.CounterVec
	RepairResent       *prometheus.CounterVec
	RepairUnavailable  *prometheus.CounterVec
	UplinkEvents       *prometheus.CounterVec

	ControlLoopLate prometheus.Histogram

	FallbackDirect      prometheus.Gauge
	FallbackTransitions *prometheus.CounterVec

	MetricsConnsClosed *prometheus.CounterVec

	DataUsed       *prometheus.GaugeVec
	DataCap        *prometheus.GaugeVec
	DataCapReached *prometheus.GaugeVec
	DataPeriodEnd  *prometheus.GaugeVec

	own []prometheus.Collector // Own
}

// CookieDirections are the values of aggd_handshake_cookie_replies_total's label.
var CookieDirections = []string{"sent", "received"}

// New creates and registers the metric set, including build info and Go runtime metrics.
func New() *Set {
	linkLabels := []string{"peer", "link"}
	s := &Set{
		Registry:      prometheus.NewRegistry(),
		LinkTxBytes:   counterVec("link_transmit_bytes_total", "Bytes sent on a link, outer headers included.", linkLabels),
		LinkTxPackets: counterVec("link_transmit_packets_total", "Packets sent on a link (data and control).", linkLabels),
		LinkRxBytes:   counterVec("link_receive_bytes_total", "Authenticated bytes received on a link, outer headers included.", linkLabels),
		LinkRxPackets: counterVec("link_receive_packets_total", "Authenticated packets received on a link.", linkLabels),
		LinkLost:      counterVec("link_lost_packets_total", "Data packets lost on a link, from gaps in its link sequence.", linkLabels),
		LinkRTT:       gaugeVec("link_rtt_seconds", "Smoothed round-trip time of a link, from probes.", linkLabels),
		LinkLoss:      gaugeVec("link_loss_ratio", "Recent loss ratio of a link as reported by the peer.", linkLabels),
		LinkRate:      gaugeVec("link_delivery_rate_bits_per_second", "Measured delivery rate of a link towards the peer.", linkLabels),
		LinkRatePrior: gaugeVec("link_scheduler_rate_bits_per_second", "Rate the scheduler currently assumes for a link.", linkLabels),
		LinkUp:        gaugeVec("link_up", "1 when the link is in the schedule (up, or suspect), else 0.", linkLabels),
		LinkInfo: gaugeVec("link_info", "1 per link, labelled with the name its owner gives it: on a CPE its own uplink name; "+
			"on a headend the CPE's name for the link its other metrics call link0, link1, ... (link0 until the CPE has said).",
			[]string{"peer", "link", "name"}),
		LinkSuspect: gaugeVec("link_suspect", "1 while a link's probe replies have stopped but it is not yet down: its traffic is also copied to another link.", linkLabels),
		LinkStateChanged: gaugeVec("link_state_change_timestamp_seconds", "Unix time of a link's last health-state change (probing, up, suspect, down): "+
			"when aggd decided it, which a scrape of aggd_link_up or aggd_link_suspect only brackets.", linkLabels),
		LinkSuspicions: counterVec("link_suspicions_total", "Times a link went suspect (its traffic copied to another link until it is up or down again), "+
			"by cause: silence (no probe reply), reports (the peer's reports show its data stopped arriving), reports_and_silence (both), owed (silent while the peer's "+
			"reports show data sent on it an RTT before missing), peer_copies (silent while the peer copies what it sends), "+
			"missed_probe (a probe unanswered while another link owes data), companion_down (no sign of life since the doubt began about a primary beside it, "+
			"then found down, while a standby link stands by).", []string{"peer", "link", "cause"}),
		LinkDuplicate: counterVec("link_redundant_packets_total", "Redundant copies sent on a link for another link in doubt.", linkLabels),
		LinkCapacity:  gaugeVec("link_capacity_bits_per_second", "Estimated capacity of a link towards the peer: its delivery rate while queueing, Kalman-filtered (0 until measured or configured).", linkLabels),
		LinkMTU: gaugeVec("link_mtu_bytes", "Largest inner packet a link takes (its MTU less the tunnel's outer headers, at most the CPE's tunnel MTU), "+
			"as the CPE announces it to the headend; 0 while unknown. A headend routes each CPE's prefixes with the smallest of its links'.", linkLabels),
		LinkBaseDelay: gaugeVec("link_base_delay_seconds", "Base one-way delay of a link towards the peer, without queueing, as the scheduler adds it "+
			"to a packet's expected arrival: relative to the session's lowest link once the peer reports one-way delays on every link "+
			"(the clocks' offset cancels out), half the link's RTT until then.", linkLabels),
		LinkJitter: gaugeVec("link_jitter_seconds", "Smoothed spread of a link's one-way delay towards the peer within a report period "+
			"(the period's last data packet above its smallest): the delay noise a queue must stand above to count.", linkLabels),
		LinkQueueDelay: gaugeVec("link_queue_delay_seconds", "Queueing delay of a link towards the peer: the last report period's smallest one-way delay above the link's floor.", linkLabels),
		Sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "aggd", Name: "sessions", Help: "Established sessions.",
		}),
		PeerSession: gaugeVec("peer_session", "1 while the peer has an established session, else 0. A headend has one per CPE in its peers list, "+
			"connected or not, so that a CPE that has not connected since the headend started shows; a config reload that removes a CPE "+
			"removes it, with every other series of that peer. On a CPE the peer is \"headend\".", []string{"peer"}),
		Handshakes: counterVec("session_handshakes_total", "Completed handshakes (initial and rekey).", []string{"peer", "result"}),
		CookieReplies: counterVec("handshake_cookie_replies_total",
			"Cookie replies: sent by a headend whose handshake rate limit was spent, in place of an answer (direction=sent); accepted by a CPE, which then sends its INIT again with a mac2 (direction=received).",
			[]string{"direction"}),
		ReorderHeld:  counterVec("reorder_held_packets_total", "Packets held by the resequencer because an earlier one was missing.", []string{"peer"}),
		ReorderLost:  counterVec("reorder_lost_packets_total", "Sequence numbers the resequencer gave up waiting for.", []string{"peer"}),
		Duplicates:   counterVec("reorder_duplicate_packets_total", "Duplicate packets dropped by the resequencer.", []string{"peer"}),
		LatePackets:  counterVec("reorder_late_packets_total", "Packets that arrived after the resequencer had given up on them.", []string{"peer"}),
		ReorderSkips: counterVec("reorder_overflow_skips_total", "Gaps skipped because the reorder buffer reached its memory cap.", []string{"peer"}),
		AQMDrops:     counterVec("aqm_drops_total", "Packets dropped at the bond's entry because every link carrying traffic kept a standing queue above the target (CoDel), so that senders slow down.", []string{"peer"}),
		AQMMarks:     counterVec("aqm_ecn_marks_total", "ECN-capable packets marked Congestion Experienced at the bond's entry where the AQM would have dropped them (aqm.ecn).", []string{"peer"}),
		AQMTakenBack: counterVec("aqm_drops_taken_back_total", "Of aqm_drops_total, the drops sent after all when a failover began: the links that carried traffic died before the flow could answer the drop, "+
			"and the links left carry at least as much (userspace datapath).", []string{"peer"}),
		AQMECTDrops: counterVec("aqm_ecn_capable_drops_total", "Of aqm_drops_total, the packets that were ECN-capable: all the AQM's ECN-capable victims with aqm.ecn off; "+
			"with it on, none (it marks them instead), so a rise there is a fault to report.", []string{"peer"}),
		Drops: counterVec("drops_total", "Received packets dropped, by reason.", []string{"reason"}),
		SocketDrops: counterVec("socket_receive_drops_total", "Datagrams the kernel dropped before aggd read them because a tunnel "+
			"socket's receive buffer was full (SO_RXQ_OVFL): aggd could not keep up.", []string{"socket"}),
		TunnelTxPacket: counterVec("tunnel_transmit_packets_total", "Inner packets taken from the tunnel interface, by outcome.", []string{"outcome"}),
		ReorderHold:    counterVec("reorder_hold_seconds_total", "Total time held packets waited in the resequencer (divide by reorder_held_packets_total for the mean).", []string{"peer"}),
		ReorderHoldNow: gaugeVec("reorder_hold_time_seconds", "The resequencer's hold time now: how long packets wait for a missing earlier one before the gap is given up "+
			"(from the links' delay spread and jitter, lengthened while packets arrive after it: reorder_hold_stretches_total).", []string{"peer"}),
	}
	s.ReorderStretches = counterVec("reorder_hold_stretches_total", "Times a packet that arrived after the hold timer had given it up "+
		"lengthened the hold time (by 10 ms, up to 30 ms more; the extra halves every 10 s without one).", []string{"peer"})
	s.ControlTxBytes = counterVec("control_transmit_bytes_total", "Bytes of the tunnel's own messages sent to the peer (probes and their replies, "+
		"FEEDBACK, loss notices, link parameters and names, repair requests; not data, not handshakes), outer IPv4 and UDP headers included, by message type: "+
		"what the bond's signalling costs the links.", []string{"peer", "type"})
	s.ControlTxPackets = counterVec("control_transmit_packets_total", "Packets of the tunnel's own messages sent to the peer, by message type "+
		"(as control_transmit_bytes_total).", []string{"peer", "type"})
	s.LossNoticeSent = counterVec("loss_notice_sent_sequences_total", "Sequence numbers named in loss notices sent to the peer because a link went down with them in flight (each notice is sent twice; both count).", []string{"peer"})
	s.LossNoticeReceived = counterVec("loss_notice_received_sequences_total", "Sequence numbers named in loss notices received from the peer (repeats included).", []string{"peer"})
	s.Rescued = counterVec("rescued_packets_total", "Data packets a link had in flight when it went into doubt or down, copied to another link "+
		"under their own sequence numbers (the kernel fast path's packets too, from its ring of kept packets).", []string{"peer"})
	s.RepairRequested = counterVec("repair_requested_packets_total", "Data packets the peer's links lost (gaps in their link sequence numbers) that this "+
		"receiver asked the peer to send again (reorder.loss_repair; userspace datapath).", []string{"peer"})
	s.RepairResent = counterVec("repair_resent_packets_total", "Data packets sent again because the peer asked for them (REPAIR_REQUEST).", []string{"peer"})
	s.RepairUnavailable = counterVec("repair_unavailable_packets_total", "Data packets the peer asked for that could not be sent again (no longer kept, "+
		"or too long for the kernel fast path to keep) and were named in a loss notice instead.", []string{"peer"})
	s.LateCopies = counterVec("reorder_late_copies_delivered_total", "Redundant copies delivered out of order because the resequencer had given their "+
		"sequence number up before they came (their original was lost): copies of what a link in doubt had in flight come behind later packets. "+
		"Late packets of sparse flows are delivered so too, and counted here.", []string{"peer"})
	s.SparseSent = counterVec("sparse_sent_packets_total", "Data packets sent marked sparse: their flow's previous packet left at least the links' "+
		"largest RTT before, so the peer may deliver them ahead of the bond's reordering (a ping, a DNS query beside a bulk transfer).", []string{"peer"})
	s.SparseAhead = counterVec("reorder_sparse_ahead_total", "Packets of sparse flows the resequencer delivered at once, ahead of a gap in front of them "+
		"(no packet of their flow was held).", []string{"peer"})
	s.UplinkEvents = counterVec("uplink_events_total", "Changes netlink reported on the CPE's uplinks, by kind (carrier_lost, carrier_back, address_added, address_removed, route_changed, created, mtu_changed).", []string{"link", "kind"})
	s.SocketWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "aggd", Name: "socket_receive_wait_seconds",
		Help: "How long each datagram waited on this host before aggd read it, from the kernel's receive stamp to the read, by socket " +
			"(an uplink's name, or listen): the host's own queue, long when the CPU cannot keep up with the links.",
		Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1},
	}, []string{"socket"})
	s.ControlLoopLate = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "aggd", Name: "control_loop_lateness_seconds",
		Help: "How much later than its interval (probe.interval) each run of the control loop came, from the gap since the run before: " +
			"time aggd could not run (a CPU too busy, a stalled VM). Links are silent to aggd for that long, so a lateness near the " +
			"suspicion time (three probe intervals) can have healthy links suspected (aggd_link_suspicions_total).",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1, 2},
	})
	s.FallbackDirect = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "aggd", Name: "fallback_direct",
		Help: "1 while new LAN connections leave directly out of an uplink because the headend is silent (CPE, fallback.enabled).",
	})
	s.FallbackTransitions = counterVec("fallback_transitions_total", "Switches between the bond and direct routing, by the mode switched to (direct, bond).", []string{"to"})
	s.MetricsConnsClosed = counterVec("metrics_connections_closed_total", fmt.Sprintf("Connections to this metrics endpoint closed because it held its limit of "+
		"%d, by reason: evicted (the one idle the longest, to make room for a new one) or refused (a new one, with every held one inside a request). "+
		"A rise with failed scrapes says something else holds the endpoint's connections.", maxConns), []string{"reason"})
	for _, r := range ConnsClosedReasons {
		s.MetricsConnsClosed.WithLabelValues(r)
	}
	capLabels := []string{"link"}
	s.DataUsed = gaugeVec("uplink_data_used_bytes", "Bytes a capped uplink's interface carried (received and sent) in its current billing period (CPE, uplinks[].data_cap).", capLabels)
	s.DataCap = gaugeVec("uplink_data_cap_bytes", "A capped uplink's allowance per billing period (uplinks[].data_cap.limit).", capLabels)
	s.DataCapReached = gaugeVec("uplink_data_cap_reached", "1 while a capped uplink has used up its allowance: it carries traffic only as a backup until the period ends.", capLabels)
	s.DataPeriodEnd = gaugeVec("uplink_data_period_end_timestamp_seconds", "When a capped uplink's billing period ends and its allowance starts again (Unix time).", capLabels)
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "aggd", Name: "build_info", Help: "Build information; the value is always 1.",
	}, []string{"version", "goversion"})
	build.WithLabelValues(buildinfo.Version, buildinfo.GoVersion()).Set(1)
	for _, d := range CookieDirections {
		s.CookieReplies.WithLabelValues(d) // at 0, so that a rate() works from the start
	}

	s.own = []prometheus.Collector{
		s.LinkTxBytes, s.LinkTxPackets, s.LinkRxBytes, s.LinkRxPackets, s.LinkLost,
		s.LinkRTT, s.LinkLoss, s.LinkRate, s.LinkRatePrior, s.LinkUp, s.LinkSuspect, s.LinkStateChanged, s.LinkSuspicions, s.LinkDuplicate,
		s.LinkCapacity, s.LinkQueueDelay, s.LinkBaseDelay, s.LinkJitter, s.LinkInfo, s.LinkMTU,
		s.Sessions, s.PeerSession, s.Handshakes, s.CookieReplies, s.ReorderHeld, s.ReorderHold, s.ReorderHoldNow, s.ReorderLost,
		s.Duplicates, s.LatePackets, s.ReorderStretches, s.ReorderSkips, s.AQMDrops, s.AQMMarks, s.AQMTakenBack, s.AQMECTDrops, s.SocketDrops, s.SocketWait, s.Drops, s.TunnelTxPacket, build,
		s.LossNoticeSent, s.LossNoticeReceived, s.Rescued, s.RepairRequested, s.RepairResent, s.RepairUnavailable, s.LateCopies, s.SparseSent, s.SparseAhead, s.UplinkEvents, s.ControlTxBytes, s.ControlTxPackets, s.ControlLoopLate, s.FallbackDirect, s.FallbackTransitions,
		s.DataUsed, s.DataCap, s.DataCapReached, s.DataPeriodEnd, s.MetricsConnsClosed,
	}
	s.Registry.MustRegister(s.own...)
	s.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return s
}

// ForgetPeer deletes every series labelled with the peer, as when a config reload
// removes a CPE: its last values would otherwise stay in every scrape, frozen (a link
// shown up for ever, or an alert that never clears).
func (s *Set) ForgetPeer(name string) {
	only := prometheus.Labels{"peer": name}
	for _, c := range s.own {
		switch v := c.(type) {
		case *prometheus.CounterVec:
			v.DeletePartialMatch(only)
		case *prometheus.GaugeVec:
			v.DeletePartialMatch(only)
		}
	}
}

// Own lists the collectors of aggd's own metrics, those New registers (not Go's
// runtime and process metrics, nor what the daemon adds for its BPF programs): the
// catalogue that deploy/prometheus's alert rules are checked against.
func (s *Set) Own() []prometheus.Collector { return s.own }

// idleTimeout is how long the metrics server keeps a connection that carries no request.
// It is longer than any usual scrape interval, so that Prometheus reuses its connection
// from one scrape to the next, and it ends what a client left open and forgot: with none
// (net/http's default) each such connection held a goroutine and a file descriptor for
// as long as the daemon ran (BenchmarkSoak found the end-to-end tests' scrapes, one
// connection each, adding up to hundreds an hour). A variable for the tests.
var idleTimeout = 3 * time.Minute

// writeTimeout bounds the writing of one response, so that a client that stops reading
// does not hold its connection for ever. A scrape of a headend with 200 CPEs took 64 ms.
const writeTimeout = 30 * time.Second

// Serve exposes m's registry as /metrics on addr until ctx ends. It returns once the
// listener is bound, so a bad address is reported before the daemon goes on.
func Serve(ctx context.Context, addr string, m *Set) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: listen on %s: %w (change metrics.listen or free the port)", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	limit := newConnLimit(maxConns, m.MetricsConnsClosed)
	if servedConnLimit != nil {
		servedConnLimit(limit)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: writeTimeout, IdleTimeout: idleTimeout,
		ConnState: limit.track}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			panic(fmt.Sprintf("metrics server: %v", err))
		}
	}()
	return nil
}

func counterVec(name, help string, labels []string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "aggd", Name: name, Help: help}, labels)
}

func gaugeVec(name, help string, labels []string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "aggd", Name: name, Help: help}, labels)
}
