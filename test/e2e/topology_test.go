package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/aggd/aggd/internal/handshake"
	"github.com/aggd/aggd/internal/testnet"
)

// The test topology (every box is a network namespace):
//
//	lan ── cpe ═══ up1 (10 Mbit/s) ═══ hub (headend) ── srv
//	           ═══ up2 (30 Mbit/s) ═══
//	           ═══ up3 (60 Mbit/s) ═══
//
// Each uplink is a veth pair shaped with TBF in both directions. The headend's public
// address (203.0.113.1) is on its loopback and reachable through every uplink; the CPE
// has one route to it per uplink, and aggd's per-uplink sockets pick theirs.
const (
	lanHost   = "10.99.0.2"
	server    = "10.97.0.2"
	headendIP = "203.0.113.1"
)

// uplinkRates are the three links' rates in Mbit/s, the same in both directions.
var uplinkRates = []int{10, 30, 60}

// bond is a running topology with aggd on both sides.
type bond struct {
	*testnet.Net
	dir     string
	cpe     *testnet.Proc
	headend *testnet.Proc
}

// aggdBinary is built once for the package by TestMain.
var aggdBinary string

// pinRoot is the daemons' bpf.pin_dir, a BPF filesystem TestMain mounts.
var pinRoot string

func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		dir, err := os.MkdirTemp("", "aggd-e2e-bin")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		aggdBinary = filepath.Join(dir, "aggd")
		// The daemons pin the fast path on a BPF filesystem of the tests' own, in the
		// host's mount namespace: `ip netns exec` gives each daemon a fresh /sys, where
		// a BPF filesystem would die with the daemon and no restart could adopt it.
		pinRoot = filepath.Join(dir, "bpf")
		if err := os.Mkdir(pinRoot, 0o700); err == nil {
			if err := unix.Mount("bpf", pinRoot, "bpf", 0, "mode=0700"); err != nil {
				fmt.Fprintln(os.Stderr, "mounting a BPF filesystem for the fast path's pins:", err)
				os.Exit(1)
			}
		}
		build := exec.Command("go", "build", "-o", aggdBinary, "github.com/aggd/aggd/cmd/aggd")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building aggd:", err)
			os.Exit(1)
		}
		code := m.Run()
		_ = unix.Unmount(pinRoot, unix.MNT_DETACH)
		os.RemoveAll(dir)
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// newTopology builds the namespaces, links, shaping and addressing, without aggd.
func newTopology(t testing.TB) *testnet.Net { return buildTopology(t, "ae", true) }

// buildTopology builds the topology with the given namespace prefix; shaped puts TBF at
// uplinkRates on both ends of each uplink, else the veths run at their natural speed.
func buildTopology(t testing.TB, prefix string, shaped bool) *testnet.Net {
	return buildTopologyWith(t, prefix, topologyOptions{shaped: shaped})
}

// topologyOptions varies buildTopology's network.
type topologyOptions struct {
	shaped bool
	// ipv6Uplink k (from 1) makes uplink k an IPv6-only line: IPv6 addresses on both
	// ends and none of IPv4, and the headend's headendIPv6 reachable over it.
	ipv6Uplink int
	// allIPv6 makes every uplink such a line (the CPE's routes to headendIPv6 by
	// metric, as the IPv4 ones are).
	allIPv6 bool
	// mtu, if set, is the MTU of both ends of the uplinks addUplink creates.
	mtu int
}

// headendIPv6 is the headend's IPv6 address (on its loopback) in topologies with an
// IPv6-only uplink.
const headendIPv6 = "2001:db8:ff::1"

func buildTopologyWith(t testing.TB, prefix string, opts topologyOptions) *testnet.Net {
	if testing.Short() {
		t.Skip("end-to-end test; skipped with -short")
	}
	n := testnet.New(t, prefix)
	n.AddNS("lan", "cpe", "hub", "srv")
	n.Veth("lan", "eth0", lanHost+"/24", "cpe", "lan0", "10.99.0.1/24")
	n.Run("lan", "ip", "route", "add", "default", "via", "10.99.0.1")
	for i := range uplinkRates {
		addUplink(n, i+1, opts)
	}
	n.Run("hub", "ip", "addr", "add", headendIP+"/32", "dev", "lo")
	if opts.ipv6Uplink != 0 || opts.allIPv6 {
		n.Run("hub", "ip", "-6", "addr", "add", headendIPv6+"/128", "dev", "lo", "nodad")
	}
	n.Veth("hub", "wan0", "10.97.0.1/24", "srv", "eth0", server+"/24")
	return n
}

