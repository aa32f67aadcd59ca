package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/loadshed/loadshed/bench/harness"
	"github.com/loadshed/loadshed/internal/cli"
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg      harness.Config
		loads    string
		workers  int
		quick    bool
		spike    bool
		scenario string
		cost     harness.CostConfig
		adaptive harness.AdaptiveConfig
		aWorkers string
		aShapes  string
	)
	fs.StringVar(&scenario, "scenario", "peers", "what to run: peers (every target under the overload points and the spike), cost (forwarding ceiling and CPU per request, one core per proxy) adaptive (loadshed adaptive vs Envoy adaptive_concurrency over W, service shapes and loads) fanout (a frontend calling four services at once, each behind its own sidecar: cohorts off vs on at 1.5x, 2x, 3x, plus single-service checks), long (loadshed adaptive as sidecar and as Envoy's ext_proc vs Envoy adaptive_concurrency, minutes at 2x and a capacity halving, shed share per second) or balancing (Envoy balancing three loadshed replicas by round robin, by their ORCA reports and by least request: one slowed, all equal, the slow one recovering); cost, adaptive, long, balancing and fanout never run in CI")
	fs.BoolVar(&quick, "quick", false, "CI smoke: one short point (2x, 3s, one repeat, a few targets, no spike); with --scenario cost or adaptive, their couple-of-minutes variant")
	fs.StringVar(&cfg.OutDir, "out", "", "results directory (default results/bench-<time> under the repository root)")
	fs.StringVar(&cfg.WorkDir, "work", "", "directory for generated configs and logs (default: a temporary directory)")
	fs.BoolVar(&cfg.KeepWork, "keep-work", false, "keep the temporary work directory (configs and logs)")
	fs.StringVar(&loads, "loads", "0.5,1,2,5,10", "overload points as multiples of the backend capacity")
	fs.DurationVar(&cfg.PointDuration, "duration", 8*time.Second, "load duration of each point (balancing: the measured window, default 30s, --quick 10s)")
	fs.IntVar(&cfg.Repeats, "repeats", 3, "repeats of every point (medians are reported)")
	fs.BoolVar(&spike, "spike", true, "also run the spike scenario (0.5x -> 5x -> 0.5x)")
	fs.DurationVar(&cfg.SpikeBase, "spike-base", 5*time.Second, "spike: time at 0.5x before the spike")
	fs.DurationVar(&cfg.SpikeHold, "spike-hold", 10*time.Second, "spike: time at 5x")
	fs.DurationVar(&cfg.SpikeAfter, "spike-after", 15*time.Second, "spike: time at 0.5x after the spike")
	fs.StringVar(&cfg.Targets, "targets", "", "comma-separated target name prefixes (default all: loadshed/, nginx/, haproxy, plainproxy, direct)")
	fs.IntVar(&workers, "backend-workers", 4, "backend workers W")
	fs.DurationVar(&cfg.Backend.Service, "backend-service", 40*time.Millisecond, "backend service time S (constant); 4 x 40ms = 100 rps keeps 10x within what k6 drives on 2 shared cores")
	fs.DurationVar(&cfg.SLO, "slo", 100*time.Millisecond, "latency SLO; limits derive from it")
	fs.DurationVar(&cfg.ClientTimeout, "client-timeout", time.Second, "k6 client timeout")
	fs.StringVar(&cfg.Pin, "pin", harness.PinNone, "CPU placement: none (each proxy one worker thread, nothing pinned), proxy (target on CPU 1) or split (backend and target on CPU 1, k6 on CPU 0)")
	fs.StringVar(&cfg.Generator, "generator", harness.GeneratorK6, "adaptive: what drives each point: k6 (overload.js) or loadgen (cmd/loadgen, the same open-model load at a fraction of k6's CPU; latency from each request's scheduled time)")
	fs.Float64Var(&cfg.MaxLateMs, "max-late-ms", 100, "a point whose iterations start later than this at p99 is invalid")
	fs.BoolVar(&cfg.InstallPeers, "install-peers", true, "apt-get install nginx and haproxy when missing (needs root)")
	k6smoke := fs.String("k6-smoke", "", "instead of the benchmark, run every loadtest/k6 script briefly against this target (e.g. loadshed/inflight) and check its summary")
	reportFrom := fs.String("report-from", "", "re-render the report from DIR/points.json of an earlier run instead of running")
	fs.StringVar(&cfg.Bins.K6, "k6", "", "k6 binary (default: scripts/install-tools.sh k6)")
	fs.StringVar(&cfg.Bins.Proxy, "proxy-bin", "", "prebuilt proxy binary (default: go build ./cmd/proxy)")
	fs.StringVar(&cfg.Bins.Backend, "backend-bin", "", "prebuilt backend binary (default: go build ./cmd/backend)")
	fs.StringVar(&cfg.Bins.PlainProxy, "plainproxy-bin", "", "prebuilt plainproxy binary (default: go build ./cmd/plainproxy)")
	fs.StringVar(&cfg.Bins.Envoy, "envoy", "", "Envoy binary (default: scripts/install-tools.sh envoy)")
	fs.StringVar(&cfg.Bins.Wrk, "wrk", "", "wrk binary, cost scenario (default: wrk on PATH, else apt-get install wrk)")
	fs.DurationVar(&adaptive.Warmup, "warmup", 5*time.Second, "cost, adaptive and balancing: unmeasured load before each measurement (cost default 2s, with --quick 1s; adaptive --quick 3s; balancing 10s, --quick 5s)")
	fs.DurationVar(&adaptive.TraceEvery, "trace-every", 100*time.Millisecond, "adaptive and long: how often each target's concurrency limit is read")
	fs.StringVar(&aWorkers, "adaptive-workers", "4,8,16", "adaptive: backend sizes W (capacity stays --backend-workers/--backend-service; S = W/C)")
	fs.StringVar(&aShapes, "adaptive-services", "constant,slow-tail", "adaptive: service time shapes (constant, slow-tail)")
	fs.Func("adaptive-variant", "an extra target loadshed/adaptive~NAME (and with --scenario peers or long envoy+loadshed~NAME, Envoy's external processor), as NAME=BLOCK with BLOCK the adaptive block in flow style, e.g. noqueue='{queue: {depthPerLimit: 0}}' (repeatable; select it with --targets)", func(v string) error {
		name, block, ok := strings.Cut(v, "=")
		if !ok || name == "" || strings.TrimSpace(block) == "" {
			return fmt.Errorf("want NAME=BLOCK, got %q", v)
		}
		adaptive.Variants = append(adaptive.Variants, harness.AdaptiveVariant{Name: name, Block: block})
		return nil
	})
	fs.BoolVar(&adaptive.FixedService, "adaptive-fixed-service", false, "adaptive: every W serves in --backend-service and C = W/S grows with W (default: C stays --backend-workers/--backend-service and S = W/C)")
	fs.Float64Var(&cost.Rate, "cost-rate", 300, "cost: the fixed rate (requests/s) CPU per request is measured at")
	fs.IntVar(&cost.Connections, "connections", 64, "cost: wrk connections for the forwarding ceiling")
	fs.DurationVar(&cost.CeilingDuration, "ceiling-duration", 10*time.Second, "cost: measured time of each forwarding-ceiling point")
	fs.DurationVar(&cost.LatencyDuration, "latency-duration", 10*time.Second, "cost: how long cmd/loadgen times the added latency at the fixed rate after k6 (0: not timed that way)")
	fs.Float64Var(&cost.BusyLimit, "busy-limit", 0.9, "cost: a point whose load core (CPU 0) was this busy is invalid")
	var bal balancingFlags
	fs.Float64Var(&bal.rate, "balancing-rate", 400, "balancing: rps offered to the replicas with one slowed (2 x 200 + 67 rps), and in the recovery case")
	fs.Float64Var(&bal.equalRate, "balancing-equal-rate", 480, "balancing: rps offered to three equal replicas (600 rps)")
	fs.DurationVar(&bal.switchAfter, "switch-after", 10*time.Second, "balancing: when the slowed replica turns fast in the recovery case, into the measured window")
	fs.StringVar(&bal.cases, "balancing-cases", "slow,equal,recovery", "balancing: the cases to run (slow, equal, recovery)")
	fs.StringVar(&bal.policies, "balancing-policies", "", "balancing: the policies to run (round_robin, client_side_weighted_round_robin, least_request; default each case's)")
	fs.StringVar(&bal.loadshed, "balancing-loadshed", harness.DefaultBalancingLoadshed, "balancing: each sidecar's admission and loadReports block (YAML)")
	longFor := fs.Duration("long", 3*time.Minute, "long: the measured time at the load (with --quick 20s)")
	halvingFor := fs.Duration("halving", time.Minute, "long: the capacity halving's run, the drop at a third of it (with --quick 12s)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *reportFrom != "" {
		return harness.Rerender(*reportFrom, stdout)
	}
	cfg.Backend.Workers = workers
	cfg.Spike = spike
	cfg.Variants = adaptive.Variants
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if cfg.Generator == harness.GeneratorLoadgen && scenario != "adaptive" {
		return cli.Usagef("--generator %s: only --scenario adaptive runs its points with it, not %s", harness.GeneratorLoadgen, scenario)
	}
	switch scenario {
	case "peers":
	case "long":
		if *k6smoke != "" {
			return cli.Usagef("--k6-smoke runs the k6 scripts, not --scenario %s", scenario)
		}
		if err := longScenario(&cfg, set, quick, loads, *longFor, *halvingFor, adaptive.Warmup); err != nil {
			return err
		}
		loads, quick = "", false // the preset replaces the peers' loads and quick point
		cfg.TraceEvery = adaptive.TraceEvery
	case "balancing":
		if *k6smoke != "" {
			return cli.Usagef("--k6-smoke runs the k6 scripts, not --scenario %s", scenario)
		}
		return runBalancing(ctx, args, set, quick, cfg, adaptive.Warmup, bal, stdout, stderr)
	case "fanout":
		if *k6smoke != "" {
			return cli.Usagef("--k6-smoke runs the k6 scripts, not --scenario %s", scenario)
		}
		return runFanout(ctx, args, set, quick, cfg, adaptive.Warmup, loads, stdout, stderr)
	case "cost", "adaptive":
		if *k6smoke != "" {
			return cli.Usagef("--k6-smoke runs the k6 scripts, not --scenario %s", scenario)
		}
		return runScenario(ctx, scenario, args, set, quick, cfg, loads, cost, adaptive, aWorkers, aShapes, stdout, stderr)
	default:
		return cli.Usagef("--scenario: want peers, cost, adaptive, long, balancing or fanout, got %q", scenario)
	}
	if quick {
		cfg.Quick = true
		if !set["loads"] {
			loads = "2"
		}
		if !set["duration"] {
			cfg.PointDuration = 3 * time.Second
		}
		if !set["repeats"] {
			cfg.Repeats = 1
		}
		if !set["spike"] {
			cfg.Spike = false
		}
		if !set["targets"] {
			cfg.Targets = "loadshed/inflight,loadshed/bounded-queue,nginx/limit_conn,haproxy,plainproxy,direct"
		}
	}
	var err error
	if loads != "" {
		if cfg.Loads, err = parseLoads(loads); err != nil {
			return err
		}
	}
	if cfg.RepoRoot, err = repoRoot(); err != nil {
		return err
	}
	if cfg.OutDir == "" {
		cfg.OutDir = filepath.Join(cfg.RepoRoot, "results", "bench-"+time.Now().UTC().Format("20060102-150405"))
	}
	if *k6smoke != "" {
		return harness.ScriptSmoke(ctx, cfg, *k6smoke, stdout, stderr)
	}
	cfg.CommandLine = strings.TrimSpace("go run ./bench/cmd/bench " + strings.Join(args, " "))
	start := time.Now()
	_, err = harness.Run(ctx, cfg, stdout, stderr)
	fmt.Fprintf(stderr, "bench: results in %s (%s)\n", cfg.OutDir, time.Since(start).Round(time.Second))
	return err
}

