package harness

import (
	"bufio"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/loadshed/loadshed/bench/k6summary"
	"github.com/loadshed/loadshed/internal/loadgen"
)

// The cost scenario measures what each proxy costs on one core (issue 16): the forwarding
// ceiling (wrk -t1 -cN against the proxy in front of nginx answering 200 at once) and CPU per
// request plus added latency at a fixed low rate (k6 at 300 requests/s in front of a 64 x 20 ms
// backend, then the project's own open-loop generator at the same rate, which times the added
// latency). Every proxy runs on CPU 1 with one worker; the load generator and the upstream share
// CPU 0, whose load is measured: a point where it was BusyLimit busy or more is invalid.

// Cost scenario phases.
const (
	PhaseCeiling = "ceiling"
	PhaseRate    = "rate"
)

// CostConfig is one run of the cost scenario.
type CostConfig struct {
	// Paths on the machine that ran are left out of points.json.
	RepoRoot, OutDir, WorkDir string `json:"-"`
	KeepWork                  bool
	Bins                      Binaries `json:"-"`
	InstallPeers              bool
	// Targets selects among CostTargets by comma-separated name prefixes ("" = all).
	Targets string
	// Repeats of both phases; targets are interleaved and their order rotated between repeats.
	Repeats int
	// Connections and Duration of the ceiling phase (wrk -t1 -c Connections), after Warmup.
	Connections     int
	CeilingDuration time.Duration
	Warmup          time.Duration
	// Rate is the fixed rate of the second phase, for RateDuration, in front of Backend.
	Rate         float64
	RateDuration time.Duration
	// LatencyDuration is how long cmd/loadgen runs at Rate after k6, on the same stack, to time
	// the added latency (0: not timed that way).
	LatencyDuration time.Duration
	Backend         Backend
	// SLO only sizes loadshed's inflight limit (L = C*S) and the goodput column.
	SLO           time.Duration
	ClientTimeout time.Duration
	MaxLateMs     float64
	// BusyLimit marks a point invalid when CPU 0 (load generator and upstream) was this busy.
	BusyLimit   float64
	Quick       bool
	CommandLine string
}

