#!/usr/bin/env bash
# The project's test command: static checks, unit tests with the race detector, then the
# overload integration tests on loopback in a separate step without -race (the race detector
# distorts timing). Fails on the first failing step.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

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
