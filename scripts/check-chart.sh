#!/usr/bin/env bash
# check-chart.sh checks the Helm chart deploy/helm/loadshed:
#   1. helm lint --strict and helm template with every ci/<strategy>-values.yaml, and lint
#      for Kubernetes 1.32 and 1.34 (a regular and a native sidecar);
#   2. bad values (unknown strategy, negative limit, typo'd key, ...) must FAIL,
#      with a message naming the value;
#   3. generated chart files (rules template, dashboard copy, README) are up to date,
#      and the two Dockerfiles' runtime stages agree;
#   4. the Go tests in deploy/ (typed decoding of every manifest, rules, dashboard);
#   5. the release workflow (.github/workflows/) passes actionlint, pinned in
#      scripts/install-tools.sh ($ACTIONLINT, else installed there).
# and the injector's chart deploy/helm/loadshed-injector: lint and template with each of its
# ci/*-values.yaml, bad values rejected, and its rendered settings.yaml the one cmd/injector's
# tests decode (cmd/injector/testdata/valid-chart-defaults.yaml).
# Helm comes from $HELM, else scripts/install-helm.sh builds the pinned version.
# SKIP_GO_TESTS=1 skips step 4.
set -euo pipefail
cd "$(dirname "$0")/.."

HELM="${HELM:-$(scripts/install-helm.sh)}"
export HELM
chart=deploy/helm/loadshed
failed=0
fail() {
	echo "check-chart: FAIL: $*" >&2
	failed=1
}

echo "check-chart: $("$HELM" version --template '{{.Version}}')" >&2
shopt -s nullglob
files=("$chart"/ci/*-values.yaml)
((${#files[@]} >= 8)) || fail "expected a ci values file per strategy, found ${#files[@]}"
for f in "${files[@]}"; do
	if ! out="$("$HELM" lint --strict "$chart" -f "$f" 2>&1)"; then
		fail "helm lint with $f:"$'\n'"$out"
		continue
	fi
	if ! out="$("$HELM" template ci "$chart" -f "$f" 2>&1 >/dev/null)"; then
		fail "helm template with $f:"$'\n'"$out"
		continue
	fi
	echo "check-chart: ok $f" >&2
done
# The sidecar is a regular container before Kubernetes 1.33 and a native sidecar (an init
# container with restartPolicy Always) from 1.33 (proxy.native auto); lint both.
for kv in 1.32.0 1.34.0; do
	if out="$("$HELM" lint --strict "$chart" --kube-version "$kv" 2>&1)"; then
		echo "check-chart: ok, lint for Kubernetes $kv" >&2
	else
		fail "helm lint --kube-version $kv:"$'\n'"$out"
	fi
done

# expect_rejected DESCRIPTION TEXT HELM-ARGS...: helm template of $chart must fail and say TEXT.
expect_rejected() {
	local what="$1" want="$2" out
	shift 2
	if out="$("$HELM" template bad "$chart" "$@" 2>&1)"; then
		fail "$what was accepted ($*)"
	elif ! grep -qF -- "$want" <<<"$out"; then
		fail "$what was rejected, but the message does not name '$want':"$'\n'"$out"
	else
		echo "check-chart: ok, $what rejected: $(grep -F -- "$want" <<<"$out" | head -n1 | sed 's/^[- ]*//')" >&2
	fi
}
expect_rejected "unknown strategy" "at '/admission/strategy'" --set admission.strategy=magic
expect_rejected "negative limit" "at '/admission/inflight/limit'" --set admission.inflight.limit=-1
expect_rejected "typo'd key" "'inflght' not allowed" --set admission.inflght.limit=3
expect_rejected "zero rate" "at '/admission/tokenBucket/rate'" --set admission.tokenBucket.rate=0
expect_rejected "bad duration" "at '/admission/boundedQueue/maxWait'" --set-string admission.boundedQueue.maxWait=eighty
expect_rejected "short grace period" "terminationGracePeriodSeconds" --set terminationGracePeriodSeconds=5
expect_rejected "unknown native mode" "at '/proxy/native'" --set proxy.native=yes
expect_rejected "removed server.fastPath" "'fastPath' not allowed" --set proxy.server.fastPath=true
expect_rejected "short drain token" "at '/proxy/drainToken'" --set proxy.drainToken=short

# The injector's chart.
injector=deploy/helm/loadshed-injector
files=("$injector"/ci/*-values.yaml)
((${#files[@]} >= 3)) || fail "expected at least 3 ci values files in $injector/ci, found ${#files[@]}"
for f in "${files[@]}"; do
	if ! out="$("$HELM" lint --strict "$injector" -f "$f" 2>&1)"; then
		fail "helm lint with $f:"$'\n'"$out"
	elif ! out="$("$HELM" template ci "$injector" -f "$f" 2>&1 >/dev/null)"; then
		fail "helm template with $f:"$'\n'"$out"
	else
		echo "check-chart: ok $f" >&2
	fi
done
chart=$injector expect_rejected "injector: unknown strategy" "at '/injection/strategy'" --set injection.strategy=magic
chart=$injector expect_rejected "injector: failurePolicy" "at '/webhook/failurePolicy'" --set webhook.failurePolicy=Never
chart=$injector expect_rejected "injector: typo'd key" "'webhok' not allowed" --set webhok.timeoutSeconds=3
chart=$injector expect_rejected "injector: renewal window" "tls.renewBeforeDays" --set tls.renewBeforeDays=400
settings=$("$HELM" template ci "$injector" --show-only templates/configmap.yaml | sed -n '/settings.yaml: |/,$p' | tail -n +2 | sed 's/^    //')
if ! diff <(printf '%s\n' "$settings") <(grep -v '^#' cmd/injector/testdata/valid-chart-defaults.yaml) >&2; then
	fail "the injector chart's settings.yaml differs from cmd/injector/testdata/valid-chart-defaults.yaml (update the testdata and check cmd/injector decodes it)"
fi

if ! (cd deploy && go run ./cmd/genchart -check); then
	fail "generated chart files are stale: run 'go generate' in deploy/"
fi
scripts/image.sh --check || fail "Dockerfile and deploy/docker/Dockerfile.local disagree"

# The release workflow cannot run here: actionlint checks it (syntax, expressions, action inputs,
# and its shell with shellcheck where that is installed).
ACTIONLINT="${ACTIONLINT:-$(scripts/install-tools.sh actionlint | sed -n 's/^actionlint=//p')}"
if [[ ! -x "$ACTIONLINT" ]]; then
	fail "actionlint is not installed (scripts/install-tools.sh actionlint)"
elif out="$("$ACTIONLINT" -no-color .github/workflows/*.yml 2>&1)"; then
	echo "check-chart: ok, actionlint $("$ACTIONLINT" -version | head -n1): $(ls .github/workflows/*.yml | tr '\n' ' ')" >&2
else
	fail "actionlint:"$'\n'"$out"
fi

if [[ "${SKIP_GO_TESTS:-0}" != 1 ]]; then
	(cd deploy && go vet ./... && go test -count=1 ./...) || fail "Go tests in deploy/"
fi

if ((failed)); then
	echo "check-chart: FAILED" >&2
	exit 1
fi
echo "check-chart: PASS" >&2