// addUplink creates uplink k (from 1) as a veth pair, up<k> in the CPE and hl<k> in the
// headend, with its addresses, the CPE's route to the headend over it and, if shaped,
// its rate uplinkRates[k-1] at both ends.
func addUplink(n *testnet.Net, k int, opts topologyOptions) {
	up, hl := fmt.Sprintf("up%d", k), fmt.Sprintf("hl%d", k)
	if k == opts.ipv6Uplink || opts.allIPv6 {
		n.Veth("cpe", up, "", "hub", hl, "")
		n.Run("cpe", "ip", "-6", "addr", "add", fmt.Sprintf("2001:db8:98:%d::2/64", k), "dev", up, "nodad")
		n.Run("hub", "ip", "-6", "addr", "add", fmt.Sprintf("2001:db8:98:%d::1/64", k), "dev", hl, "nodad")
		route := []string{"ip", "-6", "route", "add", headendIPv6 + "/128", "via", fmt.Sprintf("2001:db8:98:%d::1", k), "dev", up}
		if opts.allIPv6 {
			route = append(route, "metric", strconv.Itoa(100+k))
		}
		n.Run("cpe", route...)
	} else if opts.mtu != 0 {
		// The MTU before the addresses: the CPE sizes the tunnel when the address comes.
		n.Veth("cpe", up, "", "hub", hl, "")
		for _, e := range []struct{ ns, ifc, addr string }{{"cpe", up, fmt.Sprintf("10.98.%d.2/24", k)}, {"hub", hl, fmt.Sprintf("10.98.%d.1/24", k)}} {
			n.Run(e.ns, "ip", "link", "set", e.ifc, "mtu", strconv.Itoa(opts.mtu))
			n.Run(e.ns, "ip", "addr", "add", e.addr, "dev", e.ifc)
		}
		n.Run("cpe", "ip", "route", "add", headendIP+"/32", "via", fmt.Sprintf("10.98.%d.1", k),
			"dev", up, "metric", strconv.Itoa(100+k))
	} else {
		n.Veth("cpe", up, fmt.Sprintf("10.98.%d.2/24", k), "hub", hl, fmt.Sprintf("10.98.%d.1/24", k))
		n.Run("cpe", "ip", "route", "add", headendIP+"/32", "via", fmt.Sprintf("10.98.%d.1", k),
			"dev", up, "metric", strconv.Itoa(100+k))
	}
	if opts.shaped {
		rate := uplinkRates[k-1]
		n.Shape("cpe", up, fmt.Sprintf("%dmbit", rate), 40)
		n.Shape("hub", hl, fmt.Sprintf("%dmbit", rate), 40)
	}
}

// startBond writes keys and configs and starts aggd as headend and CPE. daemonArgs,
// if any, are appended to both daemons' command lines (e.g. "--no-bpf").
func startBond(t testing.TB, n *testnet.Net, daemonArgs ...string) *bond {
	return startBondWith(t, n, bondOptions{}, daemonArgs...)
}

// ipv6BondOptions is the bond over IPv6-only uplinks ks: the headend listens on both
// versions, and each of those uplinks sends to its IPv6 address.
func ipv6BondOptions(ks ...int) bondOptions {
	opts := bondOptions{listen: "[::]:4242", uplink: map[int]string{}}
	for _, k := range ks {
		opts.uplink[k] = `    endpoint: "[` + headendIPv6 + `]:4242"` + "\n"
	}
	return opts
}

