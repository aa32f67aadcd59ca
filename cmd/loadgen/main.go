// Command loadgen sends an open-model HTTP load (or gRPC calls) to a target and reports
// goodput, refusals, latency and late starts (see package internal/loadgen).
//
//	loadgen --target http://127.0.0.1:8000 --rate 800 --duration 8s --timeout 1s --slo 100ms [--json]
//	loadgen --target URL --phases 200:10s,2000:30s,200:20s --poisson-seed 1 --capacity 400
//	loadgen --grpc --target 127.0.0.1:8000 --rate 500 --duration 8s --capacity 100
//	loadgen --target URL --rate 400 --duration 10s --poisson-seed 1 --traceparent --users 10000
//
// --traceparent gives every request a fresh W3C traceparent and --users N a user id header
// drawn from N users, as a frontend's user requests carry them.
//
// With --grpc every request is a unary call of loadshed.backend.v1.Backend/Work (the synthetic
// backend's gRPC method) over h2c, and refusals are counted by grpc-status with their
// grpc-retry-pushback-ms coverage.
//
// It exits with status 1 when the run is invalid (too many late starts) or cannot start, and 2
// on bad flags.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/loadshed/loadshed/internal/backend"
	"github.com/loadshed/loadshed/internal/backend/backendpb"
	"github.com/loadshed/loadshed/internal/cli"
	"github.com/loadshed/loadshed/internal/loadgen"
)

func main() { cli.Main("loadgen", run) }

// usageError marks a problem with the command line (exit status 2).
type usageError = cli.UsageError

// headerFlags collects repeated --header "Name: value" flags.
type headerFlags http.Header

func (h headerFlags) String() string { return "" }

func (h headerFlags) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	if !ok || strings.TrimSpace(name) == "" {
		return fmt.Errorf("want \"Name: value\", got %q", v)
	}
	http.Header(h).Add(strings.TrimSpace(name), strings.TrimSpace(value))
	return nil
}

var help = cli.Help{
	Name:     "loadgen",
	Synopsis: "sends an open-model HTTP load (or gRPC calls) to a target and reports goodput, refusals, latency and late starts",
	Usage: []string{
		"--target URL --rate N --duration D [flags]",
		"--target URL --phases RATE:DURATION,... [flags]",
		"--grpc --target HOST:PORT --rate N --duration D [flags]",
	},
	Examples: []string{"loadgen --target http://127.0.0.1:8000 --rate 800 --duration 8s --timeout 1s --slo 100ms"},
}

