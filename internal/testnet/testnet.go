// Package testnet builds throw-away network topologies out of network namespaces and
// veth pairs for aggd's integration tests and benchmarks. Everything it creates carries
// a per-run prefix and is removed when the test ends, also when it fails.
//
// It drives the real tools (ip, tc, iperf3) the way an operator would, so a failing step
// prints the exact command to reproduce it.
package testnet

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// Net is one topology under construction.
type Net struct {
	t      testing.TB
	prefix string
	mu     sync.Mutex
	procs  []*Proc
	spaces []string
}

// Proc is a background command; Done is closed when it has exited.
type Proc struct {
	Cmd  *exec.Cmd
	Done chan struct{}
	Err  error // valid after Done
}

// RequireRoot skips when the test cannot create namespaces. CI runs as root, so there
// the tests always run; the skip is for developers running `go test` unprivileged.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces (run `make test` as root)")
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: run `make deps`", tool)
		}
	}
}

// New starts a topology whose namespaces are named prefix-<name>.
func New(t testing.TB, prefix string) *Net {
	RequireRoot(t)
	n := &Net{t: t, prefix: fmt.Sprintf("%s%d", prefix, os.Getpid()%100000)}
	t.Cleanup(n.teardown)
	return n
}

// NS returns the full name of a namespace of this topology.
func (n *Net) NS(name string) string { return n.prefix + "-" + name }

// AddNS creates namespaces with loopback up.
func (n *Net) AddNS(names ...string) {
	for _, name := range names {
		full := n.NS(name)
		_ = exec.Command("ip", "netns", "del", full).Run() // a leftover of a killed run
		n.ip("netns", "add", full)
		n.mu.Lock()
		n.spaces = append(n.spaces, full)
		n.mu.Unlock()
		n.Run(name, "ip", "link", "set", "lo", "up")
	}
}

// Veth joins nsA:ifA and nsB:ifB with a veth pair, assigns the addresses (CIDR, may be
// empty) and brings both ends up.
func (n *Net) Veth(nsA, ifA, addrA, nsB, ifB, addrB string) {
	n.ip("link", "add", ifA, "netns", n.NS(nsA), "type", "veth", "peer", "name", ifB, "netns", n.NS(nsB))
	for _, e := range []struct{ ns, ifc, addr string }{{nsA, ifA, addrA}, {nsB, ifB, addrB}} {
		if e.addr != "" {
			n.Run(e.ns, "ip", "addr", "add", e.addr, "dev", e.ifc)
		}
		n.Run(e.ns, "ip", "link", "set", e.ifc, "up")
	}
}

// Shape limits egress of ifc in ns to rate (tc syntax, e.g. "10mbit") with a token bucket
// and a queue of about queueMs milliseconds at that rate.
func (n *Net) Shape(ns, ifc, rate string, queueMs int) {
	n.Run(ns, "tc", "qdisc", "replace", "dev", ifc, "root", "tbf", "rate", rate,
		"burst", "15kb", "latency", fmt.Sprintf("%dms", queueMs))
}

// Run executes a command inside a namespace and returns its standard output. A failure
// fails the test with the command line and its output.
func (n *Net) Run(ns string, args ...string) string {
	n.t.Helper()
	out, err := n.Try(ns, args...)
	if err != nil {
		n.t.Fatalf("%s: %v\n%s", n.cmdline(ns, args), err, out)
	}
	return out
}

// Try is Run without failing the test.
func (n *Net) Try(ns string, args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.NS(ns)}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// Start runs a command in a namespace in the background; its output goes to logPath.
// It is killed at teardown if still running.
func (n *Net) Start(ns, logPath string, args ...string) *Proc {
	n.t.Helper()
	f, err := os.Create(logPath)
	if err != nil {
		n.t.Fatal(err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.NS(ns)}, args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		n.t.Fatalf("%s: %v", n.cmdline(ns, args), err)
	}
	p := &Proc{Cmd: cmd, Done: make(chan struct{})}
	go func() { p.Err = cmd.Wait(); f.Close(); close(p.Done) }()
	n.mu.Lock()
	n.procs = append(n.procs, p)
	n.mu.Unlock()
	return p
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.Done:
		return true
	default:
		return false
	}
}

// Do runs f with the calling goroutine's OS thread inside the namespace. Sockets created
// in f stay in that namespace after Do returns.
func (n *Net) Do(ns string, f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	target, err := netns.GetFromName(n.NS(ns))
	if err != nil {
		return fmt.Errorf("namespace %s: %w", n.NS(ns), err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		return err
	}
	defer func() { _ = netns.Set(orig) }()
	return f()
}

// HTTPGet fetches a URL from inside a namespace (e.g. a daemon's metrics on loopback).
// Its connection is closed after the one request: a transport per call that kept it
// would leave the daemon holding one idle connection per call.
func (n *Net) HTTPGet(ns, url string) (string, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := n.Do(ns, func() (err error) {
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	return b.String(), err
}

func (n *Net) ip(args ...string) {
	n.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		n.t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (n *Net) cmdline(ns string, args []string) string {
	return "ip netns exec " + n.NS(ns) + " " + strings.Join(args, " ")
}

func (n *Net) teardown() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.procs {
		if !p.Exited() {
			_ = p.Cmd.Process.Signal(os.Interrupt)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, p := range n.procs {
		select {
		case <-p.Done:
		case <-time.After(time.Until(deadline)):
			n.t.Logf("%s did not stop on SIGINT within 5s; killing it", strings.Join(p.Cmd.Args, " "))
			_ = p.Cmd.Process.Kill()
			<-p.Done
		}
	}
	for _, s := range n.spaces {
		_ = exec.Command("ip", "netns", "del", s).Run()
	}
}
