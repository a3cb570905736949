#!/usr/bin/env bash
# check.sh: exhaustive SPIN verification of the receive-ordering handover
# protocol (handover.pml; docs/fastpath-ordering.md says what and why).
#
# Two kinds of runs:
#  proof   the search must complete with no error: every reachable state of
#          that configuration satisfies every assertion, and every end state
#          (nothing can move any more) the end-state checks.
#  refute  a configuration that is known to break a property (a deliberate
#          protocol breakage, the agg0 delivery order without steering, or a
#          reachability witness). The search must find a counterexample for
#          the named assertion; the shortest one (breadth-first) is replayed
#          and its events kept. If it finds none, the model has stopped
#          exercising what it claims to, and that is a failure too.
#
# Exit status: 0 if every run came out as expected, 1 otherwise.
# Usage: test/model/check.sh [-v] [-k DIR]
#   -v      print each counterexample's event trail
#   -k DIR  keep the work files (pan sources, outputs, trails) in DIR
# Environment: JOBS (parallel runs, default: number of CPUs),
#              DEEP=1 (add larger configurations, minutes and ~4 GB).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
model="$here/handover.pml"
verbose=0
keep=""
while getopts "vk:" opt; do
	case $opt in
	v) verbose=1 ;;
	k) keep=$OPTARG ;;
	*) echo "usage: $0 [-v] [-k DIR]" >&2; exit 2 ;;
	esac
done

for tool in spin gcc; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "check.sh: $tool not found: apt-get install spin gcc (or scripts/deps.sh)" >&2
		exit 1
	fi
done

if [ -n "$keep" ]; then
	mkdir -p "$keep"
	work=$(cd "$keep" && pwd)
else
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
fi
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}

# name | kind | spin -D flags | pan compile flags | pan run flags | expected assertion (refute)
runs=(
	# ---- proofs: the protocol as specified, two CPUs (one per uplink) ----
	"core-n4|proof|-DN=4|-DSAFETY|"
	"core-n5|proof|-DN=5 -DNCANNOT=0|-DSAFETY|"
	"cannot-n5|proof|-DN=5 -DNDUP=0|-DSAFETY|"
	"loss-n6|proof|-DN=6 -DNDUP=0 -DNCANNOT=0|-DSAFETY|"
	"rps-n4|proof|-DN=4 -DRPS|-DSAFETY|"
	"init-bpf-n4|proof|-DN=4 -DINIT_BPF|-DSAFETY|"
	"terminates-n4|proof|-DN=4|-DNP|-l"
	"order-steered-n4|proof|-DN=4 -DCHECK_OUT_ORDER -DRPS -DAGG0_RPS|-DSAFETY|"
	"fix-resync-n4|proof|-DN=4 -DSOCKDROP -DFIX_RESYNC|-DSAFETY|"
	"fix-tally-n4|proof|-DN=4 -DSOCKDROP -DFIX_RESYNC -DFIX_TALLY|-DSAFETY|"
	# ---- the recoveries' timing assumptions broken: a loss, never a duplicate ----
	"tally-early-n3|proof|-DN=3 -DSOCKDROP -DFIX_RESYNC -DFIX_TALLY -DTALLY_EARLY -DSTRICT=0|-DSAFETY|"
	"resync-early-n3|proof|-DN=3 -DSOCKDROP -DFIX_RESYNC -DRESYNC_EARLY -DSTRICT=0|-DSAFETY|"
	"hardening-clear-stale-n4|proof|-DN=4 -DCLEAR_STALE|-DSAFETY|"
	# ---- agg0 delivery order without single-queue steering: must break ----
	"order-2cpu|refute|-DN=4 -DCHECK_OUT_ORDER|-DBFS||s>last_out"
	"order-rps|refute|-DN=4 -DCHECK_OUT_ORDER -DRPS|-DBFS||s>last_out"
	"order-rps-sync|refute|-DN=4 -DCHECK_OUT_ORDER -DRPS -DDAEMON_SYNC|-DBFS||s>last_out"
	# ---- deliberate breakages: each must be caught ----
	"broken-count-after-unlock|refute|-DN=4 -DCOUNT_AFTER_UNLOCK -DSTRICT=0|-DBFS||ndecided[i]==1"
	"broken-repost|refute|-DN=4 -DREPOST -DSTRICT=0|-DBFS||ndecided[s]==0"
	"broken-overcount|refute|-DN=4 -DOVERCOUNT -DSTRICT=0|-DBFS||ndecided[i]==1"
	"broken-sockdrop|refute|-DN=4 -DSOCKDROP|-DBFS||ord.req_stamp==divert"
	"broken-tally-early-died-by-epoch|refute|-DN=3 -DSOCKDROP -DFIX_RESYNC -DFIX_TALLY -DTALLY_EARLY -DDIED_BY_EPOCH -DSTRICT=0|-DBFS||stray_dropped[d_next]"
	"broken-resync-early-died-by-epoch|refute|-DN=3 -DSOCKDROP -DFIX_RESYNC -DRESYNC_EARLY -DDIED_BY_EPOCH -DSTRICT=0|-DBFS||stray_dropped[d_next]"
	# ---- witnesses: the interesting situations are reachable ----
	"reach-stale-request|refute|-DN=4 -DWITNESS=1|-DBFS||1!=1"
	"reach-handback-accepted|refute|-DN=4 -DWITNESS=2|-DBFS||2!=2"
	"reach-handover|refute|-DN=4 -DWITNESS=3|-DBFS||3!=3"
	"reach-epoch-moved|refute|-DN=4 -DWITNESS=4|-DBFS||4!=4"
	"reach-request-died|refute|-DN=4 -DWITNESS=5|-DBFS||5!=5"
	"reach-timer-skip|refute|-DN=4 -DWITNESS=6|-DBFS||6!=6"
	"reach-tally|refute|-DN=4 -DSOCKDROP -DFIX_RESYNC -DFIX_TALLY -DWITNESS=7|-DBFS||7!=7"
)
if [ "${DEEP:-0}" = 1 ]; then
	runs+=(
		"deep-core-n5-all|proof|-DN=5|-DSAFETY -DCOLLAPSE|"
		"deep-order-steered-n5|proof|-DN=5 -DCHECK_OUT_ORDER -DRPS -DAGG0_RPS|-DSAFETY -DCOLLAPSE|"
		"deep-tally-early-n4|proof|-DN=4 -DSOCKDROP -DFIX_RESYNC -DFIX_TALLY -DTALLY_EARLY -DSTRICT=0|-DSAFETY -DCOLLAPSE|"
		"deep-resync-early-n4|proof|-DN=4 -DSOCKDROP -DFIX_RESYNC -DRESYNC_EARLY -DSTRICT=0|-DSAFETY -DCOLLAPSE|"
	)
