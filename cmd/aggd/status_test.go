package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStatusRefusesBadArguments(t *testing.T) {
	for _, args := range [][]string{
		{"status", "--config", "a.yaml", "--addr", "127.0.0.1:9469"},
		{"status", "--addr", "no-port"},
		{"status", "--watch", "--interval", "0"},
		{"status", "extra"},
	} {
		var out, errOut bytes.Buffer
		if code := run(args, nil, &out, &errOut); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errOut.String())
		}
	}
}

// A daemon that is not running is the most likely failure; the message must say where
// aggd status looked and what to check.
func TestStatusWithoutADaemonSaysWhatToCheck(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil { // nothing listens there now
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"status", "--addr", addr, "--interval", "0"}, nil, &out, &errOut); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	for _, want := range []string{"http://" + addr + "/metrics", "connection refused", "is the daemon running"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("message lacks %q: %s", want, errOut.String())
		}
	}
}

func TestStatusWithMetricsDisabledInTheConfig(t *testing.T) {
	example, err := os.ReadFile("../../configs/cpe.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "cpe.yaml")
	text := strings.Replace(string(example), "  enabled: true\n  # Local ip:port", "  enabled: false\n  # Local ip:port", 1)
	if text == string(example) {
		t.Fatal("the example's metrics section changed; update this test")
	}
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"status", "--config", path}, nil, &out, &errOut); code != 2 {
		t.Fatalf("exit %d, want 2 for disabled metrics: %s", code, errOut.String())
	}
	if !strings.Contains(errOut.String(), "metrics.enabled: false") {
		t.Errorf("message does not name the setting: %s", errOut.String())
	}
}
