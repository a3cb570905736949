# shellcheck shell=bash
# Shared helpers for aggd's lab scripts (scripts/demo.sh). Source it after setting
# LAB_PREFIX, the prefix every namespace of the lab carries (e.g. "aggd-demo-").
# Everything here works by namespace name and process id, so it never touches anything
# outside the lab: leftovers are found by prefix, processes by `ip netns pids`.

# ---- output -------------------------------------------------------------------------

# step prints one line per step, so a failing run shows where it stopped.
step() { printf '==> %s\n' "$*"; }
# info prints details under a step.
info() { printf '    %s\n' "$*"; }
# warn and die go to stderr so they stand out from the step log.
warn() { printf 'warning: %s\n' "$*" >&2; }
die() {
	printf 'error: %s\n' "$*" >&2
	exit 1
}

# ---- namespaces ---------------------------------------------------------------------

# lab_ns maps a short name (cpe) to the namespace's full name (aggd-demo-cpe).
lab_ns() { printf '%s%s' "$LAB_PREFIX" "$1"; }

# in_ns runs a command inside a lab namespace: in_ns cpe ip addr.
in_ns() {
	local ns
	ns=$(lab_ns "$1")
	shift
	ip netns exec "$ns" "$@"
}

# lab_list_namespaces prints the namespaces carrying our prefix (ours, or a killed run's).
lab_list_namespaces() {
	ip netns list 2>/dev/null | awk -v p="$LAB_PREFIX" 'index($1, p) == 1 { print $1 }'
}

# lab_kill_processes_in_namespaces stops every process still living in one of our
# namespaces: TERM first so aggd can remove its routes and NAT rules, KILL after 5 s.
# Deleting a namespace does not end the processes in it, so this has to come first.
lab_kill_processes_in_namespaces() {
	local ns pids="" i
	for ns in $(lab_list_namespaces); do
		pids+=" $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
	done
	pids=$(echo "$pids" | xargs -r)
	[[ -z $pids ]] && return 0
	# shellcheck disable=SC2086 # word splitting of the pid list is intended
	kill -TERM $pids 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		# shellcheck disable=SC2086
		kill -0 $pids 2>/dev/null || return 0
		sleep 0.1
	done
	# shellcheck disable=SC2086
	kill -KILL $pids 2>/dev/null || true
}

# lab_delete_namespaces removes our namespaces; their veths and qdiscs go with them.
lab_delete_namespaces() {
	local ns
	for ns in $(lab_list_namespaces); do
		ip netns del "$ns" 2>/dev/null || warn "could not delete namespace $ns"
	done
}

# lab_add_namespaces creates namespaces with loopback up (metrics listen on 127.0.0.1).
lab_add_namespaces() {
	local name
	for name in "$@"; do
		ip netns add "$(lab_ns "$name")"
		in_ns "$name" ip link set lo up
	done
}

# lab_veth joins nsA:ifA and nsB:ifB with a veth pair, addresses both ends (CIDR) and
# brings them up.
lab_veth() {
	local nsa=$1 ifa=$2 addra=$3 nsb=$4 ifb=$5 addrb=$6
	ip link add "$ifa" netns "$(lab_ns "$nsa")" type veth peer name "$ifb" netns "$(lab_ns "$nsb")"
	in_ns "$nsa" ip addr add "$addra" dev "$ifa"
	in_ns "$nsb" ip addr add "$addrb" dev "$ifb"
	in_ns "$nsa" ip link set "$ifa" up
	in_ns "$nsb" ip link set "$ifb" up
}

# lab_shape limits the egress of ns:ifc to rate (tc syntax, "10mbit") with a token
# bucket and about queue_ms of queue, the same shaping the e2e tests use. Shaping both
# ends of a veth gives the link its rate in both directions.
lab_shape() {
	local ns=$1 ifc=$2 rate=$3 queue_ms=$4
	in_ns "$ns" tc qdisc replace dev "$ifc" root tbf rate "$rate" burst 15kb latency "${queue_ms}ms"
}

