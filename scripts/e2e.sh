#!/usr/bin/env bash
# e2e.sh: loadshed's end-to-end test on a real kind cluster (issue 7), the one command.
#
#   scripts/e2e.sh
#
# Builds the images (loadshed, k6, Prometheus, Envoy), creates a kind cluster, installs the Helm chart
# once per admission strategy, overloads each with k6 running in the cluster at 3x the backend's
# capacity, checks the alerts in an in-cluster Prometheus, replaces pods under steady load, and
# writes results.md / results.json (and, on failure, the cluster's logs) into $E2E_ARTIFACTS.
# The cluster is always deleted, also on failure or interrupt; a cluster left by an e2e run that
# was killed outright is deleted by the next one (scripts/e2e-owners.sh).
#
# Environment (see e2e/doc.go for the rest):
#   KIND_NODE_IMAGE   kind node image; unset: built by ../shared/tools/kind-offline when that
#                     folder exists, else kind's default image
#   E2E_ARTIFACTS     output folder (default out/e2e)
#   E2E_STRATEGIES    comma-separated subset, e.g. inflight,adaptive (default: all six)
#   E2E_QUOTA         the quota rows (replicas sharing a quota through Redis): 1 (default), 0, only
#   E2E_ENVOY         the Envoy row (Envoy in the pod, loadshed its ext_proc server): 1 (default), 0, only
#   E2E_INJECT        the injection rows (webhook, inject | kubectl apply): 1 (default), 0, only
#   E2E_COHORTS       the fan-out row (a frontend and four services, cohorts off then on): 1 (default), 0, only
#   E2E_STEAL         1 stalls the node through each strategy row's measurement, as a slow day's
#                     steal time does (e2e/doc.go); default none
#   E2E_TIMEOUT       go test timeout (default 40m)
#   E2E_KEEP_CLUSTER  1 keeps the cluster for debugging (delete it with kind delete cluster --name ...)
#   LOADSHED_CACHE    tool cache (default ~/.cache/loadshed)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

export E2E_CLUSTER=${E2E_CLUSTER:-loadshed-e2e-$(date +%s)}
export E2E_ARTIFACTS=${E2E_ARTIFACTS:-$root/out/e2e}
kind=${LOADSHED_CACHE:-$HOME/.cache/loadshed}/bin/kind
source scripts/e2e-owners.sh

# The test deletes its cluster itself, interrupted or not. This is the backstop for a test
# process that was killed outright (go test's own timeout kills without running cleanups).
cleanup() {
	local rc=$?
	if [[ ${E2E_KEEP_CLUSTER:-} != 1 && -x $kind ]] && "$kind" get clusters 2>/dev/null | grep -qxF "$E2E_CLUSTER"; then
		echo "e2e.sh: deleting leftover cluster $E2E_CLUSTER" >&2
		"$kind" delete cluster --name "$E2E_CLUSTER" >&2 || true
	fi
	# Gone, or kept on purpose (then reported as nobody's by later runs, never deleted).
	e2e_owner_release "$E2E_CLUSTER"
	if [[ $rc -ne 0 ]]; then
		echo >&2
		echo "e2e.sh: FAILED (exit $rc). Artifacts: $E2E_ARTIFACTS" >&2
		[[ -f $E2E_ARTIFACTS/commands.log ]] && echo "e2e.sh: every command and its output: $E2E_ARTIFACTS/commands.log" >&2
		[[ -d $E2E_ARTIFACTS/cluster ]] && echo "e2e.sh: cluster logs, pod logs, events: $E2E_ARTIFACTS/cluster" >&2
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$E2E_ARTIFACTS"
# Clusters left by e2e runs that were killed outright go first; this run owns its own.
e2e_reap_stale "$kind" "$E2E_CLUSTER"
e2e_owner_claim "$E2E_CLUSTER"
start=$SECONDS
echo "e2e.sh: cluster $E2E_CLUSTER, artifacts in $E2E_ARTIFACTS"
set +e
(cd e2e && go test -tags e2e -count=1 -v -timeout "${E2E_TIMEOUT:-40m}" -run '^TestKind$' .) 2>&1 | tee -i "$E2E_ARTIFACTS/test.log"
rc=${PIPESTATUS[0]}
set -e
echo "e2e.sh: go test exited $rc after $((SECONDS - start)) s"
if [[ -f $E2E_ARTIFACTS/results.md ]]; then
	echo
	cat "$E2E_ARTIFACTS/results.md"
fi
exit "$rc"
