package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/loadshed/loadshed/bench/k6summary"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The adaptive scenario (issue 18) runs loadshed's adaptive strategy (its default and each
// algorithm) and Envoy's adaptive_concurrency side by side, none told the capacity, over backends
// of W workers with a constant or a slow-tail service time, at several overloads, and traces each
// one's concurrency limit over time.

// Service time shapes of the adaptive scenario.
const (
	ServiceConstant = "constant"
	ServiceSlowTail = "slow-tail"
)

// AdaptiveConfig is one run of the adaptive scenario. The embedded Config gives the shared
// settings; its Backend fixes the capacity C = Workers/Service that every case keeps (a case of
// W workers serves in W/C), and its SLO is scaled with the service time (SLO x S/Service).
// With FixedService, every case serves in Backend.Service instead, with the SLO as given, and
// its capacity W/Service grows with W (and so do the offered rates).
type AdaptiveConfig struct {
	Config
	FixedService bool `json:",omitempty"`
	// Workers are the backend sizes W, one case each (per service shape).
	Workers []int
	// Services are the service time shapes (ServiceConstant, ServiceSlowTail).
	Services []string
	// Warmup runs each point's load for this long before the measurement.
	Warmup time.Duration
}

// AdaptiveVariant is an extra adaptive target: Block is the adaptive block's body in the
// config file's flow style, e.g. "{queue: {depthPerLimit: 0}}".
type AdaptiveVariant struct{ Name, Block string }

// Validate reports every problem, naming the field.
func (c AdaptiveConfig) Validate() error {
	errs := []error{c.Config.Validate()}
	if len(c.Workers) == 0 {
		errs = append(errs, errors.New("Workers: need at least one backend size"))
	}
	for _, w := range c.Workers {
		if w < 1 || w > 4096 {
			errs = append(errs, fmt.Errorf("Workers: %d is not in [1, 4096]", w))
		}
	}
	if len(c.Services) == 0 {
		errs = append(errs, errors.New("Services: need at least one service shape"))
	}
	for _, s := range c.Services {
		if s != ServiceConstant && s != ServiceSlowTail {
			errs = append(errs, fmt.Errorf("Services: want %q or %q, got %q", ServiceConstant, ServiceSlowTail, s))
		}
	}
	if c.Warmup < 0 {
		errs = append(errs, fmt.Errorf("Warmup: must not be negative, got %s", c.Warmup))
	}
	return errors.Join(errs...)
}

// AdaptiveCase is one backend of the scenario.
type AdaptiveCase struct {
	Name    string // "w8-constant"
	Workers int
	Service string
	Backend Backend
	SLO     time.Duration
	Limits  Limits
}

// adaptiveCases are the backends, W-major.
func (c AdaptiveConfig) cases() ([]AdaptiveCase, error) {
	capacity := c.Backend.CapacityRPS()
	var out []AdaptiveCase
	for _, w := range c.Workers {
		s := time.Duration(float64(w) / capacity * float64(time.Second)).Round(time.Microsecond)
		slo := time.Duration(float64(c.SLO) * float64(s) / float64(c.Backend.Service)).Round(time.Millisecond)
		if c.FixedService {
			s, slo = c.Backend.Service, c.SLO
		}
		for _, shape := range c.Services {
			b := Backend{Workers: w, Service: s, SlowTail: shape == ServiceSlowTail}
			l, err := DeriveLimits(b, slo)
			if err != nil {
				return nil, fmt.Errorf("W=%d: %w", w, err)
			}
			out = append(out, AdaptiveCase{Name: fmt.Sprintf("w%d-%s", w, shape), Workers: w, Service: shape, Backend: b, SLO: slo, Limits: l})
		}
	}
	return out, nil
}

// AdaptiveRun is one scenario (case and load) of the run.
type AdaptiveRun struct {
	Case     int
	Scenario Scenario
}

// AdaptiveResult is everything one adaptive run measured.
type AdaptiveResult struct {
	// Kind is "adaptive", so --report-from knows the file.
	Kind    string
	Config  AdaptiveConfig
	Cases   []AdaptiveCase
	Runs    []AdaptiveRun
	Targets []Target
	Skipped []Skipped
	Points  []Point
	Started time.Time
	Elapsed time.Duration
}

// DefaultAdaptive is the target whose figures the judgement uses: loadshed's adaptive strategy
// as a user gets it, against EnvoyAdaptive.
const (
	DefaultAdaptive = "loadshed/adaptive"
	EnvoyAdaptive   = "envoy/adaptive_concurrency"
	// EnvoyLoadshed is Envoy with loadshed (adaptive) as its external processor.
	EnvoyLoadshed = "envoy+loadshed"
)

