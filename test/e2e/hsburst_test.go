package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// BenchmarkHandshakeBurstStall measures what a burst of handshakes does to the data a
// headend forwards: a LAN host pings the server through the bond every 10 ms for 3 s,
// and 1 s into it 100 INITs from keys the headend does not know (each costs its
// responder two Curve25519 operations before it is refused: what a herd of CPEs after a
// restart, or a flood, costs) reach the headend at once. It reports the pings' worst
// RTT with the burst and without it, alternated, three of each, and writes
// results/bench/handshake-burst.json.
// Run: make bench (or: go test -run '^$' -bench HandshakeBurstStall -benchtime 1x -v ./test/e2e).
func BenchmarkHandshakeBurstStall(b *testing.B) {
	n := newTopology(b)
	bd := startBond(b, n)
	res := struct {
		Date      string    `json:"date"`
		Commit    string    `json:"commit"`
		QuietMax  []float64 `json:"quiet_ping_max_ms"`
		BurstMax  []float64 `json:"burst_ping_max_ms"`
		Refused   float64   `json:"inits_refused"`
		BurstSize int       `json:"burst_inits"`
	}{Date: time.Now().UTC().Format(time.RFC3339), Commit: gitCommit(), BurstSize: 100}
	failed := func() float64 { return bd.metricOr0("hub", `aggd_drops_total{reason="handshake_failed"}`) }
	before := failed()
	for round := range 3 {
		for _, burst := range []bool{false, true} {
			var inits [][]byte
			if burst {
				for range res.BurstSize {
					inits = append(inits, foreignHandshake(b, bd))
				}
			}
			out := filepath.Join(b.TempDir(), fmt.Sprintf("ping-%d-%v.txt", round, burst))
			ping := n.Start("lan", out, "ping", "-i", "0.01", "-c", "300", "-W", "1", server)
			time.Sleep(time.Second)
			if burst {
				if err := sendFromUplink(n, 3, inits...); err != nil { // the fastest uplink
					b.Fatalf("send the INITs: %v", err)
				}
			}
			<-ping.Done
			worst := pingMax(b, out)
			if burst {
				res.BurstMax = append(res.BurstMax, worst)
			} else {
				res.QuietMax = append(res.QuietMax, worst)
			}
		}
	}
	res.Refused = failed() - before
	b.Logf("worst ping RTT through the bond: quiet %v ms, with a burst of %d INITs %v ms; %v INITs refused by the responder",
		res.QuietMax, res.BurstSize, res.BurstMax, res.Refused)
	writeJSON(b, "handshake-burst.json", res)
}

var pingSummary = regexp.MustCompile(`rtt min/avg/max/mdev = [0-9.]+/[0-9.]+/([0-9.]+)/`)

// pingMax reads the worst RTT from ping's summary.
func pingMax(b *testing.B, path string) float64 {
	data, _ := os.ReadFile(path)
	m := pingSummary.FindSubmatch(data)
	if m == nil {
		b.Fatalf("no RTT summary in ping's output:\n%s", data)
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}