// longScenario sets cfg up for the long scenario: the adaptive targets (harness.LongTargets)
// at one load (--loads, default 2: an ideal shed share of 0.5) for --long after --warmup, then
// through a capacity halving for --halving; one repeat unless --repeats.
func longScenario(cfg *harness.Config, set map[string]bool, quick bool, loads string, long, halving, warmup time.Duration) error {
	load := 2.0
	if set["loads"] {
		ls, err := parseLoads(loads)
		if err != nil {
			return err
		}
		if len(ls) != 1 {
			return cli.Usagef("--loads: the long scenario runs one load, got %q", loads)
		}
		load = ls[0]
	}
	if !set["warmup"] {
		warmup = 10 * time.Second
	}
	if quick {
		if !set["long"] {
			long = 20 * time.Second
		}
		if !set["halving"] {
			halving = 12 * time.Second
		}
		if !set["warmup"] {
			warmup = 3 * time.Second
		}
	}
	if long < 10*time.Second || halving < 6*time.Second {
		return cli.Usagef("--long must be at least 10s and --halving at least 6s, got %s and %s", long, halving)
	}
	if !set["targets"] {
		cfg.Targets = strings.Join(harness.LongTargets, ",")
	}
	if !set["repeats"] {
		cfg.Repeats = 1
	}
	cfg.Spike = false
	cfg.Extra = harness.LongScenarios(load, long, warmup, halving)
	if !set["out"] {
		root, err := repoRoot()
		if err != nil {
			return err
		}
		cfg.OutDir = filepath.Join(root, "results", "long-"+time.Now().UTC().Format("20060102-150405"))
	}
	return nil
}

