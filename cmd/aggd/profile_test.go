package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --cpu-profile names a directory; anything else stops the daemon before it starts,
// saying what to give instead.
func TestCPUProfileNeedsADirectory(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{filepath.Join(t.TempDir(), "missing"), file} {
		var errOut bytes.Buffer
		code := run([]string{"cpe", "--cpu-profile", dir, "--config", "/nonexistent.yaml"}, nil, &bytes.Buffer{}, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), "--cpu-profile") || !strings.Contains(errOut.String(), "directory") {
			t.Errorf("--cpu-profile %s: exit %d, %q; want 2 and a message asking for a directory", dir, code, errOut.String())
		}
	}
}

// The profile is a pprof file named by role and process, complete once stopped.
func TestCPUProfileIsWritten(t *testing.T) {
	dir := t.TempDir()
	stop, path, err := startCPUProfile(dir, "headend")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "aggd-headend-"); !strings.HasPrefix(path, want) || !strings.HasSuffix(path, ".pprof") {
		t.Errorf("profile written to %s, want %s<pid>.pprof", path, want)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b { // pprof profiles are gzipped protobufs
		t.Errorf("the profile (%d bytes) is not a gzipped pprof profile", len(b))
	}
}
