// Command demo shows loadshed at work on loopback: it starts the synthetic backend, puts the
// proxy in front of it with each admission strategy in turn (and with none), offers 0.5x, 2x
// and 5x the backend's capacity with the built-in open-model load generator, and prints what
// clients got: goodput (2xx within the SLO), admitted latency and the share shed.
//
//	go run ./cmd/demo [--workers 8] [--service 20ms] [--slo 100ms] [--duration 5s]
//	                  [--loads 0.5,2,5] [--strategies none,inflight,adaptive,adaptive/vegas,...]
//	go run ./cmd/demo --quick   # none, inflight and adaptive at 2x, printed row by row
//	go run ./cmd/demo --grpc [...]
//
// With --grpc the load is gRPC calls of the backend's loadshed.backend.v1.Backend/Work over h2c,
// through the proxy to the backend's gRPC port: goodput counts OK calls within the SLO, and the
// shed share counts the proxy's trailers-only refusals.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/loadshed/loadshed/internal/cli"
	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/live"
	"github.com/loadshed/loadshed/internal/loadgen"
)

func main() { cli.Main("demo", run) }

var help = cli.Help{
	Name:     "demo",
	Synopsis: "shows on loopback what clients of an overloaded backend get with each admission strategy, and with none",
	Usage:    []string{"[--quick] [--loads 0.5,2,5] [--strategies none,inflight,adaptive,...] [flags]"},
	Examples: []string{"go run ./cmd/demo --quick", "go run ./cmd/demo --strategies none,adaptive --loads 2"},
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet(help, stdout)
	workers := fs.Int("workers", 8, "backend workers")
	service := fs.Duration("service", 20*time.Millisecond, "backend service time (constant)")
	slo := fs.Duration("slo", 100*time.Millisecond, "latency within which a 2xx counts as goodput")
	timeout := fs.Duration("timeout", time.Second, "client timeout")
	duration := fs.Duration("duration", 5*time.Second, "length of each run's measurement")
	warmup := fs.Duration("warmup", time.Second, "load offered before each measurement, left out of the figures")
	loads := fs.String("loads", "0.5,2,5", "offered loads, as multiples of the backend's capacity")
	strategies := fs.String("strategies", strings.Join(live.StrategyOrder, ","), "strategies to show")
	useGRPC := fs.Bool("grpc", false, "offer gRPC calls (Backend/Work over h2c) instead of HTTP requests")
	quick := fs.Bool("quick", false, "a first look: none, inflight and adaptive at 2x, "+quickDuration.String()+" measured each after a "+quickWarmup.String()+" warm-up (flags given still apply)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for name, v := range map[string]string{"loads": "2", "strategies": "none,inflight,adaptive", "duration": quickDuration.String(), "warmup": quickWarmup.String()} {
			if !set[name] {
				_ = fs.Set(name, v) // the values are valid
			}
		}
	}
	var mults []float64
	for _, f := range strings.Split(*loads, ",") {
		m, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || m <= 0 || m > 50 {
			return cli.Usagef("--loads: %q is not a multiple between 0 and 50", f)
		}
		mults = append(mults, m)
	}
	capacity := live.Capacity{Workers: *workers, Service: *service}
	policies := live.Policies(capacity, *slo)
	names := strings.Split(*strategies, ",")
	for _, n := range names {
		// "adaptive/vegas" selects the adaptive strategy with another limit algorithm.
		if algo, ok := strings.CutPrefix(n, "adaptive/"); ok {
			a := config.DefaultAdaptive()
			a.Algorithm = algo
			policies[n] = config.Use(&a)
		}
		p, ok := policies[n]
		if !ok {
			return cli.Usagef("--strategies: unknown strategy %q (want some of %s, or adaptive/ALGORITHM)", n, strings.Join(config.Strategies, ","))
		}
		if _, err := p.Build(); err != nil {
			return cli.Usagef("--strategies: %s: %v", n, err)
		}
	}
	var grpcLoad *loadgen.GRPC
	if *useGRPC {
		grpcLoad = &loadgen.GRPC{}
		fmt.Fprintf(stdout, "gRPC calls of %s over h2c, through the proxy to the backend's gRPC port\n", loadgen.WorkMethod)
	}
	fmt.Fprintf(stdout, "backend: %d workers x %s = capacity %.0f rps; SLO %s; client timeout %s; each run: %s warm-up, then %s measured\n\n",
		*workers, *service, capacity.RPS(), *slo, *timeout, *warmup, *duration)
	width := 0
	for _, name := range names {
		for _, m := range mults {
			width = max(width, len(rowName(name, m)))
		}
	}
	// Each row is printed as its run ends: the whole table takes minutes.
	table, err := loadgen.NewRowWriter(stdout, capacity.RPS(), width)
	if err != nil {
		return err
	}
	for _, name := range names {
		for _, m := range mults {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// A fresh backend and proxy per run: no run inherits another's backlog or limit.
			env, err := live.Start(live.Setup{Workers: *workers, Service: live.Constant(*service), Admission: policies[name], GRPC: *useGRPC})
			if err != nil {
				return err
			}
			fmt.Fprintf(stderr, "running %s at %gx ...\n", name, m)
			res, err := env.Run(ctx, live.Load{Rate: m * capacity.RPS(), Duration: *duration, Warmup: *warmup, Timeout: *timeout, SLO: *slo, GRPC: grpcLoad})
			env.Close()
			if err != nil {
				return fmt.Errorf("%s at %gx: %w", name, m, err)
			}
			if err := table.Write(loadgen.Row{Name: rowName(name, m), Result: res}); err != nil {
				return err
			}
		}
	}
	return nil
}

// The runs of --quick: long enough for the adaptive limit to settle below the overload.
const (
	quickDuration = 3 * time.Second
	quickWarmup   = 2 * time.Second
)

func rowName(strategy string, load float64) string { return fmt.Sprintf("%s @ %gx", strategy, load) }
