package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/loadshed/loadshed/internal/cli"
	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/lab"
	"github.com/loadshed/loadshed/internal/version"
)

// commands are lab's subcommands, in the order help lists them, with their synopses and an
// example each.
var commands = [][3]string{
	{"backpressure", "reproduce the published comparison (1000 requests, 200 rps offered, 100 rps target)", "lab backpressure --no-charts"},
	{"run", "run strategies (or a proxy config) against a modelled workload", "lab run --arrivals poisson:rate=400 --duration 10s"},
	{"sweep", "run strategies at offered loads from 0.25x to 10x of capacity", "lab sweep --loads 0.5,1,2,5"},
	{"compare", "run a scenario in the lab and live, side by side (calibrating the hop first)", "lab compare --load 2 --duration 10s"},
	{"fanout", "predict a call graph: user requests fanning out to N services, independent sidecars against cohorts", "lab fanout --loads 2"},
	{"calibrate", "measure the hop through the live proxy, unloaded and at capacity", "lab calibrate --servers 8"},
	{"quota", "predict what a per-client quota gives a client at given replica counts", "lab quota --clients '{rate: 100, burst: 20}' --replicas 1,2,3"},
	{"trace", "write the arrivals of a workload as a trace file", "lab trace --arrivals poisson:rate=100 --duration 10s --out arrivals.trace"},
	{"help", "show this text", "lab help"},
}

var help = cli.Help{
	Name:     "lab",
	Synopsis: "a deterministic simulator running the real admission strategies under a virtual clock",
	Usage:    []string{"<command> [flags]", "<command> --help", "--version"},
	Examples: []string{"go run ./cmd/lab sweep --strategies none,inflight,adaptive"},
}

// writeUsage prints lab's help: the synopsis, usage and example, then the commands.
func writeUsage(w io.Writer) {
	help.Write(w, nil)
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-13s %s\n", c[0], c[1])
	}
}

// run is the whole program: main only sets up signals and the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return cli.Usagef("no command given")
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "--version", "-version", "version":
		fmt.Fprintln(stdout, version.String("lab"))
		return nil
	case "help", "-h", "-help", "--help":
		writeUsage(stdout)
		return nil
	case "backpressure":
		return runBackpressure(rest, stdout, stderr)
	case "run":
		return runRun(ctx, rest, stdout, stderr)
	case "sweep":
		return runSweep(ctx, rest, stdout, stderr)
	case "compare":
		return runCompare(ctx, rest, stdout, stderr)
	case "fanout":
		return runFanout(ctx, "fanout", rest, false, stdout, stderr)
	case "calibrate":
		return runCalibrate(ctx, rest, stdout, stderr)
	case "quota":
		return runQuota(rest, stdout, stderr)
	case "trace":
		return runTrace(rest, stdout, stderr)
	default:
		return cli.Usagef("unknown command %q (want one of %s)", cmd, commandNames())
	}
}

func commandNames() string {
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c[0]
	}
	return strings.Join(names, ", ")
}

// newFlagSet returns the flag set of the subcommand name; its --help goes to stdout.
func newFlagSet(name string, stdout io.Writer) *flag.FlagSet {
	h := cli.Help{Name: "lab " + name, Usage: []string{"[flags]"}}
	for _, c := range commands {
		if c[0] == name {
			h.Synopsis, h.Examples = c[1], []string{c[2]}
		}
	}
	return cli.NewFlagSet(h, stdout)
}

func parse(fs *flag.FlagSet, args []string) error { return cli.Parse(fs, args) }

// listFlag collects a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func runBackpressure(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("backpressure", stdout)
	out := fs.String("out", filepath.Join("out", "backpressure"), "directory for summary.csv, snapshots.csv and the charts")
	noCharts := fs.Bool("no-charts", false, "skip the PNG charts")
	if err := parse(fs, args); err != nil {
		return err
	}
	results, err := lab.RunCases(lab.BackpressureCases(), lab.RunOptions{})
	if err != nil {
		return err
	}
	return report(*out, "backpressure", results, false, *noCharts, stdout, stderr)
}

