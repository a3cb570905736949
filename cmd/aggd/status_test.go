package main

import (
	"bytes"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/aggd/aggd/internal/metrics"
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

// On a headend with many CPEs, --peer shows one; a name without a session is an error
// that lists the peers there are.
func TestStatusShowsOnePeer(t *testing.T) {
	m := metrics.New()
	for _, p := range []string{"shop-berlin", "shop-paris"} {
		m.LinkUp.WithLabelValues(p, "link0").Set(1)
		m.LinkInfo.WithLabelValues(p, "link0", "dsl").Set(1)
	}
	srv := httptest.NewServer(promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	var out, errOut bytes.Buffer
	if code := run([]string{"status", "--addr", addr, "--interval", "0", "--peer", "shop-paris"}, nil, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "peer shop-paris") || strings.Contains(out.String(), "shop-berlin") {
		t.Errorf("--peer shop-paris printed:\n%s", out.String())
	}
	out.Reset()
	if code := run([]string{"status", "--addr", addr, "--interval", "0", "--peer", "shop-rome"}, nil, &out, &errOut); code != 1 {
		t.Fatalf("an unknown peer: exit %d, want 1", code)
	}
	if msg := errOut.String(); !strings.Contains(msg, `"shop-rome"`) || !strings.Contains(msg, "shop-berlin, shop-paris") {
		t.Errorf("an unknown peer says: %s", msg)
	}
}
