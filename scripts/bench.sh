#!/usr/bin/env bash
# make bench: micro-benchmarks of the per-packet Go code and the transmit BPF program,
# then the bond on the three-link namespace topology, what an idle bond puts on a
# backup link, what a headend costs per idle CPE, what a burst of handshakes does to its
# data, how a CPE reconnects during a handshake flood, then forwarding packets per
# second (fast path against --no-bpf) on that topology without shaping, and last a
# soak of the bond (AGGD_BENCH_SOAK). Results go to results/bench/ (JSON and text).
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/bench
mkdir -p "$out"
echo "bench: per-packet micro-benchmarks -> $out/micro.txt"
go test -run '^$' -bench . -benchmem -count 1 ./internal/sched ./internal/reseq ./internal/wire ./internal/auth ./internal/clock ./internal/cookie | tee "$out/micro.txt"
echo "bench: the transmit BPF program per packet, IPv4 and IPv6 uplinks (needs root) -> $out/tx-program.txt"
go test -run '^$' -bench TxProgram -benchtime 100000x -count 3 ./internal/bpf | tee "$out/tx-program.txt"
echo "bench: bond goodput and failover (needs root) -> $out/bond.json"
AGGD_RESULTS="$PWD/$out" go test -run '^$' -bench BondGoodput -benchtime 1x -timeout 10m -v ./test/e2e | grep -v 'level=' | tee "$out/bond.txt"
echo "bench: what an idle bond puts on a backup link and a primary (needs root) -> $out/idle-link.json"
AGGD_RESULTS="$PWD/$out" go test -run '^$' -bench IdleLinkCost -benchtime 1x -timeout 5m -v ./test/e2e | grep -v 'level=' | tee "$out/idle-link.txt"
echo "bench: what one headend costs per idle CPE it serves, 1, 10, 50 and 100 CPEs (needs root; AGGD_BENCH_CPES) -> $out/headend-scale.json"
AGGD_RESULTS="$PWD/$out" go test -run '^$' -bench HeadendScale -benchtime 1x -timeout 10m -v ./test/e2e | grep -v 'level=' | tee "$out/headend-scale.txt"
echo "bench: what a burst of 100 handshakes does to the pings a headend forwards (needs root) -> $out/handshake-burst.json"
AGGD_RESULTS="$PWD/$out" go test -run '^$' -bench HandshakeBurstStall -benchtime 1x -timeout 5m -v ./test/e2e | grep -v 'level=' | tee "$out/handshake-burst.txt"
echo "bench: how long a restarted CPE takes to reconnect while the headend is flooded with handshakes (needs root) -> $out/handshake-flood.json"
AGGD_RESULTS="$PWD/$out" go test -run '^$' -bench ReconnectDuringFlood -benchtime 1x -timeout 5m -v ./test/e2e | grep -v 'level=' | tee "$out/handshake-flood.txt"
echo "bench: forwarding packets per second, fast path vs --no-bpf, unshaped veths (needs root) -> $out/pps.json"
AGGD_RESULTS="$PWD/$out" go test -run '^$' -bench ForwardingPPS -benchtime 1x -timeout 15m -v ./test/e2e | grep -v 'level=' | tee "$out/pps.txt"
echo "bench: one bond through cycles of TCP, an uplink cut and back, UDP, reloads and rekeys, watching both daemons for growth (needs root; AGGD_BENCH_SOAK, default 5m) -> $out/soak.json"
AGGD_RESULTS="$PWD/$out" go test -run '^$' -bench Soak -benchtime 1x -timeout 0 -v ./test/e2e | grep -v 'level=' | tee "$out/soak.txt"
echo "bench: machine: $(nproc) CPUs, $(uname -r), $(date -u +%F)"
