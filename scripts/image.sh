#!/usr/bin/env bash
# image.sh builds the loadshed container image without pulling anything: the
# binaries are built on the host (static, CGO_ENABLED=0) and placed in a
# generated build context that deploy/docker/Dockerfile.local turns into the
# same runtime image the repository's Dockerfile describes.
#
#   scripts/image.sh                  # builds loadshed:dev
#   IMAGE=loadshed:v0.1.0 VERSION=v0.1.0 scripts/image.sh
#   scripts/image.sh --push registry.example.com/tools/loadshed:v0.1.0
#                                     # builds it under that reference and pushes it (log in with
#                                     # docker login first); the chart's image.repository/tag,
#                                     # inject --image and the injector's injection.image take it
#   scripts/image.sh --check          # only check that the two Dockerfiles agree
#
# The image is for the host's architecture. Multi-arch images (linux/amd64 and linux/arm64) come
# from the repository's Dockerfile with docker buildx, as the release workflow builds them.
#
# Environment:
#   IMAGE    image reference to tag (default loadshed:dev; --push REF sets it to REF)
#   VERSION  version stamped into the binaries and the labels (default: the tag of IMAGE, "dev"
#            when it has none)
#   BINDIR   use the static binaries proxy, backend and lab found there instead of building them
#   BUILD_TAGS  Go build tags for the binaries, as the Dockerfile's BUILD_TAGS build argument
#               (default nocharts,nolive: the lab in the image writes CSVs, not PNGs, and runs
#               no live comparison, to stay small)
#
# Prints the image reference on stdout when done.
set -euo pipefail
cd "$(dirname "$0")/.."

push=
case "${1:-}" in
--check | "") ;;
--push)
	if [[ $# -ne 2 || -z "$2" || "$2" == -* ]]; then
		echo "image.sh: --push needs an image reference, e.g. --push registry.example.com/tools/loadshed:v0.1.0" >&2
		exit 2
	fi
	push=$2
	IMAGE=$push
	set --
	;;
*)
	echo "usage: scripts/image.sh [--check | --push REF]" >&2
	exit 2
	;;
esac

IMAGE="${IMAGE:-loadshed:dev}"
# The tag: what follows the last ':' after the last '/' (a registry's port is not a tag).
tag=dev
if [[ "${IMAGE##*/}" == *:* ]]; then
	tag="${IMAGE##*:}"
fi
VERSION="${VERSION:-$tag}"
BINARIES=(proxy backend lab)

# runtime_stage prints a Dockerfile from its runtime stage's FROM line to the end.
runtime_stage() {
	awk '/^FROM scratch AS runtime$/ {on = 1} on' "$1"
}

check_dockerfiles() {
	local a b
	a="$(runtime_stage Dockerfile)"
	b="$(runtime_stage deploy/docker/Dockerfile.local)"
	if [[ -z "$a" ]]; then
		echo "image.sh: Dockerfile has no 'FROM scratch AS runtime' stage" >&2
		return 1
	fi
	if [[ "$a" != "$b" ]]; then
		echo "image.sh: the runtime stages of Dockerfile and deploy/docker/Dockerfile.local differ:" >&2
		diff <(echo "$a") <(echo "$b") >&2 || true
		return 1
	fi
}

if [[ "${1:-}" == "--check" ]]; then
	check_dockerfiles
	echo "image.sh: runtime stages agree" >&2
	exit 0
fi
if [[ $# -gt 0 ]]; then
	echo "usage: scripts/image.sh [--check | --push REF]" >&2
	exit 2
fi

check_dockerfiles

ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
rootfs="$ctx/rootfs"
mkdir -p "$rootfs/usr/local/bin"

if [[ -n "${BINDIR:-}" ]]; then
	for b in "${BINARIES[@]}"; do
		install -m 0755 "$BINDIR/$b" "$rootfs/usr/local/bin/$b"
	done
else
	echo "image.sh: building ${BINARIES[*]} (version $VERSION)" >&2
	pkgs=()
	for b in "${BINARIES[@]}"; do pkgs+=("./cmd/$b"); done
	CGO_ENABLED=0 go build -trimpath -tags "${BUILD_TAGS-nocharts,nolive}" \
		-ldflags "-s -w -X github.com/loadshed/loadshed/internal/version.Version=$VERSION" \
		-o "$rootfs/usr/local/bin/" "${pkgs[@]}"
fi
for b in "${BINARIES[@]}"; do
	# A FROM scratch image has no dynamic loader: refuse anything that needs one.
	if file -b "$rootfs/usr/local/bin/$b" 2>/dev/null | grep -q 'dynamically linked'; then
		echo "image.sh: $b is dynamically linked; build it with CGO_ENABLED=0" >&2
		exit 1
	fi
done

cp -R deploy/docker/rootfs/. "$rootfs/"
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
install -d -m 1777 "$rootfs/tmp"
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group"

revision="$(git rev-parse --verify -q HEAD 2>/dev/null || echo unknown)"
if [[ -n "${SOURCE_DATE_EPOCH:-}" ]]; then
	created="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"
else
	created="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
fi

old_id="$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
# The engine here has no BuildKit; the classic builder handles this file.
DOCKER_BUILDKIT=0 docker build --quiet \
	-f deploy/docker/Dockerfile.local \
	--build-arg "VERSION=$VERSION" \
	--build-arg "REVISION=$revision" \
	--build-arg "CREATED=$created" \
	-t "$IMAGE" "$ctx" >&2
new_id="$(docker image inspect -f '{{.Id}}' "$IMAGE")"
if [[ -n "$old_id" && "$old_id" != "$new_id" ]]; then
	# Drop the image this tag used to name, unless something still uses it.
	docker rmi "$old_id" >/dev/null 2>&1 || true
fi
if [[ -n "$push" ]]; then
	echo "image.sh: pushing $push" >&2
	if ! docker push "$push" >&2; then
		echo "image.sh: docker push $push failed (logged in to its registry? docker login ${push%%/*})" >&2
		exit 1
	fi
fi
echo "$IMAGE"
