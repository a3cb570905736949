package e2e

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// `aggd status` against a running CPE during a TCP transfer: it finds the metrics
// through the config file, shows the headend as the peer with every uplink up, and
// from its two readings what each uplink carries now.
func TestStatusShowsLinksAndTheirSplit(t *testing.T) {
	n := newTopology(t)
	b := startBond(t, n)
	startIperfServer(t, n)

	done := make(chan error, 1)
	go func() {
		_, err := n.Try("lan", "iperf3", "-c", server, "-t", "6", "--connect-timeout", "3000")
		done <- err
	}()
	time.Sleep(2 * time.Second)
	out := n.Run("cpe", aggdBinary, "status", "--config", filepath.Join(b.dir, "cpe.yaml"), "--interval", "2s")
	// The headend's status names the CPE's links as the CPE does, next to its own ids.
	hubOut := n.Run("hub", aggdBinary, "status", "--config", filepath.Join(b.dir, "hub.yaml"), "--interval", "200ms")
	if err := <-done; err != nil {
		t.Fatalf("iperf3 during the status: %v", err)
	}
	t.Logf("aggd status:\n%s", out)
	t.Logf("aggd status on the headend:\n%s", hubOut)
	for k := range uplinkRates {
		label := "up" + strconv.Itoa(k+1) + " (link" + strconv.Itoa(k) + ")"
		if row := statusRow(hubOut, label); statusCell(hubOut, row, "state") != "up" {
			t.Errorf("the headend's status has no row %q with state up:\n%s", label, hubOut)
		}
	}

	if !strings.Contains(out, "peer headend") || !strings.Contains(out, "1 session") {
		t.Fatalf("status does not show the session with the headend:\n%s", out)
	}
	// Both daemons read the flow's datagrams in the interval: each says how long they
	// waited on its host (its kernel stamps, aggd_socket_receive_wait_seconds).
	for who, o := range map[string]string{"CPE": out, "headend": hubOut} {
		if !strings.Contains(o, "(since the last reading)") || !strings.Contains(o, "datagrams waited") {
			t.Errorf("the %s's status does not say how long its datagrams waited on the host:\n%s", who, o)
		}
	}
	var sum float64
	for k := range uplinkRates {
		name := "up" + strconv.Itoa(k+1)
		row := statusRow(out, name)
		if state := statusCell(out, row, "state"); state != "up" {
			t.Errorf("%s: state %q, want up", name, state)
		}
		if statusCell(out, row, "for") == "-" {
			t.Errorf("%s: the status does not say how long the link has been up:\n%s", name, out)
		}
		sending := statusCell(out, row, "sending")
		v, unit, _ := strings.Cut(sending, " ")
		rate, err := strconv.ParseFloat(v, 64)
		if err != nil || (unit != "Mbit/s" && unit != "kbit/s") {
			t.Fatalf("%s: cannot read the sending rate from %q:\n%s", name, sending, out)
		}
		if unit == "kbit/s" {
			rate /= 1000
		}
		sum += rate
	}
	// The flow exceeds any one link (10/30/60 Mbit/s): the links together carry more
	// than the sanity floor the other end-to-end tests use.
	if sum*1e6 < goodputFloor {
		t.Errorf("the links carry %.1f Mbit/s together by the status, want more than %.0f", sum, goodputFloor/1e6)
	}
}

// statusRow returns the cells of the status line for link name (nil if none). The
// table's columns are at least two spaces apart; a cell has single spaces at most.
func statusRow(out, name string) []string {
	for _, line := range strings.Split(out, "\n") {
		cells := columnGap.Split(strings.TrimSpace(line), -1)
		if len(cells) > 0 && cells[0] == name {
			return cells
		}
	}
	return nil
}

// statusCell returns row's cell in the column headed column ("" if either is missing),
// found by the table's header line (the first that starts with "link").
func statusCell(out string, row []string, column string) string {
	head := statusRow(out, "link")
	for i, h := range head {
		if h == column && i < len(row) {
			return row[i]
		}
	}
	return ""
}

var columnGap = regexp.MustCompile(`\s{2,}`)
