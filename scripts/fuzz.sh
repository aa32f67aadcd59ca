#!/usr/bin/env bash
# Runs every Go fuzz target of the module for a while each, one after the other.
#
#   scripts/fuzz.sh [SECONDS]      (default 10 s per target; CI calls it with about 10)
#
# FUZZ_PARALLEL sets the fuzzing workers per target (default: go test's, GOMAXPROCS).
# FUZZ_MATCH restricts the run to targets whose name matches an extended regex.
# The checked-in seed corpora (testdata/fuzz/<FuzzName>/) also run as plain tests in go test.
# A failing input is written by go test to testdata/fuzz/<FuzzName>/ of its package: check it in
# with the fix, so it stays a regression test. Prints one line per target (executions, new
# interesting inputs, result) and exits non-zero if any target failed.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-10}
[[ $secs =~ ^[0-9]+$ && $secs -gt 0 ]] || { echo "usage: scripts/fuzz.sh [SECONDS]" >&2; exit 2; }
parallel=()
[[ -n ${FUZZ_PARALLEL:-} ]] && parallel=(-parallel "$FUZZ_PARALLEL")

# Every "func FuzzXxx(" in a test file under cmd, internal and pkg (deploy/ and e2e/ are modules of
# their own and have none; cmd/inject and cmd/injector are modules of their own too, so each runs
# from its directory).
mapfile -t targets < <(grep -rE --include='*_test.go' -o '^func Fuzz[A-Za-z0-9_]*\(' cmd internal pkg 2>/dev/null |
	sed -E 's|^(.*)/[^/]*_test\.go:func (Fuzz[A-Za-z0-9_]*)\($|./\1 \2|' | sort -u)
if [[ ${#targets[@]} -eq 0 ]]; then
	echo "fuzz: no fuzz targets found" >&2
	exit 1
fi

# stop_race: the run's only failure is the coordinator's own deadline, with no failing input.
stop_race() {
	local f=$1
	grep -q '^    context deadline exceeded$' "$f" &&
		! grep -qE 'Failing input written to|panic:|_test\.go:[0-9]+:' "$f" &&
		[[ $(grep -c -- '--- FAIL' "$f") -eq 1 ]]
}

log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=0
summary=()
for t in "${targets[@]}"; do
	read -r pkg name <<<"$t"
	if [[ -n ${FUZZ_MATCH:-} && ! $name =~ $FUZZ_MATCH ]]; then
		continue
	fi
	printf '== %s %s (%ss)\n' "$pkg" "$name" "$secs"
	start=$SECONDS
	# From the package's own directory: cmd/inject and cmd/injector are modules of their own.
	if (cd "$pkg" && go test -run '^$' -fuzz "^${name}\$" -fuzztime "${secs}s" "${parallel[@]}" .) >"$log" 2>&1; then
		result=ok
	elif stop_race "$log"; then
		# Go's fuzz coordinator can report its own -fuzztime deadline as a failure when a
		# worker is mid-call at the moment it expires (go.dev/issue/75804, fixed in Go 1.27).
		# Such a run found nothing: no input failed and none was written.
		result="ok (toolchain stop race at the deadline, no failing input)"
	else
		result=FAILED
		failed=1
		cat "$log"
	fi
	last=$(grep -E '^fuzz: elapsed: .*execs: ' "$log" | tail -1 || true)
	execs=$(sed -nE 's/.*execs: ([0-9]+).*/\1/p' <<<"$last")
	interesting=$(sed -nE 's/.*new interesting: ([0-9]+) \(total: ([0-9]+)\).*/\1 new, corpus \2/p' <<<"$last")
	summary+=("$(printf '%-22s %-20s %6ss %12s execs  %-22s %s' "$name" "$pkg" "$((SECONDS - start))" "${execs:-?}" "${interesting:-}" "$result")")
done

printf '\n%s\n' "fuzz summary (target, package, wall time, executions, inputs, result):"
printf '%s\n' "${summary[@]}"
exit "$failed"