// report writes the table to stdout and the CSVs and charts to dir.
func report(dir, title string, results []lab.Named, extended, noCharts bool, stdout, stderr io.Writer) error {
	if err := lab.WriteTable(stdout, results, extended); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files := []string{filepath.Join(dir, "summary.csv"), filepath.Join(dir, "snapshots.csv")}
	var sum, snap bytes.Buffer
	if err := lab.WriteSummaryCSV(&sum, results, extended); err != nil {
		return err
	}
	if err := lab.WriteSnapshotsCSV(&snap, results, extended); err != nil {
		return err
	}
	if err := os.WriteFile(files[0], sum.Bytes(), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(files[1], snap.Bytes(), 0o644); err != nil {
		return err
	}
	if !noCharts && !lab.ChartsAvailable {
		fmt.Fprintln(stderr, "lab: this build draws no charts (built with -tags nocharts); the CSV files hold the figures")
	} else if !noCharts {
		charts, err := lab.WriteCharts(dir, title, results)
		if err != nil {
			return err
		}
		files = append(files, charts...)
	}
	fmt.Fprintf(stderr, "lab: wrote %s\n", strings.Join(files, " "))
	return nil
}

// scenarioSized are the strategies run and sweep show when none is given, each sized for the
// scenario's backend: none, and the ones an operator configures from the backend's capacity
// (the registry's kinds told the capacity, in its order; not the chain, a composition of them).
var scenarioSized = func() []string {
	out := []string{config.StrategyNone}
	for _, k := range config.Kinds() {
		if k.ToldCapacity() && k.Name != config.StrategyChain {
			out = append(out, k.Name)
		}
	}
	return out
}()

// scenarioFlags are the workload and backend flags shared by run, sweep and compare.
type scenarioFlags struct {
	service         string
	servers         int
	timeout         time.Duration
	propagate       bool
	upstreamTimeout time.Duration
	retries         int
	backoff         time.Duration
	multiplier      float64
	maxBackoff      time.Duration
	jitter          bool
	retryOn         string
	honorRetryAfter bool
	slo             time.Duration
	seed            uint64
	hop             string
	node            string
	warmup          time.Duration
}

func (f *scenarioFlags) register(fs *flag.FlagSet, timeout, slo time.Duration) {
	fs.StringVar(&f.service, "service", "slowtail", "service time: constant:10ms, exponential:20ms, slowtail[:mean=20ms,stddev=5ms,tailProb=0.01,tailMean=300ms,tailMin=100ms,tailMax=2s,fanout=1]")
	fs.IntVar(&f.servers, "servers", 8, "backend workers (0 = unlimited); admitted requests beyond them wait in the backend's FIFO")
	fs.DurationVar(&f.timeout, "timeout", timeout, "client timeout (0 = clients wait for ever)")
	fs.BoolVar(&f.propagate, "propagate-deadline", false, "send the client timeout as the request deadline, so strategies refuse work that cannot finish in time")
	fs.DurationVar(&f.upstreamTimeout, "upstream-timeout", 0, "proxy upstream timeout: 504 past it (0 = none; a --config file sets its own)")
	fs.IntVar(&f.retries, "retries", 0, "client retries per request (0 = none)")
	fs.DurationVar(&f.backoff, "backoff", 100*time.Millisecond, "wait before the first retry")
	fs.Float64Var(&f.multiplier, "backoff-multiplier", 2, "each retry waits this many times longer")
	fs.DurationVar(&f.maxBackoff, "backoff-max", 5*time.Second, "longest wait between retries (0 = no cap)")
	fs.BoolVar(&f.jitter, "jitter", false, "full jitter: draw each wait from [0, backoff]")
	fs.StringVar(&f.retryOn, "retry-on", "refusal,timeout", "what clients retry: refusal, timeout, or both")
	fs.BoolVar(&f.honorRetryAfter, "honor-retry-after", false, "wait at least the Retry-After of a refusal")
	fs.DurationVar(&f.slo, "slo", slo, "a success within this much of a request's first attempt counts as goodput (0 = every success)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of Poisson arrivals, service times, hops and jitter")
	fs.StringVar(&f.node, "node", "quiet", "how busy the node is: quiet, busy (medians like a loaded two-core kind node's), or spread=0.04[,epoch=100ms][,stall=0.02][,stallFactor=1.8]: every service time and hop that starts in an epoch is stretched by 1 + spread x |N(0,1)|, or by stallFactor when the epoch stalls")
	fs.DurationVar(&f.warmup, "warmup", 0, "leave the requests arriving in this first stretch (whole seconds) out of the latency percentiles")
	fs.StringVar(&f.hop, "hop", "none", "what each admitted request pays on the way through the proxy to the backend and back: none, 1.2ms (path=1.2ms), path=1.2ms,worker=1ms, or file=hop.csv,worker=1ms (lab calibrate measures it)")
}

func (f *scenarioFlags) scenario() (lab.Scenario, error) {
	svc, err := lab.ParseService(f.service)
	if err != nil {
		return lab.Scenario{}, fmt.Errorf("--service: %w", err)
	}
	hop, err := lab.ParseHop(f.hop)
	if err != nil {
		return lab.Scenario{}, fmt.Errorf("--hop: %w", err)
	}
	node, err := lab.ParseNode(f.node)
	if err != nil {
		return lab.Scenario{}, fmt.Errorf("--node: %w", err)
	}
	sc := lab.Scenario{
		Node: node, Warmup: f.warmup,
		Hop: hop, Service: svc, Servers: f.servers, UpstreamTimeout: f.upstreamTimeout, SLO: f.slo, Seed: f.seed,
		Client: lab.Client{
			Timeout: f.timeout, PropagateDeadline: f.propagate,
			Retry: lab.Retry{Max: f.retries, Backoff: f.backoff, Multiplier: f.multiplier, MaxBackoff: f.maxBackoff,
				Jitter: f.jitter, HonorRetryAfter: f.honorRetryAfter},
		},
	}
	for _, w := range strings.Split(f.retryOn, ",") {
		switch strings.TrimSpace(w) {
		case "refusal", "refusals", "refused":
			sc.Client.Retry.OnRefusal = true
		case "timeout", "timeouts":
			sc.Client.Retry.OnTimeout = true
		case "":
		default:
			return sc, fmt.Errorf("--retry-on: %q is not refusal or timeout", w)
		}
	}
	if f.retries > 0 && sc.Client.Retry.OnTimeout && f.timeout == 0 && f.upstreamTimeout == 0 {
		// Nothing can time out: retry refusals only rather than reject the combination.
		sc.Client.Retry.OnTimeout = false
	}
	return sc, nil
}

// strategyFlags select strategies by spec or by proxy config file.
type strategyFlags struct {
	specs, configs listFlag
}

func (f *strategyFlags) register(fs *flag.FlagSet, defaults string) {
	fs.Var(&f.specs, "strategy", "a strategy: an admission block as the proxy's config file spells it, e.g. '{strategy: inflight, inflight: {limit: 8}}', "+
		"'{strategy: chain, chain: [{tokenBucket: {rate: 300, burst: 30}}, {inflight: {limit: 8}}]}', or a bare name for one with defaults (none, adaptive, codel); repeatable (default "+defaults+")")
	fs.Var(&f.configs, "config", "a proxy config file (YAML) whose admission policy to run, repeatable")
}

// defaultStrategies are what a command runs when no strategy is given: explicit specs, or
// strategies sized for the scenario's backend (lab.ScenarioStrategies).
type defaultStrategies struct {
	specs []string
	sized []string
}

func (d defaultStrategies) String() string {
	if len(d.specs) > 0 {
		return strings.Join(d.specs, " ")
	}
	return strings.Join(d.sized, ", ") + ", sized for the scenario's servers by Little's law"
}

// strategies returns the selected strategies; a config file's upstreamTimeout applies unless
// --upstream-timeout was given.
func (f *strategyFlags) strategies(defaults defaultStrategies, sc *lab.Scenario, upstreamSet bool) ([]lab.Strategy, error) {
	var out []lab.Strategy
	var err error
	switch {
	case len(f.specs) > 0 || len(f.configs) > 0:
		out, err = lab.ParseStrategies(f.specs)
	case len(defaults.specs) > 0:
		out, err = lab.ParseStrategies(defaults.specs)
	default:
		out, err = lab.ScenarioStrategies(*sc, defaults.sized)
	}
	if err != nil {
		return nil, cli.UsageError{Err: fmt.Errorf("--strategy: %w", err)}
	}
	for _, path := range f.configs {
		cs, err := lab.StrategyFromConfig(path)
		if err != nil {
			return nil, cli.UsageError{Err: fmt.Errorf("--config: %w", err)}
		}
		if !upstreamSet {
			sc.UpstreamTimeout = cs.UpstreamTimeout
		}
		out = append(out, cs.Strategy)
	}
	return out, nil
}

// command holds the flags that run, sweep and compare share.
type command struct {
	fs       *flag.FlagSet
	sf       scenarioFlags
	st       strategyFlags
	defaults defaultStrategies
	out      *string
	noCharts *bool
	quiet    *bool
}

// newCommand registers the shared flags; outDir "" means the command writes no files.
func newCommand(name string, stdout io.Writer, defaults defaultStrategies, timeout, slo time.Duration, outDir string) *command {
	c := &command{fs: newFlagSet(name, stdout), defaults: defaults}
	c.sf.register(c.fs, timeout, slo)
	c.st.register(c.fs, defaults.String())
	if outDir != "" {
		c.out = c.fs.String("out", outDir, "directory for the CSV files and the charts")
		c.noCharts = c.fs.Bool("no-charts", false, "skip the PNG charts")
		c.quiet = c.fs.Bool("quiet", false, "no progress lines")
	}
	return c
}

// setup parses args and returns the scenario (without arrivals) and the strategies.
func (c *command) setup(args []string) (lab.Scenario, []lab.Strategy, error) {
	if err := parse(c.fs, args); err != nil {
		return lab.Scenario{}, nil, err
	}
	sc, err := c.sf.scenario()
	if err != nil {
		return sc, nil, cli.UsageError{Err: err}
	}
	strategies, err := c.st.strategies(c.defaults, &sc, flagSet(c.fs, "upstream-timeout"))
	return sc, strategies, err
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}

// progressLine prints at most one line a second to w while a long run goes on.
func progressLine(w io.Writer) func(lab.Progress) {
	last := time.Now()
	return func(p lab.Progress) {
		if time.Since(last) < time.Second {
			return
		}
		last = time.Now()
		fmt.Fprintf(w, "lab: %s: virtual %s of %s, %d offered\n", p.Strategy, p.Now.Truncate(time.Millisecond), p.Span, p.Offered)
	}
}

func runRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newCommand("run", stdout, defaultStrategies{sized: scenarioSized}, 0, 0, filepath.Join("out", "lab"))
	arrivals := c.fs.String("arrivals", "poisson:rate=400", "arrivals: constant:rate=R, poisson:rate=R, ramp:from=R,to=R[,steps=N], spike:base=R,peak=R,at=D,for=D (ramp/spike take poisson=true), trace:FILE")
	duration := c.fs.Duration("duration", 10*time.Second, "how long generated arrivals go on")
	requests := c.fs.Int("requests", 0, "stop after this many fresh requests (0 = no cap)")
	sc, strategies, err := c.setup(args)
	if err != nil {
		return err
	}
	if sc.Arrivals, err = lab.ParseArrivals(*arrivals, *duration); err != nil {
		return fmt.Errorf("--arrivals: %w", err)
	}
	sc.MaxRequests = *requests
	opts := lab.RunOptions{}
	if !*c.quiet {
		opts.Progress = progressLine(stderr)
	}
	var results []lab.Named
	for _, s := range strategies {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := lab.Run(sc, s, opts)
		if err != nil {
			return err
		}
		results = append(results, lab.Named{Strategy: s.Name, Result: r})
	}
	fmt.Fprintf(stdout, "Arrivals: %s. %s, %s. Client timeout: %s, retries: %d.%s%s\n\n",
		sc.Arrivals, describeService(c.sf.service), describeServers(sc.Servers), describeTimeout(sc.Client.Timeout), sc.Client.Retry.Max, describeHop(sc), describeNode(sc))
	return report(*c.out, "run", results, true, *c.noCharts, stdout, stderr)
}