// RunAdaptive runs the adaptive scenario and writes its outputs into cfg.OutDir.
func RunAdaptive(ctx context.Context, cfg AdaptiveConfig, stdout, stderr io.Writer) (*AdaptiveResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cases, err := cfg.cases()
	if err != nil {
		return nil, err
	}
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "bench adaptive: "+format+"\n", a...) }
	targets, err := SelectTargets(AdaptiveTargets(cases[0].Limits, cfg.Variants...), cfg.Targets)
	if err != nil {
		return nil, err
	}
	work, cleanup, err := workDir(cfg.WorkDir, cfg.KeepWork, "loadshed-adaptive-")
	if err != nil {
		return nil, err
	}
	defer cleanup()
	if err := os.MkdirAll(filepath.Join(cfg.OutDir, "k6"), 0o755); err != nil {
		return nil, err
	}
	bins, err := prepareBinaries(ctx, cfg.Config, targets, work, logf)
	if err != nil {
		return nil, err
	}
	if cfg.Generator == GeneratorLoadgen && bins.Loadgen == "" {
		if bins.Loadgen, err = buildProgram(ctx, cfg.RepoRoot, filepath.Join(work, "bin"), "cmd/loadgen", "loadgen", logf); err != nil {
			return nil, err
		}
	}
	root := os.Geteuid() == 0
	pinned := cfg.Pin != PinNone && bins.Taskset != "" && runtime.NumCPU() >= 2
	res := &AdaptiveResult{Kind: "adaptive", Config: cfg, Cases: cases, Started: time.Now()}
	if res.Targets, res.Skipped, err = acceptedTargets(ctx, targets, bins.Proxy, cases[0].Limits, work, cfg.Quick, logf); err != nil {
		return nil, err
	}
	for i, c := range cases {
		for _, l := range cfg.Loads {
			res.Runs = append(res.Runs, AdaptiveRun{Case: i, Scenario: Scenario{
				Name: fmt.Sprintf("%s-%gx", c.Name, l), Script: "overload.js", Load: l, Warmup: cfg.Warmup,
				Env: map[string]string{"K": fmt.Sprint(l), "DURATION": cfg.PointDuration.String()},
			}})
		}
	}

	var failures []string
	n, total := 0, cfg.Repeats*len(res.Runs)*len(res.Targets)
	for rep := 1; rep <= cfg.Repeats; rep++ {
		for _, run := range res.Runs {
			c := cases[run.Case]
			ccfg := cfg.Config
			ccfg.Backend, ccfg.SLO = c.Backend, c.SLO
			cres := &Result{Limits: c.Limits, Pinned: pinned}
			for _, t := range rotate(res.Targets, rep-1) {
				if err := ctx.Err(); err != nil {
					return res, err
				}
				n++
				logf("[%d/%d] repeat %d, %s, %s", n, total, rep, run.Scenario.Name, t.Name)
				p := runPoint(ctx, ccfg, cres, bins, t, run.Scenario, rep, work, root)
				res.Points = append(res.Points, p)
				switch {
				case p.Err != "":
					logf("  FAILED: %s", p.Err)
					failures = append(failures, fmt.Sprintf("%s %s repeat %d: %s", t.Name, run.Scenario.Name, rep, p.Err))
					if cfg.Quick {
						res.Elapsed = time.Since(res.Started)
						_ = res.writeOutputs(stdout)
						return res, fmt.Errorf("%s at %s failed: %s", t.Name, run.Scenario.Name, p.Err)
					}
				case !p.Summary.Valid:
					logf("  INVALID: %s", p.Summary.InvalidReason)
				default:
					s := p.Summary
					logf("  goodput/C %.3f, admitted p99 %s ms, shed %.1f%%, mean limit %s",
						k6summary.Value(s.GoodputRatio), fmtMs(s.AdmittedMs.P99), 100*s.ShedShare, fmtNum(meanLimit(p), "n"))
				}
			}
		}
	}
	res.Elapsed = time.Since(res.Started)
	return res, finishRun(func() error { return res.writeOutputs(stdout) }, failures)
}

