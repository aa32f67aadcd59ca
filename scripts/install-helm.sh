#!/usr/bin/env bash
# install-helm.sh builds the pinned Helm v3 from the Go module proxy into the
# project's tool cache and prints the path of the binary on stdout.
#
# Idempotent: when the cached binary already reports the pinned version it is
# reused. Override the pin with HELM_VERSION, the cache with LOADSHED_CACHE.
#
#   HELM=$(scripts/install-helm.sh)
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE="${LOADSHED_CACHE:-$HOME/.cache/loadshed}"
BIN="$CACHE/bin"
HELM_BIN="$BIN/helm"

installed_version() {
	"$HELM_BIN" version --template '{{.Version}}' 2>/dev/null || true
}

if [[ -x "$HELM_BIN" && "$(installed_version)" == "$HELM_VERSION" ]]; then
	echo "$HELM_BIN"
	exit 0
fi

mkdir -p "$BIN"
echo "install-helm: building helm $HELM_VERSION into $BIN (a few minutes on 2 cores)" >&2
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work" # outside any module, so the project's go.mod does not interfere

# Helm's own release build stamps its version and the Kubernetes version that
# `helm template` and `helm lint` assume (from the client-go it is built with;
# unstamped, Helm assumes Kubernetes 1.20). Do the same.
gomod="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
client_go="$(awk '$1 == "k8s.io/client-go" {print $2}' "$gomod")"
k8s_minor="$(echo "$client_go" | cut -d. -f2)"
if [[ -z "$k8s_minor" ]]; then
	echo "install-helm: cannot find the k8s.io/client-go version in $gomod" >&2
	exit 1
fi
ldflags="-s -w"
ldflags+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.metadata="
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
	ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done
CGO_ENABLED=0 GOBIN="$BIN" GOFLAGS=-trimpath go install -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"

got="$(installed_version)"
if [[ "$got" != "$HELM_VERSION" ]]; then
	echo "install-helm: built helm reports version '$got', want $HELM_VERSION" >&2
	exit 1
fi
echo "$HELM_BIN"
