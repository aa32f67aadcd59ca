// Command lab is a deterministic simulator that runs the real admission strategies under a
// virtual clock: it reproduces the published backpressure comparison, runs a user's policy
// against a modelled workload, sweeps offered load, and compares its predictions with live runs.
// Run "lab help" for the subcommands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	default:
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(1)
	}
}