func describeService(spec string) string { return "service " + spec }

// describeHop is a sentence on the scenario's hop, empty when there is none.
func describeHop(sc lab.Scenario) string {
	if sc.Hop.IsZero() {
		return ""
	}
	s := " Hop: " + sc.Hop.String()
	if c := lab.EffectiveCapacity(sc); c > 0 {
		s += fmt.Sprintf(" (effective capacity %.1f rps)", c)
	}
	return s + "."
}

// describeNode is a sentence on a busy node and a warm-up, empty for a quiet node without one.
func describeNode(sc lab.Scenario) string {
	s := ""
	if !sc.Node.IsZero() {
		s += " Node: " + sc.Node.String() + "."
	}
	if sc.Warmup > 0 {
		s += fmt.Sprintf(" Latency percentiles leave out the first %s.", sc.Warmup)
	}
	return s
}

func describeServers(n int) string {
	if n == 0 {
		return "unlimited workers"
	}
	return strconv.Itoa(n) + " workers"
}

func describeTimeout(d time.Duration) string {
	if d == 0 {
		return "none"
	}
	return d.String()
}

func parseLoads(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return nil, fmt.Errorf("--loads: %q is not a number", f)
		}
		out = append(out, v)
	}
	return out, nil
}

func runSweep(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := newCommand("sweep", stdout, defaultStrategies{sized: scenarioSized}, time.Second, 500*time.Millisecond, filepath.Join("out", "sweep"))
	capacity := c.fs.Float64("capacity", 0, "backend capacity in requests/s (0 = servers / mean service time)")
	loadList := c.fs.String("loads", "0.25,0.5,0.75,1,1.25,1.5,2,3,4,6,8,10", "offered loads as multiples of capacity")
	duration := c.fs.Duration("duration", 20*time.Second, "how long each point offers requests")
	even := c.fs.Bool("even", false, "evenly spaced arrivals instead of Poisson")
	sc, strategies, err := c.setup(args)
	if err != nil {
		return err
	}
	loads, err := parseLoads(*loadList)
	if err != nil {
		return err
	}
	var progress func(done, total int, s string, load float64)
	if !*c.quiet {
		progress = func(done, total int, s string, load float64) {
			fmt.Fprintf(stderr, "lab: sweep %d/%d: %s at %gx\n", done+1, total, s, load)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	points, capRPS, err := lab.Sweep(lab.SweepConfig{Base: sc, Capacity: *capacity, Loads: loads, Duration: *duration, Even: *even}, strategies, progress)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "Capacity %.1f rps (%s, %s); SLO %s; client timeout %s.%s%s\n\n", capRPS, describeService(c.sf.service),
		describeServers(sc.Servers), describeTimeout(sc.SLO), describeTimeout(sc.Client.Timeout), describeHop(sc), describeNode(sc))
	if err := writeSweepTable(stdout, points); err != nil {
		return err
	}
	if err := os.MkdirAll(*c.out, 0o755); err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := lab.WriteSweepCSV(&buf, points); err != nil {
		return err
	}
	files := []string{filepath.Join(*c.out, "sweep.csv")}
	if err := os.WriteFile(files[0], buf.Bytes(), 0o644); err != nil {
		return err
	}
	if !*c.noCharts && !lab.ChartsAvailable {
		fmt.Fprintln(stderr, "lab: this build draws no charts (built with -tags nocharts); the CSV files hold the figures")
	} else if !*c.noCharts {
		charts, err := lab.WriteSweepCharts(*c.out, points)
		if err != nil {
			return err
		}
		files = append(files, charts...)
	}
	fmt.Fprintf(stderr, "lab: wrote %s\n", strings.Join(files, " "))
	return nil
}

// writeSweepTable prints goodput (requests/s within the SLO) per strategy and load.
func writeSweepTable(w io.Writer, points []lab.SweepPoint) error {
	var loads []float64
	var order []string
	cell := map[string]map[float64]lab.SweepPoint{}
	for _, p := range points {
		if cell[p.Strategy] == nil {
			cell[p.Strategy] = map[float64]lab.SweepPoint{}
			order = append(order, p.Strategy)
		}
		if !slices.Contains(loads, p.Load) {
			loads = append(loads, p.Load)
		}
		cell[p.Strategy][p.Load] = p
	}
	var b strings.Builder
	b.WriteString("goodput rps (p99 ms)\n\n| strategy |")
	for _, l := range loads {
		fmt.Fprintf(&b, " %gx |", l)
	}
	b.WriteString("\n|---|")
	for range loads {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, s := range order {
		fmt.Fprintf(&b, "| %s |", s)
		for _, l := range loads {
			p, ok := cell[s][l]
			if !ok {
				b.WriteString(" - |")
				continue
			}
			fmt.Fprintf(&b, " %.0f (%.0f) |", p.Summary.GoodputRPS(), p.Summary.P99.Seconds()*1000)
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func runCompare(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if isFanoutCompare(args) {
		return runFanout(ctx, "compare", args, true, stdout, stderr)
	}
	c := newCommand("compare", stdout, defaultStrategies{specs: lab.DefaultCompareSpecs()}, 2*time.Second, 0, "")
	capacity := c.fs.Float64("capacity", 0, "backend capacity in requests/s that loads are multiples of (0 = servers / mean service time)")
	load := c.fs.Float64("load", 2, "offered load as a multiple of capacity")
	loadList := c.fs.String("loads", "", "several offered loads, e.g. 1.5,3,5 (overrides --load)")
	duration := c.fs.Duration("duration", 10*time.Second, "how long requests are offered")
	labOnly := c.fs.Bool("lab-only", false, "run only the lab half")
	c.fs.Bool("fanout", false, "compare a call graph instead (lab fanout's prediction against a live frontend calling the services): takes lab fanout's flags and --lab-only")
	matrix := c.fs.Bool("matrix", false, "run the acceptance matrix: for each of "+strings.Join(lab.MatrixServices, ", ")+
		" (or --service), an in-flight limit, token buckets at 0.9x and 1.1x of capacity, a leaky bucket at 1.0x, a bounded queue and a chain, at loads "+
		strings.Trim(strings.Join(strings.Fields(fmt.Sprint(lab.MatrixLoads)), ","), "[]")+" (unless --loads)")
	if f := c.fs.Lookup("hop"); f != nil {
		f.Usage += "; when not given, compare calibrates with the live half (none with --lab-only)"
	}
	out := c.fs.String("out", "", "directory for compare.csv and the calibration's hop samples (default: none written)")
	// A 1% slow tail puts p99 on the edge of the tail's clamp, where a handful of samples decide
	// it: compare defaults to the sampler's normal part alone, which both halves resolve.
	if f := c.fs.Lookup("service"); f != nil {
		f.DefValue = "slowtail:tailProb=0"
		f.Value.Set(f.DefValue)
	}
	sc, strategies, err := c.setup(args)
	if err != nil {
		return err
	}
	if !sc.Node.IsZero() {
		// The live half runs on this machine as it is: a modelled busy node would compare the
		// lab with something it is not.
		return cli.UsageError{Err: errors.New("--node: compare's live half runs on this machine as it is; model a busy node with run or sweep")}
	}
	cfg := lab.CompareConfig{Capacity: *capacity, Load: *load, Duration: *duration}
	if *loadList != "" {
		if cfg.Loads, err = parseLoads(*loadList); err != nil {
			return cli.UsageError{Err: err}
		}
	}
	type block struct {
		service    string
		sc         lab.Scenario
		strategies []lab.Strategy
	}
	blocks := []block{{c.sf.service, sc, strategies}}
	if *matrix {
		for _, f := range []string{"strategy", "config", "capacity"} {
			if flagSet(c.fs, f) {
				return cli.Usagef("--matrix chooses the strategies itself: drop --%s", f)
			}
		}
		if len(cfg.Loads) == 0 {
			cfg.Loads = lab.MatrixLoads
		}
		services := lab.MatrixServices
		if flagSet(c.fs, "service") {
			services = []string{c.sf.service}
		}
		blocks = nil
		for _, spec := range services {
			bsc := sc
			if bsc.Service, err = lab.ParseService(spec); err != nil {
				return err
			}
			sts, err := lab.MatrixStrategies(bsc)
			if err != nil {
				return err
			}
			blocks = append(blocks, block{spec, bsc, sts})
		}
	}
	var live lab.Live
	if !*labOnly {
		live = newLive()
		cfg.Calibrate = !flagSet(c.fs, "hop")
	}
	loads := fmt.Sprintf("%gx", *load)
	if len(cfg.Loads) > 0 {
		loads = ""
		for i, l := range cfg.Loads {
			if i > 0 {
				loads += ", "
			}
			loads += fmt.Sprintf("%gx", l)
		}
	}
	start := time.Now()
	var rows []lab.CompareRow
	var hopFiles [][]time.Duration
	for i, b := range blocks {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		bstart := time.Now()
		cfg.Scenario = b.sc
		cmp, err := lab.CompareAll(ctx, cfg, b.strategies, live, stderr)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "Offered %s of capacity %.1f rps (Poisson, %s); %s, %s; client timeout %s.\n", loads, cmp.Capacity, *duration,
			describeService(b.service), describeServers(b.sc.Servers), describeTimeout(b.sc.Client.Timeout))
		if cal := cmp.Calibration; cal != nil {
			fmt.Fprintf(stdout, "Calibrated in %s (%d workers x %s behind the proxy): %s.\n", cal.Took.Round(100*time.Millisecond),
				cal.Workers, cal.Service, describeCalibration(*cal))
			hopFiles = append(hopFiles, cal.Loaded.Samples)
		}
		fmt.Fprintf(stdout, "Hop modelled: %s; effective capacity %.1f rps.\n", cmp.Hop, cmp.Effective)
		if live != nil {
			fmt.Fprintf(stdout, "Machine: %s; took %s.\n", describeMachine(cmp.Rows), time.Since(bstart).Round(time.Second))
		}
		fmt.Fprintln(stdout)
		if err := lab.WriteCompareTable(stdout, cmp.Rows); err != nil {
			return err
		}
		for i := range cmp.Rows {
			cmp.Rows[i].Service = b.service
		}
		rows = append(rows, cmp.Rows...)
	}
	if live != nil && len(blocks) > 1 {
		fmt.Fprintf(stdout, "\n%s; machine: %s; took %s.\n", describeVerdicts(rows), describeMachine(rows), time.Since(start).Round(time.Second))
	}
	if *out == "" {
		return nil
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := lab.WriteCompareCSV(&buf, rows); err != nil {
		return err
	}
	files := []string{filepath.Join(*out, "compare.csv")}
	if err := os.WriteFile(files[0], buf.Bytes(), 0o644); err != nil {
		return err
	}
	for i, samples := range hopFiles {
		buf.Reset()
		if err := lab.WriteHopSamples(&buf, samples); err != nil {
			return err
		}
		name := "hop.csv"
		if len(hopFiles) > 1 {
			name = fmt.Sprintf("hop-%d.csv", i+1)
		}
		path := filepath.Join(*out, name)
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			return err
		}
		files = append(files, path)
	}
	fmt.Fprintf(stderr, "lab: wrote %s\n", strings.Join(files, " "))
	return nil
}

// describeVerdicts counts the rows within bounds.
func describeVerdicts(rows []lab.CompareRow) string {
	within, ranged, invalid := 0, 0, 0
	for _, r := range rows {
		switch {
		case r.Live != nil && r.Live.Invalid != "":
			invalid++
		case r.Within():
			within++
			if !r.PointWithin() {
				ranged++
			}
		}
	}
	return fmt.Sprintf("%d of %d within bounds (%d of them judged on the range); %d live runs invalid", within, len(rows), ranged, invalid)
}

// describeCalibration summarises what a calibration measured.
func describeCalibration(c lab.Calibration) string {
	h := c.Hop()
	return fmt.Sprintf("capacity %.1f rps (nominal %.1f), so %s more per request in a worker; path hop unloaded p50 %s p99 %s, at capacity p50 %s p99 %s; %s",
		c.Throughput, float64(c.Workers)/c.Service.Seconds(), h.Worker, roundUS(c.Unloaded.Quantile(0.5)), roundUS(c.Unloaded.Quantile(0.99)),
		roundUS(c.Loaded.Quantile(0.5)), roundUS(c.Loaded.Quantile(0.99)), c.Machine)
}

func roundUS(d time.Duration) time.Duration { return d.Round(time.Microsecond) }

// describeMachine summarises how busy the machine was during the live runs.
func describeMachine(rows []lab.CompareRow) string {
	var sum, peak float64
	n, busy := 0, 0
	cpus := 0
	for _, r := range rows {
		if r.Live == nil || !r.Live.Machine.Known {
			continue
		}
		m := r.Live.Machine
		sum += m.Others
		peak = max(peak, m.Others)
		cpus = m.CPUs
		n++
		if m.Busy() {
			busy++
		}
	}
	if n == 0 {
		return "load unknown"
	}
	s := fmt.Sprintf("during the live runs other processes used %.0f%% of %d cores on average (at most %.0f%%)", 100*sum/float64(n), cpus, 100*peak)
	if busy > 0 {
		s += fmt.Sprintf("; %d of %d runs were on a busy machine (others above %.0f%%)", busy, n, 100*lab.BusyShare)
	} else {
		s += "; not busy"
	}
	return s
}

func runCalibrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("calibrate", stdout)
	service := fs.String("service", "slowtail:tailProb=0", "the backend's service time, as for lab run: calibration uses its mean")
	servers := fs.Int("servers", 8, "backend workers")
	unloaded := fs.Duration("unloaded", time.Second, "how long the unloaded phase runs")
	loaded := fs.Duration("loaded", 2*time.Second, "how long the phase at capacity runs")
	out := fs.String("out", "", "write the path hops measured at capacity to this CSV file (for --hop file=FILE)")
	if err := parse(fs, args); err != nil {
		return err
	}
	svc, err := lab.ParseService(*service)
	if err != nil {
		return cli.UsageError{Err: fmt.Errorf("--service: %w", err)}
	}
	if *servers < 1 {
		return cli.UsageError{Err: fmt.Errorf("--servers: must be at least 1, got %d", *servers)}
	}
	if *unloaded <= 0 || *loaded <= 0 || *unloaded > 30*time.Second || *loaded > 30*time.Second {
		return cli.UsageError{Err: fmt.Errorf("--unloaded, --loaded: must be in (0, 30s], got %s and %s", *unloaded, *loaded)}
	}
	r := liveRunner{unloaded: *unloaded, loaded: *loaded}
	c, err := r.Calibrate(ctx, lab.Scenario{Service: svc, Servers: *servers})
	if err != nil {
		return err
	}
	h := c.Hop()
	fmt.Fprintf(stdout, "Calibrated in %s: %d workers x %s (the mean of %s) behind the proxy, which admits everything.\n",
		c.Took.Round(100*time.Millisecond), c.Workers, c.Service, *service)
	fmt.Fprintf(stdout, "Machine: %s.\n\n", c.Machine)
	fmt.Fprintln(stdout, "| phase | answers/s | hop p50 ms | hop p90 ms | hop p99 ms | hop mean ms |")
	fmt.Fprintln(stdout, "|---|---|---|---|---|---|")
	for _, p := range []struct {
		name string
		rps  float64
		d    lab.HopDist
	}{{"unloaded", 0, c.Unloaded}, {"at capacity", c.Throughput, c.Loaded}} {
		rps := "-"
		if p.rps > 0 {
			rps = fmt.Sprintf("%.1f", p.rps)
		}
		fmt.Fprintf(stdout, "| %s | %s | %.3f | %.3f | %.3f | %.3f |\n", p.name, rps, msf(p.d.Quantile(0.5)), msf(p.d.Quantile(0.9)),
			msf(p.d.Quantile(0.99)), msf(p.d.Mean()))
	}
	nominal := float64(c.Workers) / c.Service.Seconds()
	fmt.Fprintf(stdout, "\nEffective capacity %.1f rps of nominal %.1f (%.1f%%): a worker is held %s longer per request than the service time (%s of it the backend's timer overshoot).\n",
		c.Throughput, nominal, 100*c.Throughput/nominal, h.Worker, roundUS(c.Overshoot))
	if *out == "" {
		fmt.Fprintf(stdout, "Model it with: --hop path=%s,worker=%s (or write the samples with --out)\n", roundUS(c.Loaded.Mean()), h.Worker)
		return nil
	}
	var buf bytes.Buffer
	if err := lab.WriteHopSamples(&buf, c.Loaded.Samples); err != nil {
		return err
	}
	if err := os.WriteFile(*out, buf.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "Model it with: --hop file=%s,worker=%s\n", *out, h.Worker)
	return nil
}

func msf(d time.Duration) float64 { return float64(d) / 1e6 }

func runTrace(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("trace", stdout)
	arrivals := fs.String("arrivals", "poisson:rate=100", "arrivals, as for lab run")
	duration := fs.Duration("duration", 10*time.Second, "how long generated arrivals go on")
	requests := fs.Int("requests", 0, "stop after this many requests (0 = no cap)")
	seed := fs.Uint64("seed", 1, "seed of Poisson arrivals")
	out := fs.String("out", "", "trace file to write (default standard output)")
	if err := parse(fs, args); err != nil {
		return err
	}
	a, err := lab.ParseArrivals(*arrivals, *duration)
	if err != nil {
		return fmt.Errorf("--arrivals: %w", err)
	}
	recs, err := lab.CollectArrivals(a, *seed, *requests)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := lab.WriteTrace(&buf, recs); err != nil {
		return err
	}
	if *out == "" {
		_, err := stdout.Write(buf.Bytes())
		return err
	}
	if err := os.WriteFile(*out, buf.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "lab: wrote %d arrivals to %s\n", len(recs), *out)
	return nil
}
