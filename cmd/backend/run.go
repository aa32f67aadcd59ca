package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/loadshed/loadshed/internal/backend"
	"github.com/loadshed/loadshed/internal/cli"
	"github.com/loadshed/loadshed/internal/version"
)

// flagOf maps Config field names (as in errors and the admin JSON) to flag names.
var flagOf = map[string]string{
	"workers": "--workers", "mean": "--mean", "stddev": "--stddev", "tailProb": "--tail-prob",
	"tailMean": "--tail-mean", "tailMin": "--tail-min", "tailMax": "--tail-max", "fanout": "--fanout",
	"callAll": "--call-all", "callTimeout": "--call-timeout", "userHeader": "--user-header", "callConns": "--call-conns",
}

var help = cli.Help{
	Name:     "backend",
	Synopsis: "the synthetic slow-tail backend to put the proxy in front of (or, with --get, a one-shot health check)",
	Usage: []string{
		"[flags]                         serve the synthetic slow-tail backend",
		"--get URL [--expect-status N]   one GET (10s timeout); exit 0 on 2xx (or on N), else 1",
		"--call-all URL,URL,... [flags]  serve as a frontend: each request calls every URL at once",
	},
	Examples: []string{
		"backend --listen 127.0.0.1:8080 --workers 8 --mean 20ms",
		"backend --listen 127.0.0.1:8080 --admin-listen 127.0.0.1:9090 --call-all http://127.0.0.1:8001/,http://127.0.0.1:8002/",
	},
}

