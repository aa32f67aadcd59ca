# The loadshed-injector image: cmd/injector, the mutating admission webhook that
# deploy/helm/loadshed-injector runs. One static binary in an empty image, uid/gid 65532.
#
#   docker build -f deploy/docker/injector.Dockerfile -t loadshed-injector:dev .
#
# cmd/injector is a module of its own (its Kubernetes libraries stay out of the sidecar's
# build); it builds against the repository's root module and cmd/inject through replace
# directives, so the context is the repository. Without a registry, the e2e (and so CI) builds
# the same image from a static host build (e2e/images/injector.Dockerfile).

ARG GO_IMAGE=golang:1.26-bookworm

FROM --platform=${BUILDPLATFORM} ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
COPY cmd/ cmd/
COPY internal/ internal/
COPY pkg/ pkg/
ARG VERSION=dev
ARG TARGETOS
ARG TARGETARCH
RUN cd cmd/injector && go mod download \
 && GOOS="${TARGETOS:-$(go env GOOS)}" GOARCH="${TARGETARCH:-$(go env GOARCH)}" CGO_ENABLED=0 go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/loadshed/loadshed/internal/version.Version=${VERSION}" -o /out/injector .

FROM scratch
COPY --from=build /out/injector /usr/local/bin/injector
LABEL org.opencontainers.image.title="loadshed-injector" \
      org.opencontainers.image.description="Mutating admission webhook that adds the loadshed load-shedding sidecar to pods" \
      org.opencontainers.image.source="https://github.com/loadshed/loadshed"
USER 65532:65532
EXPOSE 8443 9090
ENTRYPOINT ["/usr/local/bin/injector"]
