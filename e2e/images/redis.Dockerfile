# Redis for the e2e cluster on machines with no container registry: Debian's redis-server and
# the three libraries it links that the base lacks (libatomic, liblzf, libjemalloc), on top of
# the Debian root filesystem image that ../shared/tools/kind-offline/build-node-image leaves
# behind (the same Debian release). On a machine with a registry the test uses the official
# image. Build context (assembled by the e2e test): redis-server, lib/*.
ARG BASE=kind-offline/rootfs:bookworm
FROM ${BASE}
ARG LIBDIR=/usr/lib/x86_64-linux-gnu
COPY redis-server /usr/bin/redis-server
COPY lib/ ${LIBDIR}/
USER 999:999
WORKDIR /data
ENTRYPOINT ["/usr/bin/redis-server"]
