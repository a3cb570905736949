#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a bounded time each (default 10s):
#   scripts/fuzz-all.sh 30s
# A crasher is written to the package's testdata/fuzz/ by go test and fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-10s}
failed=0
count=0
for pkg in $(go list ./...); do
	targets=$(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true)
	for target in $targets; do
		count=$((count + 1))
		printf 'fuzz: %-60s %s for %s\n' "$pkg" "$target" "$fuzztime"
		if ! go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" >/tmp/aggd-fuzz.log 2>&1; then
			echo "fuzz: $target FAILED:"
			tail -n 30 /tmp/aggd-fuzz.log
			failed=$((failed + 1))
		fi
	done
done
echo "fuzz: $count targets run, $failed failed"
[ "$failed" -eq 0 ]