// meanLimit is the mean of the trace over the measured run (after the warm-up); NaN without
// a trace.
func meanLimit(p Point) float64 {
	var sum float64
	n := 0
	for _, s := range p.Trace {
		if s.T >= p.TraceStart {
			sum += s.Limit
			n++
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return sum / float64(n)
}

// result is the run as a plain Result, for the per-target cells and the CSV files.
func (r *AdaptiveResult) result() *Result {
	rr := &Result{Config: r.Config.Config, Targets: r.Targets, Points: r.Points, Started: r.Started, Elapsed: r.Elapsed}
	for _, run := range r.Runs {
		rr.Scenarios = append(rr.Scenarios, run.Scenario)
	}
	return rr
}

// meanLimitStat is the median over valid repeats of the mean limit.
func (r *AdaptiveResult) meanLimitStat(target, scenario string) Stat {
	var xs []float64
	for _, p := range r.Points {
		if p.Target == target && p.Scenario == scenario && p.Valid() {
			xs = append(xs, meanLimit(p))
		}
	}
	return statOf(xs)
}

// fmtFixed writes x with prec decimals, or n/a.
func fmtFixed(x float64, prec int) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "n/a"
	}
	return strconv.FormatFloat(x, 'f', prec, 64)
}

// backendStats are the medians over valid repeats of the backend's busy share (of w workers)
// and mean service time in ms, over the points whose backend usage was read.
func (r *AdaptiveResult) backendStats(target, scenario string, w int) (busy, service Stat) {
	var bs, ss []float64
	for _, p := range r.Points {
		if p.Target != target || p.Scenario != scenario || !p.Valid() || p.Backend == nil || p.Backend.Served <= 0 {
			continue
		}
		bs = append(bs, p.Backend.Busy(w, p.Summary.DurationS))
		ss = append(ss, 1e3*p.Backend.ServiceSeconds/float64(p.Backend.Served))
	}
	return statOf(bs), statOf(ss)
}

func (r *AdaptiveResult) hasTarget(name string) bool {
	for _, t := range r.Targets {
		if t.Name == name {
			return true
		}
	}
	return false
}

// judgement is issue 18's acceptance at one scenario: loadshed's default adaptive goodput at
// least Envoy's and its admitted p99 at most 1.1 x Envoy's (medians of the valid repeats).
type judgement struct {
	lsGoodput, envGoodput, lsP99, envP99 float64
	verdict                              string
}

func (r *AdaptiveResult) judge(cells map[string]map[string]*Cell, scenario string) judgement {
	j := judgement{lsGoodput: math.NaN(), envGoodput: math.NaN(), lsP99: math.NaN(), envP99: math.NaN(), verdict: "n/a"}
	if !r.hasTarget(DefaultAdaptive) || !r.hasTarget(EnvoyAdaptive) {
		return j
	}
	ls, env := cells[DefaultAdaptive][scenario], cells[EnvoyAdaptive][scenario]
	if ls.Valid == 0 || env.Valid == 0 {
		j.verdict = "INVALID"
		return j
	}
	j.lsGoodput, j.envGoodput = ls.Stats["goodput_ratio"].Median, env.Stats["goodput_ratio"].Median
	j.lsP99, j.envP99 = ls.Stats["admitted_p99_ms"].Median, env.Stats["admitted_p99_ms"].Median
	j.verdict = verdict(j.lsGoodput >= j.envGoodput && j.lsP99 <= 1.1*j.envP99)
	return j
}

