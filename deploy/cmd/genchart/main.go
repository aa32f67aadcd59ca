// Command genchart regenerates the Helm chart's derived files from their
// sources (see package chartgen): run `go generate` in deploy/, or
// `go run ./cmd/genchart -check` to fail when a generated file is out of date.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "genchart:", err)
		os.Exit(1)
	}
}
