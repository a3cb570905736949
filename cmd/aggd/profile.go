package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
)

// startCPUProfile writes a Go CPU profile of the daemon's run into dir, as
// aggd-ROLE-PID.pprof (so that a CPE and a headend given the same option on one machine
// do not overwrite each other), for `go tool pprof`. It returns the function that ends
// the profile and closes the file. Meant for finding where a slow router's CPU goes:
// the profile costs a few percent of CPU while it runs.
func startCPUProfile(dir, role string) (stop func() error, path string, err error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, "", fmt.Errorf("--cpu-profile: %w (give an existing directory)", err)
	}
	if !st.IsDir() {
		return nil, "", fmt.Errorf("--cpu-profile: %s is not a directory (give the directory the profile goes in)", dir)
	}
	path = filepath.Join(dir, fmt.Sprintf("aggd-%s-%d.pprof", role, os.Getpid()))
	f, err := os.Create(path)
	if err != nil {
		return nil, "", fmt.Errorf("--cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, "", fmt.Errorf("--cpu-profile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, path, nil
}