// Validate reports every problem, naming the field.
func (c CostConfig) Validate() error {
	var errs []error
	if c.RepoRoot == "" || c.OutDir == "" {
		errs = append(errs, errors.New("RepoRoot, OutDir: required"))
	}
	if c.Repeats < 1 {
		errs = append(errs, fmt.Errorf("Repeats: must be at least 1, got %d", c.Repeats))
	}
	if c.Connections < 1 {
		errs = append(errs, fmt.Errorf("Connections: must be at least 1, got %d", c.Connections))
	}
	if c.CeilingDuration < time.Second || c.RateDuration < time.Second {
		errs = append(errs, fmt.Errorf("CeilingDuration, RateDuration: each must be at least 1s, got %s and %s", c.CeilingDuration, c.RateDuration))
	}
	if c.Warmup < 0 {
		errs = append(errs, fmt.Errorf("Warmup: must not be negative, got %s", c.Warmup))
	}
	if c.LatencyDuration != 0 && c.LatencyDuration < time.Second {
		errs = append(errs, fmt.Errorf("LatencyDuration: must be 0 (none) or at least 1s, got %s", c.LatencyDuration))
	}
	if !(c.Rate > 0) {
		errs = append(errs, fmt.Errorf("Rate: must be above 0, got %g", c.Rate))
	}
	if c.ClientTimeout <= 0 {
		errs = append(errs, fmt.Errorf("ClientTimeout: must be above 0, got %s", c.ClientTimeout))
	}
	if c.MaxLateMs <= 0 {
		errs = append(errs, fmt.Errorf("MaxLateMs: must be above 0, got %g", c.MaxLateMs))
	}
	if !(c.BusyLimit > 0 && c.BusyLimit <= 1) {
		errs = append(errs, fmt.Errorf("BusyLimit: must be in (0, 1], got %g", c.BusyLimit))
	}
	if _, err := DeriveLimits(c.Backend, c.SLO); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// CostPoint is one target in one phase of one repeat.
type CostPoint struct {
	Target string
	Phase  string
	Repeat int
	// Requests answered during the measurement, Served those with a 2xx, Errors socket errors
	// and timeouts; Seconds the measured time.
	Requests, Served, Errors int64
	Seconds                  float64
	// P50Ms and P99Ms: wrk's latency (ceiling) or k6's admitted latency (rate); 0 if unknown.
	P50Ms, P99Ms float64
	// OutP50Ms and OutP99Ms (rate phase): percentiles of each answer's latency less the time
	// the backend reports for it (k6's outside_backend_ms); nil if unknown. Unlike the whole
	// latency they hold none of the backend's own timer jitter, which on the shared load core
	// moves a 20 ms backend's p99 by several ms from one run to the next.
	OutP50Ms, OutP99Ms *float64 `json:",omitempty"`
	// GenP50Ms and GenP99Ms (rate phase): admitted latency, from each request's scheduled time,
	// of cmd/loadgen's open-loop run at the same rate after k6's; nil if not measured, or when
	// GenInvalid says why that run may not be used. The Go generator costs the shared load core
	// a fraction of what k6 does, so its latencies do not carry k6's own scheduling jitter
	// (direct's p99 through it stays within a fraction of a millisecond from one repeat to the
	// next, k6's moves by several).
	GenP50Ms, GenP99Ms *float64 `json:",omitempty"`
	GenInvalid         string   `json:",omitempty"`
	// CPUNanos is the target's CPU time during the measurement.
	CPUNanos int64
	// LoadBusy and ProxyBusy are the busy shares of CPU 0 (load generator and upstream) and
	// CPU 1 (the proxy) during the measurement; 0 if unknown. LoadOwn is the part of CPU 0 the
	// load generator and the upstream used themselves (the rest is other work on the machine).
	LoadBusy, ProxyBusy, LoadOwn float64
	// Summary is k6's summary (rate phase).
	Summary *k6summary.Summary `json:",omitempty"`
	// Invalid says why the figures may not be used; Err why there are none.
	Invalid string `json:",omitempty"`
	Err     string `json:",omitempty"`
}

// Valid reports whether the point's figures may be used.
func (p CostPoint) Valid() bool { return p.Err == "" && p.Invalid == "" }

// ServedRPS is the 2xx answers per second.
func (p CostPoint) ServedRPS() float64 {
	if p.Seconds <= 0 {
		return math.NaN()
	}
	return float64(p.Served) / p.Seconds
}

// CPUPerRequestUs is the target's CPU per answered request, in microseconds.
func (p CostPoint) CPUPerRequestUs() float64 {
	if p.Requests == 0 || p.CPUNanos == 0 {
		return math.NaN()
	}
	return float64(p.CPUNanos) / 1e3 / float64(p.Requests)
}

// CostResult is everything one cost run measured.
type CostResult struct {
	// Kind is "cost", so --report-from knows the file.
	Kind    string
	Config  CostConfig
	Limits  Limits
	Targets []Target
	Points  []CostPoint
	Started time.Time
	Elapsed time.Duration
}

// RunCost runs the cost scenario and writes its outputs into cfg.OutDir.
func RunCost(ctx context.Context, cfg CostConfig, stdout, stderr io.Writer) (*CostResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	limits, _ := DeriveLimits(cfg.Backend, cfg.SLO)
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "bench cost: "+format+"\n", a...) }
	targets, err := SelectTargets(CostTargets(limits), cfg.Targets)
	if err != nil {
		return nil, err
	}
	if runtime.NumCPU() < 2 {
		return nil, errors.New("the cost scenario needs two CPUs: the proxy on one, load generator and upstream on the other")
	}
	work, cleanup, err := workDir(cfg.WorkDir, cfg.KeepWork, "loadshed-cost-")
	if err != nil {
		return nil, err
	}
	defer cleanup()
	if err := os.MkdirAll(filepath.Join(cfg.OutDir, "k6"), 0o755); err != nil {
		return nil, err
	}
	base := Config{RepoRoot: cfg.RepoRoot, Bins: cfg.Bins, InstallPeers: cfg.InstallPeers, Backend: cfg.Backend, SLO: cfg.SLO,
		ClientTimeout: cfg.ClientTimeout, MaxLateMs: cfg.MaxLateMs, OutDir: cfg.OutDir, Pin: PinNone}
	// nginx is always needed: it is the ceiling's upstream.
	bins, err := prepareBinaries(ctx, base, append(append([]Target(nil), targets...), Target{Kind: KindNginx}), work, logf)
	if err != nil {
		return nil, err
	}
	if bins.Taskset == "" {
		return nil, errors.New("the cost scenario needs taskset (util-linux) to put each proxy on its own core")
	}
	if bins.Wrk == "" {
		if bins.Wrk, err = findOrInstall(ctx, "wrk", cfg.InstallPeers, logf); err != nil {
			return nil, err
		}
	}
	if cfg.LatencyDuration > 0 && bins.Loadgen == "" {
		if bins.Loadgen, err = buildProgram(ctx, cfg.RepoRoot, filepath.Join(work, "bin"), "cmd/loadgen", "loadgen", logf); err != nil {
			return nil, err
		}
	}
	base.Bins = bins
	root := os.Geteuid() == 0
	res := &CostResult{Kind: "cost", Config: cfg, Limits: limits, Targets: targets, Started: time.Now()}

	var failures []string
	n, total := 0, cfg.Repeats*2*len(targets)
	for rep := 1; rep <= cfg.Repeats; rep++ {
		for _, phase := range []string{PhaseCeiling, PhaseRate} {
			for _, t := range rotate(targets, rep-1) {
				if err := ctx.Err(); err != nil {
					return res, err
				}
				n++
				logf("[%d/%d] repeat %d, %s, %s", n, total, rep, phase, t.Name)
				var p CostPoint
				if phase == PhaseCeiling {
					p = runCeiling(ctx, cfg, base, limits, t, rep, work, root)
				} else {
					p = runRate(ctx, cfg, base, limits, t, rep, work, root)
				}
				res.Points = append(res.Points, p)
				switch {
				case p.Err != "":
					logf("  FAILED: %s", p.Err)
					failures = append(failures, fmt.Sprintf("%s %s repeat %d: %s", t.Name, phase, rep, p.Err))
					if cfg.Quick {
						res.Elapsed = time.Since(res.Started)
						_ = res.writeOutputs(stdout)
						return res, fmt.Errorf("%s %s failed: %s", t.Name, phase, p.Err)
					}
				default:
					state := ""
					if p.Invalid != "" {
						state = " INVALID: " + p.Invalid
					}
					logf("  %.0f served rps, p50 %.2f ms, p99 %.2f ms, CPU %.1f us/req, load core %.0f%% (own %.0f%%), proxy core %.0f%%%s",
						p.ServedRPS(), p.P50Ms, p.P99Ms, p.CPUPerRequestUs(), 100*p.LoadBusy, 100*p.LoadOwn, 100*p.ProxyBusy, state)
					switch {
					case p.GenInvalid != "":
						logf("  open-loop latency run INVALID: %s", p.GenInvalid)
					case p.GenP99Ms != nil:
						logf("  open-loop latency run: p50 %.2f ms, p99 %.2f ms", *p.GenP50Ms, *p.GenP99Ms)
					}
				}
			}
		}
	}
	res.Elapsed = time.Since(res.Started)
	return res, finishRun(func() error { return res.writeOutputs(stdout) }, failures)
}