fi

# one run: writes $dir/result (one summary line) and $dir/status (ok|FAIL)
one() {
	local name=$1 kind=$2 dflags=$3 cflags=$4 rflags=$5 expect=$6
	local dir="$work/$name" opt=-O1
	mkdir -p "$dir"
	cp "$model" "$dir/handover.pml"
	cd "$dir"
	# shellcheck disable=SC2086
	if ! spin $dflags -a handover.pml >spin.out 2>&1; then
		echo "$name: spin -a failed: $(tail -3 spin.out | tr '\n' ' ')" >result; echo FAIL >status; return
	fi
	[ "$kind" = refute ] && opt=-O0
	# shellcheck disable=SC2086
	if ! gcc -w $opt $cflags -o pan pan.c >gcc.out 2>&1; then
		echo "$name: gcc failed: $(tail -3 gcc.out | tr '\n' ' ')" >result; echo FAIL >status; return
	fi
	local t0 t1
	t0=$(date +%s.%N)
	# shellcheck disable=SC2086
	./pan -m1000000 -w24 $rflags >pan.out 2>&1 || true
	t1=$(date +%s.%N)
	local states depth errors secs
	states=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' pan.out | head -1)
	depth=$(sed -n 's/.*depth reached \([0-9]*\).*/\1/p' pan.out | head -1)
	errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' pan.out | head -1)
	secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
	local flags="spin $dflags; pan $cflags $rflags"
	if [ "$kind" = proof ]; then
		if [ "$errors" = 0 ] && ! grep -q "Search not completed" pan.out &&
			! grep -q "max search depth too small" pan.out &&
			! grep -q "out of memory" pan.out; then
			printf '%-27s proved   %10s states  depth %4s  %6ss   [%s]\n' "$name" "$states" "$depth" "$secs" "$flags" >result
			echo ok >status
		else
			printf '%-27s FAILED   errors=%s  [%s]\n%s\n' "$name" "${errors:-?}" "$flags" \
				"$(grep -E 'violated|error|Search not|depth too small|invalid end' pan.out | head -5)" >result
			if [ -f handover.pml.trail ]; then
				# shellcheck disable=SC2086
				spin $dflags -t handover.pml 2>&1 | grep -E 'EV|Error|assert' >trail.txt || true
				sed 's/^ */    /' trail.txt >>result
			fi
			echo FAIL >status
		fi
	else
		local viol
		viol=$(sed -n 's/^pan:1: assertion violated \(.*\) (at depth.*/\1/p' pan.out | head -1)
		if [ "${errors:-0}" != 0 ] && [ -f handover.pml.trail ] && [[ "$viol" == *"$expect"* ]]; then
			# shellcheck disable=SC2086
			spin $dflags -t handover.pml 2>&1 | grep -E 'EV|Error: text|text of failed' |
				sed 's/^ *//' >trail.txt || true
			printf '%-27s refuted  as expected: %s  (trail %s steps, %s states)\n' "$name" "$viol" \
				"$(grep -c '^EV' trail.txt)" "$states" >result
			echo ok >status
		else
			printf '%-27s FAILED   expected a violation of "%s", got errors=%s %s  [%s]\n' \
				"$name" "$expect" "${errors:-?}" "$viol" "$flags" >result
			echo FAIL >status
		fi
	fi
}

echo "handover.pml: $(spin -V 2>/dev/null | head -1); $(gcc --version | head -1); $jobs parallel runs"
start=$(date +%s)
running=0
for r in "${runs[@]}"; do
	IFS='|' read -r name kind dflags cflags rflags expect <<<"$r"
	( one "$name" "$kind" "$dflags" "$cflags" "$rflags" "$expect" ) &
	running=$((running + 1))
	if [ "$running" -ge "$jobs" ]; then
		wait -n || true
		running=$((running - 1))
	fi
done
wait

fail=0
for r in "${runs[@]}"; do
	IFS='|' read -r name kind _ <<<"$r"
	if [ -f "$work/$name/result" ]; then
		cat "$work/$name/result"
	else
		echo "$name: no result"
	fi
	if [ "$(cat "$work/$name/status" 2>/dev/null)" != ok ]; then
		fail=1
	fi
	if [ "$verbose" = 1 ] && [ "$kind" = refute ] && [ -f "$work/$name/trail.txt" ]; then
		sed 's/^/      /' "$work/$name/trail.txt"
	fi
done
echo "total $(($(date +%s) - start))s"
if [ "$fail" != 0 ]; then
	echo "check.sh: FAILED (see above)"
	exit 1
fi
echo "check.sh: all ${#runs[@]} runs as expected"
