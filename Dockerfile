# loadshed container image: the sidecar proxy, the synthetic backend and the lab
# simulator in one static, shell-less image that runs as uid/gid 65532.
#
#   docker build --build-arg VERSION=v0.1.0 -t loadshed:v0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 --build-arg VERSION=v0.1.0 -t REF --push .
#
# The build stage runs on the builder's own platform and cross-compiles for the target's (Go
# needs no emulator for that); the release workflow (.github/workflows/release.yml) builds both.
#
# BUILD_TAGS passes Go build tags: the default leaves the lab's charts (nocharts) and its live
# half (nolive: the in-process proxy and backend of "lab compare") out of the image.
#
# On machines without a container registry, scripts/image.sh assembles the same
# runtime stage (see deploy/docker/Dockerfile.local) from binaries built on the
# host. The runtime stage below must stay byte-for-byte identical to that file's;
# scripts/image.sh and the deploy tests check it.

ARG GO_IMAGE=golang:1.26-bookworm

# rootfs: build static binaries and lay out the runtime filesystem under /rootfs.
FROM --platform=${BUILDPLATFORM} ${GO_IMAGE} AS rootfs
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY cmd/ cmd/
COPY internal/ internal/
COPY pkg/ pkg/
ARG VERSION=dev
ARG BUILD_TAGS=nocharts,nolive
ARG TARGETOS
ARG TARGETARCH
RUN GOOS="${TARGETOS:-$(go env GOOS)}" GOARCH="${TARGETARCH:-$(go env GOARCH)}" CGO_ENABLED=0 go build -trimpath -buildvcs=false -tags "${BUILD_TAGS}" \
      -ldflags "-s -w -X github.com/loadshed/loadshed/internal/version.Version=${VERSION}" \
      -o /rootfs/usr/local/bin/ ./cmd/proxy ./cmd/backend ./cmd/lab
COPY deploy/docker/rootfs/ /rootfs/
RUN install -D -m 0644 /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/ca-certificates.crt \
 && install -d -m 1777 /rootfs/tmp

# ---- runtime stage (identical in deploy/docker/Dockerfile.local) ----
FROM scratch AS runtime
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
COPY --from=rootfs /rootfs/ /
LABEL org.opencontainers.image.title="loadshed" \
      org.opencontainers.image.description="Load-shedding sidecar reverse proxy for Kubernetes, with a synthetic slow-tail backend and a simulator" \
      org.opencontainers.image.source="https://github.com/loadshed/loadshed" \
      org.opencontainers.image.url="https://github.com/loadshed/loadshed" \
      org.opencontainers.image.documentation="https://github.com/loadshed/loadshed/tree/main/deploy" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
USER 65532:65532
EXPOSE 8000 9901
ENTRYPOINT ["/usr/local/bin/proxy"]