// workDir returns dir (created) or a new temporary directory, and what to call at the end.
func workDir(dir string, keep bool, prefix string) (string, func(), error) {
	cleanup := func() {}
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", prefix); err != nil {
			return "", nil, err
		}
		if !keep {
			d := dir
			cleanup = func() { os.RemoveAll(d) }
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", nil, err
	}
	return dir, cleanup, nil
}

// findOrInstall finds a program on PATH or installs the Debian package of the same name.
func findOrInstall(ctx context.Context, name string, install bool, logf func(string, ...any)) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if !install {
		return "", fmt.Errorf("%s not installed (apt-get install %s, or let the harness with --install-peers)", name, name)
	}
	if err := installPeers(ctx, []string{name}, logf); err != nil {
		return "", err
	}
	return exec.LookPath(name)
}

func costPointName(rep int, phase string, t Target) string {
	return fmt.Sprintf("r%d-%s-%s", rep, phase, strings.ReplaceAll(t.Name, "/", "-"))
}

// runCeiling measures the target's forwarding ceiling: wrk with N connections against it, in
// front of nginx answering 200 at once.
func runCeiling(ctx context.Context, cfg CostConfig, base Config, l Limits, t Target, rep int, work string, root bool) CostPoint {
	p := CostPoint{Target: t.Name, Phase: PhaseCeiling, Repeat: rep}
	name := costPointName(rep, PhaseCeiling, t)
	dir := filepath.Join(work, "points", name)
	c := base
	c.fastUpstream = true
	st, err := startStack(ctx, c, l, base.Bins, t, dir, root, pinCost)
	if err != nil {
		p.Err = err.Error()
		return p
	}
	defer st.stop()
	wrk := func(d time.Duration, log string) (wrkResult, error) {
		argv := []string{base.Bins.Taskset, "-c", "0", base.Bins.Wrk, "-t1", fmt.Sprintf("-c%d", cfg.Connections),
			fmt.Sprintf("-d%ds", int(math.Ceil(d.Seconds()))), "--latency", "--timeout", "2s", st.launch.URL}
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		out, err := cmd.CombinedOutput()
		_ = os.WriteFile(filepath.Join(dir, log), out, 0o644)
		if err != nil {
			return wrkResult{}, fmt.Errorf("wrk: %v: %s", err, tailString(string(out), 5))
		}
		r, err := parseWrk(string(out))
		r.CPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		return r, err
	}
	if cfg.Warmup > 0 {
		if _, err := wrk(cfg.Warmup, "wrk-warmup.log"); err != nil {
			p.Err = "warm-up: " + err.Error()
			return p
		}
	}
	var w wrkResult
	m, err := measure(st, func() (time.Duration, error) {
		var err error
		w, err = wrk(cfg.CeilingDuration, "wrk.log")
		return w.CPU, err
	})
	if err != nil {
		p.Err = err.Error()
		return p
	}
	p.Requests, p.Served, p.Errors, p.Seconds = w.Requests, w.Requests-w.Non2xx, w.SocketErrors, w.Seconds
	p.P50Ms, p.P99Ms = orZero(w.P50Ms), orZero(w.P99Ms)
	m.apply(&p)
	p.Invalid = loadCoreVerdict(p.LoadBusy, cfg.BusyLimit)
	if p.Invalid == "" && p.Requests == 0 {
		p.Invalid = "no request answered"
	}
	return p
}

// runRate measures the target's CPU per request and latency at the fixed rate.
func runRate(ctx context.Context, cfg CostConfig, base Config, l Limits, t Target, rep int, work string, root bool) CostPoint {
	p := CostPoint{Target: t.Name, Phase: PhaseRate, Repeat: rep}
	name := costPointName(rep, PhaseRate, t)
	dir := filepath.Join(work, "points", name)
	st, err := startStack(ctx, base, l, base.Bins, t, dir, root, pinCost)
	if err != nil {
		p.Err = err.Error()
		return p
	}
	defer st.stop()
	k := cfg.Rate / l.CapacityRPS
	sc := Scenario{Name: "rate", Script: "overload.js", Load: k,
		Env: map[string]string{"K": strconv.FormatFloat(k, 'g', -1, 64), "DURATION": cfg.RateDuration.String()}}
	if cfg.Warmup > 0 {
		warm := sc
		warm.Env = map[string]string{"K": sc.Env["K"], "DURATION": cfg.Warmup.String()}
		if err := runK6(ctx, base, l, base.Bins, 0, warm, st.launch.URL, filepath.Join(dir, "warmup.json"), filepath.Join(dir, "k6-warmup.log")); err != nil {
			p.Err = "warm-up: " + err.Error()
			return p
		}
	}
	summaryPath := filepath.Join(cfg.OutDir, "k6", name+".json")
	m, err := measure(st, func() (time.Duration, error) {
		return runK6CPU(ctx, base, l, base.Bins, 0, sc, st.launch.URL, summaryPath, filepath.Join(dir, "k6.log"))
	})
	if err != nil {
		p.Err = err.Error()
		return p
	}
	s, err := k6summary.Read(summaryPath)
	if err != nil {
		p.Err = err.Error()
		return p
	}
	p.Summary = s
	p.Requests, p.Served, p.Errors, p.Seconds = s.Requests, s.OK, s.Timeouts+s.Unexpected, s.DurationS
	p.P50Ms, p.P99Ms = orZero(v(s.AdmittedMs.P50)), orZero(v(s.AdmittedMs.P99))
	p.OutP50Ms, p.OutP99Ms = s.OutsideBackendMs.P50, s.OutsideBackendMs.P99
	m.apply(&p)
	switch {
	case !s.Valid:
		p.Invalid = s.InvalidReason
	default:
		p.Invalid = loadCoreVerdict(p.LoadBusy, cfg.BusyLimit)
	}
	if cfg.LatencyDuration > 0 {
		r, err := runLoadgen(ctx, cfg, base.Bins, st.launch.URL, filepath.Join(cfg.OutDir, "loadgen", name+".json"), filepath.Join(dir, "loadgen.log"))
		if err != nil {
			p.Err = "open-loop latency run: " + err.Error()
			return p
		}
		p.GenP50Ms, p.GenP99Ms, p.GenInvalid = genLatency(r)
	}
	return p
}

