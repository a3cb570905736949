#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a bounded time or number of inputs each
# (default 50000 inputs; go test's -fuzztime syntax):
#   scripts/fuzz-all.sh 30s
#   scripts/fuzz-all.sh 200000x
# A crasher is written to the package's testdata/fuzz/ by go test and fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-50000x}
failed=0
count=0

# fuzz_one runs one target. Go's fuzzer sometimes ends a time-limited run with "context
# deadline exceeded" and no failing input (a race in the fuzzer at the deadline, not a
# finding); such a run is repeated once. A real finding is written to testdata/fuzz/.
fuzz_one() {
	local pkg=$1 target=$2
	for attempt in 1 2; do
		if go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" >/tmp/aggd-fuzz.log 2>&1; then
			return 0
		fi
		if grep -q 'Failing input written' /tmp/aggd-fuzz.log || ! grep -q 'context deadline exceeded' /tmp/aggd-fuzz.log; then
			return 1
		fi
		echo "fuzz: $target: the fuzzer stopped at its deadline without a finding; running it again ($attempt)"
	done
	return 1
}
for pkg in $(go list ./...); do
	targets=$(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true)
	for target in $targets; do
		count=$((count + 1))
		printf 'fuzz: %-60s %s for %s\n' "$pkg" "$target" "$fuzztime"
		if ! fuzz_one "$pkg" "$target"; then
			echo "fuzz: $target FAILED:"
			tail -n 30 /tmp/aggd-fuzz.log
			failed=$((failed + 1))
		fi
	done
done
echo "fuzz: $count targets run, $failed failed"
[ "$failed" -eq 0 ]
