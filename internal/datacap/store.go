package datacap

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The state file keeps each uplink's count across restarts, so that a restart (an
// upgrade, a reboot) does not hand a metered line a fresh allowance.

// FileName is the state file's name in the daemon's state directory.
const FileName = "data-usage.json"

const fileVersion = 1

type stateFile struct {
	Version int               `json:"version"`
	Uplinks map[string]record `json:"uplinks"`
}

type record struct {
	PeriodStart time.Time `json:"period_start"`
	UsedBytes   uint64    `json:"used_bytes"`
	// LastReading is the reading UsedBytes counts up to (absent in files written
	// before it was kept, and when aggd knows no boot ID: then a restart counts from
	// its first reading, and what the line carried while aggd was stopped is lost).
	LastReading *reading `json:"last_reading,omitempty"`
}

// reading is an interface's counters as a meter last read them, and in which boot.
type reading struct {
	Boot  string `json:"boot_id"`
	Index int    `json:"ifindex"`
	Rx    uint64 `json:"rx_bytes"`
	Tx    uint64 `json:"tx_bytes"`
	// Unit is what Rx and Tx count: readingUnit; "" in files of versions that counted
	// the link-layer headers too, whose readings a start cannot compare with its own.
	Unit string `json:"unit,omitempty"`
}

// readingUnit says a reading counts IP bytes (IPBytes).
const readingUnit = "ip_bytes"

// BootIDFile holds the running kernel's boot ID, a random UUID drawn at each boot.
const BootIDFile = "/proc/sys/kernel/random/boot_id"

// BootID reads the running kernel's boot ID ("" if it cannot be read).
func BootID() string {
	data, err := os.ReadFile(BootIDFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// Load reads the counts a previous run saved and gives each meter the one of its
// uplink (by name) if it is for the current period, with the reading it counts up to,
// so that the meter's first reading adds what the interface carried since. It returns
// the names of the meters restored. A missing file is no error: nothing was saved yet.
func Load(path string, now time.Time, meters []*Meter) ([]string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("data caps: read %s: %w", path, err)
	}
	var st stateFile
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("data caps: %s is not a usage file aggd wrote (%v); remove it to count from zero", path, err)
	}
	if st.Version != fileVersion {
		return nil, fmt.Errorf("data caps: %s has version %d, this aggd reads %d; remove it to count from zero", path, st.Version, fileVersion)
	}
	var restored []string
	for _, m := range meters {
		if r, ok := st.Uplinks[m.Name]; ok && m.Restore(now, r.PeriodStart, r.UsedBytes) {
			m.resume(r.LastReading)
			restored = append(restored, m.Name)
		}
	}
	return restored, nil
}

// Save writes the meters' counts to path, replacing the file whole (a crash leaves
// the old file or the new one, never half of one). It creates the directory.
func Save(path string, meters []*Meter) error {
	st := stateFile{Version: fileVersion, Uplinks: map[string]record{}}
	for _, m := range meters {
		if m.start.IsZero() {
			continue
		}
		r := record{PeriodStart: m.start, UsedBytes: m.used}
		if m.seen && m.Boot != "" {
			r.LastReading = &reading{Boot: m.Boot, Index: m.last.Index, Rx: m.last.Rx, Tx: m.last.Tx, Unit: readingUnit}
		}
		st.Uplinks[m.Name] = r
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("data caps: %w (state_dir must be writable)", err)
	}
	tmp, err := os.CreateTemp(dir, FileName+".*")
	if err != nil {
		return fmt.Errorf("data caps: %w (state_dir must be writable)", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing to remove
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("data caps: write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("data caps: write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("data caps: write %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("data caps: %w", err)
	}
	return nil
}
