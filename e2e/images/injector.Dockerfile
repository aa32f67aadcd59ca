# The loadshed-injector image for the e2e (issue 14): cmd/injector, built static on the host,
# in an empty image, as deploy/docker/injector.Dockerfile builds it where a registry is
# reachable. Build context (assembled by the e2e test): injector.
FROM scratch
COPY injector /usr/local/bin/injector
USER 65532:65532
EXPOSE 8443 9090
ENTRYPOINT ["/usr/local/bin/injector"]
