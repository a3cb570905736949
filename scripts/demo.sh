#!/usr/bin/env bash
# aggd demo. By default (DEMO_MODE=auto) it runs the netem lab's three-link SOHO scenario
# (ADSL + cable + LTE with real delay, jitter and loss; test/vm/lab demo soho), inside a
# qemu VM when this kernel lacks netem: live per-link throughput during an iperf3
# transfer each way, then the bond's goodput against the sum of the links, and where
# the results and metrics are. If the netem lab cannot run here, it falls back to the
# TBF namespace demo below (DEMO_MODE=netns forces it, DEMO_MODE=lab forbids it).
#
# The TBF namespace demo: builds a throw-away lab of network namespaces on this machine,
# bonds three TBF-shaped links with aggd, and shows what a single TCP flow gets through
# the bond compared with what each link gives on its own.
#
#   lan ── cpe ═══ up1 (10 Mbit/s) ═══ hub (headend) ── srv
#              ═══ up2 (30 Mbit/s) ═══
#              ═══ up3 (60 Mbit/s) ═══
#
# The same topology, addresses and configs as test/e2e/topology_test.go, under the
# namespace prefix aggd-demo-. Run as root after `make build` (or via `make demo`).
#
# Environment:
#   DEMO_MODE=auto          auto | lab (netem lab, test/vm) | netns (TBF namespaces, below)
#   DEMO_SCENARIO=soho      the lab scenario (test/vm/scenarios/NAME.yaml)
#   DEMO_RATES="10 30 60"   link rates in Mbit/s, one per uplink (1-8 links), both directions
#   DEMO_BASELINE_SECS=5    length of each per-link baseline measurement
#   DEMO_BOND_SECS=10       length of each bond measurement (upstream, downstream)
#   DEMO_HOLD=1             keep the lab running at the end until Enter (to scrape metrics)
#   KEEP=1                  keep the temp dir (configs, keys, logs) after exit
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/.." && pwd)
AGGD="$REPO_DIR/bin/aggd"

# A prefix of its own, so the demo never collides with the e2e tests' namespaces.
# shellcheck disable=SC2034 # used by lib-lab.sh
LAB_PREFIX=aggd-demo-
# shellcheck source-path=SCRIPTDIR source=lib-lab.sh
source "$SCRIPT_DIR/lib-lab.sh"

DEMO_RATES=${DEMO_RATES:-"10 30 60"}
DEMO_BASELINE_SECS=${DEMO_BASELINE_SECS:-5}
DEMO_BOND_SECS=${DEMO_BOND_SECS:-10}
DEMO_HOLD=${DEMO_HOLD:-0}
KEEP=${KEEP:-0}

# Addresses as in the e2e topology.
readonly LAN_HOST=10.99.0.2
readonly SERVER=10.97.0.2
readonly HEADEND_IP=203.0.113.1
readonly TUNNEL_PORT=4242
readonly METRICS_URL=http://127.0.0.1:9469/metrics
# The headend names the CPE's links under this peer name (its entry in hub.yaml); the
# CPE names its links under peer "headend".
readonly CPE_PEER_NAME=cpe1
readonly QUEUE_MS=40
readonly BOND_READY_TIMEOUT=30

RATES=()           # link rates in Mbit/s, index 0 = up1
WORK_DIR=""        # temp dir with keys, configs and logs
STARTED_PIDS=()    # every background process we started, stopped on exit
declare -A BASE_UP BASE_DOWN                  # per-link baseline goodput, Mbit/s
declare -A BOND_BYTES_UP BOND_BYTES_DOWN      # per-link tunnel bytes during the bond runs
GOODPUT_UP="" GOODPUT_DOWN=""                 # bond goodput, Mbit/s

# ---- exit handling --------------------------------------------------------------------