# lab_wait_listening waits up to 5 s for a TCP listener on port in ns (an iperf3 server
# started in the background is not ready at once).
lab_wait_listening() {
	local ns=$1 port=$2 i
	for ((i = 0; i < 50; i++)); do
		in_ns "$ns" ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && return 0
		sleep 0.1
	done
	return 1
}

# ---- metrics ------------------------------------------------------------------------

# lab_pick_http_getter chooses how to fetch the metrics pages: curl, else wget, else
# python3's urllib, so the demo runs on a minimal system without installing anything.
LAB_HTTP_GETTER=""
lab_pick_http_getter() {
	local tool
	for tool in curl wget python3; do
		if command -v "$tool" >/dev/null 2>&1; then
			LAB_HTTP_GETTER=$tool
			return 0
		fi
	done
	return 1
}

# lab_http_get fetches a URL from inside a namespace (metrics listen on its loopback).
lab_http_get() {
	local ns=$1 url=$2
	case $LAB_HTTP_GETTER in
	curl) in_ns "$ns" curl -sf --max-time 2 "$url" ;;
	wget) in_ns "$ns" wget -q -T 2 -O - "$url" ;;
	python3)
		in_ns "$ns" python3 -c 'import sys, urllib.request
sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())' "$url"
		;;
	*) return 1 ;;
	esac
}

# lab_scrape_command prints the command a person can paste to scrape a namespace.
lab_scrape_command() {
	local ns=$1 url=$2
	case $LAB_HTTP_GETTER in
	wget) printf 'ip netns exec %s wget -qO- %s' "$(lab_ns "$ns")" "$url" ;;
	python3) printf "ip netns exec %s python3 -c 'import urllib.request; print(urllib.request.urlopen(\"%s\").read().decode())'" "$(lab_ns "$ns")" "$url" ;;
	*) printf 'ip netns exec %s curl -s %s' "$(lab_ns "$ns")" "$url" ;;
	esac
}

# lab_metric_by_link prints "link value" for every series of one per-link metric that
# belongs to peer, sorted by link name, from a scraped page on stdin. The label order in
# the exposition format is not relied on.
lab_metric_by_link() {
	local metric=$1 peer=$2
	awk -v m="$metric" -v peer="$peer" '
		index($0, m "{") == 1 && index($0, "peer=\"" peer "\"") > 0 {
			if (match($0, /link="[^"]*"/)) printf "%s %.0f\n", substr($0, RSTART + 6, RLENGTH - 7), $NF
		}' | sort -V
}

# ---- the netem lab (test/vm) ----------------------------------------------------------

# lab_netem_lab_unavailable prints why the netem lab (test/vm/lab) cannot run on this
# machine and succeeds, or prints nothing and fails when it can: it needs Debian's
# python3 with yaml, and either a kernel with netem or what test/vm/vm-run needs to boot
# one (qemu, depmod, busybox, and virtme-ng or pip to install it).
lab_netem_lab_unavailable() {
	local repo=$1 missing=()
	[[ -x $repo/test/vm/lab ]] || { echo "no test/vm/lab"; return 0; }
	/usr/bin/python3 -c 'import yaml' 2>/dev/null || { echo "/usr/bin/python3 lacks yaml (apt-get install python3-yaml)"; return 0; }
	command -v iperf3 >/dev/null || { echo "no iperf3"; return 0; }
	if command -v unshare >/dev/null && unshare -n tc qdisc add dev lo root netem delay 1ms >/dev/null 2>&1; then
		return 1
	fi
	command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
	command -v depmod >/dev/null || missing+=(kmod)
	command -v busybox >/dev/null || [[ -x /bin/busybox ]] || missing+=(busybox-static)
	command -v vng >/dev/null || python3 -m pip --version >/dev/null 2>&1 || missing+=("virtme-ng (pip)")
	if ((${#missing[@]})); then
		echo "no netem in this kernel and no VM: missing ${missing[*]}"
		return 0
	fi
	return 1
}
