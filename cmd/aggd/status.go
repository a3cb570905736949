package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/aggd/aggd/internal/config"
	"github.com/aggd/aggd/internal/status"
)

// showStatus prints a running daemon's links from its metrics endpoint: once, or
// every interval with --watch until interrupted.
func showStatus(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "the daemon's config file: its metrics.listen is the address to read")
	addr := fs.String("addr", "", "the daemon's metrics address, HOST:PORT (default "+config.DefaultMetricsListen+")")
	interval := fs.Duration("interval", time.Second, "time between the two readings the current rates come from (0: no rates, one reading)")
	watch := fs.Bool("watch", false, "print again every interval until interrupted")
	peer := fs.String("peer", "", "show this peer alone (on a headend, one CPE by its name in peers[])")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: aggd status [--config FILE | --addr HOST:PORT] [--peer NAME] [--interval D] [--watch]\n\n"+
			"Shows each peer's links (health and how long in it, RTT, queueing delay, loss, estimated\n"+
			"capacity, the rate the scheduler assumes) and, from two readings --interval apart, what\n"+
			"each link carries now.\n"+
			"It reads the daemon's Prometheus endpoint, so metrics must be enabled.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 0 {
		fs.Usage()
		return 2
	}
	if *interval < 0 || (*watch && *interval == 0) {
		fmt.Fprintf(stderr, "aggd status: --interval must be positive with --watch, and never negative (got %s)\n", *interval)
		return 2
	}
	target, code := statusAddr(*path, *addr, stderr)
	if code != 0 {
		return code
	}
	url := "http://" + target + "/metrics"

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	client := &http.Client{Timeout: 5 * time.Second}
	read := func() (*status.Snapshot, bool) {
		s, err := status.Fetch(ctx, client, url)
		if err != nil {
			if ctx.Err() == nil {
				fmt.Fprintln(stderr, statusError(url, *path, *addr, err))
			}
			return nil, false
		}
		return s, true
	}
	prev, ok := read()
	if !ok {
		return 1
	}
	for {
		cur := prev
		if *interval > 0 {
			select {
			case <-ctx.Done():
				return 0
			case <-time.After(*interval):
			}
			if cur, ok = read(); !ok {
				return 1
			}
		}
		var earlier *status.Snapshot
		if cur != prev {
			earlier = prev
		}
		if *watch {
			fmt.Fprint(stdout, "\033[H\033[2J") // clear the terminal, as watch(1) does
			fmt.Fprintf(stdout, "%s   every %s, Ctrl-C to stop\n", cur.At.Format("15:04:05"), *interval)
		}
		shown, err := onlyPeer(cur, *peer)
		switch {
		case err != nil && *watch:
			fmt.Fprintln(stdout, err) // the CPE may be reconnecting: keep watching
		case err != nil:
			fmt.Fprintf(stderr, "aggd status: %v\n", err)
			return 1
		default:
			if earlier != nil && *peer != "" {
				earlier, _ = onlyPeer(earlier, *peer) // nil if it had no session then: no rates
			}
			if err := status.Render(stdout, earlier, shown); err != nil {
				return 1
			}
		}
		if !*watch {
			return 0
		}
		prev = cur
	}
}

// onlyPeer narrows a reading to one peer when --peer names one.
func onlyPeer(s *status.Snapshot, name string) (*status.Snapshot, error) {
	if name == "" {
		return s, nil
	}
	return s.OnlyPeer(name)
}

// statusAddr picks the metrics address: --addr, else the config's metrics.listen,
// else the default.
func statusAddr(path, addr string, stderr io.Writer) (string, int) {
	switch {
	case path != "" && addr != "":
		fmt.Fprintln(stderr, "aggd status: give --config or --addr, not both")
		return "", 2
	case addr != "":
		if _, _, err := net.SplitHostPort(addr); err != nil {
			fmt.Fprintf(stderr, "aggd status: --addr %q: %v (want HOST:PORT, e.g. %s)\n", addr, err, config.DefaultMetricsListen)
			return "", 2
		}
		return addr, 0
	case path == "":
		return config.DefaultMetricsListen, 0
	}
	m, err := configMetrics(path)
	if err != nil {
		return "", reportConfig(err, stderr)
	}
	if !m.Enabled {
		fmt.Fprintf(stderr, "aggd status: %s has metrics.enabled: false; aggd status reads the metrics endpoint, so enable it and restart the daemon\n", path)
		return "", 2
	}
	return m.Listen.String(), 0
}

// configMetrics loads a config of either role for its metrics section. Offline: the
// interfaces it names need not be checked to find an address.
func configMetrics(path string) (config.Metrics, error) {
	role, err := guessRole(path)
	if err != nil {
		return config.Metrics{}, err
	}
	opts := config.Options{Offline: true}
	if role == "cpe" {
		c, err := config.LoadCPEWith(path, opts)
		if err != nil {
			return config.Metrics{}, err
		}
		return c.Metrics, nil
	}
	c, err := config.LoadHeadendWith(path, opts)
	if err != nil {
		return config.Metrics{}, err
	}
	return c.Metrics, nil
}

// statusError says what went wrong reading the endpoint and what to try.
func statusError(url, path, addr string, err error) string {
	var opErr *net.OpError
	if errors.As(err, &opErr) || errors.Is(err, context.DeadlineExceeded) {
		hint := "is the daemon running (systemctl status aggd-cpe or aggd-headend)?"
		if path == "" && addr == "" {
			hint += " If its metrics.listen is not " + config.DefaultMetricsListen + ", pass --config FILE or --addr HOST:PORT."
		}
		return fmt.Sprintf("aggd status: cannot read %s: %v; %s", url, err, hint)
	}
	return fmt.Sprintf("aggd status: %s: %v", url, err)
}