CLEANED_UP=0
# cleanup runs on every exit (success, error, Ctrl-C): the namespaces, daemons and iperf3
# processes must not outlive the demo, or the next run and the host's view get cluttered.
cleanup() {
	local rc=$?
	[[ $CLEANED_UP == 1 ]] && return
	CLEANED_UP=1
	# Every cleanup step must run even if one fails, or if stdout is gone (a closed
	# pipe or terminal makes the messages fail, not the cleanup).
	set +e
	trap '' INT TERM HUP PIPE # a second Ctrl-C must not leave the cleanup half done
	# On a failure the log tails usually say why; on Ctrl-C (130) they are just noise.
	if [[ $rc != 0 && $rc != 130 && -n $WORK_DIR ]]; then
		show_daemon_log_tails
	fi
	if ((${#STARTED_PIDS[@]})) || [[ -n $(lab_list_namespaces) ]]; then
		step "Cleaning up: stopping aggd and iperf3, deleting namespaces $(lab_ns '*')"
	fi
	stop_started_processes
	lab_kill_processes_in_namespaces
	lab_delete_namespaces
	if [[ -n $WORK_DIR && -d $WORK_DIR ]]; then
		if [[ $KEEP == 1 ]]; then
			rm -f -- "$WORK_DIR/.in-use-by-pid"
			info "kept $WORK_DIR (configs, keys, logs) because KEEP=1"
		else
			rm -rf -- "$WORK_DIR"
			info "removed $WORK_DIR (run with KEEP=1 to keep configs and logs)"
		fi
	fi
	exit "$rc"
}

# on_signal turns Ctrl-C / kill into an ordinary exit, so the EXIT trap cleans up once.
on_signal() {
	# Ignore further signals first: with a closed output, the message below raises
	# SIGPIPE again, and a trap that re-enters itself would recurse until bash dies.
	trap '' INT TERM HUP PIPE
	printf '\ninterrupted by SIG%s\n' "$1" >&2 || true
	exit 130
}

# stop_started_processes ends our own children by pid: TERM, so aggd removes its routes
# and NAT rules itself, then KILL after 5 s.
stop_started_processes() {
	local pid i alive
	((${#STARTED_PIDS[@]})) || return 0
	for pid in "${STARTED_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for ((i = 0; i < 50; i++)); do
		alive=0
		for pid in "${STARTED_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
		((alive)) || break
		sleep 0.1
	done
	for pid in "${STARTED_PIDS[@]}"; do
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	STARTED_PIDS=()
}

# show_daemon_log_tails prints the end of the daemons' logs when the demo fails, since
# the temp dir is removed right after (unless KEEP=1).
show_daemon_log_tails() {
	local f
	for f in hub.log cpe.log; do
		[[ -s $WORK_DIR/$f ]] || continue
		printf -- '---- last lines of %s ----\n' "$f" >&2
		tail -n 15 "$WORK_DIR/$f" >&2 || true
	done
}

# start_in_ns runs a command in a namespace in the background with its output in a log
# file, and remembers its pid. `ip netns exec` execs the command, so the pid is the
# command's own.
LAST_PID=""
start_in_ns() {
	local ns=$1 log=$2
	shift 2
	ip netns exec "$(lab_ns "$ns")" "$@" >"$log" 2>&1 &
	LAST_PID=$!
	STARTED_PIDS+=("$LAST_PID")
}

# forget_pid drops a pid that has been waited for from the list cleanup kills, so a
# recycled pid can never hit an unrelated process.
forget_pid() {
	local pid=$1 keep=() p
	for p in "${STARTED_PIDS[@]}"; do [[ $p == "$pid" ]] || keep+=("$p"); done
	STARTED_PIDS=("${keep[@]}")
}

# stop_pid ends one of our background processes early (e.g. the baseline iperf3 servers).
stop_pid() {
	local pid=$1
	kill -TERM "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	forget_pid "$pid"
}

# ---- steps ----------------------------------------------------------------------------

say_what_this_is() {
	cat <<'EOF'
aggd demo
  This demo uses TBF-shaped veth links in network namespaces on this machine: the links
  have rates but no added delay, jitter or loss, because this kernel lacks netem
  (sch_netem). The netem lab in a qemu VM, with realistic links, is work in progress
  (test/vm). The datapath is aggd's userspace one; the eBPF fast path is not wired in yet.
EOF
}

check_prerequisites() {
	step "Checking prerequisites"
	[[ $EUID -eq 0 ]] || die "must run as root (it creates network namespaces): sudo $0"
	local tool missing=()
	for tool in ip tc iperf3 ping ss awk; do
		command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
	done
	((${#missing[@]} == 0)) || die "missing tools: ${missing[*]} (run \`scripts/deps.sh\` or apt-get install iproute2 iperf3 iputils-ping)"
	[[ -x $AGGD ]] || die "$AGGD not found: run \`make build\` first"
	lab_pick_http_getter || die "need curl, wget or python3 to read the metrics (apt-get install curl)"
	parse_rates
	info "root ok; ip, tc, iperf3, ping present; $AGGD present; metrics read with $LAB_HTTP_GETTER"
	info "links: ${RATES[*]} Mbit/s (DEMO_RATES), baseline ${DEMO_BASELINE_SECS}s per link and direction, bond runs ${DEMO_BOND_SECS}s"
}

# parse_rates validates DEMO_RATES early: a typo should fail here, not as a tc error.
parse_rates() {
	local r
	read -r -a RATES <<<"$DEMO_RATES"
	((${#RATES[@]} >= 1 && ${#RATES[@]} <= 8)) || die "DEMO_RATES must list 1 to 8 rates in Mbit/s, got '$DEMO_RATES'"
	for r in "${RATES[@]}"; do
		if ! [[ $r =~ ^[0-9]+(\.[0-9]+)?$ ]] || ! awk -v r="$r" 'BEGIN { exit !(r >= 0.1 && r <= 10000) }'; then
			die "DEMO_RATES: '$r' is not a rate in Mbit/s between 0.1 and 10000"
		fi
	done
	[[ $DEMO_BASELINE_SECS =~ ^[1-9][0-9]*$ ]] || die "DEMO_BASELINE_SECS must be a whole number of seconds"
	[[ $DEMO_BOND_SECS =~ ^[1-9][0-9]*$ ]] || die "DEMO_BOND_SECS must be a whole number of seconds"
}

# remove_leftovers clears what a killed run (kill -9, power loss) left behind, so that
# running the demo again always works: processes and namespaces by prefix, and temp dirs
# still marked as in use by a process that no longer exists (KEEP=1 dirs of finished
# runs carry no marker and are left alone).
remove_leftovers() {
	local left dir pid
	left=$(lab_list_namespaces | xargs -r)
	if [[ -n $left ]]; then
		step "Removing leftovers of an earlier run: namespaces $left and their processes"
		lab_kill_processes_in_namespaces
		lab_delete_namespaces
	fi
	for dir in "${TMPDIR:-/tmp}"/aggd-demo.*; do
		[[ -f $dir/.in-use-by-pid ]] || continue
		pid=$(<"$dir/.in-use-by-pid")
		if ! kill -0 "$pid" 2>/dev/null; then
			step "Removing temp dir $dir of an earlier run that was killed"
			rm -rf -- "$dir"
		fi
	done
}

build_topology() {
	step "Building the namespaces $(lab_ns lan), $(lab_ns cpe), $(lab_ns hub), $(lab_ns srv) and ${#RATES[@]} shaped uplinks"
	lab_add_namespaces lan cpe hub srv
	lab_veth lan eth0 "$LAN_HOST/24" cpe lan0 10.99.0.1/24
	in_ns lan ip route add default via 10.99.0.1
	local i k
	for i in "${!RATES[@]}"; do
		k=$((i + 1))
		lab_veth cpe "up$k" "10.98.$k.2/24" hub "hl$k" "10.98.$k.1/24"
		# Both ends shaped: the CPE's egress is the link's upload, the hub's its download.
		lab_shape cpe "up$k" "${RATES[i]}mbit" "$QUEUE_MS" ||
			die "tc could not add a tbf qdisc on up$k (is sch_tbf available?)"
		lab_shape hub "hl$k" "${RATES[i]}mbit" "$QUEUE_MS"
		# One route to the headend per uplink; aggd's per-uplink sockets pick theirs.
		in_ns cpe ip route add "$HEADEND_IP/32" via "10.98.$k.1" dev "up$k" metric $((100 + k))
		info "up$k: cpe 10.98.$k.2 ⇄ hub 10.98.$k.1, TBF ${RATES[i]} Mbit/s each way, ${QUEUE_MS} ms queue"
	done
	in_ns hub ip addr add "$HEADEND_IP/32" dev lo
	lab_veth hub wan0 10.97.0.1/24 srv eth0 "$SERVER/24"
	info "lan $LAN_HOST → cpe → hub (headend $HEADEND_IP:$TUNNEL_PORT) → srv $SERVER"
}

# iperf_receiver_mbit prints the receiver's goodput in Mbit/s from iperf3's text output
# (-f m makes every rate Mbits/sec); it fails when there is no receiver summary.
iperf_receiver_mbit() {
	awk '/receiver/ { for (i = 2; i <= NF; i++) if ($i == "Mbits/sec") v = $(i - 1) }
		END { if (v == "") exit 1; print v }' "$1"
}

# run_iperf_client runs an iperf3 client in a namespace with its output in log. An
# iperf3 server that has just finished a test sometimes resets the next connection
# ("unable to connect to server: Connection reset by peer"), so a test that fails
# before it starts is retried twice; a failure during a test is not.
run_iperf_client() {
	local log=$1 ns=$2 attempt
	shift 2
	for attempt in 1 2 3; do
		if in_ns "$ns" iperf3 -f m --connect-timeout 3000 "$@" >"$log" 2>&1; then
			return 0
		fi
		grep -q 'unable to connect\|server is busy\|unable to send control message' "$log" || return 1
		((attempt < 3)) && sleep 1
	done
	return 1
}

# measure_baselines measures each uplink on its own, with plain TCP and no tunnel, before
# aggd starts: the links are then idle (no aggd probes), so this is what one TCP flow can
# get from each link, the fair yardstick for the bond.
measure_baselines() {
	step "Measuring each uplink alone, without the tunnel (one TCP flow, ${DEMO_BASELINE_SECS}s per direction)"
	# One iperf3 server per link and direction, each bound to the link's hub address, so
	# no test reuses a server that is still tidying up the previous one.
	local i k port pid log servers=()
	for i in "${!RATES[@]}"; do
		k=$((i + 1))
		for port in $((5210 + k)) $((5220 + k)); do
			start_in_ns hub "$WORK_DIR/iperf3-baseline-server-$port.log" iperf3 -s -B "10.98.$k.1" -p "$port"
			servers+=("$LAST_PID")
			lab_wait_listening hub "$port" || die "iperf3 server for up$k did not start (see $WORK_DIR/iperf3-baseline-server-$port.log)"
		done
	done
	for i in "${!RATES[@]}"; do
		k=$((i + 1))
		port=$((5210 + k))
		log="$WORK_DIR/iperf3-baseline-up$k-upstream.log"
		run_iperf_client "$log" cpe -c "10.98.$k.1" -B "10.98.$k.2" -p "$port" -t "$DEMO_BASELINE_SECS" ||
			die "baseline iperf3 on up$k failed: $(tail -n 3 "$log")"
		BASE_UP[$k]=$(iperf_receiver_mbit "$log") || die "no iperf3 result in $log"
		log="$WORK_DIR/iperf3-baseline-up$k-downstream.log"
		run_iperf_client "$log" cpe -c "10.98.$k.1" -B "10.98.$k.2" -p $((5220 + k)) -t "$DEMO_BASELINE_SECS" -R ||
			die "baseline iperf3 -R on up$k failed: $(tail -n 3 "$log")"
		BASE_DOWN[$k]=$(iperf_receiver_mbit "$log") || die "no iperf3 result in $log"
		info "up$k (TBF ${RATES[i]} Mbit/s): upstream ${BASE_UP[$k]} Mbit/s, downstream ${BASE_DOWN[$k]} Mbit/s"
	done
	for pid in "${servers[@]}"; do stop_pid "$pid"; done
}

generate_keys_and_configs() {
	step "Generating keys and configs in $WORK_DIR"
	local cpe_pub hub_pub i k uplinks=""
	# Private keys must be readable by root only; aggd may refuse anything looser.
	(umask 077 && "$AGGD" genkey >"$WORK_DIR/cpe.key" && "$AGGD" genkey >"$WORK_DIR/hub.key") ||
		die "aggd genkey failed"
	cpe_pub=$("$AGGD" pubkey <"$WORK_DIR/cpe.key") || die "aggd pubkey failed"
	hub_pub=$("$AGGD" pubkey <"$WORK_DIR/hub.key") || die "aggd pubkey failed"
	for i in "${!RATES[@]}"; do
		k=$((i + 1))
		uplinks+="  - name: up$k
    interface: up$k
    rate_up: ${RATES[i]}mbit
    rate_down: ${RATES[i]}mbit
"
	done
	cat >"$WORK_DIR/cpe.yaml" <<EOF
# aggd CPE config written by scripts/demo.sh (same shape as the e2e tests').
private_key_file: $WORK_DIR/cpe.key
headend:
  endpoint: $HEADEND_IP:$TUNNEL_PORT
  public_key: $hub_pub
tunnel:
  address: [100.64.0.2/32]
uplinks:
${uplinks}log:
  level: debug
EOF
	cat >"$WORK_DIR/hub.yaml" <<EOF
# aggd headend config written by scripts/demo.sh (same shape as the e2e tests').
private_key_file: $WORK_DIR/hub.key
listen: $HEADEND_IP:$TUNNEL_PORT
tunnel:
  address: [100.64.0.1/24]
nat:
  out_interface: wan0
peers:
  - name: $CPE_PEER_NAME
    public_key: $cpe_pub
    tunnel_address: [100.64.0.2/32]
log:
  level: debug
EOF
	info "cpe public key $cpe_pub, headend public key $hub_pub"
}

# check_configs runs check-config inside each namespace, because it also checks the
# config against the machine (e.g. that the uplink interfaces exist), and those
# interfaces only exist in the namespaces.
check_configs() {
	step "Validating both configs with aggd check-config"
	local ns out
	for ns in cpe hub; do
		out=$(in_ns "$ns" "$AGGD" check-config "$WORK_DIR/$ns.yaml" 2>&1) ||
			die "aggd check-config rejected $WORK_DIR/$ns.yaml:
$out"
		info "$out"
	done
}

CPE_PID="" HUB_PID=""
start_daemons() {
	step "Starting aggd headend in $(lab_ns hub) and aggd cpe in $(lab_ns cpe)"
	start_in_ns hub "$WORK_DIR/hub.log" "$AGGD" headend --config "$WORK_DIR/hub.yaml"
	HUB_PID=$LAST_PID
	start_in_ns cpe "$WORK_DIR/cpe.log" "$AGGD" cpe --config "$WORK_DIR/cpe.yaml"
	CPE_PID=$LAST_PID
	info "headend pid $HUB_PID, log $WORK_DIR/hub.log; cpe pid $CPE_PID, log $WORK_DIR/cpe.log"
}

# count_links_up counts the links with aggd_link_up 1 for one peer on one side.
count_links_up() {
	local ns=$1 peer=$2 page
	page=$(lab_http_get "$ns" "$METRICS_URL" 2>/dev/null) || {
		echo 0
		return
	}
	lab_metric_by_link aggd_link_up "$peer" <<<"$page" | awk '$2 == 1 { n++ } END { print n + 0 }'
}

# HUB_PEER is the peer label the headend's per-link metrics carry for our CPE. It should
# be the peer's name from hub.yaml (cpe1); some daemon builds label them peer="" instead.
# The demo then says so and reads those series, rather than showing nothing.
HUB_PEER=$CPE_PEER_NAME
HUB_PEER_WARNED=0
detect_hub_peer_label() {
	local page
	page=$(lab_http_get hub "$METRICS_URL" 2>/dev/null) || return 0
	if [[ -n $(lab_metric_by_link aggd_link_up "$CPE_PEER_NAME" <<<"$page") ]]; then
		HUB_PEER=$CPE_PEER_NAME
	elif [[ -n $(lab_metric_by_link aggd_link_up "" <<<"$page") ]]; then
		HUB_PEER=""
		if ((!HUB_PEER_WARNED)); then
			warn "the headend labels this CPE's link metrics peer=\"\", not peer=\"$CPE_PEER_NAME\" (a daemon bug); the demo reads those"
			HUB_PEER_WARNED=1
		fi
	fi
}

# wait_for_bond waits until the LAN host reaches the server through the tunnel and every
# link is up on both sides: a ping alone could pass with a single link up.
wait_for_bond() {
	step "Waiting for the bond (ping $LAN_HOST → $SERVER through it, aggd_link_up = 1 for all ${#RATES[@]} links on both sides)"
	local start=$SECONDS ping_ok cpe_up hub_up n=${#RATES[@]}
	while true; do
		kill -0 "$HUB_PID" 2>/dev/null || die "aggd headend exited early (log: $WORK_DIR/hub.log)"
		kill -0 "$CPE_PID" 2>/dev/null || die "aggd cpe exited early (log: $WORK_DIR/cpe.log)"
		ping_ok=no
		in_ns lan ping -c1 -W1 "$SERVER" >/dev/null 2>&1 && ping_ok=yes
		cpe_up=$(count_links_up cpe headend)
		detect_hub_peer_label
		hub_up=$(count_links_up hub "$HUB_PEER")
		if [[ $ping_ok == yes && $cpe_up == "$n" && $hub_up == "$n" ]]; then
			info "bond up after $((SECONDS - start))s: ping ok, cpe links up $cpe_up/$n, headend links up $hub_up/$n"
			return 0
		fi
		if ((SECONDS - start >= BOND_READY_TIMEOUT)); then
			die "bond not up after ${BOND_READY_TIMEOUT}s: ping $ping_ok, cpe links up $cpe_up/$n, headend links up $hub_up/$n"
		fi
		sleep 0.5
	done
}

print_metrics_info() {
	info "metrics: cpe at $METRICS_URL inside $(lab_ns cpe), headend at $METRICS_URL inside $(lab_ns hub)"
	info "  scrape: $(lab_scrape_command cpe "$METRICS_URL")"
	info "          $(lab_scrape_command hub "$METRICS_URL")"
	info "logs:     $WORK_DIR/cpe.log, $WORK_DIR/hub.log, iperf3 logs in $WORK_DIR"
}

# tx_bytes_snapshot prints "link bytes" of aggd_link_transmit_bytes_total on the sending
# side: the cpe (peer headend) for upstream, the hub (peer cpe1) for downstream.
# The headend may not know the CPE's uplink names and call them link0, link1, … by link
# id; the id is the uplink's position in cpe.yaml, so link<i> is renamed up<i+1> to line
# the two directions up in the summary.
tx_bytes_snapshot() {
	local ns=$1 peer=$2 page
	page=$(lab_http_get "$ns" "$METRICS_URL") || die "could not scrape $METRICS_URL in $(lab_ns "$ns")"
	lab_metric_by_link aggd_link_transmit_bytes_total "$peer" <<<"$page" |
		awk '$1 ~ /^link[0-9]+$/ { $1 = "up" (substr($1, 5) + 1) } { print }'
}

# rate_line prints each link's rate between two snapshots and the sum, in Mbit/s.
rate_line() {
	local prev=$1 cur=$2 seconds=$3
	awk -v s="$seconds" 'NR == FNR { p[$1] = $2; next }
		{ r = ($2 - p[$1]) * 8 / s / 1e6; sum += r; printf "%s %6.1f  ", $1, r }
		END { printf "| all links %6.1f Mbit/s\n", sum }' <(echo "$prev") <(echo "$cur")
}

# run_bond_flow runs one TCP flow lan → srv (or srv → lan) through the bond and prints,
# every second, how much each link carries, from the sender's aggd counters. Those count
# tunnel bytes on the wire (outer headers included), so their sum is a bit above goodput.
run_bond_flow() {
	local direction=$1 ns peer flag=(-p 5201) log first prev cur t_prev t_now t0 pid rc goodput status_shown=""
	if [[ $direction == upstream ]]; then
		ns=cpe peer=headend
	else
		ns=hub peer=$HUB_PEER flag=(-p 5202 -R)
	fi
	step "Bond, $direction: one TCP flow $([[ $direction == upstream ]] && echo "lan → srv" || echo "srv → lan") for ${DEMO_BOND_SECS}s (per-link rates from aggd_link_transmit_bytes_total in $(lab_ns "$ns"), peer=\"$peer\")"
	log="$WORK_DIR/iperf3-bond-$direction.log"
	first=$(tx_bytes_snapshot "$ns" "$peer")
	[[ -n $first ]] || die "no aggd_link_transmit_bytes_total series for peer \"$peer\" in $(lab_ns "$ns")"
	prev=$first
	t0=$(date +%s.%N)
	t_prev=$t0
	ip netns exec "$(lab_ns lan)" iperf3 -c "$SERVER" -t "$DEMO_BOND_SECS" -f m --connect-timeout 3000 \
		"${flag[@]}" >"$log" 2>&1 &
	pid=$!
	STARTED_PIDS+=("$pid")
	while kill -0 "$pid" 2>/dev/null; do
		sleep 1
		cur=$(tx_bytes_snapshot "$ns" "$peer")
		t_now=$(date +%s.%N)
		printf '    t=%4.1fs  %s' "$(awk -v a="$t_now" -v b="$t0" 'BEGIN { print a - b }')" \
			"$(rate_line "$prev" "$cur" "$(awk -v a="$t_now" -v b="$t_prev" 'BEGIN { print a - b }')")"
		printf '\n'
		prev=$cur t_prev=$t_now
		# Halfway through the upstream flow, what the CPE's own status command shows.
		if [[ $direction == upstream && -z $status_shown ]] &&
			awk -v a="$t_now" -v b="$t0" -v h="$DEMO_BOND_SECS" 'BEGIN { exit !(a - b >= h / 2) }'; then
			status_shown=1
			info "what \`aggd status\` shows on the CPE now:"
			in_ns cpe "$AGGD" status --interval 1s 2>&1 | sed 's/^/    /' || warn "aggd status failed"
		fi
	done
	rc=0
	wait "$pid" || rc=$?
	forget_pid "$pid"
	((rc == 0)) || die "iperf3 through the bond ($direction) failed: $(tail -n 3 "$log")"
	goodput=$(iperf_receiver_mbit "$log") || die "no iperf3 result in $log"
	# Per-link bytes over the whole run: shares and average rates in the summary.
	local link bytes
	while read -r link bytes; do
		if [[ $direction == upstream ]]; then BOND_BYTES_UP[$link]=$bytes; else BOND_BYTES_DOWN[$link]=$bytes; fi
	done < <(
		awk 'NR == FNR { p[$1] = $2; next } { print $1, $2 - p[$1] }' <(echo "$first") <(echo "$prev"))
	if [[ $direction == upstream ]]; then GOODPUT_UP=$goodput; else GOODPUT_DOWN=$goodput; fi
	info "goodput (iperf3 receiver): $goodput Mbit/s"
}

# print_summary compares the bond's single-flow goodput with the sum of what each link
# gives a single flow alone. Link shares are of tunnel bytes (outer headers included).
print_summary() {
	step "Summary (Mbit/s, one TCP flow per measurement)"
	local i k link sum_up=0 sum_down=0 tot_up=0 tot_down=0 row='    %-5s %5s | %8s %8s | %17s %17s\n'
	for link in "${!BOND_BYTES_UP[@]}"; do tot_up=$((tot_up + BOND_BYTES_UP[$link])); done
	for link in "${!BOND_BYTES_DOWN[@]}"; do tot_down=$((tot_down + BOND_BYTES_DOWN[$link])); done
	# shellcheck disable=SC2059 # the format is ours
	{
		printf '    %-5s %5s | %-17s | %-35s\n' "" "" "baseline, alone" "carried in the bond run"
		printf '    %-5s %5s | %-17s | %-35s\n' "" "" "(no tunnel)" "(tunnel bytes per s, share)"
		printf "$row" link TBF up down up down
		for i in "${!RATES[@]}"; do
			k=$((i + 1)) link=up$((i + 1))
			sum_up=$(add "$sum_up" "${BASE_UP[$k]}")
			sum_down=$(add "$sum_down" "${BASE_DOWN[$k]}")
			printf "$row" "$link" "${RATES[i]}" "$(fmt1 "${BASE_UP[$k]}")" "$(fmt1 "${BASE_DOWN[$k]}")" \
				"$(share "${BOND_BYTES_UP[$link]:-0}" "$tot_up")" "$(share "${BOND_BYTES_DOWN[$link]:-0}" "$tot_down")"
		done
		printf "$row" sum "" "$(fmt1 "$sum_up")" "$(fmt1 "$sum_down")" "$(share "$tot_up" "$tot_up")" "$(share "$tot_down" "$tot_down")"
	}
	echo
	row='    %-46s %8s %8s\n'
	# shellcheck disable=SC2059
	{
		printf "$row" "" up down
		printf "$row" "best single link alone (no tunnel)" \
			"$(printf '%s\n' "${BASE_UP[@]}" | sort -g | tail -n1 | fmt1)" "$(printf '%s\n' "${BASE_DOWN[@]}" | sort -g | tail -n1 | fmt1)"
		printf "$row" "sum of per-link baselines" "$(fmt1 "$sum_up")" "$(fmt1 "$sum_down")"
		printf "$row" "bond goodput (iperf3 receiver, lan <-> srv)" "$(fmt1 "$GOODPUT_UP")" "$(fmt1 "$GOODPUT_DOWN")"
		printf "$row" "ratio bond goodput / sum of baselines" \
			"$(awk -v g="$GOODPUT_UP" -v s="$sum_up" 'BEGIN { printf "%.2f", (s > 0 ? g / s : 0) }')" \
			"$(awk -v g="$GOODPUT_DOWN" -v s="$sum_down" 'BEGIN { printf "%.2f", (s > 0 ? g / s : 0) }')"
	}
	echo
	info "Every tunnel packet carries 56 bytes of outer headers (IPv4 + UDP + aggd) that the"
	info "baselines do not pay, about 4% of a 1500-byte packet, so ~0.96 is this ratio's ceiling."
}

# add prints a + b (decimals allowed).
add() { awk -v a="$1" -v b="$2" 'BEGIN { print a + b }'; }

# fmt1 prints a number (argument or stdin) with one decimal.
fmt1() {
	if (($#)); then awk -v v="$1" 'BEGIN { printf "%.1f", v }'; else awk '{ printf "%.1f", $1 }'; fi
}

# share formats "<avg Mbit/s over the run> (<percent>)" for one link's bytes.
share() {
	awk -v b="$1" -v t="$2" -v s="$DEMO_BOND_SECS" \
		'BEGIN { printf "%5.1f (%5.1f%%)", b * 8 / s / 1e6, (t > 0 ? 100 * b / t : 0) }'
}

hold_if_asked() {
	[[ $DEMO_HOLD == 1 ]] || return 0
	step "DEMO_HOLD=1: the lab stays up for scraping; press Enter (or Ctrl-C) to clean up"
	read -r _ || true
}

main() {
	trap cleanup EXIT
	trap 'on_signal INT' INT
	trap 'on_signal TERM' TERM
	# A closed terminal or output pipe (./demo.sh | head) would otherwise kill the
	# script without running the EXIT trap, leaving the lab behind.
	trap 'on_signal HUP' HUP
	trap 'on_signal PIPE' PIPE
	say_what_this_is
	check_prerequisites
	remove_leftovers
	# One temp dir for keys, configs and every log, created before anything writes logs.
	WORK_DIR=$(mktemp -d "${TMPDIR:-/tmp}/aggd-demo.XXXXXX")
	echo $$ >"$WORK_DIR/.in-use-by-pid" # lets a later run tell a killed run's dir
	build_topology
	measure_baselines
	generate_keys_and_configs
	check_configs
	start_daemons
	wait_for_bond
	print_metrics_info
	step "Starting iperf3 servers in $(lab_ns srv) (port 5201 for upstream, 5202 for downstream)"
	local port
	for port in 5201 5202; do
		start_in_ns srv "$WORK_DIR/iperf3-server-$port.log" iperf3 -s -p "$port"
		lab_wait_listening srv "$port" || die "iperf3 server on port $port in $(lab_ns srv) did not start"
	done
	run_bond_flow upstream
	run_bond_flow downstream
	print_summary
	print_metrics_info
	if [[ $DEMO_HOLD != 1 ]]; then
		info "(the lab is removed on exit: DEMO_HOLD=1 keeps it up to scrape, KEEP=1 keeps the logs)"
	fi
	hold_if_asked
	step "Done"
}

# run_netem_lab_if_possible hands the demo to the netem lab (test/vm/lab) when it can run
# here. The lab cleans up after itself: in the VM everything dies with the VM (Ctrl-C
# stops qemu), on a host with netem the runner removes its namespaces on exit or signal.
run_netem_lab_if_possible() {
	local mode=${DEMO_MODE:-auto} why
	case $mode in
	netns) return 0 ;;
	lab | auto) ;;
	*) die "DEMO_MODE must be auto, lab or netns, not '$mode'" ;;
	esac
	if why=$(lab_netem_lab_unavailable "$REPO_DIR"); then
		[[ $mode == lab ]] && die "the netem lab cannot run here: $why"
		warn "the netem lab cannot run here ($why): showing the TBF namespace demo instead"
		return 0
	fi
	[[ $EUID -eq 0 ]] || die "must run as root (it creates network namespaces or boots a VM): sudo $0"
	[[ -x $AGGD ]] || die "$AGGD not found: run \`make build\` first"
	cat <<EOF
aggd demo — the netem lab, scenario ${DEMO_SCENARIO:-soho}
  Three access links with real delay, jitter, loss and queues (netem + tbf), aggd as CPE
  and headend, one TCP flow through the bond each way. This kernel's netem decides where
  it runs: directly, or in a qemu VM (about 20 s to boot, software emulation, so link
  rates are scaled down; see test/vm/README.md). Ctrl-C stops it and cleans up.
EOF
	exec "$REPO_DIR/test/vm/lab" demo "${DEMO_SCENARIO:-soho}"
}

run_netem_lab_if_possible
main "$@"
