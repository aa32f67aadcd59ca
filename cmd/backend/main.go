// Command backend is the synthetic slow-tail backend: a service with a fixed number of workers,
// an unbounded queue inside and sampled service times, for showing the proxy in front of it.
// With --get URL it is instead a one-shot HTTP client for health checks (the image has no curl).
//
// Run `backend --help` for the flags; see package internal/backend for the behaviour.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := exitCode(run(ctx, os.Args[1:], os.Stdout, os.Stderr), os.Stderr)
	stop()
	os.Exit(code)
}
