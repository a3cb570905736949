package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDataCapMakesAnUplinkABackup: up3 (60 Mbit/s, about 0.6 of a flow) has a 16-MiB
// monthly cap. The first transfers use it up; from then on up3 carries no data either
// way (the headend is told: LINK_PARAMS), while the others carry the flows. The count
// is saved in state_dir, so a CPE killed and started again keeps up3 capped from its
// first second.
func TestDataCapMakesAnUplinkABackup(t *testing.T) {
	n := newTopology(t)
	stateDir := t.TempDir()
	b := startBondWith(t, n, bondOptions{
		uplink: map[int]string{3: "    data_cap:\n      limit: 16MiB\n"},
		cpe:    "state_dir: " + stateDir + "\n",
	})
	startIperfServer(t, n)
	cpeLog := filepath.Join(b.dir, "cpe.log")
	reached := `aggd_uplink_data_cap_reached{link="up3"}`
	if v := b.metric(t, "cpe", reached); v != 0 {
		t.Fatalf("%s = %v before any traffic, want 0", reached, v)
	}
	if v := b.metric(t, "cpe", `aggd_uplink_data_cap_bytes{link="up3"}`); v != 16<<20 {
		t.Errorf("up3's cap is exported as %v bytes, want %d", v, 16<<20)
	}

	// Before the cap: up3 carries its share (and the transfers use its 16 MiB up).
	if share := b.up3Share(t); share < 0.3 {
		t.Fatalf("before its cap was reached up3 carried %.2f of the data; want its share of about 0.6 (the test would prove nothing)", share)
	}
	waitMetric(t, b, "cpe", reached, 1, 10*time.Second)
	used := b.metric(t, "cpe", `aggd_uplink_data_used_bytes{link="up3"}`)
	if used < 16<<20 {
		t.Errorf("up3 is capped with %v bytes used, below its 16 MiB", used)
	}
	line := logLine(t, cpeLog, "uplink used up its data cap")
	if !strings.Contains(line, "link=up3") || !strings.Contains(line, "until=") {
		t.Errorf("the cap's log line does not name the link and the period's end: %q", line)
	}
	out := b.Run("cpe", aggdBinary, "status", "--config", filepath.Join(b.dir, "cpe.yaml"), "--interval", "200ms")
	if !strings.Contains(out, "data caps") || !strings.Contains(out, "CAP REACHED") {
		t.Errorf("aggd status does not show up3's cap as reached:\n%s", out)
	}
	t.Logf("aggd status with up3's cap reached:\n%s", out)
	time.Sleep(1500 * time.Millisecond) // LINK_PARAMS reach the headend
	if share := b.up3Share(t); share > 0.02 {
		t.Errorf("after up3 used up its cap it carried %.3f of the data; want none (probes only)", share)
	}
	if v := b.metricOr0("cpe", `aggd_uplink_data_cap_reached{link="up1"}`); v != 0 {
		t.Errorf("up1, which has no cap, is exported as capped (%v)", v)
	}

	// The count is on disk, for this month.
	var st struct {
		Uplinks map[string]struct {
			PeriodStart time.Time `json:"period_start"`
			UsedBytes   uint64    `json:"used_bytes"`
		} `json:"uplinks"`
	}
	data, err := os.ReadFile(filepath.Join(stateDir, "data-usage.json"))
	if err != nil {
		t.Fatalf("no usage file in state_dir: %v", err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatalf("usage file: %v\n%s", err, data)
	}
	if r, ok := st.Uplinks["up3"]; !ok || r.UsedBytes < 16<<20 || r.PeriodStart.Day() != 1 {
		t.Errorf("usage file holds %+v for up3; want at least 16 MiB in a period from the 1st\n%s", r, data)
	}
	if _, ok := st.Uplinks["up1"]; ok {
		t.Errorf("usage file holds up1, which has no cap:\n%s", data)
	}

	// Killed (no final save) and started again: up3 stays capped.
	kill(t, b.cpe)
	args := append([]string{aggdBinary, "cpe", "--config", filepath.Join(b.dir, "cpe.yaml")},
		strings.Fields(os.Getenv("AGGD_E2E_DAEMON_ARGS"))...)
	restartLog := filepath.Join(b.dir, "cpe-restart.log")
	b.cpe = b.Start("cpe", restartLog, args...)
	b.waitReady(t)
	if line := logLine(t, restartLog, "data cap: counting", "link=up3"); !strings.Contains(line, "restored=true") {
		t.Errorf("the restarted CPE did not take up3's count from the file: %q", line)
	}
	if v := b.metric(t, "cpe", reached); v != 1 {
		t.Errorf("after the restart %s = %v, want 1", reached, v)
	}
	time.Sleep(1500 * time.Millisecond)
	if share := b.up3Share(t); share > 0.02 {
		t.Errorf("after the restart up3 carried %.3f of the data; want none (its cap is still used up)", share)
	}
}
