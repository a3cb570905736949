#!/usr/bin/env bash
# deps.sh — install what aggd's build, tests and lab need on Debian or Ubuntu, starting
# from nothing but apt (make deps runs it; so can a machine that has no make yet).
# Idempotent; needs root. In order:
#   1. the Debian packages (compilers, BPF tools, the lab's qemu, iperf3, …), make included;
#   2. Go, if no Go as new as go.mod asks is found: neither Debian 12 nor Ubuntu
#      ships one that new, so the official toolchain goes to /usr/local/go
#      (scripts/install-go.py; checked against Go's checksum database);
#   3. the Go modules, virtme-ng (the lab's VM runner, from PyPI) and golangci-lint;
#   4. a Prometheus server for the alert rules' end-to-end test: the distribution's
#      prometheus package, unpacked to /usr/local/lib/aggd/prometheus, not installed
#      (no service is started on this machine).
set -euo pipefail
cd "$(dirname "$0")/.."

GO_VERSION=${GO_VERSION:-1.26.8}       # the release CI and BENCHMARKS.md use
GOLANGCI_LINT_VERSION=v2.15.0
VIRTME_NG_VERSION=1.42

PACKAGES=(
	make git ca-certificates python3 python3-pip python3-yaml python3-matplotlib
	clang llvm libbpf-dev linux-libc-dev gcc-multilib binutils
	iproute2 iperf3 nftables tcpdump ethtool iputils-ping procps spin
	qemu-system-x86 kmod busybox-static udev systemd file
	openvpn wireguard-tools
)
# Installed where the archive has them; nothing here needs them. bpftool (for looking
# at aggd's maps and programs by hand) is its own package in Debian, but older Ubuntu
# releases have it only in linux-tools-$(uname -r).
OPTIONAL=(bpftool)

say() { echo "deps: $*"; }
die() { echo "deps: ERROR: $*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "run as root (it installs packages): sudo $0"
command -v apt-get >/dev/null || die "no apt-get: this script knows Debian and Ubuntu only; install the packages listed in $0 and a Go as new as go.mod asks by hand"

# --- 1. Debian packages -------------------------------------------------------------
installed() { dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q 'install ok installed'; }
available() { apt-cache show --no-all-versions "$1" >/dev/null 2>&1; }
missing=()
for p in "${PACKAGES[@]}" "${OPTIONAL[@]}"; do installed "$p" || missing+=("$p"); done
if ((${#missing[@]})); then
	apt-get update -qq
	install=() unavailable=()
	for p in "${missing[@]}"; do
		if available "$p"; then install+=("$p"); else unavailable+=("$p"); fi
	done
	for p in "${unavailable[@]}"; do
		[[ " ${OPTIONAL[*]} " == *" $p "* ]] ||
			die "package $p is not in this system's apt sources (on Ubuntu, enable the universe component: add-apt-repository universe); missing: ${unavailable[*]}"
		echo "deps: note: optional package $p is not in this system's apt sources; skipped" >&2
	done
	if ((${#install[@]})); then
		say "installing ${install[*]}"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${install[@]}"
	fi
else
	say "all Debian packages present"
fi

# --- 2. Go --------------------------------------------------------------------------
python3 scripts/install-go.py --version "$GO_VERSION" --dir /usr/local/go
# The go to use from here on, chosen as the Makefile chooses it: PATH's go, or else
# /usr/local/go/bin/go, whichever is new enough (an old Debian go may come first on PATH).
GO=$(python3 scripts/install-go.py --find --dir /usr/local/go) ||
	die "no Go as new as go.mod asks found after installing one (scripts/install-go.py --find)"

# --- 3. Go modules, virtme-ng, golangci-lint -----------------------------------------
"$GO" mod download
if ! command -v vng >/dev/null; then
	# Not in Debian 12; pip refuses the system Python without --break-system-packages
	# there (PEP 668), and older pips do not know that option.
	python3 -m pip install -q "virtme-ng==$VIRTME_NG_VERSION" 2>/dev/null ||
		python3 -m pip install -q --break-system-packages "virtme-ng==$VIRTME_NG_VERSION" ||
		echo "deps: WARNING: could not install virtme-ng; the netem lab (make demo, make lab) needs it: pip install virtme-ng==$VIRTME_NG_VERSION" >&2
fi
gobin=$("$GO" env GOPATH)/bin
[[ -x $gobin/golangci-lint ]] ||
	GOTOOLCHAIN=local "$GO" install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION"

# --- 4. Prometheus, for TestPrometheusAlertsOnTheDaemons --------------------------------
PROMETHEUS=/usr/local/lib/aggd/prometheus
if [[ ! -x $PROMETHEUS ]]; then
	say "unpacking the prometheus package's server to $PROMETHEUS (not installed as a service)"
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	download() { (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root prometheus); }
	download || { apt-get update -qq && download; } ||
		die "could not download the prometheus package (on Ubuntu, enable the universe component: add-apt-repository universe)"
	dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
	install -D -m 0755 "$tmp/x/usr/bin/prometheus" "$PROMETHEUS"
fi
say "done ($("$GO" version); $("$PROMETHEUS" --version 2>&1 | head -1))"