// runLoadgen runs cmd/loadgen on CPU 0 at the fixed rate against url and returns its result,
// which it also writes to out.
func runLoadgen(ctx context.Context, cfg CostConfig, bins Binaries, url, out, logPath string) (*loadgen.Result, error) {
	argv := []string{bins.Loadgen, "--target", url, "--rate", strconv.FormatFloat(cfg.Rate, 'g', -1, 64),
		"--duration", cfg.LatencyDuration.String(), "--timeout", cfg.ClientTimeout.String(), "--json"}
	if bins.Taskset != "" {
		argv = append([]string{bins.Taskset, "-c", "0"}, argv...)
	}
	return execLoadgen(ctx, argv, out, logPath)
}

// genLatency takes the admitted p50 and p99 of an open-loop run in which every request was
// answered 2xx; otherwise it says why the run's latency may not be used.
func genLatency(r *loadgen.Result) (p50, p99 *float64, invalid string) {
	switch {
	case !r.Valid:
		return nil, nil, r.InvalidReason
	case r.Offered == 0 || r.Success != r.Offered:
		return nil, nil, fmt.Sprintf("%d of %d requests answered 2xx", r.Success, r.Offered)
	}
	ms := func(d time.Duration) *float64 {
		x := float64(d) / float64(time.Millisecond)
		return &x
	}
	return ms(r.AdmittedLatency.P50), ms(r.AdmittedLatency.P99), ""
}

// orZero keeps NaN (unknown) out of points.json, which JSON cannot hold.
func orZero(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0
	}
	return x
}

// measurement is what a load run cost: the target's CPU, the load side's (the load generator's
// and the upstream's) and the busy shares of both cores.
type measurement struct {
	targetCPU, loadCPU  time.Duration
	loadBusy, proxyBusy float64
}

// measure runs the load, which returns the CPU the load generator used, and reads the target,
// the upstream and both cores around it. It fails when the load failed or a server exited.
func measure(st *stack, load func() (time.Duration, error)) (measurement, error) {
	before, upBefore, cpuBefore := st.usage(), treeUsage(st.backend.pid()), readCPUTimes()
	genCPU, err := load()
	after, upAfter, cpuAfter := st.usage(), treeUsage(st.backend.pid()), readCPUTimes()
	if err != nil {
		return measurement{}, err
	}
	for _, w := range st.watch() {
		if err := w.exited(); err != nil {
			return measurement{}, err
		}
	}
	return measurement{
		targetCPU: time.Duration(after.CPUNanos - before.CPUNanos),
		loadCPU:   genCPU + time.Duration(upAfter.CPUNanos-upBefore.CPUNanos),
		loadBusy:  busyShare(cpuBefore, cpuAfter, 0),
		proxyBusy: busyShare(cpuBefore, cpuAfter, 1),
	}, nil
}

// apply sets the point's CPU and core figures; p.Seconds must be set.
func (m measurement) apply(p *CostPoint) {
	p.CPUNanos = m.targetCPU.Nanoseconds()
	p.LoadBusy, p.ProxyBusy = orZero(m.loadBusy), orZero(m.proxyBusy)
	if p.Seconds > 0 {
		p.LoadOwn = orZero(m.loadCPU.Seconds() / p.Seconds)
	}
}

func loadCoreVerdict(busy, limit float64) string {
	if busy >= limit {
		return fmt.Sprintf("load core %.0f%% busy (limit %.0f%%)", 100*busy, 100*limit)
	}
	return ""
}

func tailString(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// startFastUpstream starts nginx answering 200 "ok" to everything, one worker, at addr.
func startFastUpstream(ctx context.Context, bins Binaries, dir, addr string, cpu int, root bool) (*proc, error) {
	udir := filepath.Join(dir, "upstream")
	for _, sub := range []string{"logs", "tmp"} {
		if err := os.MkdirAll(filepath.Join(udir, sub), 0o755); err != nil {
			return nil, err
		}
	}
	path := filepath.Join(udir, "nginx.conf")
	if err := os.WriteFile(path, []byte(fastUpstreamConfig(udir, addr)), 0o644); err != nil {
		return nil, err
	}
	if root {
		if err := makeWritable(udir); err != nil {
			return nil, err
		}
	}
	p, err := startProc("upstream nginx", bins.Nginx, []string{"-p", udir, "-c", path, "-e", filepath.Join(udir, "logs", "error.log")}, nil,
		filepath.Join(dir, "upstream.log"), bins.Taskset, cpu, root)
	if err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, "http://"+addr+"/", 10*time.Second, p); err != nil {
		p.stop(0)
		return nil, fmt.Errorf("upstream nginx: %w", err)
	}
	return p, nil
}

func fastUpstreamConfig(dir, addr string) string {
	return nginxHead("the cost scenario's upstream, answering 200 at once", dir) + fmt.Sprintf(`  server {
    listen %s;
    location / { return 200 "ok\n"; }
  }
}
`, addr)
}

// wrkResult is what the harness reads from wrk's report.
type wrkResult struct {
	Requests, Non2xx, SocketErrors int64
	Seconds                        float64
	P50Ms, P99Ms                   float64
	// CPU is the CPU time wrk used (set by the caller).
	CPU time.Duration
}

