package config

import (
	"net/netip"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// fakeInterfaces pretends exactly the named interfaces exist.
func fakeInterfaces(names ...string) func(string) bool {
	set := map[string]bool{}
	for _, n := range names {
		set[n] = true
	}
	return func(name string) bool { return set[name] }
}

// exampleInterfaces are the interface names the example files use.
var exampleInterfaces = fakeInterfaces("ppp0", "eth0", "eth1", "wwan0")

func TestCPEExampleIsValid(t *testing.T) {
	cfg, err := LoadCPEWith("../../configs/cpe.example.yaml", Options{InterfaceExists: exampleInterfaces})
	if err != nil {
		t.Fatalf("example does not pass its own checks:\n%v", err)
	}
	if got := len(cfg.Uplinks); got != 3 {
		t.Fatalf("example has %d uplinks, want 3 (dsl, cable, lte)", got)
	}
	lte := cfg.Uplinks[2]
	if lte.Name != "lte" || lte.Class != ClassOverflow || lte.RateDown != 30_000_000 {
		t.Errorf("lte uplink = %+v, want class overflow and rate_down 30mbit", lte)
	}
	if cfg.Uplinks[1].Gateway != netip.MustParseAddr("192.0.2.1") {
		t.Errorf("cable gateway = %s, want 192.0.2.1", cfg.Uplinks[1].Gateway)
	}
	if cfg.Headend.Endpoint != (Endpoint{Host: "203.0.113.10", Port: 4242}) {
		t.Errorf("endpoint = %+v", cfg.Headend.Endpoint)
	}
}

func TestHeadendExampleIsValid(t *testing.T) {
	cfg, err := LoadHeadendWith("../../configs/headend.example.yaml", Options{InterfaceExists: exampleInterfaces})
	if err != nil {
		t.Fatalf("example does not pass its own checks:\n%v", err)
	}
	if got := len(cfg.Peers); got != 3 {
		t.Fatalf("example has %d peers, want 3", got)
	}
	if got := cfg.Peers[1].Routes; len(got) != 1 || got[0] != netip.MustParsePrefix("198.51.100.0/26") {
		t.Errorf("office-hamburg routes = %v", got)
	}
}

// The example files are the reference for users: every key of the schema must appear
// in them, set or commented out.
func TestExamplesDocumentEveryKey(t *testing.T) {
	for file, schema := range map[string]any{
		"../../configs/cpe.example.yaml":     CPE{},
		"../../configs/headend.example.yaml": Headend{},
	} {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range schemaKeys(reflect.TypeOf(schema)) {
			re := regexp.MustCompile(`(?m)^[ \t]*(#[ \t]*)?(-[ \t]+)?` + regexp.QuoteMeta(key) + `:`)
			if !re.Match(text) {
				t.Errorf("%s does not show the key %q", file, key)
			}
		}
	}
}

// schemaKeys lists every yaml key name reachable from t.
func schemaKeys(t reflect.Type) []string {
	var keys []string
	for name, i := range yamlFields(t) {
		keys = append(keys, name)
		ft := t.Field(i).Type
		if ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct {
			keys = append(keys, schemaKeys(ft)...)
		}
	}
	return keys
}

// A minimal file gets every default the schema promises.
func TestDefaultsApplied(t *testing.T) {
	cfg, err := ParseCPE([]byte(minimalCPE), Options{InterfaceExists: exampleInterfaces})
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultCPE()
	want.PrivateKeyFile = cfg.PrivateKeyFile
	want.Headend = cfg.Headend
	want.Tunnel.Address = cfg.Tunnel.Address
	want.Uplinks = []Uplink{{Name: "dsl", Interface: "eth1", Class: ClassPrimary}}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("got  %+v\nwant %+v", cfg, want)
	}
	// Spot-check the documented values, so a changed default is a visible decision.
	if cfg.Reorder.MaxHold != 200*time.Millisecond || cfg.Reorder.MaxBuffer != 4<<20 || !cfg.Reorder.LossRepair ||
		cfg.Probe.Interval != 100*time.Millisecond || cfg.Probe.DownAfter != 600*time.Millisecond ||
		cfg.RekeyInterval != 120*time.Second || cfg.Tunnel.Interface != "agg0" ||
		cfg.Tunnel.RouteMetric != 10 || !cfg.Tunnel.NAT || len(cfg.Tunnel.Routes) != 2 ||
		cfg.Metrics.Listen.String() != "127.0.0.1:9469" || !cfg.Metrics.Enabled ||
		cfg.Log.Level != LogInfo || cfg.Log.Format != LogText || !cfg.BPF.Enabled {
		t.Errorf("defaults differ from the documented ones: %+v", cfg)
	}

	h, err := ParseHeadend([]byte("private_key_file: /k\ntunnel: {address: [100.64.0.1/24]}\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if h.Listen.String() != "0.0.0.0:4242" || !h.NAT.Enabled || h.Tunnel.Interface != "agg0" || h.Peers != nil {
		t.Errorf("headend defaults differ from the documented ones: %+v", h)
	}
}

const minimalCPE = `
private_key_file: /etc/aggd/cpe.key
headend:
  endpoint: headend.example.net:4242
  public_key: HeadendPublicKeyPlaceholderReplaceMe000000A=
tunnel:
  address: [100.64.0.2/32]
uplinks:
  - name: dsl
    interface: eth1
`

// A list in the file replaces the default list; it is not appended to.
func TestListReplacesDefault(t *testing.T) {
	for _, tc := range []struct {
		routes string
		want   []netip.Prefix
	}{
		{"[]", []netip.Prefix{}},
		{"[10.0.0.0/8]", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
	} {
		data := strings.Replace(minimalCPE, "  address: [100.64.0.2/32]\n",
			"  address: [100.64.0.2/32]\n  routes: "+tc.routes+"\n", 1)
		cfg, err := ParseCPE([]byte(data), Options{Offline: true})
		if err != nil {
			t.Fatalf("routes %s: %v", tc.routes, err)
		}
		if !reflect.DeepEqual(cfg.Tunnel.Routes, tc.want) {
			t.Errorf("routes %s: got %v, want %v", tc.routes, cfg.Tunnel.Routes, tc.want)
		}
	}
}
