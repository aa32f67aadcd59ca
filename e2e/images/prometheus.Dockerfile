# Prometheus for the e2e cluster on machines with no container registry: Debian's prometheus
# binary (it links libc) on top of the Debian root filesystem image that
# ../shared/tools/kind-offline/build-node-image leaves behind (same Debian release, so the
# libc it needs is there). On a machine with a registry the test uses the official image.
# Build context (assembled by the e2e test): prometheus.
ARG BASE=kind-offline/rootfs:bookworm
FROM ${BASE}
COPY prometheus /usr/bin/prometheus
USER 65534:65534
WORKDIR /prometheus
ENTRYPOINT ["/usr/bin/prometheus"]