// run parses args and serves until ctx ends, or performs one --get.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	def := backend.DefaultConfig()
	fs := cli.NewFlagSet(help, stdout)
	listen := fs.String("listen", ":8080", "data `address`")
	grpcListen := fs.String("grpc-listen", "", "gRPC `address` (h2c): loadshed.backend.v1.Backend/Work on the same workers, plus health and reflection; off when empty")
	adminListen := fs.String("admin-listen", "", "admin `address` (GET/POST /admin/config, /metrics, /healthz); a TEST TOOL that changes behaviour at run time; off when empty")
	cfg := def
	fs.IntVar(&cfg.Workers, "workers", def.Workers, "requests served at once; more wait inside, FIFO, without bound")
	fs.DurationVar(&cfg.Service.Mean, "mean", def.Service.Mean, "mean of the normal service time")
	fs.DurationVar(&cfg.Service.Stddev, "stddev", def.Service.Stddev, "standard deviation of the normal service time (clamped to mean ± 4 stddev, at least 0)")
	fs.Float64Var(&cfg.Service.TailProb, "tail-prob", def.Service.TailProb, "probability of a slow-path sample, in [0, 1]")
	fs.DurationVar(&cfg.Service.TailMean, "tail-mean", def.Service.TailMean, "mean of the exponential slow path")
	fs.DurationVar(&cfg.Service.TailMin, "tail-min", def.Service.TailMin, "lower clamp of the slow path")
	fs.DurationVar(&cfg.Service.TailMax, "tail-max", def.Service.TailMax, "upper clamp of the slow path")
	fs.IntVar(&cfg.Service.Fanout, "fanout", def.Service.Fanout, "service time is the slowest of this many samples")
	fs.Uint64Var(&cfg.Seed, "seed", def.Seed, "sampler seed (draw order follows arrival order)")
	shutdown := fs.Duration("shutdown-timeout", backend.DefaultShutdownTimeout, "after SIGTERM/SIGINT, how long running and waiting requests may finish")
	get := fs.String("get", "", "one-shot client: GET this `URL`, print the status line, exit 0 on 2xx")
	expect := fs.Int("expect-status", 0, "with --get: exit 0 only on this `status` instead of any 2xx")
	callAll := fs.String("call-all", "", "frontend mode: answer each request by calling every one of these comma-separated `URLs` at once (GET); 200 when every leg answered 2xx, else 503 with Retry-After when one was refused (429/503), else 502; the workers and service-time flags are then unused")
	var call backend.CallAll
	fs.DurationVar(&call.Timeout, "call-timeout", backend.DefaultCallTimeout, "with --call-all: time limit of each leg")
	fs.StringVar(&call.UserHeader, "user-header", backend.DefaultUserHeader, "with --call-all: the user id `header` passed on to every leg (with traceparent, tracestate and baggage)")
	fs.IntVar(&call.Conns, "call-conns", backend.DefaultCallConns, "with --call-all: most connections to each leg's host (kept alive); a leg that finds them busy waits within --call-timeout")

	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *get != "" {
		return backend.Probe(ctx, *get, *expect, backend.ProbeTimeout, stdout)
	}
	if *expect != 0 {
		return cli.Usagef("--expect-status: only with --get")
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var opts []backend.Option
	if *callAll != "" {
		if *grpcListen != "" {
			return cli.Usagef("--grpc-listen: not with --call-all (the frontend mode serves HTTP only)")
		}
		call.URLs = backend.ParseURLList(*callAll)
		if call.Timeout == 0 {
			return cli.Usagef("--call-timeout: must be > 0, got 0s")
		}
		if call.UserHeader == "" {
			return cli.Usagef("--user-header: must not be empty")
		}
		if call.Conns == 0 {
			return cli.Usagef("--call-conns: must be in [1, %d], got 0", backend.MaxCallConns)
		}
		if err := call.Validate(); err != nil {
			return flagProblems(err)
		}
		opts = append(opts, backend.WithCallAll(call))
	} else {
		for _, name := range []string{"call-timeout", "user-header", "call-conns"} {
			if set[name] {
				return cli.Usagef("--%s: only with --call-all", name)
			}
		}
	}
	if *shutdown < 0 {
		return cli.Usagef("--shutdown-timeout: must be >= 0, got %s", *shutdown)
	}
	if err := cfg.Validate(); err != nil {
		return flagProblems(err)
	}

	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	srv, err := backend.New(cfg, append(opts, backend.WithRegistry(reg))...)
	if err != nil {
		return err
	}
	data, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	sc := backend.ServeConfig{
		Data:            data,
		ShutdownTimeout: *shutdown,
		Logger:          cli.NewLogger(stderr, slog.LevelInfo),
	}
	if *adminListen != "" {
		if sc.Admin, err = net.Listen("tcp", *adminListen); err != nil {
			data.Close()
			return fmt.Errorf("--admin-listen: %w", err)
		}
	}
	if *grpcListen != "" {
		if sc.GRPC, err = net.Listen("tcp", *grpcListen); err != nil {
			data.Close()
			if sc.Admin != nil {
				sc.Admin.Close()
			}
			return fmt.Errorf("--grpc-listen: %w", err)
		}
	}
	fmt.Fprintf(stdout, "backend: data on %s\n", data.Addr())
	if sc.GRPC != nil {
		fmt.Fprintf(stdout, "backend: grpc on %s (h2c)\n", sc.GRPC.Addr())
	}
	if sc.Admin != nil {
		fmt.Fprintf(stdout, "backend: admin on %s (test tool)\n", sc.Admin.Addr())
	}
	if len(call.URLs) > 0 {
		fmt.Fprintf(stdout, "backend: frontend calling %s\n", strings.Join(call.URLs, ", "))
		sc.Logger.Info("frontend mode", "legs", len(call.URLs), "callTimeout", call.Timeout, "userHeader", call.UserHeader, "callConns", call.Conns)
	}
	sc.Logger.Info("serving", "version", version.Version, "workers", cfg.Workers, "mean", cfg.Service.Mean,
		"stddev", cfg.Service.Stddev, "tailProb", cfg.Service.TailProb, "tailMean", cfg.Service.TailMean,
		"tailMin", cfg.Service.TailMin, "tailMax", cfg.Service.TailMax, "fanout", cfg.Service.Fanout, "seed", cfg.Seed)
	return srv.Serve(ctx, sc)
}

// flagProblems turns Validate's field errors into a usage error naming the flags.
func flagProblems(err error) error {
	var lines []string
	for _, p := range backend.Problems(err) {
		field, problem, _ := strings.Cut(p, ": ")
		if f, ok := flagOf[field]; ok {
			field = f
		}
		lines = append(lines, field+": "+problem)
	}
	return cli.Usagef("%s", "invalid flags:\n  "+strings.Join(lines, "\n  "))
}