// parseWrk reads wrk --latency output: "N requests in 10.00s", "Non-2xx or 3xx responses: N",
// "Socket errors: connect A, read B, write C, timeout D" and the latency distribution.
func parseWrk(out string) (wrkResult, error) {
	r := wrkResult{P50Ms: math.NaN(), P99Ms: math.NaN()}
	found := false
	s := bufio.NewScanner(strings.NewReader(out))
	for s.Scan() {
		f := strings.Fields(s.Text())
		switch {
		case len(f) >= 4 && f[1] == "requests" && f[2] == "in":
			n, err1 := strconv.ParseInt(f[0], 10, 64)
			d, err2 := time.ParseDuration(strings.TrimSuffix(f[3], ","))
			if err1 != nil || err2 != nil {
				return r, fmt.Errorf("wrk: cannot read %q", s.Text())
			}
			r.Requests, r.Seconds, found = n, d.Seconds(), true
		case len(f) == 5 && f[0] == "Non-2xx":
			r.Non2xx, _ = strconv.ParseInt(f[4], 10, 64)
		case len(f) >= 2 && f[0] == "Socket" && f[1] == "errors:":
			for _, part := range strings.Split(strings.Join(f[2:], " "), ",") {
				kv := strings.Fields(part)
				if len(kv) == 2 {
					n, _ := strconv.ParseInt(kv[1], 10, 64)
					r.SocketErrors += n
				}
			}
		case len(f) == 2 && (f[0] == "50%" || f[0] == "99%"):
			ms, err := wrkMs(f[1])
			if err != nil {
				return r, err
			}
			if f[0] == "50%" {
				r.P50Ms = ms
			} else {
				r.P99Ms = ms
			}
		}
	}
	if !found {
		return r, fmt.Errorf("wrk: no \"requests in\" line in its output: %s", tailString(out, 5))
	}
	return r, nil
}

// wrkMs converts wrk's "812.00us", "1.23ms", "2.00s" or "1.5m" to milliseconds.
func wrkMs(s string) (float64, error) {
	units := []struct {
		suffix string
		ms     float64
	}{{"us", 1e-3}, {"ms", 1}, {"s", 1e3}, {"m", 60e3}}
	for _, u := range units {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			x, err := strconv.ParseFloat(num, 64)
			if err != nil {
				break
			}
			return x * u.ms, nil
		}
	}
	return math.NaN(), fmt.Errorf("wrk: cannot read latency %q", s)
}

// cpuTimes are the per-CPU busy and total jiffies from /proc/stat.
type cpuTimes map[int][2]uint64

func readCPUTimes() cpuTimes {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	return parseCPUTimes(string(b))
}

// parseCPUTimes reads the "cpuN user nice system idle iowait irq softirq steal" lines; busy is
// everything but idle and iowait.
func parseCPUTimes(stat string) cpuTimes {
	out := cpuTimes{}
	for _, line := range strings.Split(stat, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		id, err := strconv.Atoi(f[0][3:])
		if err != nil {
			continue
		}
		var total, idle uint64
		for i, x := range f[1:] {
			if i >= 8 { // guest times are already in user and nice
				break
			}
			n, _ := strconv.ParseUint(x, 10, 64)
			total += n
			if i == 3 || i == 4 {
				idle += n
			}
		}
		out[id] = [2]uint64{total - idle, total}
	}
	return out
}

// busyShare is the share of time CPU cpu was busy between two readings (NaN when unknown).
func busyShare(a, b cpuTimes, cpu int) float64 {
	x, okA := a[cpu]
	y, okB := b[cpu]
	if !okA || !okB || y[1] <= x[1] {
		return math.NaN()
	}
	return float64(y[0]-x[0]) / float64(y[1]-x[1])
}

// --- report ---

// costStat is the median of a figure over the valid repeats of one target and phase.
func (r *CostResult) costStat(target, phase string, get func(CostPoint) float64) Stat {
	var xs []float64
	for _, p := range r.Points {
		if p.Target == target && p.Phase == phase && p.Valid() {
			xs = append(xs, get(p))
		}
	}
	return statOf(xs)
}

// addedOverDirect is the target's figure minus direct's in the same repeat, at the fixed rate.
func (r *CostResult) addedOverDirect(target string, get func(CostPoint) float64) Stat {
	direct := map[int]CostPoint{}
	for _, p := range r.Points {
		if p.Target == "direct" && p.Phase == PhaseRate && p.Valid() {
			direct[p.Repeat] = p
		}
	}
	var xs []float64
	for _, p := range r.Points {
		if d, ok := direct[p.Repeat]; ok && p.Target == target && p.Phase == PhaseRate && p.Valid() {
			xs = append(xs, get(p)-get(d))
		}
	}
	return statOf(xs)
}

// addedPair shows the target's added p50 / p99 over direct.
func (r *CostResult) addedPair(target string, p50, p99 func(CostPoint) float64) string {
	return fmtNum(r.addedOverDirect(target, p50).Median, "ms") + " / " + fmtNum(r.addedOverDirect(target, p99).Median, "ms")
}

// ceilingPairs lists, for every loadshed target, its ceiling over Envoy's repeat by repeat: the
// proxy core's speed drifts between points on a shared machine, and the spread of these ratios
// says how far one run's medians can be trusted.
func (r *CostResult) ceilingPairs(w *strings.Builder) {
	if !r.has("envoy/proxy") {
		return
	}
	envoy := map[int]float64{}
	for _, p := range r.Points {
		if p.Target == "envoy/proxy" && p.Phase == PhaseCeiling && p.Valid() {
			envoy[p.Repeat] = p.ServedRPS()
		}
	}
	wrote := false
	for _, t := range r.Targets {
		if t.Kind != KindLoadshed {
			continue
		}
		var xs []float64
		var text []string
		for _, p := range r.Points {
			if e, ok := envoy[p.Repeat]; ok && e > 0 && p.Target == t.Name && p.Phase == PhaseCeiling && p.Valid() {
				x := p.ServedRPS() / e
				xs = append(xs, x)
				text = append(text, fmt.Sprintf("%.2f", x))
			}
		}
		if len(xs) < 2 {
			continue
		}
		st := statOf(xs)
		fmt.Fprintf(w, "- %s over envoy/proxy, repeat by repeat: %s (median %.2f, range %.2f-%.2f)\n", t.Name, strings.Join(text, ", "), st.Median, st.Min, st.Max)
		wrote = true
	}
	if wrote {
		w.WriteString("\n")
	}
}