// bondOptions varies the CPE's config from startBond's.
type bondOptions struct {
	// noRates leaves out each uplink's rate_up/rate_down (the real rates, as priors):
	// aggd must measure the links.
	noRates bool
	// uplink adds lines to uplink k's entry (k from 1), indented like its keys.
	uplink map[int]string
	// cpe adds top-level lines to the CPE config, tunnel lines to its tunnel section
	// (indented like its keys).
	cpe, tunnel string
	// listen is the headend's listen address; "" is headendIP:4242.
	listen string
	// noWait returns once both daemons run, without waiting for the bond to be ready
	// (a test that starts it with an uplink missing).
	noWait bool
	// autoInterfaces leaves bpf.interfaces out of the headend's config: it picks where
	// its shield goes itself (the default routes' interfaces). Otherwise the config
	// lists the uplinks' hl1..hl3 and the second CPE's hm1, hm2 (TestHeadendServesTwoCPEs).
	autoInterfaces bool
	// hubInterfaces, if set, is the headend config's bpf.interfaces line instead.
	hubInterfaces string
	// logLevel is both daemons' log.level; "" is debug (a failing test's log then says
	// the most).
	logLevel string
}

// hubInterfaces is the headend config's bpf.interfaces line for opts.
func hubInterfaces(opts bondOptions) string {
	if opts.autoInterfaces {
		return ""
	}
	if opts.hubInterfaces != "" {
		return opts.hubInterfaces
	}
	return "  interfaces: [hl1, hl2, hl3, hm1, hm2]\n"
}

// startBondWith is startBond with the CPE config varied by opts.
func startBondWith(t testing.TB, n *testnet.Net, opts bondOptions, daemonArgs ...string) *bond {
	dir := t.TempDir()
	cpeKey, hubKey := writeKey(t, dir, "cpe.key"), writeKey(t, dir, "hub.key")
	logLevel := opts.logLevel
	if logLevel == "" {
		logLevel = "debug"
	}
	var ups strings.Builder
	for i := range uplinkRates {
		k := i + 1
		fmt.Fprintf(&ups, "  - name: up%d\n    interface: up%d\n", k, k)
		if !opts.noRates {
			fmt.Fprintf(&ups, "    rate_up: %dmbit\n    rate_down: %dmbit\n", uplinkRates[i], uplinkRates[i])
		}
		ups.WriteString(opts.uplink[k])
	}
	writeFile(t, dir, "cpe.yaml", fmt.Sprintf(`private_key_file: %s
headend:
  endpoint: %s:4242
  public_key: %s
tunnel:
  address: [100.64.0.2/32]
%suplinks:
%slog:
  level: %s
bpf:
  pin_dir: %s
%s`, filepath.Join(dir, "cpe.key"), headendIP, hubKey, opts.tunnel, ups.String(), logLevel, pinRoot, opts.cpe))
	listen := opts.listen
	if listen == "" {
		listen = headendIP + ":4242"
	}
	writeFile(t, dir, "hub.yaml", fmt.Sprintf(`private_key_file: %s
listen: "%s"
tunnel:
  address: [100.64.0.1/24]
nat:
  out_interface: wan0
peers:
  - name: cpe1
    public_key: %s
    tunnel_address: [100.64.0.2/32]
log:
  level: %s
bpf:
  pin_dir: %s
%s`, filepath.Join(dir, "hub.key"), listen, cpeKey, logLevel, pinRoot, hubInterfaces(opts)))

	// AGGD_E2E_DAEMON_ARGS adds options to both daemons of every test (e.g. --fast-path:
	// `make test` runs the suite once more with it, so the userspace tests check the
	// kernel fast path too). A test that asks for --no-bpf itself runs without BPF in
	// both suites: --fast-path would contradict it.
	env := strings.Fields(os.Getenv("AGGD_E2E_DAEMON_ARGS"))
	if slices.Contains(daemonArgs, "--no-bpf") {
		env = slices.DeleteFunc(env, func(a string) bool { return a == "--fast-path" })
	}
	daemonArgs = append(daemonArgs, env...)
	b := &bond{Net: n, dir: dir}
	b.headend = n.Start("hub", filepath.Join(dir, "hub.log"), append([]string{aggdBinary, "headend", "--config", filepath.Join(dir, "hub.yaml")}, daemonArgs...)...)
	b.cpe = n.Start("cpe", filepath.Join(dir, "cpe.log"), append([]string{aggdBinary, "cpe", "--config", filepath.Join(dir, "cpe.yaml")}, daemonArgs...)...)
	t.Cleanup(func() {
		// AGGD_E2E_KEEP_LOGS=dir keeps both daemons' whole logs there, per test.
		if keep := os.Getenv("AGGD_E2E_KEEP_LOGS"); keep != "" {
			dst := filepath.Join(keep, strings.ReplaceAll(t.Name(), "/", "_"))
			if err := os.MkdirAll(dst, 0o755); err == nil {
				for _, f := range []string{"cpe.log", "hub.log"} {
					if data, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
						_ = os.WriteFile(filepath.Join(dst, f), data, 0o644)
					}
				}
			}
		}
		if t.Failed() {
			for _, f := range []string{"cpe.log", "hub.log"} {
				data, _ := os.ReadFile(filepath.Join(dir, f))
				t.Logf("---- %s: what it logged above debug (last 8 KiB of that) ----\n%s", f, tail(aboveDebug(data), 8192))
				t.Logf("---- %s (last 4 KiB) ----\n%s", f, tail(data, 4096))
			}
		}
	})
	if opts.noWait {
		b.waitRunning(t)
	} else {
		b.waitReady(t)
	}
	return b
}