// runScenario runs the cost or adaptive scenario, with its own defaults for the shared flags the
// user did not set.
func runScenario(ctx context.Context, scenario string, args []string, set map[string]bool, quick bool, cfg harness.Config, loads string,
	cost harness.CostConfig, adaptive harness.AdaptiveConfig, aWorkers, aShapes string, stdout, stderr io.Writer) error {
	var err error
	if cfg.RepoRoot, err = repoRoot(); err != nil {
		return err
	}
	if cfg.OutDir == "" {
		cfg.OutDir = filepath.Join(cfg.RepoRoot, "results", scenario+"-"+time.Now().UTC().Format("20060102-150405"))
	}
	cfg.CommandLine = strings.TrimSpace("go run ./bench/cmd/bench " + strings.Join(args, " "))
	cfg.Quick = quick
	def := func(name string, apply func()) {
		if !set[name] {
			apply()
		}
	}
	start := time.Now()
	defer func() {
		fmt.Fprintf(stderr, "bench: results in %s (%s)\n", cfg.OutDir, time.Since(start).Round(time.Second))
	}()
	if scenario == "cost" {
		// The setup: a 64 x 20 ms backend, 300 requests/s, two interleaved repeats.
		def("backend-workers", func() { cfg.Backend.Workers = 64 })
		def("backend-service", func() { cfg.Backend.Service = 20 * time.Millisecond })
		def("duration", func() { cfg.PointDuration = 20 * time.Second })
		def("repeats", func() { cfg.Repeats = 2 })
		def("warmup", func() { adaptive.Warmup = 2 * time.Second })
		if quick {
			def("duration", func() { cfg.PointDuration = 5 * time.Second })
			def("ceiling-duration", func() { cost.CeilingDuration = 3 * time.Second })
			def("latency-duration", func() { cost.LatencyDuration = 3 * time.Second })
			def("warmup", func() { adaptive.Warmup = time.Second })
			def("repeats", func() { cfg.Repeats = 1 })
		}
		cost.RepoRoot, cost.OutDir, cost.WorkDir, cost.KeepWork = cfg.RepoRoot, cfg.OutDir, cfg.WorkDir, cfg.KeepWork
		cost.Bins, cost.InstallPeers, cost.Targets, cost.Repeats = cfg.Bins, cfg.InstallPeers, cfg.Targets, cfg.Repeats
		cost.Warmup, cost.RateDuration, cost.Backend, cost.SLO = adaptive.Warmup, cfg.PointDuration, cfg.Backend, cfg.SLO
		cost.ClientTimeout, cost.MaxLateMs, cost.Quick, cost.CommandLine = cfg.ClientTimeout, cfg.MaxLateMs, cfg.Quick, cfg.CommandLine
		_, err = harness.RunCost(ctx, cost, stdout, stderr)
		return err
	}
	// Envoy starts with a min-RTT measurement (50 requests at concurrency 3: 2.7 s when S is
	// 160 ms); the warm-up lets it and every limit settle before the figures start.
	def("loads", func() { loads = "1.5,2,5,10" })
	def("repeats", func() { cfg.Repeats = 2 })
	def("warmup", func() { adaptive.Warmup = 5 * time.Second })
	if quick {
		def("adaptive-workers", func() { aWorkers = "4,16" })
		def("loads", func() { loads = "5" })
		def("duration", func() { cfg.PointDuration = 4 * time.Second })
		def("warmup", func() { adaptive.Warmup = 3 * time.Second })
		def("repeats", func() { cfg.Repeats = 1 })
		def("targets", func() { cfg.Targets = harness.DefaultAdaptive + "," + harness.EnvoyAdaptive })
	}
	cfg.Spike = false
	if cfg.Loads, err = parseLoads(loads); err != nil {
		return err
	}
	if adaptive.Workers, err = parseInts(aWorkers); err != nil {
		return cli.Usagef("--adaptive-workers: %v", err)
	}
	for _, s := range strings.Split(aShapes, ",") {
		if s = strings.TrimSpace(s); s != "" {
			adaptive.Services = append(adaptive.Services, s)
		}
	}
	cfg.TraceEvery = adaptive.TraceEvery
	adaptive.Config = cfg
	_, err = harness.RunAdaptive(ctx, adaptive, stdout, stderr)
	return err
}

