package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/testnet"
)

// wireLikeHosts makes the LAN host and the server send MTU-sized packets, as a host
// behind a physical wire delivers them to a router. Over a veth a host's TCP blocks
// (TSO/GSO) reach the router as they are, which no NIC does; the fast path hands
// blocks to the daemon (verdict gso), so its tests and benchmarks use these hosts.
// Checksum offload stays on: pending checksums (CHECKSUM_PARTIAL) must survive the
// fast path (the daemon turns checksum offload off on veth uplinks).
func wireLikeHosts(n *testnet.Net) {
	n.Run("lan", "ethtool", "-K", "eth0", "tso", "off", "gso", "off")
	n.Run("srv", "ethtool", "-K", "eth0", "tso", "off", "gso", "off")
}

// verdictCounts snapshots one daemon's fast-path counters: direction -> verdict -> n.
func (b *bond) verdictCounts(t testing.TB, ns string) map[string]map[string]float64 {
	t.Helper()
	m, err := b.metrics(ns)
	if err != nil {
		t.Fatalf("metrics of %s: %v", ns, err)
	}
	return map[string]map[string]float64{"tx": verdicts(m, "tx"), "rx": verdicts(m, "rx")}
}

func verdicts(m map[string]float64, dir string) map[string]float64 {
	out := map[string]float64{}
	pre := `aggd_fastpath_packets_total{direction="` + dir + `",verdict="`
	for k, v := range m {
		if strings.HasPrefix(k, pre) {
			out[strings.TrimSuffix(k[len(pre):], `"}`)] = v
		}
	}
	return out
}

// fastShare is the share of data packets the fast path carried between two snapshots:
// verdict fast among all verdicts except those that are not data it could carry
// (drop_old: duplicates it dropped; not_data: control messages; no_route: before the
// session existed) and aqm_mark, which counts packets again that another verdict counts.
func fastShare(before, after map[string]float64) (share, total float64) {
	var fast float64
	for v, n := range after {
		d := n - before[v]
		switch v {
		case "drop_old", "not_data", "no_route", "aqm_mark":
			continue
		case "fast":
			fast += d
		}
		total += d
	}
	if total == 0 {
		return 0, 0
	}
	return fast / total, total
}

// udpFlow sends UDP at a fixed rate through the bond for seconds and returns the
// receiver's loss and out-of-order counts.
func udpFlow(t testing.TB, n *testnet.Net, rate string, seconds int, reverse bool) (lostPct float64, outOfOrder int) {
	t.Helper()
	args := []string{"iperf3", "-c", server, "-u", "-b", rate, "-l", "1200", "-t", strconv.Itoa(seconds), "-J",
		"--connect-timeout", "3000"}
	if reverse {
		args = append(args, "-R")
	}
	out, err := n.Try("lan", args...)
	r, jerr := parseIperfUDP(out)
	if jerr != nil || err != nil || r.Error != "" {
		t.Fatalf("iperf3 %v failed: %v %s\n%s", args, err, r.Error, tail([]byte(out), 2000))
	}
	return r.End.Sum.LostPercent, r.End.Sum.OutOfOrder
}

// iperfUDPResult is the part of an iperf3 -u -J client output the tests read.
type iperfUDPResult struct {
	End struct {
		Sum struct {
			LostPercent float64 `json:"lost_percent"`
			OutOfOrder  int     `json:"out_of_order"`
		} `json:"sum"`
	} `json:"end"`
	Error string `json:"error"`
}

func parseIperfUDP(out string) (iperfUDPResult, error) {
	var r iperfUDPResult
	err := json.Unmarshal([]byte(out), &r)
	return r, err
}