func (r *CostResult) counts(target, phase string) (valid, total int) {
	for _, p := range r.Points {
		if p.Target == target && p.Phase == phase {
			total++
			if p.Valid() {
				valid++
			}
		}
	}
	return valid, total
}

func (r *CostResult) has(target string) bool {
	for _, t := range r.Targets {
		if t.Name == target {
			return true
		}
	}
	return false
}

var (
	servedRPS = func(p CostPoint) float64 { return p.ServedRPS() }
	cpuUs     = func(p CostPoint) float64 { return p.CPUPerRequestUs() }
	p50Ms     = func(p CostPoint) float64 { return p.P50Ms }
	p99Ms     = func(p CostPoint) float64 { return p.P99Ms }
	outP50Ms  = func(p CostPoint) float64 { return v(p.OutP50Ms) }
	outP99Ms  = func(p CostPoint) float64 { return v(p.OutP99Ms) }
	genP50Ms  = func(p CostPoint) float64 { return v(p.GenP50Ms) }
	genP99Ms  = func(p CostPoint) float64 { return v(p.GenP99Ms) }
	loadBusy  = func(p CostPoint) float64 { return p.LoadBusy }
	loadOwn   = func(p CostPoint) float64 { return p.LoadOwn }
	proxyBusy = func(p CostPoint) float64 { return p.ProxyBusy }
	// otherOnProxyCore is the busy share of the proxy's core not spent by the proxy: other
	// work on the machine that competed with it.
	otherOnProxyCore = func(p CostPoint) float64 {
		if p.Seconds <= 0 {
			return math.NaN()
		}
		return math.Max(0, p.ProxyBusy-float64(p.CPUNanos)/1e9/p.Seconds)
	}
	refusedShare = func(p CostPoint) float64 {
		if p.Requests == 0 {
			return math.NaN()
		}
		return float64(p.Requests-p.Served) / float64(p.Requests)
	}
)

