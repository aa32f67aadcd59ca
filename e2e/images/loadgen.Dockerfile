# loadshed's own load generator (cmd/loadgen) for the fan-out row's in-cluster Job: Poisson
# arrivals and a W3C traceparent per request. The static binary is built on the host by the e2e
# test. Nothing is pulled.
# Build context (assembled by the e2e test): loadgen.
FROM scratch
COPY loadgen /usr/local/bin/loadgen
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/loadgen"]