// runFanout runs the fan-out scenario (issue 32): harness.DefaultFanoutConfig with --loads
// (default 1.5,2,3), --duration (default 15s), --warmup (default 5s) and --repeats (default 1)
// when set; with --quick one 2x pair and the single-service points, shorter.
func runFanout(ctx context.Context, args []string, set map[string]bool, quick bool, cfg harness.Config, warmup time.Duration,
	loads string, stdout, stderr io.Writer) error {
	f := harness.DefaultFanoutConfig()
	f.WorkDir, f.KeepWork, f.Bins, f.Quick = cfg.WorkDir, cfg.KeepWork, cfg.Bins, quick
	if quick {
		f.Loads, f.Duration, f.Warmup = []float64{2}, 6*time.Second, 3*time.Second
		f.StepBefore, f.StepAfter = 4*time.Second, 8*time.Second
	}
	if set["loads"] {
		ls, err := parseLoads(loads)
		if err != nil {
			return err
		}
		f.Loads = ls
	}
	if set["duration"] {
		f.Duration = cfg.PointDuration
	}
	if set["warmup"] {
		f.Warmup = warmup
	}
	if set["repeats"] {
		f.Repeats = cfg.Repeats
	}
	if set["slo"] {
		f.SLO = cfg.SLO
	}
	var err error
	if f.RepoRoot, err = repoRoot(); err != nil {
		return err
	}
	f.OutDir = cfg.OutDir
	if f.OutDir == "" {
		f.OutDir = filepath.Join(f.RepoRoot, "results", "fanout-"+time.Now().UTC().Format("20060102-150405"))
	}
	f.CommandLine = strings.TrimSpace("go run ./bench/cmd/bench " + strings.Join(args, " "))
	start := time.Now()
	defer func() {
		fmt.Fprintf(stderr, "bench: results in %s (%s)\n", f.OutDir, time.Since(start).Round(time.Second))
	}()
	_, err = harness.RunFanout(ctx, f, stdout, stderr)
	return err
}