func (r *CostResult) markdown(w *strings.Builder) {
	c := r.Config
	fmt.Fprintf(w, "# The cost of a proxy, one core each\n\n")
	fmt.Fprintf(w, "Command: `%s`  \n", c.CommandLine)
	fmt.Fprintf(w, "Run: %s, %s, %d CPUs, %s elapsed; %d repeat(s), targets interleaved and rotated; medians of valid repeats.  \n",
		r.Started.UTC().Format(time.RFC3339), runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), r.Elapsed.Round(time.Second), c.Repeats)
	fmt.Fprintf(w, "Placement: each proxy pinned to CPU 1 with one worker (nginx `worker_processes 1`, HAProxy `nbthread 1`, Envoy `--concurrency 1`, Go `GOMAXPROCS=1`); load generator and upstream pinned to CPU 0. A point whose CPU 0 was %.0f%% busy or more is invalid.  \n", 100*c.BusyLimit)
	fmt.Fprintf(w, "Ceiling: `wrk -t1 -c%d` for %s (after %s of warm-up) in front of nginx `return 200`. Fixed rate: k6 open model at %g requests/s for %s in front of the backend (%d workers x %s, C = %.0f rps); loadshed inflight limit L = %d.",
		c.Connections, c.CeilingDuration, c.Warmup, c.Rate, c.RateDuration, c.Backend.Workers, c.Backend.Service, r.Limits.CapacityRPS, r.Limits.InFlight)
	if c.LatencyDuration > 0 {
		fmt.Fprintf(w, " Then, on the same processes, the project's open-loop generator (`cmd/loadgen`) at the same rate for %s.", c.LatencyDuration)
	}
	w.WriteString("\n\n")

	fmt.Fprintf(w, "| target | settings |\n|---|---|\n")
	for _, t := range r.Targets {
		fmt.Fprintf(w, "| %s | %s |\n", t.Name, t.Settings)
	}
	w.WriteString("\n")

	ref := func(name string, phase string, get func(CostPoint) float64) float64 {
		if !r.has(name) {
			return math.NaN()
		}
		return r.costStat(name, phase, get).Median
	}
	envoyCeil, nginxCeil := ref("envoy/proxy", PhaseCeiling, servedRPS), ref("nginx/proxy", PhaseCeiling, servedRPS)
	fmt.Fprintf(w, "## Forwarding ceiling (wrk -t1 -c%d, fast upstream)\n\n", c.Connections)
	fmt.Fprintf(w, "| target | valid | served rps | vs envoy/proxy | vs nginx/proxy | refused | p50 ms | p99 ms | CPU us/req | proxy core busy | other load on proxy core | load core busy (load generator + upstream) |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, t := range r.Targets {
		valid, total := r.counts(t.Name, PhaseCeiling)
		st := func(get func(CostPoint) float64) float64 { return r.costStat(t.Name, PhaseCeiling, get).Median }
		if valid == 0 {
			// Show what was measured, marked: an invalid ceiling is still a lower bound.
			fmt.Fprintf(w, "| %s | 0/%d | %s |  |  |  |  |  |  |  |  | %s |\n", t.Name, total, r.invalidSummary(t.Name, PhaseCeiling), r.rawBusy(t.Name, PhaseCeiling))
			continue
		}
		rps := st(servedRPS)
		fmt.Fprintf(w, "| %s | %d/%d | %.0f | %s | %s | %s | %s | %s | %.1f | %s | %s | %s |\n", t.Name, valid, total, rps,
			fmtRatio(rps, envoyCeil), fmtRatio(rps, nginxCeil), fmtPct(st(refusedShare)), fmtNum(st(p50Ms), "ms"), fmtNum(st(p99Ms), "ms"),
			st(cpuUs), fmtPct(st(proxyBusy)), fmtPct(st(otherOnProxyCore)), fmtBusy(st(loadBusy), st(loadOwn)))
	}
	w.WriteString("\ndirect: wrk straight to the upstream, both on CPU 0 (the load core's own ceiling, for reference).\n\n")
	r.ceilingPairs(w)

	plainCPU, nginxCPU := ref("plainproxy", PhaseRate, cpuUs), ref("nginx/proxy", PhaseRate, cpuUs)
	fmt.Fprintf(w, "## At %g requests/s (backend %d x %s)\n\n", c.Rate, c.Backend.Workers, c.Backend.Service)
	fmt.Fprintf(w, "CPU per request = the proxy's CPU time (every thread, from /proc) over the requests k6 sent. "+
		"Added latency = target minus direct in the same repeat, median over repeats, three ways. "+
		"First from the open-loop Go generator's run, latency from each request's scheduled time: "+
		"it costs the shared load core a fraction of what k6 does, and direct's own p99 through it moves by a fraction of a millisecond between repeats. "+
		"Then from k6's run: per request, each answer's latency less the time the backend reports for it "+
		"(`X-Backend-Wait` + `X-Backend-Service`), and from the whole latency; both carry k6's own scheduling jitter on the shared load core "+
		"(direct's p99 through k6 moves by several ms between repeats, more than the 1 ms the goal asks about).\n\n")
	fmt.Fprintf(w, "| target | valid | CPU us/req | vs plainproxy | vs nginx/proxy | added p50 / p99 ms, open-loop generator | added p50 / p99 ms, k6 outside the backend | added p50 / p99 ms, k6 whole latency | generator p99 ms | k6 p99 ms | load core busy (load generator + upstream) | other load on proxy core |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, t := range r.Targets {
		valid, total := r.counts(t.Name, PhaseRate)
		if valid == 0 {
			fmt.Fprintf(w, "| %s | 0/%d | %s |  |  |  |  |  |  |  | %s |  |\n", t.Name, total, r.invalidSummary(t.Name, PhaseRate), r.rawBusy(t.Name, PhaseRate))
			continue
		}
		st := func(get func(CostPoint) float64) float64 { return r.costStat(t.Name, PhaseRate, get).Median }
		cpu := st(cpuUs)
		gen, out, whole := "", "", ""
		if t.Kind != KindDirect {
			gen, out, whole = r.addedPair(t.Name, genP50Ms, genP99Ms), r.addedPair(t.Name, outP50Ms, outP99Ms), r.addedPair(t.Name, p50Ms, p99Ms)
		}
		cpuText, vsPlain, vsNginx := fmtNum(cpu, "us"), fmtRatio(cpu, plainCPU), fmtRatio(cpu, nginxCPU)
		if t.Kind == KindDirect {
			cpuText, vsPlain, vsNginx = "", "", ""
		}
		fmt.Fprintf(w, "| %s | %d/%d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", t.Name, valid, total, cpuText, vsPlain, vsNginx,
			gen, out, whole, fmtNum(st(genP99Ms), "ms"), fmtNum(st(p99Ms), "ms"), fmtBusy(st(loadBusy), st(loadOwn)), fmtPct(st(otherOnProxyCore)))
	}
	w.WriteString("\n")

	r.costGoals(w)
	w.WriteString("## README table\n\n")
	r.readmeTable(w)
	w.WriteString("\n")

	var bad []string
	for _, p := range r.Points {
		switch {
		case p.Err != "":
			bad = append(bad, fmt.Sprintf("- %s %s repeat %d: FAILED: %s", p.Target, p.Phase, p.Repeat, firstLine(p.Err)))
		case p.Invalid != "":
			bad = append(bad, fmt.Sprintf("- %s %s repeat %d: INVALID: %s", p.Target, p.Phase, p.Repeat, p.Invalid))
		}
		if p.GenInvalid != "" {
			bad = append(bad, fmt.Sprintf("- %s %s repeat %d: open-loop latency run INVALID: %s", p.Target, p.Phase, p.Repeat, p.GenInvalid))
		}
	}
	if len(bad) > 0 {
		fmt.Fprintf(w, "## Points not used\n\n%s\n\n", strings.Join(bad, "\n"))
	}
}

// invalidSummary shows the median served rps of invalid points, marked, or INVALID.
func (r *CostResult) invalidSummary(target, phase string) string {
	var xs []float64
	for _, p := range r.Points {
		if p.Target == target && p.Phase == phase && p.Err == "" {
			if phase == PhaseCeiling {
				xs = append(xs, p.ServedRPS())
			} else {
				xs = append(xs, p.CPUPerRequestUs())
			}
		}
	}
	st := statOf(xs)
	if st.N == 0 {
		return "INVALID"
	}
	if phase == PhaseCeiling {
		return fmt.Sprintf("INVALID (%.0f rps measured)", st.Median)
	}
	return fmt.Sprintf("INVALID (%.1f us/req measured)", st.Median)
}

func (r *CostResult) rawBusy(target, phase string) string {
	var busy, own []float64
	for _, p := range r.Points {
		if p.Target == target && p.Phase == phase && p.Err == "" {
			busy, own = append(busy, p.LoadBusy), append(own, p.LoadOwn)
		}
	}
	return fmtBusy(statOf(busy).Median, statOf(own).Median)
}

// fmtBusy shows a core's busy share with the part the harness's own processes used.
func fmtBusy(busy, own float64) string {
	return fmtPct(busy) + " (" + fmtPct(own) + ")"
}

func fmtPct(x float64) string {
	if math.IsNaN(x) {
		return "n/a"
	}
	return fmt.Sprintf("%.0f%%", 100*x)
}

