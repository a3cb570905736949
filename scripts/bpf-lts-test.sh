#!/usr/bin/env bash
# The BPF programs' in-kernel tests on the lab's Debian LTS kernel (6.1 today): its
# verifier differs from the host's (ARCHITECTURE §9), and the programs must load on the
# kernels routers run. Builds the internal/bpf test binary on the host and runs it in
# the lab VM (always the VM, even where the host has netem: the point is the kernel).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
mkdir -p results
bin=results/.bpf-lts.test # the VM sees the repo at the same path
go test -c -o "$bin" ./internal/bpf
trap 'rm -f "$bin"' EXIT
echo "bpf-lts: running the BPF tests in the lab VM"
test/vm/vm-run --vm --timeout "${BPF_LTS_TIMEOUT:-900}" -- bash -c "
	modprobe tun 2>/dev/null; [ -e /dev/net/tun ] || { mkdir -p /dev/net && mknod /dev/net/tun c 10 200; }
	echo \"bpf-lts: kernel \$(uname -r)\"
	cd '$repo/internal/bpf' && '$repo/$bin' -test.count=1 -test.v > /tmp/bpf-lts.log 2>&1; rc=\$?
	grep -E '^(--- |PASS|FAIL|ok)' /tmp/bpf-lts.log; [ \$rc = 0 ] || tail -40 /tmp/bpf-lts.log; exit \$rc"
