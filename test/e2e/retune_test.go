package e2e

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A CPE applies its uplinks' classes, rate priors and weights on SIGHUP (systemctl
// reload aggd-cpe), in the running session: here up3, the fastest line, becomes a
// backup (a metered LTE link, say) and carries no more data either way, the headend
// having been told in LINK_PARAMS, with no new handshake; up1's doubled rates are its
// estimate's new starting point on both sides. A change that needs a
// restart is named as such; a config with problems changes nothing.
func TestCPEReloadRetunesUplinks(t *testing.T) {
	n := newTopology(t)
	b := startBond(t, n)
	startIperfServer(t, n)
	cpeYAML, cpeLog := filepath.Join(b.dir, "cpe.yaml"), filepath.Join(b.dir, "cpe.log")
	original := readFileString(cpeYAML)
	reload := func(content string) {
		t.Helper()
		writeFile(t, b.dir, "cpe.yaml", content)
		if err := b.cpe.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}

	// Before: up3 carries its share.
	if share := b.up3Share(t); share < 0.3 {
		t.Fatalf("before the reload up3 carried %.2f of the data; want its share of about 0.6 (the test would prove nothing)", share)
	}

	// A broken config: nothing changes.
	reload("uplinks: nowhere\n")
	waitLog(t, cpeLog, "reload: the config has problems", 10*time.Second)

	// up3 becomes a backup, up1's rates double (its estimate starts again from them,
	// on both sides); the log level changes too (a restart's business).
	edited := strings.Replace(original, "  - name: up3\n    interface: up3\n", "  - name: up3\n    interface: up3\n    class: backup\n", 1)
	edited = strings.Replace(edited, "  - name: up1\n    interface: up1\n    rate_up: 10mbit\n    rate_down: 10mbit\n",
		"  - name: up1\n    interface: up1\n    rate_up: 20mbit\n    rate_down: 20mbit\n", 1)
	edited = strings.Replace(edited, "log:\n  level: debug\n", "log:\n  level: info\n", 1)
	if edited == original {
		t.Fatalf("cpe.yaml does not have the layout this test edits:\n%s", original)
	}
	reload(edited)
	waitLog(t, cpeLog, "reload: uplink classes, rates and weights applied", 10*time.Second)
	waitMetric(t, b, "cpe", `aggd_link_capacity_bits_per_second{link="up1",peer="headend"}`, 20e6, 5*time.Second)
	waitMetric(t, b, "hub", `aggd_link_capacity_bits_per_second{link="link0",peer="cpe1"}`, 20e6, 5*time.Second)
	if line := logLine(t, cpeLog, "reload: uplink classes, rates and weights applied"); !strings.Contains(line, "changed=\"[up1 up3]\"") && !strings.Contains(line, "changed=[up1 up3]") {
		t.Errorf("the reload names the wrong uplinks: %q", line)
	}
	if line := logLine(t, cpeLog, "reload: these settings changed"); !strings.Contains(line, "keys=log") {
		t.Errorf("the restart-only change is not named: %q", line)
	}
	time.Sleep(1500 * time.Millisecond) // LINK_PARAMS reach the headend
	if share := b.up3Share(t); share > 0.02 {
		t.Errorf("after up3 became a backup it carried %.3f of the data; want none (probes only)", share)
	}
	if c := logCount(filepath.Join(b.dir, "hub.log"), `msg="session established"`); c != 1 {
		t.Errorf("%d sessions established at the headend, want 1: the reload must keep the session", c)
	}
}

// up3Share runs a 3-s TCP upload and a 3-s download through the bond and returns the
// largest share of the data packets up3 carried in either direction (the CPE's
// transmit counters upstream, the headend's downstream).
func (b *bond) up3Share(t *testing.T) float64 {
	t.Helper()
	worst := 0.0
	for _, dir := range []struct {
		ns, peer, up3 string
		args          []string
	}{
		{"cpe", "headend", "up3", nil},
		{"hub", "cpe1", "link2", []string{"-R"}},
	} {
		before := b.linkTx(t, dir.ns, dir.peer)
		args := append([]string{"iperf3", "-c", server, "-t", "3", "--connect-timeout", "3000"}, dir.args...)
		if out, err := b.Try("lan", args...); err != nil {
			t.Fatalf("iperf3 %v: %v\n%s", dir.args, err, out)
		}
		after := b.linkTx(t, dir.ns, dir.peer)
		total := 0.0
		for name, v := range after {
			total += v - before[name]
		}
		if total > 0 {
			worst = max(worst, (after[dir.up3]-before[dir.up3])/total)
		}
	}
	return worst
}
