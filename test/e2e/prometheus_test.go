package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// prometheusBinary is the Prometheus server the test runs: scripts/deps.sh unpacks the
// distribution's there; AGGD_PROMETHEUS names another.
func prometheusBinary(t *testing.T) string {
	t.Helper()
	path := os.Getenv("AGGD_PROMETHEUS")
	if path == "" {
		path = "/usr/local/lib/aggd/prometheus"
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("no Prometheus server at %s (%v): scripts/deps.sh unpacks Debian's or Ubuntu's there; "+
			"AGGD_PROMETHEUS=PATH names another", path, err)
	}
	return path
}

// A real Prometheus server, scraping a real headend and loading the shipped rules
// (deploy/prometheus/aggd.rules.yml), raises the alerts they are for: a CPE listed in
// the headend's peers that never connected is named (AggdPeerNoSession), a CPE's link
// that dies is named as the CPE names it (AggdLinkDown, joined with aggd_link_info),
// and nothing is raised for the healthy CPE or once the link is back. The rules' own
// test (make test-alerts) evaluates them on made-up series with Prometheus's engine;
// this one checks them against what a running aggd exports, on the Prometheus release
// a distribution ships. Alerts with a `for` time are pending at first: ALERTS shows
// them so, which is all this test waits for.
func TestPrometheusAlertsOnTheDaemons(t *testing.T) {
	server := prometheusBinary(t)
	rules, err := filepath.Abs("../../deploy/prometheus/aggd.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	n := newTopology(t)
	b := startBond(t, n)

	// A second CPE listed, whose aggd never runs.
	b.addHubPeer(t, "cpe-absent", "absent.key", "100.64.0.9/32")

	dir := t.TempDir()
	writeFile(t, dir, "prometheus.yml", fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: aggd
    static_configs:
      - targets: ["127.0.0.1:9469"]
        labels: {instance: hub}
`, rules))
	logPath := filepath.Join(dir, "prometheus.log")
	prom := n.Start("hub", logPath, server, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:9090")
	t.Cleanup(func() {
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			t.Logf("---- prometheus.log (last 4 KiB) ----\n%s", tail(data, 4096))
		}
	})

	// alerts is what ALERTS holds now for the headend: "alertname state peer name" each.
	alerts := func() ([]string, error) {
		body, err := n.HTTPGet("hub", "http://127.0.0.1:9090/api/v1/query?query="+url.QueryEscape(`ALERTS{instance="hub"}`))
		if err != nil {
			return nil, err
		}
		var r struct {
			Status string
			Error  string
			Data   struct {
				Result []struct{ Metric map[string]string }
			}
		}
		if err := json.Unmarshal([]byte(body), &r); err != nil || r.Status != "success" {
			return nil, fmt.Errorf("query failed: %v %s: %s", err, r.Error, body)
		}
		var out []string
		for _, s := range r.Data.Result {
			m := s.Metric
			out = append(out, strings.Join([]string{m["alertname"], m["alertstate"], m["peer"], m["name"]}, " "))
		}
		return out, nil
	}
	has := func(list []string, prefix string) bool {
		for _, a := range list {
			if strings.HasPrefix(a, prefix) {
				return true
			}
		}
		return false
	}
	// waitAlerts waits until cond holds of the alerts, and returns them.
	waitAlerts := func(what string, within time.Duration, cond func([]string) bool) []string {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			list, err := alerts()
			if err == nil && cond(list) {
				return list
			}
			if prom.Exited() {
				t.Fatalf("prometheus exited: %v", prom.Err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v; alerts now %q (last error: %v)", what, within, list, err)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}

	list := waitAlerts("the absent CPE named", 60*time.Second, func(l []string) bool {
		return has(l, "AggdPeerNoSession pending cpe-absent")
	})
	for _, a := range list {
		if strings.Contains(a, " cpe1") {
			t.Errorf("an alert about the healthy CPE: %q (all: %q)", a, list)
		}
	}

	// up2 dies on the CPE's side: the headend's link to it goes down, named up2.
	n.Run("cpe", "ip", "link", "set", "up2", "down")
	list = waitAlerts("the dead link named", 30*time.Second, func(l []string) bool {
		return has(l, "AggdLinkDown pending cpe1 up2")
	})
	if has(list, "AggdPeerUnreachable") || has(list, "AggdLinkDown pending cpe1 up1") || has(list, "AggdLinkDown pending cpe1 up3") {
		t.Errorf("one link of three down, and the alerts say more: %q", list)
	}
	n.Run("cpe", "ip", "link", "set", "up2", "up")
	waitAlerts("the link's alert cleared once it is back", 30*time.Second, func(l []string) bool {
		return !has(l, "AggdLinkDown")
	})
}