// balancingFlags are the balancing scenario's own flags.
type balancingFlags struct {
	rate, equalRate           float64
	switchAfter               time.Duration
	cases, policies, loadshed string
}

// runBalancing runs the balancing scenario: --duration (default 30s) measured after --warmup
// (default 10s), --repeats (default 2), --slo 250ms unless set; with --quick one repeat of 10 s
// after 5 s.
func runBalancing(ctx context.Context, args []string, set map[string]bool, quick bool, cfg harness.Config, warmup time.Duration,
	f balancingFlags, stdout, stderr io.Writer) error {
	b := harness.BalancingConfig{WorkDir: cfg.WorkDir, KeepWork: cfg.KeepWork, Bins: cfg.Bins, Repeats: cfg.Repeats,
		Warmup: warmup, Duration: cfg.PointDuration, SLO: cfg.SLO, ClientTimeout: cfg.ClientTimeout,
		SampleEvery: 250 * time.Millisecond, Loadshed: f.loadshed, Quick: quick}
	def := func(name string, apply func()) {
		if !set[name] {
			apply()
		}
	}
	def("duration", func() { b.Duration = 30 * time.Second })
	def("warmup", func() { b.Warmup = 10 * time.Second })
	def("repeats", func() { b.Repeats = 2 })
	def("slo", func() { b.SLO = 250 * time.Millisecond })
	if quick {
		def("duration", func() { b.Duration = 10 * time.Second })
		def("warmup", func() { b.Warmup = 5 * time.Second })
		def("repeats", func() { b.Repeats = 1 })
		def("switch-after", func() { f.switchAfter = 3 * time.Second })
	}
	want := map[string]bool{}
	for _, c := range strings.Split(f.cases, ",") {
		if c = strings.TrimSpace(c); c != "" {
			want[c] = true
		}
	}
	var pols []string
	for _, p := range strings.Split(f.policies, ",") {
		if p = strings.TrimSpace(p); p != "" {
			pols = append(pols, p)
		}
	}
	for _, cs := range harness.BalancingCases(f.rate, f.equalRate, f.switchAfter) {
		if !want[cs.Name] {
			continue
		}
		delete(want, cs.Name)
		if len(pols) > 0 {
			cs.Policies = pols
		}
		b.Cases = append(b.Cases, cs)
	}
	for c := range want {
		return cli.Usagef("--balancing-cases: want slow, equal or recovery, got %q", c)
	}
	var err error
	if b.RepoRoot, err = repoRoot(); err != nil {
		return err
	}
	b.OutDir = cfg.OutDir
	if b.OutDir == "" {
		b.OutDir = filepath.Join(b.RepoRoot, "results", "balancing-"+time.Now().UTC().Format("20060102-150405"))
	}
	b.CommandLine = strings.TrimSpace("go run ./bench/cmd/bench " + strings.Join(args, " "))
	start := time.Now()
	defer func() {
		fmt.Fprintf(stderr, "bench: results in %s (%s)\n", b.OutDir, time.Since(start).Round(time.Second))
	}()
	_, err = harness.RunBalancing(ctx, b, stdout, stderr)
	return err
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a whole number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func parseLoads(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		x, err := strconv.ParseFloat(strings.TrimSuffix(f, "x"), 64)
		if err != nil {
			return nil, cli.Usagef("--loads: %q is not a number", f)
		}
		out = append(out, x)
	}
	return out, nil
}

// repoRoot finds the repository root: git's top level, or the nearest directory with go.mod.
func repoRoot() (string, error) {
	if out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output(); err == nil {
		if root := strings.TrimSpace(string(out)); root != "" {
			if _, err := os.Stat(filepath.Join(root, "loadtest", "k6")); err == nil {
				return root, nil
			}
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the repository root (run from inside the checkout)")
		}
		dir = parent
	}
}