// run parses the command line, runs the load and prints the result.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet(help, stdout)
	var (
		target      = fs.String("target", "", "base URL to load, e.g. http://127.0.0.1:8000/ (required)")
		rate        = fs.Float64("rate", 0, "requests per second (with --duration)")
		duration    = fs.Duration("duration", 0, "length of a constant-rate run")
		phases      = fs.String("phases", "", "phases as rate:duration pairs, e.g. 200:10s,2000:30s,200:20s (instead of --rate/--duration)")
		seed        = fs.Uint64("poisson-seed", 0, "draw Poisson arrivals from this seed (0: evenly spaced arrivals)")
		timeout     = fs.Duration("timeout", loadgen.DefaultTimeout, "client timeout, counted from each request's scheduled time")
		slo         = fs.Duration("slo", 0, "latency within which a 2xx answer counts as goodput (default: --timeout)")
		method      = fs.String("method", http.MethodGet, "HTTP method")
		mix         = fs.String("priority-mix", "", "weighted X-Loadshed-Priority values, e.g. critical=30,sheddable=70; requests are tagged by priority")
		maxInFlight = fs.Int("max-inflight", 0, "cap on requests in flight (default: peak rate x timeout + margin)")
		lateTol     = fs.Duration("late-tolerance", loadgen.DefaultLateTolerance, "a request starting later than this after its scheduled time is a late start")
		warmup      = fs.Duration("warmup", 0, "send the first part of the schedule like the rest but leave it out of the figures (a steady state after it)")
		capacity    = fs.Float64("capacity", 0, "capacity of the system under test in rps, for the goodput/C column")
		useGRPC     = fs.Bool("grpc", false, "send gRPC calls of "+loadgen.WorkMethod+" over h2c instead of HTTP requests; --target is host:port or http://host:port")
		grpcConns   = fs.Int("grpc-conns", 0, "with --grpc: HTTP/2 connections to spread the calls over (default: one per 100 calls in flight)")
		grpcSleep   = fs.Duration("grpc-sleep", 0, "with --grpc: ask the backend for this service time instead of a sampled one")
		grpcCode    = fs.Int("grpc-code", 0, "with --grpc: ask the backend to answer with this gRPC status code (0 = OK)")
		grpcReply   = fs.Int("grpc-reply-bytes", 0, "with --grpc: ask the backend for a reply payload of this many bytes")
		asJSON      = fs.Bool("json", false, "print the full result as JSON")
		traceparent = fs.Bool("traceparent", false, "send a fresh random W3C traceparent (version 00, sampled) with every request, replacing one from --header")
		users       = fs.Int("users", 0, "send a user id header (--user-header) with every request, drawn uniformly from this many users (user-0 ... user-<N-1>; the draw follows --poisson-seed)")
		userHeader  = fs.String("user-header", loadgen.DefaultUserHeader, "with --users: the user id `header`")
	)
	headers := headerFlags{}
	fs.Var(headers, "header", "request header \"Name: value\" (repeatable)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}

	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var grpcCfg *loadgen.GRPC
	if *useGRPC {
		if set["method"] {
			return usageError{Err: errors.New("--method: not used with --grpc (every call is " + loadgen.WorkMethod + ")")}
		}
		*method = ""
		work := &backendpb.WorkRequest{Code: int32(*grpcCode), ReplyBytes: int32(*grpcReply)}
		if *grpcCode < 0 || *grpcCode > 16 {
			return usageError{Err: fmt.Errorf("--grpc-code: must be a gRPC status code in [0, 16], got %d", *grpcCode)}
		}
		if *grpcReply < 0 || *grpcReply > backend.MaxReplyBytes {
			return usageError{Err: fmt.Errorf("--grpc-reply-bytes: must be in [0, %d], got %d", backend.MaxReplyBytes, *grpcReply)}
		}
		if set["grpc-sleep"] {
			if *grpcSleep < 0 || *grpcSleep > time.Hour {
				return usageError{Err: fmt.Errorf("--grpc-sleep: must be in [0, 1h], got %s", *grpcSleep)}
			}
			us := grpcSleep.Microseconds()
			work.SleepMicros = &us
		}
		grpcCfg = &loadgen.GRPC{Work: work, Conns: *grpcConns}
	} else {
		for _, name := range []string{"grpc-conns", "grpc-sleep", "grpc-code", "grpc-reply-bytes"} {
			if set[name] {
				return usageError{Err: fmt.Errorf("--%s: only with --grpc", name)}
			}
		}
	}

	var sched loadgen.Schedule
	switch {
	case *phases != "" && (*rate != 0 || *duration != 0):
		return usageError{Err: errors.New("--phases cannot be combined with --rate or --duration")}
	case *phases != "":
		ps, err := loadgen.ParsePhases(*phases)
		if err != nil {
			return usageError{Err: fmt.Errorf("--phases: %w", err)}
		}
		sched = loadgen.Phases(ps...)
	case *rate > 0 && *duration > 0:
		sched = loadgen.ConstantRate(*rate, *duration)
	default:
		return usageError{Err: errors.New("give --rate and --duration, or --phases")}
	}
	if *seed != 0 {
		sched = sched.WithPoisson(*seed)
	}

	base := loadgen.Request{Method: *method, Header: http.Header(headers)}
	prepare := func(int) loadgen.Request { return base }
	if *mix != "" {
		pick, err := loadgen.ParseMix("X-Loadshed-Priority", *mix, http.Header(headers), 1)
		if err != nil {
			return usageError{Err: fmt.Errorf("--priority-mix: %w", err)}
		}
		prepare = func(i int) loadgen.Request {
			r := pick(i)
			r.Method = *method
			return r
		}
	}

	if set["user-header"] && !set["users"] {
		return usageError{Err: errors.New("--user-header: only with --users")}
	}
	if *users < 0 || *users > loadgen.MaxUsers {
		return usageError{Err: fmt.Errorf("--users: must be in [1, %d], got %d", loadgen.MaxUsers, *users)}
	}
	if set["users"] && *users == 0 {
		return usageError{Err: errors.New("--users: must be in [1, " + fmt.Sprint(loadgen.MaxUsers) + "], got 0")}
	}
	id := loadgen.Identity{Traceparent: *traceparent, Users: *users, UserHeader: *userHeader, Seed: *seed}
	if *userHeader == "" {
		return usageError{Err: errors.New("--user-header: must not be empty")}
	}
	wrapped, err := id.Wrap(prepare)
	if err != nil {
		// Users was checked above: the header name is what is left.
		return usageError{Err: fmt.Errorf("--user-header: not a valid header name: %q", *userHeader)}
	}
	prepare = wrapped

	cfg := loadgen.Config{
		Target:        *target,
		Schedule:      sched,
		Timeout:       *timeout,
		SLO:           *slo,
		Prepare:       prepare,
		MaxInFlight:   *maxInFlight,
		LateTolerance: *lateTol,
		Warmup:        *warmup,
		GRPC:          grpcCfg,
	}
	if *timeout <= 0 {
		return usageError{Err: fmt.Errorf("--timeout: must be > 0, got %s", *timeout)}
	}
	if *lateTol <= 0 {
		return usageError{Err: fmt.Errorf("--late-tolerance: must be > 0, got %s", *lateTol)}
	}
	res, err := loadgen.Run(ctx, cfg)
	if res == nil {
		return usageError{Err: err} // invalid configuration: nothing was sent
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if werr := enc.Encode(res); werr != nil {
			return werr
		}
	} else {
		name := fmt.Sprintf("%s %s", *method, *target)
		if *useGRPC {
			name = "gRPC " + *target
		}
		if werr := loadgen.WriteTable(stdout, *capacity, []loadgen.Row{{Name: name, Result: res}}); werr != nil {
			return werr
		}
		fmt.Fprintln(stdout)
		if werr := loadgen.WriteSummary(stdout, res); werr != nil {
			return werr
		}
	}
	if err != nil {
		return err
	}
	if !res.Valid {
		return fmt.Errorf("invalid run: %s", res.InvalidReason)
	}
	return nil
}
