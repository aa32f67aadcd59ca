package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/loadshed/loadshed/internal/cli"
	"github.com/loadshed/loadshed/internal/soak"
)

// errFailed: the soak ran and found problems (exit status 1, the summary says which).
var errFailed = errors.New("soak failed (see the summary)")

var help = cli.Help{
	Name:     "soak",
	Synopsis: "runs the proxy at 10x overload for minutes and fails if its memory, goroutines, descriptors or in-flight grow",
	Usage:    []string{"[--duration D] [--load X] [flags]"},
	Examples: []string{"go run ./cmd/soak --duration 45s"},
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := soak.Default()
	fs := cli.NewFlagSet(help, stdout)
	fs.DurationVar(&c.Duration, "duration", c.Duration, "how long the load runs")
	fs.Float64Var(&c.Load, "load", c.Load, "offered load as a multiple of the backend's nominal capacity")
	fs.IntVar(&c.Workers, "workers", c.Workers, "backend workers (nominal; the schedule halves and doubles them)")
	fs.DurationVar(&c.Service, "service", c.Service, "backend mean service time (nominal; the schedule halves and doubles it)")
	fs.StringVar(&c.Admission, "admission", c.Admission, "the proxy's admission block (YAML)")
	admissionFile := fs.String("admission-file", "", "read the admission block from this file instead")
	fs.StringVar(&c.ProxyBinary, "proxy-binary", "", "run this proxy binary (default: build ./cmd/proxy)")
	fs.StringVar(&c.WorkDir, "out", "", "directory for samples.csv, summary.json, proxy.log and the built proxy (default: a new temporary directory)")
	fs.DurationVar(&c.Interval, "interval", c.Interval, "sampling interval")
	fs.DurationVar(&c.ClientTimeout, "timeout", c.ClientTimeout, "client timeout of every request")
	fs.DurationVar(&c.Chunk, "chunk", c.Chunk, "length of one load-generator run (memory bound of the generator)")
	fs.IntVar(&c.Conns, "conns", c.Conns, "client connections, opened before the load and kept")
	rssMiB := fs.Int64("max-rss-mib", c.Ceilings.RSSBytes>>20, "ceiling of the proxy's resident memory, MiB")
	fs.IntVar(&c.Ceilings.Goroutines, "max-goroutines", c.Ceilings.Goroutines, "ceiling of the proxy's goroutines")
	fs.IntVar(&c.Ceilings.FDs, "max-fds", c.Ceilings.FDs, "ceiling of the proxy's open file descriptors")
	fs.Float64Var(&c.Ceilings.InFlight, "max-inflight", c.Ceilings.InFlight, "ceiling of requests in flight (the admission limit)")
	fs.Float64Var(&c.MaxGrowth, "max-growth", c.MaxGrowth, "allowed growth of the last third's mean over the middle third's (fraction)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	c.Ceilings.RSSBytes = *rssMiB << 20
	if *admissionFile != "" {
		b, err := os.ReadFile(*admissionFile)
		if err != nil {
			return cli.Usagef("--admission-file: %v", err)
		}
		c.Admission = string(b)
	}
	if c.WorkDir == "" {
		dir, err := os.MkdirTemp("", "loadshed-soak-")
		if err != nil {
			return err
		}
		c.WorkDir = dir
	}
	c.Log = stderr
	if err := c.Validate(); err != nil {
		return cli.UsageError{Err: err}
	}
	fmt.Fprintf(stderr, "soak: %s at %gx of %.0f rps; writing to %s\n", c.Duration, c.Load, c.NominalRPS(), c.WorkDir)
	sum, err := soak.Run(ctx, c)
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, sum.Text())
	fmt.Fprintf(stdout, "samples: %s\nsummary: %s/summary.json\n", sum.CSV, c.WorkDir)
	if !sum.Pass {
		return errFailed
	}
	return nil
}
