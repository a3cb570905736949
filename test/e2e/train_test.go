package e2e

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestProbeTrainMeasuresTheLinks: without configured rates, each side measures the
// capacity of every link towards its peer with a probe train as soon as the link is up,
// before any traffic (internal/tunnel/train.go). The uplinks are shaped here with a
// small token-bucket burst (3 KB, two packets), as a modem's serialisation would space
// the probes; the topology's usual 15-KB burst lets a whole train through at line rate,
// which the daemon recognises and does not use.
func TestProbeTrainMeasuresTheLinks(t *testing.T) {
	n := newTopology(t)
	for i, rate := range uplinkRates {
		k := i + 1
		for _, side := range []struct{ ns, ifc string }{{"cpe", fmt.Sprintf("up%d", k)}, {"hub", fmt.Sprintf("hl%d", k)}} {
			n.Run(side.ns, "tc", "qdisc", "replace", "dev", side.ifc, "root", "tbf", "rate", fmt.Sprintf("%dmbit", rate),
				"burst", "3kb", "latency", "40ms")
		}
	}
	b := startBondWith(t, n, bondOptions{noRates: true})
	for _, side := range []struct{ log, what, linkAttr string }{
		{"cpe.log", "upstream", `link=up(\d)`},
		{"hub.log", "downstream", `link=link(\d)`},
	} {
		path := filepath.Join(b.dir, side.log)
		line := regexp.MustCompile(`msg="link capacity measured by a probe train".*` + side.linkAttr + `.*mbit_s=([0-9.]+)|` +
			`msg="link capacity measured by a probe train".*mbit_s=([0-9.]+).*` + side.linkAttr)
		deadline := time.Now().Add(10 * time.Second)
		var got map[int]float64
		for time.Now().Before(deadline) {
			got = map[int]float64{}
			for _, m := range line.FindAllStringSubmatch(readFileString(path), -1) {
				idx, mbit := m[1], m[2]
				if idx == "" {
					idx, mbit = m[4], m[3]
				}
				k, _ := strconv.Atoi(idx)
				v, _ := strconv.ParseFloat(mbit, 64)
				got[k] = v
			}
			if len(got) == len(uplinkRates) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		for i, rate := range uplinkRates {
			k := i + 1 // up1 (CPE) is the headend's link0
			if side.log == "hub.log" {
				k = i
			}
			v, ok := got[k]
			t.Logf("%s link %d: probe train measured %.2f Mbit/s (TBF rate %d)", side.what, i+1, v, rate)
			if !ok {
				t.Errorf("%s link %d: no probe train measure in %s", side.what, i+1, side.log)
				continue
			}
			if v < 0.8*float64(rate) || v > 1.25*float64(rate) {
				t.Errorf("%s link %d: probe train measured %.2f Mbit/s, want within -20%%/+25%% of the %d Mbit/s rate", side.what, i+1, v, rate)
			}
		}
		if t.Failed() {
			logTrainSpacings(t, path)
		}
	}
}

// logTrainSpacings logs every train's arrival spacings from a daemon's debug log: a
// measure off its link's rate is rare, and the log the failure prints keeps only its
// tail, long past the trains.
func logTrainSpacings(t *testing.T, path string) {
	for _, line := range strings.Split(readFileString(path), "\n") {
		if strings.Contains(line, `msg="probe train"`) {
			t.Logf("%s: %s", filepath.Base(path), line)
		}
	}
}