func (r *AdaptiveResult) markdown(w *strings.Builder) {
	c := r.Config
	rr := r.result()
	cells := rr.Cells()
	fmt.Fprintf(w, "# Adaptive admission: loadshed vs Envoy's adaptive_concurrency\n\n")
	fmt.Fprintf(w, "Command: `%s`  \n", c.CommandLine)
	fmt.Fprintf(w, "Run: %s, %s, %d CPUs, %s elapsed; %d repeat(s), targets interleaved and rotated; medians of valid repeats.  \n",
		r.Started.UTC().Format(time.RFC3339), runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), r.Elapsed.Round(time.Second), c.Repeats)
	backends := fmt.Sprintf("capacity C = %.0f rps in every case, W workers serving in S = W/C (W and S grow together); SLO %s at S = %s, scaled with S", c.Backend.CapacityRPS(), c.SLO, c.Backend.Service)
	if c.FixedService {
		backends = fmt.Sprintf("service time S = %s in every case, capacity C = W/S (the offered rates grow with W); SLO %s", c.Backend.Service, c.SLO)
	}
	fmt.Fprintf(w, "Backends: %s; constant service, or slow-tail (the project's slow-tail model scaled to the service time: stddev S/4, 1%% of requests in an exponential tail of mean 15 S clamped to [5 S, 100 S], which takes about an eighth of C); client timeout %s. Each point: %s of the same load unmeasured (warm-up), then %s measured; fresh backend and target per point. Limits traced every %s (loadshed: `loadshed_limit` on /metrics; Envoy: the gradient controller's `concurrency_limit` on its admin /stats). Nobody is told the capacity.\n\n",
		backends, c.ClientTimeout, c.Warmup, c.PointDuration, c.TraceEvery)
	if c.Generator == GeneratorLoadgen {
		fmt.Fprintf(w, "Load: `cmd/loadgen` (--generator loadgen), overload.js's load without k6: evenly spaced arrivals at K x C, latency counted from each request's scheduled time (k6 counts from when it sent the request), no outside-the-backend latency. The warm-up is the same run's first part (loadgen --warmup), so the measured window starts and ends with the requests in flight of a steady state (a window that starts empty credits each target with what it holds in flight when the load stops). Raw results: `k6/*.loadgen.json`.\n\n")
	} else {
		fmt.Fprintf(w, "Load: k6, `loadtest/k6/overload.js` (constant arrival rate).\n\n")
	}

	fmt.Fprintf(w, "| target | settings |\n|---|---|\n")
	for _, t := range r.Targets {
		fmt.Fprintf(w, "| %s | %s |\n", t.Name, t.Settings)
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "| %s | SKIPPED: %s |\n", s.Target, s.Reason)
	}
	w.WriteString("\n")

	fmt.Fprintf(w, "## Judgement (issue 18; reported, not enforced)\n\n%s goodput >= %s's and admitted p99 <= 1.1 x %s's, at every point.\n\n", DefaultAdaptive, EnvoyAdaptive, EnvoyAdaptive)
	fmt.Fprintf(w, "| W | service | load | loadshed goodput/C | Envoy goodput/C | ratio | loadshed p99 ms | Envoy p99 ms | ratio | verdict |\n|---|---|---|---|---|---|---|---|---|---|\n")
	pass, judged := 0, 0
	for _, run := range r.Runs {
		cs := r.Cases[run.Case]
		j := r.judge(cells, run.Scenario.Name)
		if j.verdict == "PASS" || j.verdict == "FAIL" {
			judged++
			if j.verdict == "PASS" {
				pass++
			}
		}
		fmt.Fprintf(w, "| %d | %s | %gx | %s | %s | %s | %s | %s | %s | %s |\n", cs.Workers, cs.Service, run.Scenario.Load,
			fmtNum(j.lsGoodput, ""), fmtNum(j.envGoodput, ""), fmtRatio(j.lsGoodput, j.envGoodput),
			fmtNum(j.lsP99, "ms"), fmtNum(j.envP99, "ms"), fmtRatio(j.lsP99, j.envP99), j.verdict)
	}
	fmt.Fprintf(w, "\n%d of %d judged points PASS (%d points in all).\n\n", pass, judged, len(r.Runs))

	cols := []string{"goodput_ratio", "admitted_p50_ms", "admitted_p99_ms", "admitted_p999_ms", "shed_share", "timeout_share"}
	for ci, cs := range r.Cases {
		fmt.Fprintf(w, "## W = %d, %s service (S = %s, C = %.0f rps, SLO %s)\n\n", cs.Workers, cs.Service, cs.Backend.Service, cs.Limits.CapacityRPS, cs.SLO)
		fmt.Fprintf(w, "Mean limit: the traced limit averaged over the measured run (W = %d is what the backend serves at once). Busy: the share of the W workers' time spent serving over the measured run, and service: the mean time a request held a worker (the backend's own service-time histogram, read before and after the run); busy tells a worker left idle from one that served slower.\n\n", cs.Workers)
		fmt.Fprintf(w, "![limit over time](limit-%s.png)\n\n", cs.Name)
		fmt.Fprintf(w, "| load | target | valid | goodput/C | p50 ms | p99 ms | p99.9 ms | shed | timeouts | mean limit | busy | service ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, run := range r.Runs {
			if run.Case != ci {
				continue
			}
			for _, t := range r.Targets {
				cell := cells[t.Name][run.Scenario.Name]
				fmt.Fprintf(w, "| %gx | %s | %d/%d |", run.Scenario.Load, t.Name, cell.Valid, cell.Total)
				for _, k := range cols {
					if cell.Valid == 0 {
						w.WriteString(" INVALID |")
						continue
					}
					fmt.Fprintf(w, " %s |", fmtNum(cell.Stats[k].Median, figureByKey(k).Unit))
				}
				busy, service := r.backendStats(t.Name, run.Scenario.Name, cs.Workers)
				fmt.Fprintf(w, " %s | %s | %s |\n", fmtNum(r.meanLimitStat(t.Name, run.Scenario.Name).Median, "n"),
					fmtFixed(busy.Median, 4), fmtFixed(service.Median, 2))
			}
		}
		w.WriteString("\n")
	}

	pointsNotUsed(w, r.Points)
}

