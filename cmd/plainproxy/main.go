// Command plainproxy is the benchmark's baseline: a net/http/httputil reverse proxy with a
// Rewrite hook and a sized upstream transport, and nothing else (no admission, no metrics).
// It shows what a Go proxy costs before loadshed adds anything.
//
//	plainproxy [--listen ADDR] [--upstream URL] [--max-idle-conns-per-host N] [--version]
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "plainproxy:", err)
		os.Exit(1)
	}
}
