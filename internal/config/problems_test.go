package config

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestProblemsFormat(t *testing.T) {
	p := &Problems{File: "cpe.yaml", List: []Problem{
		{Path: "private_key_file", Msg: "missing"},
		{Path: "uplinks[1].rate_up", Line: 12, Msg: `"10" has no unit`},
		{Line: 3, Msg: "YAML syntax error: x"},
	}}
	want := "cpe.yaml: private_key_file: missing\n" +
		"cpe.yaml:12: uplinks[1].rate_up: \"10\" has no unit\n" +
		"cpe.yaml:3: YAML syntax error: x"
	if got := p.Error(); got != want {
		t.Errorf("Error() =\n%s\nwant\n%s", got, want)
	}
	var b bytes.Buffer
	if _, err := p.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.String(), want+"\n") || !strings.Contains(b.String(), "cpe.yaml: 3 problems;") {
		t.Errorf("WriteTo wrote\n%s", b.String())
	}
}

// Problems come out ordered by line, file-wide ones first, although decoding finds the
// later lines' problems before the checks that follow it find the earlier ones.
func TestProblemsSortedByLine(t *testing.T) {
	data := "uplinks: []\nprivate_key_file: /k\nheadend: {endpoint: 'x', public_key: y}\nlog: {level: loud}\n"
	_, err := ParseCPE([]byte(data), Options{Offline: true})
	var probs *Problems
	if !errors.As(err, &probs) {
		t.Fatalf("want *Problems, got %v", err)
	}
	var got []string
	for _, p := range probs.List {
		got = append(got, fmt.Sprintf("%d %s", p.Line, p.Path))
	}
	want := []string{"0 tunnel.address", "1 uplinks", "3 headend.endpoint", "3 headend.public_key", "4 log.level"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got problems\n%v\nwant in this order: %v", err, want)
	}
}

// A valid config returns a true nil error, not a nil *Problems in an error interface.
func TestValidConfigReturnsNilError(t *testing.T) {
	cfg, err := ParseCPE([]byte(minimalCPE), Options{Offline: true})
	if err != nil || cfg == nil {
		t.Fatalf("ParseCPE = %v, %v", cfg, err)
	}
}

func TestOfflineSkipsInterfaceCheck(t *testing.T) {
	none := func(string) bool { return false }
	if _, err := ParseCPE([]byte(minimalCPE), Options{InterfaceExists: none}); err == nil ||
		!strings.Contains(err.Error(), `no interface "eth1" on this machine`) {
		t.Errorf("with no interfaces: %v; want the missing interface reported", err)
	}
	if _, err := ParseCPE([]byte(minimalCPE), Options{InterfaceExists: none, Offline: true}); err != nil {
		t.Errorf("offline: %v; want no interface check", err)
	}
}

// A missing uplink interface is an error that points at hotplug, and no error for an
// uplink marked hotplug: it may appear after the start.
func TestHotplugUplinkMayBeMissing(t *testing.T) {
	none := func(string) bool { return false }
	_, err := ParseCPE([]byte(minimalCPE), Options{InterfaceExists: none})
	if err == nil || !strings.Contains(err.Error(), "set uplinks[0].hotplug: true") {
		t.Errorf("missing interface: %v; want the hint to set uplinks[0].hotplug", err)
	}
	hot := strings.Replace(minimalCPE, "    interface: eth1\n", "    interface: eth1\n    hotplug: true\n", 1)
	cfg, err := ParseCPE([]byte(hot), Options{InterfaceExists: none})
	if err != nil || !cfg.Uplinks[0].Hotplug {
		t.Errorf("hotplug uplink with its interface missing: %v, %v; want it accepted", cfg, err)
	}
	bad := strings.Replace(hot, "interface: eth1", "interface: eth/1", 1)
	if _, err := ParseCPE([]byte(bad), Options{InterfaceExists: none}); err == nil {
		t.Error("hotplug uplink with an invalid interface name accepted")
	}
}

// Without an injected check, interfaces are looked up on this machine.
func TestDefaultInterfaceCheckAsksKernel(t *testing.T) {
	ifs, err := net.Interfaces()
	if err != nil || len(ifs) == 0 {
		t.Skip("no interfaces visible here")
	}
	exists := Options{}.interfaceExists()
	if !exists(ifs[0].Name) {
		t.Errorf("interface %q exists but the default check says no", ifs[0].Name)
	}
	if exists("aggd-no-such0") {
		t.Error("the default check says a made-up interface exists")
	}
}

func TestLoadReportsFileName(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cpe.yaml")
	if err := os.WriteFile(path, []byte("private_key_file: /k\nbogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadCPEWith(path, Options{Offline: true})
	if err == nil || !strings.Contains(err.Error(), path+":2: bogus: unknown key") {
		t.Errorf("LoadCPEWith error = %v; want it to name %s line 2", err, path)
	}

	_, err = LoadHeadend(filepath.Join(dir, "missing.yaml"))
	var probs *Problems
	if err == nil || errors.As(err, &probs) || !strings.Contains(err.Error(), "missing.yaml") ||
		!strings.Contains(err.Error(), "configs/headend.example.yaml") {
		t.Errorf("LoadHeadend(missing) = %v; want a read error naming the file and the example", err)
	}
}

func TestFixSyntaxLine(t *testing.T) {
	for _, tc := range []struct {
		data string
		want int
	}{
		{"a: 1\nb:\n  c: [1, 2\nd: 3\n", 3}, // unclosed list opened on line 3
		{"a: 1\nb: {x: 1\nc: 2\n", 2},       // unclosed mapping opened on line 2
		{"a: 1\n- b\n", 2},                  // list item in a mapping
		{"a: 1\nb: c: d\n", 2},              // scanner error: already 1-based
		{"a: 1\nb:\n  c: 1\n\td: 2\n", 4},   // tab on line 4
		{"a: 1\nb:\n  c: 1\n d: 2\n", 4},    // bad indentation on line 4
		{"a: 1\nb: \"open\nc: 2\n", 2},      // unterminated string starts on line 2
	} {
		c := newCollector()
		var out struct{}
		if c.decodeDocument([]byte(tc.data), &out) || len(c.list) != 1 {
			t.Errorf("%q: want one syntax error, got %v", tc.data, c.list)
			continue
		}
		if got := c.list[0].Line; got != tc.want {
			t.Errorf("%q: line %d (%s), want %d", tc.data, got, c.list[0].Msg, tc.want)
		}
	}
}