func (r *AdaptiveResult) writeOutputs(stdout io.Writer) error {
	dir := r.Config.OutDir
	var md strings.Builder
	r.markdown(&md)
	if err := writeReport(dir, r, md.String(), stdout); err != nil {
		return err
	}
	rr := r.result()
	cells := rr.Cells()
	if err := rr.writePointsCSV(filepath.Join(dir, "points.csv")); err != nil {
		return err
	}
	if err := rr.writeSummaryCSV(filepath.Join(dir, "summary.csv"), cells); err != nil {
		return err
	}
	for ci, cs := range r.Cases {
		if err := r.limitChart(filepath.Join(dir, "limit-"+cs.Name+".png"), ci); err != nil {
			return fmt.Errorf("chart limit-%s: %w", cs.Name, err)
		}
	}
	return nil
}

// limitChart draws, for one case, a panel per load with each target's limit over time (its
// first repeat with a trace), the measured run's start and the backend's W.
func (r *AdaptiveResult) limitChart(path string, ci int) error {
	cs := r.Cases[ci]
	var panels []*plot.Plot
	for _, run := range r.Runs {
		if run.Case != ci {
			continue
		}
		p := plot.New()
		p.Title.Text = fmt.Sprintf("W = %d, %s, %gx", cs.Workers, cs.Service, run.Scenario.Load)
		p.X.Label.Text = "s since the warm-up began"
		p.Y.Label.Text = "concurrency limit"
		p.Add(plotter.NewGrid())
		p.Legend.Top = true
		p.Legend.TextStyle.Font.Size = vg.Points(9)
		maxT, maxY, start, entries := 0.0, float64(cs.Workers), math.NaN(), 2
		for i, t := range r.Targets {
			pt, ok := r.firstTrace(t.Name, run.Scenario.Name)
			if !ok {
				continue
			}
			xys := make(plotter.XYs, 0, len(pt.Trace))
			for _, s := range pt.Trace {
				xys = append(xys, plotter.XY{X: s.T, Y: s.Limit})
				maxT, maxY = math.Max(maxT, s.T), math.Max(maxY, s.Limit)
			}
			if math.IsNaN(start) {
				start = pt.TraceStart
			}
			line, err := plotter.NewLine(xys)
			if err != nil {
				return err
			}
			line.Color = plotutil.Color(i)
			line.Dashes = plotutil.Dashes(i / 7)
			line.Width = vg.Points(1.2)
			p.Add(line)
			p.Legend.Add(t.Name, line)
			entries++
		}
		if maxT == 0 {
			continue
		}
		ref, err := plotter.NewLine(plotter.XYs{{X: 0, Y: float64(cs.Workers)}, {X: maxT, Y: float64(cs.Workers)}})
		if err != nil {
			return err
		}
		ref.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(ref)
		p.Legend.Add(fmt.Sprintf("W = %d", cs.Workers), ref)
		if !math.IsNaN(start) {
			mark, err := plotter.NewLine(plotter.XYs{{X: start, Y: 0}, {X: start, Y: maxY * 1.05}})
			if err != nil {
				return err
			}
			mark.Dashes = []vg.Length{vg.Points(1), vg.Points(3)}
			p.Add(mark)
			p.Legend.Add("measurement starts", mark)
		}
		// Headroom above the lines for the legend (top right), one band per entry.
		p.X.Min, p.Y.Min, p.Y.Max = 0, 0, maxY*(1.1+0.085*float64(entries))
		panels = append(panels, p)
	}
	if len(panels) == 0 {
		return nil
	}
	cols := min(2, len(panels))
	rows := (len(panels) + cols - 1) / cols
	// Align needs every cell; a cell past the last panel gets an empty plot, not drawn.
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
		for j := range grid[i] {
			grid[i][j] = plot.New()
		}
	}
	for i, p := range panels {
		grid[i/cols][i%cols] = p
	}
	img := vgimg.New(vg.Length(cols)*7*vg.Inch, vg.Length(rows)*4.5*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(6),
		PadX: vg.Points(12), PadY: vg.Points(12)}
	canvases := plot.Align(grid, tiles, dc)
	for i, p := range panels {
		p.Draw(canvases[i/cols][i%cols])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// firstTrace is the target's first valid point at the scenario that carries a trace.
func (r *AdaptiveResult) firstTrace(target, scenario string) (Point, bool) {
	for _, p := range r.Points {
		if p.Target == target && p.Scenario == scenario && p.Valid() && len(p.Trace) > 0 {
			return p, true
		}
	}
	return Point{}, false
}
