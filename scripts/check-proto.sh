#!/usr/bin/env bash
# check-proto.sh: the Go code generated from the repository's .proto files is up to date.
#
#   scripts/check-proto.sh          regenerate into a temporary folder and compare (CI)
#   scripts/check-proto.sh --write  regenerate in place (after editing a .proto)
#
# Tools: protoc from Debian's protobuf-compiler package (apt-get installs it when missing and
# this runs as root), and protoc-gen-go / protoc-gen-go-grpc at the pinned versions below,
# built with `go install` into ${LOADSHED_CACHE:-$HOME/.cache/loadshed}/bin. The generated
# files name the protoc version that made them; a different protoc than Debian 12's is
# reported, and that one header line is left out of the comparison.
set -euo pipefail

PROTOC_GEN_GO_VERSION=v1.36.12     # google.golang.org/protobuf, as in go.mod
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2  # google.golang.org/grpc/cmd/protoc-gen-go-grpc
PROTOC_VERSION="libprotoc 3.21.12" # Debian 12 (bookworm) protobuf-compiler

cd "$(dirname "$0")/.."
cache=${LOADSHED_CACHE:-$HOME/.cache/loadshed}
bin=$cache/bin
mkdir -p "$bin"
log() { printf 'check-proto: %s\n' "$*" >&2; }

write=0
case ${1:-} in
"") ;;
--write) write=1 ;;
*)
	echo "usage: scripts/check-proto.sh [--write]" >&2
	exit 2
	;;
esac

if ! command -v protoc >/dev/null; then
	if [[ $(id -u) -ne 0 ]]; then
		log "protoc is missing: install Debian's protobuf-compiler (apt-get install protobuf-compiler)"
		exit 1
	fi
	log "installing protobuf-compiler with apt-get"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y -qq --no-install-recommends protobuf-compiler >/dev/null 2>&1 ||
		{ apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends protobuf-compiler >/dev/null; }
fi
have_protoc=$(protoc --version)
[[ $have_protoc == "$PROTOC_VERSION" ]] || log "protoc is '$have_protoc', not '$PROTOC_VERSION': its version line is not compared"

# install NAME MODULE@VERSION WANT: go install MODULE into the cache unless NAME --version shows WANT.
install() {
	local name=$1 pkg=$2 want=$3
	if ! "$bin/$name" --version 2>/dev/null | grep -qF -- "$want"; then
		log "building $pkg"
		# Outside any module and workspace: installing a tool never touches this module's go.mod.
		(cd "$cache" && env GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 GOBIN="$bin" go install "$pkg")
		"$bin/$name" --version 2>/dev/null | grep -qF -- "$want" || { log "$name does not report $want"; exit 1; }
	fi
}
install protoc-gen-go "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION" "$PROTOC_GEN_GO_VERSION"
install protoc-gen-go-grpc "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC_VERSION" "${PROTOC_GEN_GO_GRPC_VERSION#v}"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mapfile -t protos < <(git ls-files --cached --others --exclude-standard '*.proto' 2>/dev/null || find . -name '*.proto' -not -path './.git/*')
[[ ${#protos[@]} -gt 0 ]] || { log "no .proto files"; exit 1; }

stale=0
for p in "${protos[@]}"; do
	dir=$(dirname "$p")
	out=$tmp/$dir
	mkdir -p "$out"
	PATH="$bin:$PATH" protoc -I "$dir" \
		--go_out="$out" --go_opt=paths=source_relative \
		--go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
		"$(basename "$p")"
	for g in "$out"/*.go; do
		dst=$dir/$(basename "$g")
		if ((write)); then
			cp "$g" "$dst"
			log "wrote $dst"
			continue
		fi
		if [[ ! -f $dst ]]; then
			log "STALE: $dst is missing; run scripts/check-proto.sh --write"
			stale=1
		elif ! diff -u -I '^//[[:space:]]*protoc[[:space:]]' "$dst" "$g" >"$tmp/diff" 2>&1; then
			log "STALE: $dst differs from what $p generates; run scripts/check-proto.sh --write"
			head -n 40 "$tmp/diff" >&2
			stale=1
		fi
	done
done
((stale == 0)) || exit 1
((write)) || log "ok: ${protos[*]} and the generated code agree"