// costGoals evaluates issue 16's acceptance figures; reported, not enforced.
func (r *CostResult) costGoals(w *strings.Builder) {
	med := func(t, phase string, get func(CostPoint) float64) float64 {
		if !r.has(t) {
			return math.NaN()
		}
		return r.costStat(t, phase, get).Median
	}
	check := func(x float64, ok bool) string {
		if math.IsNaN(x) {
			return "n/a"
		}
		return verdict(ok)
	}
	fmt.Fprintf(w, "## Goals (issue 16; reported, not enforced)\n\n| goal | loadshed strategy | value | verdict |\n|---|---|---|---|\n")
	envoy := med("envoy/proxy", PhaseCeiling, servedRPS)
	plain := med("plainproxy", PhaseRate, cpuUs)
	nginx := med("nginx/proxy", PhaseRate, cpuUs)
	none := med("loadshed/none", PhaseCeiling, servedRPS)
	for _, t := range r.Targets {
		if t.Kind != KindLoadshed {
			continue
		}
		s := strings.TrimPrefix(t.Name, "loadshed/")
		ceil := med(t.Name, PhaseCeiling, servedRPS)
		x := ceil / envoy
		fmt.Fprintf(w, "| forwarding ceiling >= 1.5 x Envoy's | %s | %s | %s |\n", s, fmtNum(x, ""), check(x, x >= 1.5))
		cpu := med(t.Name, PhaseRate, cpuUs)
		x = cpu / plain
		fmt.Fprintf(w, "| CPU per request at the fixed rate <= 1.0 x plainproxy's | %s | %s | %s |\n", s, fmtNum(x, ""), check(x, x <= 1.0))
		x = cpu / nginx
		fmt.Fprintf(w, "| (stretch) CPU per request <= 2 x nginx's | %s | %s | %s |\n", s, fmtNum(x, ""), check(x, x <= 2))
		a := r.addedOverDirect(t.Name, genP99Ms).Median
		fmt.Fprintf(w, "| added p99 at the fixed rate <= 1 ms (open-loop generator) | %s | %s | %s |\n", s, fmtNum(a, "ms"), check(a, a <= 1))
		a = r.addedOverDirect(t.Name, outP99Ms).Median
		fmt.Fprintf(w, "| added p99 at the fixed rate <= 1 ms (k6, per request outside the backend) | %s | %s | %s |\n", s, fmtNum(a, "ms"), check(a, a <= 1))
		if s != "none" {
			x = ceil / none
			fmt.Fprintf(w, "| closed-loop saturation: serves >= 0.9 x what none serves | %s | %s | %s |\n", s, fmtNum(x, ""), check(x, x >= 0.9))
		}
	}
	w.WriteString("\n")
}

// readmeTable is the summary the top-level README quotes.
func (r *CostResult) readmeTable(w *strings.Builder) {
	envoy := math.NaN()
	if r.has("envoy/proxy") {
		envoy = r.costStat("envoy/proxy", PhaseCeiling, servedRPS).Median
	}
	plain := math.NaN()
	if r.has("plainproxy") {
		plain = r.costStat("plainproxy", PhaseRate, cpuUs).Median
	}
	fmt.Fprintf(w, "| proxy (one core) | forwarding ceiling rps | vs Envoy | CPU per request at %g rps | vs plain httputil | added p50 / p99 ms, open-loop generator | added p50 / p99 ms, k6 outside the backend |\n|---|---|---|---|---|---|---|\n", r.Config.Rate)
	for _, t := range r.Targets {
		if t.Kind == KindDirect {
			continue
		}
		ceilSt := r.costStat(t.Name, PhaseCeiling, servedRPS)
		ceil := "INVALID"
		if ceilSt.N > 0 {
			ceil = fmt.Sprintf("%.0f", ceilSt.Median)
		}
		cpu := r.costStat(t.Name, PhaseRate, cpuUs).Median
		cpuText := "n/a"
		if !math.IsNaN(cpu) {
			cpuText = fmtNum(cpu, "us") + " us"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", t.Name, ceil, fmtRatio(ceilSt.Median, envoy), cpuText, fmtRatio(cpu, plain),
			r.addedPair(t.Name, genP50Ms, genP99Ms), r.addedPair(t.Name, outP50Ms, outP99Ms))
	}
}

func (r *CostResult) writeOutputs(stdout io.Writer) error {
	dir := r.Config.OutDir
	var md, tbl strings.Builder
	r.markdown(&md)
	r.readmeTable(&tbl)
	if err := os.WriteFile(filepath.Join(dir, "readme-table.md"), []byte(tbl.String()), 0o644); err != nil {
		return err
	}
	if err := writeReport(dir, r, md.String(), stdout); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "points.csv"))
	if err != nil {
		return err
	}
	defer f.Close()
	cw := csv.NewWriter(f)
	_ = cw.Write([]string{"target", "phase", "repeat", "valid", "invalid_reason", "requests", "served", "errors", "seconds", "served_rps",
		"p50_ms", "p99_ms", "cpu_us_per_req", "load_core_busy", "load_core_own", "proxy_core_busy", "gen_p50_ms", "gen_p99_ms", "gen_invalid", "error"})
	for _, p := range r.Points {
		_ = cw.Write([]string{p.Target, p.Phase, fmt.Sprint(p.Repeat), strconv.FormatBool(p.Valid()), p.Invalid,
			fmt.Sprint(p.Requests), fmt.Sprint(p.Served), fmt.Sprint(p.Errors), csvNum(p.Seconds), csvNum(p.ServedRPS()),
			csvNum(p.P50Ms), csvNum(p.P99Ms), csvNum(p.CPUPerRequestUs()), csvNum(p.LoadBusy), csvNum(p.LoadOwn), csvNum(p.ProxyBusy),
			csvNum(v(p.GenP50Ms)), csvNum(v(p.GenP99Ms)), p.GenInvalid, firstLine(p.Err)})
	}
	cw.Flush()
	return cw.Error()
}
