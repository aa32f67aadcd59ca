#!/usr/bin/env bash
# Installs a pinned staticcheck into ${LOADSHED_CACHE:-$HOME/.cache/loadshed}/bin (built with the
# local Go from the module proxy, once) and runs it over the main module, with and without the
# integration build tag, so the integration tests are checked too.
#
#   scripts/staticcheck.sh [PACKAGES...]    (default ./...)
#
# Exits non-zero when staticcheck reports anything. Progress goes to stderr.
set -euo pipefail

# staticcheck 2026.2.2, the newest release; 2025.1.1 (v0.6.1) also runs with Go 1.26 and reports
# the same findings on this module. (The module proxy serves them by module version, not by the
# 20xx.y.z release name.)
STATICCHECK_VERSION=v0.8.2

cd "$(dirname "$0")/.."
cache=${LOADSHED_CACHE:-$HOME/.cache/loadshed}
bin=$cache/bin
exe=$bin/staticcheck
mkdir -p "$bin"

if ! "$exe" -version 2>/dev/null | grep -qF "(${STATICCHECK_VERSION#v})"; then
	printf 'staticcheck.sh: building staticcheck %s into %s\n' "$STATICCHECK_VERSION" "$bin" >&2
	# Outside any module and workspace: installing a tool never touches this module's go.mod.
	(cd "$cache" && env GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 GOBIN="$bin" \
		go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION")
fi
"$exe" -version >&2

pkgs=("$@")
[[ ${#pkgs[@]} -gt 0 ]] || pkgs=(./...)
status=0
"$exe" "${pkgs[@]}" || status=1
"$exe" -tags integration "${pkgs[@]}" || status=1
exit "$status"