// TestFastPathCarriesTraffic runs the bond with the kernel fast path on (--fast-path).
//
// Full load: one TCP flow each way over all three links must work as with the
// userspace path (the goodput floor); the share the fast path carried is logged, not
// asserted: TBF's bursts reorder packets between links, and every gap hands the
// ordering to the daemon until it has caught up.
//
// In order: after a quiet 1.5 s (see there), a 10 Mbit/s UDP flow each way, whose
// packets arrive in order: at least 95% of the data packets must take the fast path at
// every stage (CPE and headend, transmit and receive), as the daemons' counters show. These links have no delay, so
// a lone 1228-byte packet's expected arrivals on the three lie within sched.TieWindow
// and the flow is shared by rate (the per-link counts are logged: about 10/30/60 %);
// iperf3 paces it at one packet a millisecond, more than the links' transmission
// times differ, so none overtakes another. (Before ties were shared, it rode the
// 60-Mbit/s link alone; at 20 Mbit/s, two packets a millisecond, it straddled two
// links, and every overtaking handed the CPE's receive ordering to its daemon for a
// while: 0.941 and 0.950 of the packets in the kernel in two CI runs.)
func TestFastPathCarriesTraffic(t *testing.T) {
	n := newTopology(t)
	wireLikeHosts(n)
	b := startBond(t, n, "--fast-path")
	startIperfServer(t, n)
	for _, dir := range []struct {
		name     string
		reverse  bool
		ns, peer string // the sending side's aggd and its name for the other side
	}{{"upstream", false, "cpe", "headend"}, {"downstream", true, "hub", "cpe1"}} {
		before := map[string]map[string]map[string]float64{"cpe": b.verdictCounts(t, "cpe"), "hub": b.verdictCounts(t, "hub")}
		linksBefore := b.linkTx(t, dir.ns, dir.peer)
		bps := iperf(t, n, 4, dir.reverse)
		// The links' counters include what the kernel sent (merged every probe interval).
		time.Sleep(300 * time.Millisecond)
		linksAfter := b.linkTx(t, dir.ns, dir.peer)
		var sum float64
		for l := range linksAfter {
			sum += linksAfter[l] - linksBefore[l]
		}
		for l := range linksAfter {
			share := (linksAfter[l] - linksBefore[l]) / sum
			t.Logf("  TCP %s: link %s carried %.1f%% of the packets", dir.name, l, 100*share)
			if share < 0.03 {
				t.Errorf("TCP %s: link %s carried only %.1f%% of the packets", dir.name, l, 100*share)
			}
		}
		t.Logf("TCP %s goodput %.1f Mbit/s", dir.name, bps/1e6)
		if bps < goodputFloor {
			t.Errorf("TCP %s goodput %.1f Mbit/s is below the sanity floor of %.0f Mbit/s", dir.name, bps/1e6, goodputFloor/1e6)
		}
		for _, ns := range []string{"cpe", "hub"} {
			after := b.verdictCounts(t, ns)
			for _, d := range []string{"tx", "rx"} {
				share, total := fastShare(before[ns][d], after[d])
				t.Logf("  TCP %s: %s %s fast path share %.3f of %.0f data packets (aqm_drop %.0f)", dir.name, ns, d, share, total,
					after[d]["aqm_drop"]-before[ns][d]["aqm_drop"])
			}
		}
	}
	// Both receivers took the ordering back from the kernel at a gap and handed it back
	// (each session starts with the daemon owning it, so at least once), and every
	// outcome belongs to a handback that was posted.
	for _, ns := range []string{"cpe", "hub"} {
		m, err := b.metrics(ns)
		if err != nil {
			t.Fatalf("metrics of %s: %v", ns, err)
		}
		// What the resequencer gave up and never saw must have been lost: on a link (the
		// link sequence shows a gap) or nowhere. While the kernel owned the ordering,
		// probes' watermarks once made a CPE's resequencer count 22 146 numbers the
		// kernel had delivered as lost, against none lost on the links. Numbers that
		// arrived after all (late) are the hold timer's business, not this accounting:
		// on this busy 2-CPU machine the kernel's receive processing stalls now and
		// then, and a 10-ms timer gave up 10-155 numbers per run, all of which came
		// (the hold now lengthens itself when that happens: reseq/stretch.go).
		linkLost, reseqLost := seriesSum(m, "aggd_link_lost_packets_total"), seriesSum(m, "aggd_reorder_lost_packets_total")
		late := seriesSum(m, "aggd_reorder_late_packets_total")
		t.Logf("  %s: resequencer gave up %.0f numbers, %.0f of which came late (the hold lengthened %.0f times, %.1f ms now); the links lost %.0f packets",
			ns, reseqLost, late, seriesSum(m, "aggd_reorder_hold_stretches_total"), 1e3*seriesSum(m, "aggd_reorder_hold_time_seconds"), linkLost)
		if never := reseqLost - late; never > max(100, 2*linkLost) {
			t.Errorf("%s: the resequencer gave up %.0f sequence numbers that never came, but the links lost only %.0f packets", ns, never, linkLost)
		}
		h := func(outcome string) float64 { return m[`aggd_fastpath_handbacks_total{outcome="`+outcome+`"}`] }
		t.Logf("  %s handbacks: posted %.0f, accepted %.0f, died %.0f, resynced %.0f, tallied %.0f", ns,
			h("posted"), h("accepted"), h("died"), h("resynced"), h("tallied"))
		if h("accepted") < 1 || h("posted") < h("accepted")+h("died") {
			t.Errorf("%s: handbacks posted %.0f, accepted %.0f, died %.0f: want at least one accepted, and no outcome without a post",
				ns, h("posted"), h("accepted"), h("died"))
		}
	}
	// A quiet spell before the in-order flows. A packet the kernel passed up during the
	// transfers may have been lost on the host (a full socket buffer); every handback is
	// then stale until the daemon finds the loss: after a second in which no DATA packet
	// reached it (tunnel.fastResyncQuiet), or while the flow goes on, after the tally's
	// 200-ms window: most of the 5 % of the 3-s flows below that may go through
	// userspace. One CI run (2026-12-05, before the tally) lost one at the
	// headend and kept its receive ordering through the whole UDP upstream flow (15 647
	// of 15 652 offers died). TestFastPathRecoversAPassUpLostOnTheHost tests the tally.
	time.Sleep(1500 * time.Millisecond)
	for _, dir := range []struct {
		name    string
		reverse bool
		sender  string
		recv    string
		peer    string // the sender's name for the other side
	}{{"upstream", false, "cpe", "hub", "headend"}, {"downstream", true, "hub", "cpe", "cpe1"}} {
		before := map[string]map[string]map[string]float64{"cpe": b.verdictCounts(t, "cpe"), "hub": b.verdictCounts(t, "hub")}
		linksBefore := b.linkTx(t, dir.sender, dir.peer)
		lost, ooo := udpFlow(t, n, "10M", 3, dir.reverse)
		t.Logf("UDP %s 10 Mbit/s: lost %.2f%%, out of order %d", dir.name, lost, ooo)
		time.Sleep(300 * time.Millisecond) // as above: the kernel's sends are merged every probe interval
		for l, v := range b.linkTx(t, dir.sender, dir.peer) {
			t.Logf("  UDP %s: link %s carried %.0f packets", dir.name, l, v-linksBefore[l])
		}
		for _, stage := range []struct{ ns, d string }{{dir.sender, "tx"}, {dir.recv, "rx"}} {
			after := b.verdictCounts(t, stage.ns)
			share, total := fastShare(before[stage.ns][stage.d], after[stage.d])
			t.Logf("  UDP %s: %s %s fast path share %.3f of %.0f data packets", dir.name, stage.ns, stage.d, share, total)
			if total < 1000 || share < 0.95 {
				t.Errorf("UDP %s: %s %s fast path share %.3f of %.0f data packets, want >= 0.95 of >= 1000",
					dir.name, stage.ns, stage.d, share, total)
			}
		}
	}
}

