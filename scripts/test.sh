#!/usr/bin/env bash
# The project's test command: static checks, unit tests with the race detector, then the
# overload integration tests on loopback in a separate step without -race (the race detector
# distorts timing). Fails on the first failing step.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

# The quota store's integration tests run Debian's redis-server on loopback. Install it as .ci/run
# does when this machine can (root and apt-get); otherwise those tests skip, said here once.
# Under CI=true a redis-server that cannot be had fails the run.
if ! command -v redis-server >/dev/null; then
	if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
		step "redis-server for the Redis quota tests (apt-get, as .ci/run does)"
		export DEBIAN_FRONTEND=noninteractive
		if apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends redis-server >/dev/null; then
			service redis-server stop >/dev/null 2>&1 || true # the tests start their own
		fi
	fi
	if ! command -v redis-server >/dev/null; then
		if [[ ${CI:-} == true ]]; then
			echo "test.sh: redis-server is missing and could not be installed: CI must have it (.ci/run installs it)" >&2
			exit 1
		fi
		echo "note: redis-server not found (and not installable here without root and apt-get): the Redis quota tests are skipped"
	fi
fi

step "go vet"
go vet ./...
go vet -tags integration ./...

step "unit tests (-race)"
go test -race -count=1 ./...

step "cmd/inject (a module of its own, for its Kubernetes libraries): vet and unit tests (-race)"
(cd cmd/inject && go vet ./... && go test -race -count=1 ./...)

step "cmd/injector (the admission webhook, a module of its own): vet and unit tests (-race)"
(cd cmd/injector && go vet ./... && go test -race -count=1 ./...)

step "integration tests (overload on loopback, no -race)"
# One package at a time and one test at a time: these tests measure latency and must not share
# the two cores with each other.
pkgs=$(grep -rl --include='*_test.go' '^//go:build integration' internal cmd pkg 2>/dev/null | xargs -r -n1 dirname | sort -u | sed 's|^|./|')
go test -tags integration -count=1 -p 1 -parallel 1 -timeout 20m $pkgs