// addHubPeer lists one more CPE in the running headend's peers, as an operator adds a
// customer, and reloads it (SIGHUP). keyFile is the CPE's private key, written into
// b.dir; the headend gets its public half.
func (b *bond) addHubPeer(t testing.TB, name, keyFile, tunnelAddr string) {
	t.Helper()
	hub, err := os.ReadFile(filepath.Join(b.dir, "hub.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	with := strings.Replace(string(hub), "\nlog:\n", fmt.Sprintf(`
  - name: %s
    public_key: %s
    tunnel_address: [%s]
log:
`, name, writeKey(t, b.dir, keyFile), tunnelAddr), 1)
	if with == string(hub) {
		t.Fatalf("hub.yaml does not have the layout addHubPeer edits:\n%s", hub)
	}
	writeFile(t, b.dir, "hub.yaml", with)
	if err := b.headend.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
}

// waitRunning waits until both daemons say they run.
func (b *bond) waitRunning(t testing.TB) {
	deadline := time.Now().Add(20 * time.Second)
	for logCount(filepath.Join(b.dir, "cpe.log"), `msg="cpe running"`) == 0 ||
		logCount(filepath.Join(b.dir, "hub.log"), `msg="headend running"`) == 0 {
		if b.cpe.Exited() || b.headend.Exited() {
			t.Fatalf("aggd exited early (cpe: %v, headend: %v)", b.cpe.Exited(), b.headend.Exited())
		}
		if time.Now().After(deadline) {
			t.Fatal("aggd not running after 20 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitReady waits until the LAN host can reach the server through the bond and every
// uplink is up on both sides. Each ping waits 100 ms for its answer (a round trip
// through the bond takes about a millisecond here): with a second, as before, a ping
// sent just before the session stood held the wait for that second, and a bench's
// "bond back after" read 1.43 s where the bond was back at 0.22.
func (b *bond) waitReady(t testing.TB) {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if b.cpe.Exited() || b.headend.Exited() {
			t.Fatalf("aggd exited early (cpe: %v, headend: %v)", b.cpe.Exited(), b.headend.Exited())
		}
		_, err := b.Try("lan", "ping", "-c1", "-W0.1", server)
		if err == nil && b.linksUp("cpe", "headend") == len(uplinkRates) && b.linksUp("hub", "cpe1") == len(uplinkRates) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("bond not ready after 20s: cpe links up %d, headend links up %d",
		b.linksUp("cpe", "headend"), b.linksUp("hub", "cpe1"))
}

func (b *bond) linksUp(ns, peer string) int {
	m, err := b.metrics(ns)
	if err != nil {
		return 0
	}
	up := 0
	for k, v := range m {
		if strings.HasPrefix(k, "aggd_link_up{") && strings.Contains(k, `peer="`+peer+`"`) && v == 1 {
			up++
		}
	}
	return up
}

// metrics scrapes a daemon's Prometheus endpoint into "name{labels}" → value.
func (b *bond) metrics(ns string) (map[string]float64, error) {
	body, err := b.HTTPGet(ns, "http://127.0.0.1:9469/metrics")
	if err != nil {
		return nil, err
	}
	out := make(map[string]float64)
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, nil
}

// seriesSum adds up every labelled series of one metric in a scrape.
func seriesSum(m map[string]float64, name string) float64 {
	var sum float64
	for k, v := range m {
		if strings.HasPrefix(k, name+"{") {
			sum += v
		}
	}
	return sum
}

// metric returns one series' value from a daemon's metrics (0 when absent).
// metricOr0 is one series' value, or 0 if the daemon does not export it.
func (b *bond) metricOr0(ns, series string) float64 {
	m, err := b.metrics(ns)
	if err != nil {
		return 0
	}
	return m[series]
}

func (b *bond) metric(t testing.TB, ns, series string) float64 {
	m, err := b.metrics(ns)
	if err != nil {
		t.Fatalf("scrape metrics in %s: %v", ns, err)
	}
	return m[series]
}

// iperfResult is the part of iperf3's JSON we use.
type iperfResult struct {
	End struct {
		SumReceived struct {
			BitsPerSecond float64 `json:"bits_per_second"`
			Bytes         float64 `json:"bytes"`
		} `json:"sum_received"`
	} `json:"end"`
	Error string `json:"error"`
}

// iperf runs one TCP flow from the LAN host to the server (reverse: server to LAN host)
// and returns the receiver's goodput in bit/s; extra are more iperf3 options. A failed
// or broken transfer fails the test.
func iperf(t testing.TB, n *testnet.Net, seconds int, reverse bool, extra ...string) float64 {
	args := []string{"iperf3", "-c", server, "-t", strconv.Itoa(seconds), "-J", "--connect-timeout", "3000"}
	if reverse {
		args = append(args, "-R")
	}
	args = append(args, extra...)
	waitIperfServerIdle(t, n, "5201")
	out, err := n.Try("lan", args...)
	var r iperfResult
	if jerr := json.Unmarshal([]byte(out), &r); jerr != nil || err != nil || r.Error != "" {
		t.Fatalf("iperf3 %v failed: %v %s\n%s\n---- iperf3 server log (last 2 KiB) ----\n%s",
			args, err, r.Error, tail([]byte(out), 2000), iperfServerLogTail(n))
	}
	return r.End.SumReceived.BitsPerSecond
}

// iperfServerLogs maps each topology to its iperf3 server's log, for failure reports.
var iperfServerLogs sync.Map // *testnet.Net → string

func startIperfServer(t testing.TB, n *testnet.Net) {
	log := filepath.Join(t.TempDir(), "iperf3-server.log")
	iperfServerLogs.Store(n, log)
	n.Start("srv", log, "iperf3", "-s")
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if out, _ := n.Try("srv", "ss", "-ltn"); strings.Contains(out, ":5201") {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("iperf3 server did not start listening on port 5201")
}

// waitIperfServerIdle waits until the iperf3 server on port holds no connection.
// It serves one test at a time and finishes a test a moment after its client has
// exited; a client that connects in that moment is turned away, and the server's
// close of the unread connection reaches the client as a reset ("unable to receive
// control message"). That is iperf3's rule, not the tunnel's doing.
func waitIperfServerIdle(t testing.TB, n *testnet.Net, port string) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, _ := n.Try("srv", "ss", "-Htn", "state", "established", "state", "close-wait", "state", "syn-recv", "sport", "=", ":"+port)
		if strings.TrimSpace(out) == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Logf("the iperf3 server on port %s still holds connections after 5 s; starting the client anyway:\n%s", port, out)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func iperfServerLogTail(n *testnet.Net) string {
	log, ok := iperfServerLogs.Load(n)
	if !ok {
		return "(no iperf3 server started on this topology)"
	}
	b, err := os.ReadFile(log.(string))
	if err != nil {
		return err.Error()
	}
	return tail(b, 2000)
}

func writeKey(t testing.TB, dir, name string) (public string) {
	k, err := handshake.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake.WritePrivateKeyFile(filepath.Join(dir, name), k); err != nil {
		t.Fatal(err)
	}
	return k.Public().String()
}

func writeFile(t testing.TB, dir, name, content string) {
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// aboveDebug keeps a daemon log's lines above debug level: state changes with their
// causes, which the debug lines' volume pushes out of a plain tail.
func aboveDebug(log []byte) []byte {
	var out []byte
	for _, line := range bytes.SplitAfter(log, []byte("\n")) {
		if !bytes.Contains(line, []byte("level=DEBUG")) {
			out = append(out, line...)
		}
	}
	return out
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