// A DATA packet the headend's kernel passed up to its daemon is lost on the host while
// a flow goes on: here an nftables rule drops it on its way to the socket, as a full
// receive buffer would. From then on the two counts of passed-up packets disagree, and
// every offer to hand the receive ordering back dies. Until the tally
// (internal/handover/tally.go) the daemon kept the ordering until the session gave it a
// quiet second (Resync), which a flow never does; one CI run kept a whole 3-second flow
// in userspace that way. Now the daemon finds the loss while the flow goes on, and the
// kernel takes the ordering back.
//
// The loss must hit a packet the kernel passed up, and while a flow is in order the
// kernel delivers nearly everything itself; so the test has the CPE's fastest uplink
// drop what it carries for a moment (its token bucket cut to 1 Mbit/s with no queue
// for 0.1 s), which leaves gaps at the headend: the kernel hands the ordering to the
// daemon there, and the next DATA packet it passes up is the one the rule drops.
// (Until 0ba7400 the test set the uplink down for the moment; since then a link whose
// carrier goes leaves the kernel's schedule at once, and that loses nothing.)
func TestFastPathRecoversAPassUpLostOnTheHost(t *testing.T) {
	n := newTopology(t)
	wireLikeHosts(n)
	b := startBond(t, n, "--fast-path")
	startIperfServer(t, n)
	n.Run("hub", "nft", "add", "table", "inet", "aggdtest")
	n.Run("hub", "nft", "add", "chain", "inet", "aggdtest", "in", "{ type filter hook input priority 0; }")
	handbacks := func(outcome string) float64 {
		m, err := b.metrics("hub")
		if err != nil {
			t.Fatalf("metrics of the headend: %v", err)
		}
		return m[`aggd_fastpath_handbacks_total{outcome="`+outcome+`"}`]
	}
	talliedBefore, resyncedBefore := handbacks("tallied"), handbacks("resynced")
	before := b.verdictCounts(t, "hub")["rx"]

	fault := make(chan error, 1)
	go func() {
		time.Sleep(time.Second)
		// One of the flow's DATA packets (the first byte of the aggd header: version 1,
		// type DATA; over 1000 bytes long), the first that comes: a quota counts a
		// packet's bytes before it judges, so it passes the first 1300-byte packet
		// (1300 < 2000) and no other.
		for _, step := range [][]string{
			{"hub", "nft", "add", "rule", "inet", "aggdtest", "in", "udp", "dport", "4242", "@th,64,8", "0x11",
				"meta", "length", ">", "1000", "quota", "until", "2000", "bytes", "counter", "drop"},
			{"cpe", "tc", "qdisc", "replace", "dev", "up3", "root", "tbf", "rate", "1mbit", "burst", "1600", "latency", "1ms"},
			{"cpe", "sleep", "0.1"},
			{"cpe", "tc", "qdisc", "replace", "dev", "up3", "root", "tbf", "rate", fmt.Sprintf("%dmbit", uplinkRates[2]), "burst", "15kb", "latency", "40ms"}, // as the topology shaped it
		} {
			if out, err := n.Try(step[0], step[1:]...); err != nil {
				fault <- fmt.Errorf("%v: %v\n%s", step, err, out)
				return
			}
		}
		fault <- nil
	}()
	lost, ooo := udpFlow(t, n, "10M", 6, false)
	if err := <-fault; err != nil {
		t.Fatal(err)
	}
	after := b.verdictCounts(t, "hub")["rx"]
	share, total := fastShare(before, after)
	tallied, resynced := handbacks("tallied")-talliedBefore, handbacks("resynced")-resyncedBefore
	rule, _ := n.Try("hub", "nft", "list", "chain", "inet", "aggdtest", "in")
	t.Logf("UDP upstream 10 Mbit/s: lost %.2f%%, out of order %d; headend rx fast path share %.3f of %.0f data packets; "+
		"tallied %.0f, resynced %.0f; the rule:\n%s", lost, ooo, share, total, tallied, resynced, rule)
	if !strings.Contains(rule, "packets 1 ") {
		t.Fatalf("the rule dropped no passed-up DATA packet: the test did not make the loss it is about")
	}
	if tallied < 1 {
		t.Errorf("the headend's daemon never tallied the loss (resynced %.0f)", resynced)
	}
	// The link drops for a moment only; the kernel delivered some 95 % of the flow in
	// the runs that passed, and some 17 % (what came before the loss) without the tally.
	if share < 0.8 {
		t.Errorf("headend rx fast path share %.3f of %.0f data packets, want >= 0.8: the kernel did not take the ordering back", share, total)
	}
}
