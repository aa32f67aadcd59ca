# The k6 load generator for the in-cluster Job: the static, pinned k6 built by
# scripts/install-tools.sh and the scripts of loadtest/k6. Nothing is pulled.
# Build context (assembled by the e2e test): k6, scripts/*.js, proto/backend.proto (the
# backend's gRPC service, for grpc-overload.js).
FROM scratch
COPY k6 /usr/bin/k6
COPY scripts/ /scripts/
COPY proto/ /proto/
USER 65532:65532
WORKDIR /scripts
ENTRYPOINT ["/usr/bin/k6"]
