// Command aggd bonds several WAN uplinks into one tunnel: `aggd cpe` on the router,
// `aggd headend` on the server that puts the traffic back together.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/aggd/aggd/internal/buildinfo"
	"github.com/aggd/aggd/internal/config"
	"github.com/aggd/aggd/internal/daemon"
	"github.com/aggd/aggd/internal/handshake"
)

const usage = `aggd bonds several internet uplinks (DSL, cable, LTE, ...) into one tunnel: packets
are striped across all uplinks to a headend, which puts them back in order.

Usage:
  aggd cpe --config FILE [--no-bpf|--fast-path]        run on the router (CPE)
  aggd headend --config FILE [--no-bpf|--fast-path]    run on the headend server
  aggd check-config [--offline] [--role cpe|headend] FILE
                                           validate a config file and print every problem
  aggd status [--config FILE | --addr HOST:PORT] [--interval D] [--watch]
                                           show a running daemon's links and how it splits traffic
  aggd genkey                              print a new private key (base64)
  aggd pubkey                              read a private key on stdin, print its public key
  aggd version                             print the version

Examples:
  aggd genkey > /etc/aggd/private.key && chmod 600 /etc/aggd/private.key
  aggd pubkey < /etc/aggd/private.key
  aggd check-config /etc/aggd/cpe.yaml
  aggd cpe --config /etc/aggd/cpe.yaml
  aggd status --watch

Documented example configs: configs/cpe.example.yaml, configs/headend.example.yaml.
Run 'aggd COMMAND --help' for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run dispatches a subcommand and returns the process exit code: 0 success, 1 runtime
// failure, 2 bad usage or bad config.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "cpe", "headend":
		return runDaemon(cmd, rest, stderr)
	case "check-config":
		return checkConfig(rest, stdout, stderr)
	case "status":
		return showStatus(rest, stdout, stderr)
	case "genkey":
		return genkey(stdout, stderr)
	case "pubkey":
		return pubkey(stdin, stdout, stderr)
	case "version", "--version":
		fmt.Fprintf(stdout, "aggd %s (%s)\n", buildinfo.Version, buildinfo.GoVersion())
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "aggd: unknown command %q\n\n%s", cmd, usage)
	return 2
}

func runDaemon(role string, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet(role, flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "/etc/aggd/"+role+".yaml", "config file")
	fs.StringVar(path, "c", "/etc/aggd/"+role+".yaml", "config file (shorthand)")
	noBPF := fs.Bool("no-bpf", false, "no BPF at all: no XDP shield, no fast path; forward in userspace")
	fastPath := fs.Bool("fast-path", false, "forward data packets in the kernel too (as bpf.fast_path: true; experimental, see docs/fastpath.md)")
	profileDir := fs.String("cpu-profile", "", "write a Go CPU profile of the run into this directory, as aggd-ROLE-PID.pprof (for go tool pprof)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: aggd %s --config FILE [--no-bpf | --fast-path] [--cpu-profile DIR]\n\nRuns the %s until SIGINT or SIGTERM, then removes everything it set up.\n\n", role, role)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *noBPF && *fastPath {
		fmt.Fprintln(stderr, "aggd: --no-bpf and --fast-path contradict each other; give one")
		return 2
	}
	opts := daemon.Options{NoBPF: *noBPF, FastPath: *fastPath, ConfigPath: *path}
	if *profileDir != "" {
		stopProfile, file, perr := startCPUProfile(*profileDir, role)
		if perr != nil {
			fmt.Fprintf(stderr, "aggd %s: %v\n", role, perr)
			return 2
		}
		defer func() {
			if err := stopProfile(); err != nil {
				fmt.Fprintf(stderr, "aggd %s: writing the CPU profile %s: %v\n", role, file, err)
			}
		}()
	}

	var err error
	if role == "cpe" {
		cfg, lerr := config.LoadCPE(*path)
		if lerr != nil {
			return reportConfig(lerr, stderr)
		}
		log := daemon.NewLogger(cfg.Log)
		opts.Reload = reloadRequests(ctx)
		err = daemon.RunCPE(ctx, cfg, opts, log)
	} else {
		cfg, lerr := config.LoadHeadend(*path)
		if lerr != nil {
			return reportConfig(lerr, stderr)
		}
		log := daemon.NewLogger(cfg.Log)
		opts.Reload = reloadRequests(ctx)
		err = daemon.RunHeadend(ctx, cfg, opts, log)
	}
	if err != nil {
		fmt.Fprintf(stderr, "aggd %s: %v\n", role, err)
		return 1
	}
	return 0
}

// reloadRequests turns SIGHUP (instead of dying, its default) into reload requests:
// the headend applies its config's peers without a restart, the CPE its uplinks'
// classes, rate priors and weights.
func reloadRequests(ctx context.Context) <-chan struct{} {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	out := make(chan struct{}, 1)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
			}
			select {
			case out <- struct{}{}:
			default: // one already pending: it will read the newest file
			}
		}
	}()
	return out
}

func checkConfig(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check-config", flag.ContinueOnError)
	fs.SetOutput(stderr)
	offline := fs.Bool("offline", false, "skip checks against this machine (interfaces), for a file meant for another host")
	role := fs.String("role", "", "cpe or headend (default: guessed from the file's keys)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: aggd check-config [--offline] [--role cpe|headend] FILE\n\nValidates FILE and prints every problem with its line and field path.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	path := fs.Arg(0)
	if *role == "" {
		r, err := guessRole(path)
		if err != nil {
			fmt.Fprintf(stderr, "aggd check-config: %v\n", err)
			return 2
		}
		*role = r
	}
	opts := config.Options{Offline: *offline}
	var err error
	switch *role {
	case "cpe":
		_, err = config.LoadCPEWith(path, opts)
	case "headend":
		_, err = config.LoadHeadendWith(path, opts)
	default:
		fmt.Fprintf(stderr, "aggd check-config: --role must be cpe or headend, not %q\n", *role)
		return 2
	}
	if err != nil {
		return reportConfig(err, stderr)
	}
	fmt.Fprintf(stdout, "%s: valid %s config\n", path, *role)
	return 0
}

// guessRole tells a CPE config from a headend config by the top-level keys only one of
// them has.
func guessRole(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("cannot read config: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "uplinks:"), strings.HasPrefix(line, "headend:"):
			return "cpe", nil
		case strings.HasPrefix(line, "peers:"), strings.HasPrefix(line, "listen:"):
			return "headend", nil
		}
	}
	return "", fmt.Errorf("%s: cannot tell whether this is a cpe or a headend config (no uplinks/headend or peers/listen key); pass --role", path)
}

func reportConfig(err error, stderr io.Writer) int {
	var probs *config.Problems
	if errors.As(err, &probs) {
		_, _ = probs.WriteTo(stderr)
		return 2
	}
	fmt.Fprintf(stderr, "aggd: %v\n", err)
	return 2
}

func genkey(stdout, stderr io.Writer) int {
	k, err := handshake.GenerateKey()
	if err != nil {
		fmt.Fprintf(stderr, "aggd genkey: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, k.Base64())
	return 0
}

func pubkey(stdin io.Reader, stdout, stderr io.Writer) int {
	b, err := io.ReadAll(io.LimitReader(stdin, 4096))
	if err != nil {
		fmt.Fprintf(stderr, "aggd pubkey: reading stdin: %v\n", err)
		return 1
	}
	k, err := handshake.ParsePrivateKey(strings.TrimSpace(string(b)))
	if err != nil {
		fmt.Fprintf(stderr, "aggd pubkey: %v (pipe in a key made by 'aggd genkey')\n", err)
		return 2
	}
	fmt.Fprintln(stdout, k.Public().String())
	return 0
}
