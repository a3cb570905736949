#!/usr/bin/env bash
# smoke.sh — prove the lab's kernel layer: netns + veth + netem + iperf3 + BPF.
#
#   test/vm/smoke.sh [vm-run options]      e.g. test/vm/smoke.sh --tcg
#
# Run from the host it re-runs itself through test/vm/vm-run (which picks the
# host kernel if it has netem, otherwise boots the VM). Inside, it joins two
# fresh namespaces with a veth pair, shapes one direction with netem
# (delay 20ms, rate 20mbit), and measures ping RTT and iperf3 TCP throughput.
# It also reports whether bpffs/bpf(), XDP attach, wireguard and ip netns
# work. A summary is written to $AGGD_RESULTS/vm-smoke.txt (results/ on the
# host). Exit status is non-zero if a required check fails.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# A trivial XDP program (returns XDP_PASS) to prove attach works.
build_xdp() { # $1: output object
	local src
	command -v clang >/dev/null || return 1
	src=$(mktemp --suffix=.c)
	cat >"$src" <<-'EOF'
		#include <linux/bpf.h>
		__attribute__((section("xdp"), used)) int xdp_pass(struct xdp_md *ctx) { return XDP_PASS; }
		char _license[] __attribute__((section("license"), used)) = "GPL";
	EOF
	clang -O2 -target bpf -c "$src" -o "$1" 2>/dev/null
	local rc=$?
	rm -f "$src"
	return $rc
}

if [[ -z ${AGGD_IN_VM:-} ]]; then
	# Compile on the host (clang under TCG takes ~15 s); the guest sees /tmp.
	obj=$(mktemp --suffix=.o /tmp/aggd-smoke-xdp.XXXXXX)
	trap 'rm -f "$obj"' EXIT
	build_xdp "$obj" && export AGGD_SMOKE_XDP_OBJ=$obj
	AGGD_VM_ENV="${AGGD_VM_ENV:-} AGGD_SMOKE_XDP_OBJ" "$here/vm-run" "$@" -- "$here/smoke.sh"
	exit
fi

t0=$(date +%s.%N)
DELAY_MS=20
RATE=20mbit
a=aggd-smk-a-$$
b=aggd-smk-b-$$
ipa=10.231.0.1
ipb=10.231.0.2
results=${AGGD_RESULTS:-/tmp}
out=$results/vm-smoke.txt
tmp=$(mktemp -d)
fail=0
report=()

note() {
	local el
	el=$(awk -v s="$t0" -v e="$(date +%s.%N)" 'BEGIN{printf "%5.1f", e-s}')
	report+=("$*"); echo "smoke: [+${el}s] $*"
}
bad() { note "FAIL $*"; fail=1; }

cleanup() {
	ip netns pids "$a" 2>/dev/null | xargs -r kill 2>/dev/null
	ip netns pids "$b" 2>/dev/null | xargs -r kill 2>/dev/null
	ip netns del "$a" 2>/dev/null
	ip netns del "$b" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT

note "kernel $(uname -r), in_vm=${AGGD_IN_VM}, $(nproc) cpu"

# --- ip netns, veth, netem ------------------------------------------------------
if ip netns add "$a" && ip netns add "$b"; then
	note "ip netns: ok"
else
	bad "ip netns add"; exit 1
fi
ip link add va netns "$a" type veth peer name vb netns "$b" || { bad "veth pair (modprobe veth?)"; exit 1; }
ip -n "$a" addr add $ipa/24 dev va
ip -n "$b" addr add $ipb/24 dev vb
for n in "$a" "$b"; do ip -n "$n" link set lo up; done
ip -n "$a" link set va up
ip -n "$b" link set vb up
if ip netns exec "$a" tc qdisc add dev va root netem delay ${DELAY_MS}ms rate $RATE limit 1000; then
	note "netem: ok ($(ip netns exec "$a" tc qdisc show dev va | head -1))"
else
	bad "netem qdisc: $(modprobe sch_netem 2>&1)"; exit 1
fi

# --- ping RTT ------------------------------------------------------------------------
pingout=$(ip netns exec "$a" ping -c 10 -i 0.2 -W 2 $ipb 2>&1)
rtt=$(sed -n 's#.*= [0-9.]*/\([0-9.]*\)/\([0-9.]*\)/.*#\1#p' <<<"$pingout")
rttmax=$(sed -n 's#.*= [0-9.]*/[0-9.]*/\([0-9.]*\)/.*#\1#p' <<<"$pingout")
loss=$(grep -o '[0-9.]*% packet loss' <<<"$pingout")
if [[ -n $rtt ]] && awk -v r="$rtt" -v d=$DELAY_MS 'BEGIN{exit !(r >= d)}'; then
	note "ping RTT avg ${rtt} ms, max ${rttmax} ms, ${loss} (netem delay ${DELAY_MS}ms one way)"
else
	bad "ping RTT '${rtt:-none}' ms (expected >= ${DELAY_MS}): $pingout"
fi

# --- iperf3 TCP through the shaped direction (a -> b) ---------------------------------
ip netns exec "$b" iperf3 -s -1 -B $ipb >"$tmp/srv.log" 2>&1 &
for _ in $(seq 50); do ip netns exec "$b" ss -ltn 2>/dev/null | grep -q ":5201 " && break; sleep 0.1; done
if ip netns exec "$a" timeout 60 iperf3 -c $ipb -t 5 -f m >"$tmp/cli.log" 2>&1; then
	# Summary lines: "[  5]   0.00-5.00   sec  11.3 MBytes  19.0 Mbits/sec  0  sender"
	sent=$(awk '/sender$/{for(i=1;i<=NF;i++) if($i=="Mbits/sec") print $(i-1)}' "$tmp/cli.log" | tail -1)
	retr=$(awk '/sender$/{for(i=1;i<=NF;i++) if($i=="Mbits/sec") print $(i+1)}' "$tmp/cli.log" | tail -1)
	recv=$(awk '/receiver$/{for(i=1;i<=NF;i++) if($i=="Mbits/sec") print $(i-1)}' "$tmp/cli.log" | tail -1)
	if awk -v r="${recv:-0}" 'BEGIN{exit !(r > 2 && r < 21)}'; then
		note "iperf3 TCP a->b: ${recv} Mbit/s received (sent ${sent}, ${retr} retransmits; netem rate ${RATE})"
	else
		bad "iperf3 TCP a->b '${recv}' Mbit/s, outside (2, 21) for rate ${RATE}: $(tail -4 "$tmp/cli.log")"
	fi
else
	bad "iperf3 client: $(tail -5 "$tmp/cli.log")"
fi
wait 2>/dev/null

# --- BPF ----------------------------------------------------------------------------
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf 2>/dev/null
if mountpoint -q /sys/fs/bpf; then note "bpffs: mounted at /sys/fs/bpf"; else bad "bpffs: cannot mount /sys/fs/bpf"; fi
if command -v bpftool >/dev/null; then
	pin=/sys/fs/bpf/aggd_smoke_$$
	if bpftool map create "$pin" type hash key 4 value 4 entries 8 name aggd_smoke >/dev/null 2>&1; then
		note "bpf() syscall: ok (created and pinned a hash map)"
		rm -f "$pin"
	else
		bad "bpf() syscall: bpftool map create failed: $(bpftool map create "$pin" type hash key 4 value 4 entries 8 name aggd_smoke 2>&1 | head -2)"
	fi
else
	note "bpf() syscall: not checked (no bpftool)"
fi
xdp=${AGGD_SMOKE_XDP_OBJ:-}
if [[ -z $xdp || ! -s $xdp ]]; then
	xdp=$tmp/pass.o
	build_xdp "$xdp" || xdp=""
fi
if [[ -n $xdp ]]; then
	if ip -n "$b" link set dev vb xdp obj "$xdp" sec xdp 2>"$tmp/xdp.err"; then
		mode=$(ip -n "$b" -d link show dev vb | grep -o 'prog/xdp[a-z]* id [0-9]*' | head -1)
		if ip netns exec "$a" ping -c 2 -i 0.2 -W 2 -q $ipb >/dev/null; then
			note "XDP: loaded and attached to veth (${mode}); traffic still passes"
		else
			bad "XDP: attached but ping fails"
		fi
		ip -n "$b" link set dev vb xdp off
	else
		bad "XDP attach: $(cat "$tmp/xdp.err")"
	fi
else
	note "XDP: not checked (no clang with the bpf target)"
fi

# --- wireguard ----------------------------------------------------------------------
if modprobe wireguard 2>"$tmp/wg.err" || [[ -d /sys/module/wireguard ]]; then
	if ip -n "$a" link add wgsmoke type wireguard 2>>"$tmp/wg.err"; then
		note "wireguard: ok (module loads, link created)"
	else
		note "wireguard: module loaded but link add failed: $(cat "$tmp/wg.err")"
	fi
else
	note "wireguard: not available: $(cat "$tmp/wg.err")"
fi

t1=$(date +%s.%N)
note "$(awk -v s="$t0" -v e="$t1" 'BEGIN{printf "smoke wall time inside: %.1fs", e-s}')"
if [[ $fail == 0 ]]; then note "RESULT: PASS"; else note "RESULT: FAIL"; fi
if mkdir -p "$results" 2>/dev/null && printf '%s\n' "${report[@]}" >"$out" 2>/dev/null; then
	echo "smoke: summary written to $out"
fi
exit $fail
