package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The fan-out scenario (issue 32) measures consistent admission across a call graph. A frontend
// (cmd/backend --call-all) calls Services services at once for every user request, each service
// a backend behind its own loadshed sidecar (strategy inflight), the frontend behind a sidecar of
// its own (strategy none); cmd/loadgen sends Poisson arrivals with a fresh traceparent each to
// the frontend's sidecar. Every point runs with cohorts off and on, interleaved, in the same run.
// Figures: the share of user requests that succeed end to end, each leg's share, the wasted legs
// (2xx legs of user requests another leg failed) over the admitted legs, and the p99 of
// successful user requests. Single-service points beside it check that cohorts cost nothing where
// there is no fan-out: an overload, a load below capacity, a load step and a priority mix.

// Fan-out point kinds.
const (
	KindFanout   = "fanout"   // the call graph at a load multiple
	KindOverload = "overload" // one service at 5x: goodput/C and admitted p99
	KindUnder    = "under"    // one service below capacity, cohorts on: no cohort refusals
	KindStep     = "step"     // one service stepped from 1x to 3x, cohorts on: the level settles
	KindCritical = "critical" // one service at 3x with a priority mix: critical traffic's success
)

// CohortLevelMetric is the sidecar's gauge of the cohort admission level (issue 32: "the level as
// a gauge per route"); the step point reads it for route "default".
const CohortLevelMetric = "loadshed_cohort_level"

// CohortShedReason is the reason label of loadshed_shed_total for refusals below the level.
const CohortShedReason = "cohort"

// FanoutConfig is one run of the fan-out scenario.
type FanoutConfig struct {
	RepoRoot, OutDir, WorkDir string `json:"-"`
	KeepWork                  bool
	Bins                      Binaries `json:"-"`
	// Services is how many services the frontend calls per user request.
	Services int
	// Service is every service's backend in the call graph; Single the backend of the
	// single-service points (no tail, so goodput/C is the strategy's, not the tail's).
	Service, Single Backend
	// Limit is each service sidecar's in-flight limit.
	Limit int
	// Loads are the fan-out points, as multiples of one service's capacity (the frontend's
	// offered rate is Load x capacity: every user request sends one leg to each service).
	Loads []float64
	// OverloadLoad, UnderLoad, StepFrom/StepTo and CriticalLoad are the single-service points;
	// a zero load leaves its point out.
	OverloadLoad, UnderLoad, StepFrom, StepTo, CriticalLoad float64
	// CriticalShare is the share of critical requests in the priority mix (the rest sheddable).
	CriticalShare float64
	// Warmup is sent before each measured Duration; the step point runs StepBefore at StepFrom
	// then StepAfter at StepTo, all measured.
	Warmup, Duration, StepBefore, StepAfter time.Duration
	// SampleEvery is how often the step point reads the level gauge.
	SampleEvery time.Duration
	// ClientTimeout is cmd/loadgen's; CallTimeout the frontend's per leg; SLO the goodput bound.
	ClientTimeout, CallTimeout, SLO time.Duration
	// Cohorts is the cohorts block of every sidecar with cohorts on, without secretFile (YAML
	// flow mapping entries), e.g. "key: traceparent, count: 128, rotate: 1h".
	Cohorts     string
	Repeats     int
	Quick       bool
	CommandLine string
}

// DefaultFanoutConfig is the setup: four services of 4 workers, 20 ms mean with 5 ms
// stddev and a 1% slow tail, in-flight limit 4, at 1.5x, 2x and 3x; the single-service points at
// 5x, 0.8x, 1x to 3x and 3x with 20% critical requests.
func DefaultFanoutConfig() FanoutConfig {
	return FanoutConfig{
		Services: 4, Service: Backend{Workers: 4, Service: 20 * time.Millisecond, SlowTail: true},
		Single: Backend{Workers: 4, Service: 20 * time.Millisecond}, Limit: 4,
		Loads:        []float64{1.5, 2, 3},
		OverloadLoad: 5, UnderLoad: 0.8, StepFrom: 1, StepTo: 3, CriticalLoad: 3, CriticalShare: 0.2,
		Warmup: 5 * time.Second, Duration: 15 * time.Second, StepBefore: 8 * time.Second, StepAfter: 15 * time.Second,
		SampleEvery:   250 * time.Millisecond,
		ClientTimeout: 3 * time.Second, CallTimeout: 2 * time.Second, SLO: time.Second,
		Cohorts: "key: traceparent, count: 128, rotate: 1h",
		Repeats: 1,
	}
}

// Validate reports every problem, naming the field.
func (c FanoutConfig) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.RepoRoot == "" || c.OutDir == "" {
		bad("RepoRoot, OutDir: required")
	}
	if c.Services < 1 || c.Services > 16 {
		bad("Services: must be in [1, 16], got %d", c.Services)
	}
	if c.Service.Workers < 1 || c.Service.Service <= 0 || c.Single.Workers < 1 || c.Single.Service <= 0 {
		bad("Service, Single: need workers and a service time above 0")
	}
	if c.Limit < 1 {
		bad("Limit: must be at least 1, got %d", c.Limit)
	}
	for _, l := range append(append([]float64{}, c.Loads...), c.OverloadLoad, c.UnderLoad, c.StepFrom, c.StepTo, c.CriticalLoad) {
		if l < 0 || l > 20 {
			bad("Loads: every load must be in [0, 20] x capacity, got %v", l)
		}
	}
	if (c.StepFrom > 0) != (c.StepTo > 0) {
		bad("StepFrom, StepTo: both or neither, got %v and %v", c.StepFrom, c.StepTo)
	}
	if c.CriticalShare <= 0 || c.CriticalShare >= 1 {
		bad("CriticalShare: must be in (0, 1), got %v", c.CriticalShare)
	}
	if c.Duration < 3*time.Second || c.Warmup < 0 || c.StepBefore < 2*time.Second || c.StepAfter < 3*time.Second {
		bad("Duration, Warmup, StepBefore, StepAfter: want Duration >= 3s, Warmup >= 0, StepBefore >= 2s, StepAfter >= 3s")
	}
	if c.SampleEvery < 50*time.Millisecond {
		bad("SampleEvery: must be at least 50ms, got %s", c.SampleEvery)
	}
	if c.SLO <= 0 || c.CallTimeout <= 0 || c.ClientTimeout <= c.CallTimeout || c.SLO > c.ClientTimeout {
		bad("SLO, CallTimeout, ClientTimeout: want 0 < SLO <= ClientTimeout and 0 < CallTimeout < ClientTimeout")
	}
	if strings.Contains(c.Cohorts, "secretFile") || strings.ContainsAny(c.Cohorts, "{}\n") {
		bad("Cohorts: flow mapping entries without braces and without secretFile, got %q", c.Cohorts)
	}
	if c.Repeats < 1 {
		bad("Repeats: must be at least 1, got %d", c.Repeats)
	}
	return errors.Join(errs...)
}

// Leg is one leg's counts from the frontend's backend_frontend_legs_total over the measured
// window.
type Leg struct {
	URL                         string
	OK, Wasted, Refused, Failed float64
}

// Total is every call of the leg.
func (l Leg) Total() float64 { return l.OK + l.Wasted + l.Refused + l.Failed }

// Admitted is the leg's 2xx answers (ok and wasted).
func (l Leg) Admitted() float64 { return l.OK + l.Wasted }

// Share is the leg's success share: its 2xx answers over its calls.
func (l Leg) Share() float64 { return fratio(l.Admitted(), l.Total()) }

// LevelSample is the cohort level gauge of a sidecar T seconds after the load started.
type LevelSample struct {
	T     float64
	Level float64
}

// FanoutPoint is one point, one repeat.
type FanoutPoint struct {
	Kind    string
	Load    float64
	Cohorts bool
	Repeat  int
	// From cmd/loadgen over the measured window.
	Offered, Success, Goodput, Shed int
	SuccessP99Ms, AdmittedP99Ms     float64
	MeasuredS                       float64
	// Fan-out points: each leg's counts over the measured window.
	Legs []Leg `json:",omitempty"`
	// Single-service points: refusals below the cohort level over the whole run (sidecar
	// metrics), and every refusal.
	CohortRefusals, Refusals float64
	// Critical points: the critical requests offered and answered 2xx.
	CriticalOffered, CriticalSuccess int
	// Step points: the level gauge over the run, the step's time and how long the level took to
	// settle after it (nil: it did not, or there was no gauge).
	Levels  []LevelSample `json:",omitempty"`
	StepAtS float64       `json:",omitempty"`
	SettleS *float64      `json:",omitempty"`
	Invalid string        `json:",omitempty"`
	Err     string        `json:",omitempty"`
}

// Valid reports whether the point's figures may be used.
func (p FanoutPoint) Valid() bool { return p.Err == "" && p.Invalid == "" }

// EndToEnd is the share of offered user requests answered 2xx.
func (p FanoutPoint) EndToEnd() float64 { return ratio(p.Success, p.Offered) }

// LeastLeg is the least-served leg's share (NaN without legs).
func (p FanoutPoint) LeastLeg() float64 {
	least := -1.0
	for _, l := range p.Legs {
		if s := l.Share(); least < 0 || s < least {
			least = s
		}
	}
	if least < 0 {
		return fratio(0, 0)
	}
	return least
}

// WastedShare is the wasted legs over the admitted legs, summed over the legs.
func (p FanoutPoint) WastedShare() float64 {
	var wasted, admitted float64
	for _, l := range p.Legs {
		wasted += l.Wasted
		admitted += l.Admitted()
	}
	return fratio(wasted, admitted)
}

// GoodputPerC is the goodput over the measured window per capacity c (rps).
func (p FanoutPoint) GoodputPerC(c float64) float64 {
	if p.MeasuredS <= 0 || c <= 0 {
		return fratio(0, 0)
	}
	return float64(p.Goodput) / p.MeasuredS / c
}

// CriticalShareKept is the share of critical requests answered 2xx.
func (p FanoutPoint) CriticalShareKept() float64 { return ratio(p.CriticalSuccess, p.CriticalOffered) }

func fratio(a, b float64) float64 {
	if b == 0 {
		return ratio(0, 0)
	}
	return a / b
}

// FanoutResult is a whole run.
type FanoutResult struct {
	Kind    string // "fanout"
	Config  FanoutConfig
	Points  []FanoutPoint
	Started time.Time
	Elapsed time.Duration
}

// fanoutPlan is the points of one repeat in order: each fan-out load off and on (their order
// alternating with the repeat), then the single-service points.
type fanoutStep struct {
	Kind    string
	Load    float64
	Cohorts bool
}

func fanoutPlan(c FanoutConfig, rep int) []fanoutStep {
	var out []fanoutStep
	pair := func(kind string, load float64) {
		first := rep%2 == 0 // repeat 1 runs cohorts off first, repeat 2 on first, ...
		out = append(out, fanoutStep{kind, load, first}, fanoutStep{kind, load, !first})
	}
	for _, l := range c.Loads {
		if l > 0 {
			pair(KindFanout, l)
		}
	}
	if c.OverloadLoad > 0 {
		pair(KindOverload, c.OverloadLoad)
	}
	if c.UnderLoad > 0 {
		out = append(out, fanoutStep{KindUnder, c.UnderLoad, true})
	}
	if c.StepTo > 0 {
		out = append(out, fanoutStep{KindStep, c.StepTo, true})
	}
	if c.CriticalLoad > 0 {
		pair(KindCritical, c.CriticalLoad)
	}
	return out
}

// RunFanout runs the fan-out scenario and writes its outputs into cfg.OutDir.
func RunFanout(ctx context.Context, cfg FanoutConfig, stdout, stderr io.Writer) (*FanoutResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "bench fanout: "+format+"\n", a...) }
	work, cleanup, err := workDir(cfg.WorkDir, cfg.KeepWork, "loadshed-fanout-")
	if err != nil {
		return nil, err
	}
	defer cleanup()
	if err := os.MkdirAll(filepath.Join(cfg.OutDir, "loadgen"), 0o755); err != nil {
		return nil, err
	}
	if cfg.Bins, err = fanoutBinaries(ctx, cfg, work, logf); err != nil {
		return nil, err
	}
	// One secret for every sidecar of the run, as a call graph's sidecars share one.
	secret := filepath.Join(work, "cohort.key")
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if err := os.WriteFile(secret, []byte(hex.EncodeToString(key)), 0o644); err != nil {
		return nil, err
	}
	root := os.Geteuid() == 0
	res := &FanoutResult{Kind: "fanout", Config: cfg, Started: time.Now()}
	var failures []string
	total := cfg.Repeats * len(fanoutPlan(cfg, 1))
	n := 0
	for rep := 1; rep <= cfg.Repeats; rep++ {
		for _, st := range fanoutPlan(cfg, rep) {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			n++
			label := fmt.Sprintf("%s %gx cohorts %s", st.Kind, st.Load, onOff(st.Cohorts))
			logf("[%d/%d] repeat %d, %s", n, total, rep, label)
			p := runFanoutPoint(ctx, cfg, st, rep, work, secret, root)
			res.Points = append(res.Points, p)
			if p.Err != "" {
				logf("  FAILED: %s", p.Err)
				failures = append(failures, fmt.Sprintf("%s repeat %d: %s", label, rep, p.Err))
				if cfg.Quick {
					res.Elapsed = time.Since(res.Started)
					_ = res.writeOutputs(stdout)
					return res, fmt.Errorf("%s failed: %s", label, p.Err)
				}
				continue
			}
			state := ""
			if p.Invalid != "" {
				state = " INVALID: " + p.Invalid
			}
			logf("  %s%s", p.summary(cfg), state)
		}
	}
	res.Elapsed = time.Since(res.Started)
	return res, finishRun(func() error { return res.writeOutputs(stdout) }, failures)
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// summary is the point's log line.
func (p FanoutPoint) summary(c FanoutConfig) string {
	switch p.Kind {
	case KindFanout:
		return fmt.Sprintf("end to end %.3f, least leg %.3f, wasted/admitted %.3f, p99 %.0f ms", p.EndToEnd(), p.LeastLeg(), p.WastedShare(), p.SuccessP99Ms)
	case KindOverload:
		return fmt.Sprintf("goodput/C %.3f, admitted p99 %.0f ms", p.GoodputPerC(c.Single.CapacityRPS()), p.AdmittedP99Ms)
	case KindUnder:
		return fmt.Sprintf("cohort refusals %.0f, all refusals %.0f", p.CohortRefusals, p.Refusals)
	case KindStep:
		return fmt.Sprintf("level settled %s after the step (%d samples)", fmtSeconds(p.SettleS), len(p.Levels))
	case KindCritical:
		return fmt.Sprintf("critical success %.3f (%d of %d)", p.CriticalShareKept(), p.CriticalSuccess, p.CriticalOffered)
	}
	return ""
}

// fanoutBinaries builds the backend, the proxy and the load generator unless given.
func fanoutBinaries(ctx context.Context, cfg FanoutConfig, work string, logf func(string, ...any)) (Binaries, error) {
	b := cfg.Bins
	binDir := filepath.Join(work, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return b, err
	}
	for _, prog := range []struct {
		dst       *string
		pkg, name string
	}{{&b.Backend, "cmd/backend", "backend"}, {&b.Proxy, "cmd/proxy", "proxy"}, {&b.Loadgen, "cmd/loadgen", "loadgen"}} {
		if *prog.dst != "" {
			continue
		}
		out, err := buildProgram(ctx, cfg.RepoRoot, binDir, prog.pkg, prog.name, logf)
		if err != nil {
			return b, err
		}
		*prog.dst = out
	}
	return b, nil
}

// sidecarSpec is one loadshed sidecar's settings.
type sidecarSpec struct {
	Listen, Admin, Upstream string
	// Strategy is "inflight" (with Limit) or "none".
	Strategy string
	Limit    int
	// Cohorts is the cohorts block's entries without secretFile; "" means cohorts off.
	Cohorts, SecretFile string
}

// fanoutSidecarConfig is a sidecar's YAML: trusting 127.0.0.0/8 (the frontend and the load
// generator are the callers), the strategy, and cohorts when on (COHORTS.md section 2).
func fanoutSidecarConfig(s sidecarSpec) string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: %q\nupstream: %q\nadminListen: %q\nupstreamTimeout: 30s\n", s.Listen, "http://"+s.Upstream, s.Admin)
	b.WriteString("trust:\n  sources: [\"127.0.0.0/8\"]\n")
	b.WriteString("admission:\n")
	switch s.Strategy {
	case "inflight":
		fmt.Fprintf(&b, "  strategy: inflight\n  inflight: {limit: %d}\n", s.Limit)
	default:
		b.WriteString("  strategy: none\n")
	}
	if s.Cohorts != "" {
		fmt.Fprintf(&b, "  cohorts: {%s, secretFile: %q}\n", s.Cohorts, s.SecretFile)
	}
	return b.String()
}

// startService starts one service: a backend configured as b behind a sidecar of spec (its
// Listen, Admin and Upstream are filled in). It returns the sidecar's data and admin addresses.
func startService(ctx context.Context, cfg FanoutConfig, name, dir string, b Backend, spec sidecarSpec, backendArgs []string, root bool, all *[]*proc) (data, admin, badmin string, err error) {
	ports, err := freePorts(4)
	if err != nil {
		return "", "", "", err
	}
	args := append([]string{"--listen", ports[2], "--admin-listen", ports[3]}, backendArgs...)
	be, err := startProc("backend "+name, cfg.Bins.Backend, args, nil, filepath.Join(dir, "backend-"+name+".log"), "", -1, root)
	if err != nil {
		return "", "", "", err
	}
	*all = append(*all, be)
	if err := waitHTTP(ctx, "http://"+ports[3]+"/healthz", 10*time.Second, be); err != nil {
		return "", "", "", fmt.Errorf("backend %s: %w", name, err)
	}
	if b.Workers > 0 {
		if err := configureBackend(ctx, ports[3], b); err != nil {
			return "", "", "", fmt.Errorf("backend %s: %w", name, err)
		}
	}
	spec.Listen, spec.Admin, spec.Upstream = ports[0], ports[1], ports[2]
	path := filepath.Join(dir, "loadshed-"+name+".yaml")
	if err := os.WriteFile(path, []byte(fanoutSidecarConfig(spec)), 0o644); err != nil {
		return "", "", "", err
	}
	sc, err := startProc("loadshed "+name, cfg.Bins.Proxy, []string{"--config", path}, []string{"GOMAXPROCS=1"},
		filepath.Join(dir, "loadshed-"+name+".log"), "", -1, root)
	if err != nil {
		return "", "", "", err
	}
	*all = append(*all, sc)
	if err := waitHTTP(ctx, "http://"+spec.Admin+"/readyz", 10*time.Second, be, sc); err != nil {
		return "", "", "", fmt.Errorf("loadshed %s: %w", name, err)
	}
	return spec.Listen, spec.Admin, ports[3], nil
}

// runFanoutPoint starts fresh processes for one point, sends the load and reads the figures.
func runFanoutPoint(ctx context.Context, cfg FanoutConfig, st fanoutStep, rep int, work, secret string, root bool) FanoutPoint {
	p := FanoutPoint{Kind: st.Kind, Load: st.Load, Cohorts: st.Cohorts, Repeat: rep}
	name := fmt.Sprintf("r%d-%s-%gx-cohorts-%s", rep, st.Kind, st.Load, onOff(st.Cohorts))
	dir := filepath.Join(work, "points", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.Err = err.Error()
		return p
	}
	if root {
		if err := makeWritable(dir); err != nil {
			p.Err = err.Error()
			return p
		}
	}
	var all []*proc
	defer func() {
		for _, pr := range all {
			pr.stop(0)
		}
	}()
	fail := func(err error) FanoutPoint {
		p.Err = err.Error()
		return p
	}
	cohorts := ""
	if st.Cohorts {
		cohorts = cfg.Cohorts
	}
	spec := sidecarSpec{Strategy: "inflight", Limit: cfg.Limit, Cohorts: cohorts, SecretFile: secret}

	// The entry: the frontend's sidecar, or the one service's.
	var entry, entryAdmin, frontAdmin string
	if st.Kind == KindFanout {
		var legs []string
		for i := range cfg.Services {
			data, _, _, err := startService(ctx, cfg, fmt.Sprintf("s%d", i+1), dir, cfg.Service, spec, nil, root, &all)
			if err != nil {
				return fail(err)
			}
			legs = append(legs, "http://"+data+"/")
		}
		front := sidecarSpec{Strategy: "none", Cohorts: cohorts, SecretFile: secret}
		args := []string{"--call-all", strings.Join(legs, ","), "--call-timeout", cfg.CallTimeout.String()}
		var err error
		if entry, entryAdmin, frontAdmin, err = startService(ctx, cfg, "frontend", dir, Backend{}, front, args, root, &all); err != nil {
			return fail(err)
		}
	} else {
		var err error
		if entry, entryAdmin, _, err = startService(ctx, cfg, "s1", dir, cfg.Single, spec, nil, root, &all); err != nil {
			return fail(err)
		}
	}
	if err := waitHTTP(ctx, "http://"+entry+"/", 10*time.Second, all...); err != nil {
		return fail(fmt.Errorf("end-to-end check: %w", err))
	}

	capacity := cfg.Service.CapacityRPS()
	if st.Kind != KindFanout {
		capacity = cfg.Single.CapacityRPS()
	}
	args := []string{"--target", "http://" + entry + "/", "--poisson-seed", fmt.Sprint(rep), "--traceparent",
		"--timeout", cfg.ClientTimeout.String(), "--slo", cfg.SLO.String(), "--json"}
	warmup := cfg.Warmup
	switch st.Kind {
	case KindStep:
		warmup = 0
		p.StepAtS = cfg.StepBefore.Seconds()
		args = append(args, "--phases", fmt.Sprintf("%s:%s,%s:%s", rateOf(cfg.StepFrom*capacity), cfg.StepBefore, rateOf(st.Load*capacity), cfg.StepAfter))
	default:
		args = append(args, "--rate", rateOf(st.Load*capacity), "--duration", (cfg.Warmup + cfg.Duration).String(), "--warmup", cfg.Warmup.String())
	}
	if st.Kind == KindCritical {
		crit := int(cfg.CriticalShare*100 + 0.5)
		args = append(args, "--priority-mix", fmt.Sprintf("critical=%d,sheddable=%d", crit, 100-crit))
	}

	client := &http.Client{Timeout: 2 * time.Second}
	var before []Leg
	var beforeErr error
	var levels []LevelSample
	var wg sync.WaitGroup
	sctx, stopSampling := context.WithCancel(ctx)
	start := time.Now()
	if frontAdmin != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-sctx.Done():
				beforeErr = sctx.Err()
				return
			case <-time.After(warmup):
			}
			before, beforeErr = readLegs(sctx, client, "http://"+frontAdmin+"/metrics")
		}()
	}
	if st.Kind == KindStep {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(cfg.SampleEvery)
			defer tick.Stop()
			for {
				if body, err := getBody(sctx, client, "http://"+entryAdmin+"/metrics"); err == nil {
					if v, ok := metricValue(body, CohortLevelMetric, map[string]string{"route": "default"}); ok {
						levels = append(levels, LevelSample{T: time.Since(start).Seconds(), Level: v})
					}
				}
				select {
				case <-sctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}
	lg, err := execLoadgen(ctx, append([]string{cfg.Bins.Loadgen}, args...), filepath.Join(cfg.OutDir, "loadgen", name+".json"), filepath.Join(dir, "loadgen.log"))
	stopSampling()
	wg.Wait()
	if err != nil {
		return fail(err)
	}
	for _, pr := range all {
		if err := pr.exited(); err != nil {
			return fail(err)
		}
	}
	p.Offered, p.Success, p.Goodput, p.Shed = lg.Offered, lg.Success, lg.Goodput, lg.Shed
	p.SuccessP99Ms = float64(lg.SuccessLatency.P99) / float64(time.Millisecond)
	p.AdmittedP99Ms = float64(lg.AdmittedLatency.P99) / float64(time.Millisecond)
	p.MeasuredS = lg.Duration.Seconds()
	if !lg.Valid {
		p.Invalid = lg.InvalidReason
	}
	if t := lg.Tags["critical"]; t != nil {
		p.CriticalOffered, p.CriticalSuccess = t.Offered, t.Success
	}
	switch st.Kind {
	case KindFanout:
		after, err := readLegs(ctx, client, "http://"+frontAdmin+"/metrics")
		if err != nil {
			return fail(fmt.Errorf("frontend metrics: %w", err))
		}
		if beforeErr != nil {
			return fail(fmt.Errorf("frontend metrics after the warm-up: %w", beforeErr))
		}
		p.Legs = legsBetween(before, after)
	default:
		body, err := getBody(ctx, client, "http://"+entryAdmin+"/metrics")
		if err != nil {
			return fail(fmt.Errorf("sidecar metrics: %w", err))
		}
		p.CohortRefusals = metricSum(body, "loadshed_shed_total", map[string]string{"reason": CohortShedReason})
		p.Refusals = metricSum(body, "loadshed_shed_total", nil)
	}
	if st.Kind == KindStep {
		p.Levels = levels
		// The gauge counts priority classes (1 = a whole class): a band of ranks is an eighth of one.
		p.SettleS = settleTime(levels, p.StepAtS, 1.0/8)
	}
	return p
}

func rateOf(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) }

// readLegs reads the frontend's leg counters.
func readLegs(ctx context.Context, client *http.Client, url string) ([]Leg, error) {
	body, err := getBody(ctx, client, url)
	if err != nil {
		return nil, err
	}
	return parseLegs(body), nil
}

// parseLegs reads backend_frontend_legs_total into one Leg per leg URL, in order of appearance.
func parseLegs(body []byte) []Leg {
	var legs []Leg
	idx := map[string]int{}
	for _, s := range parseSeries(body, "backend_frontend_legs_total") {
		u := s.labels["leg"]
		i, ok := idx[u]
		if !ok {
			i = len(legs)
			idx[u] = i
			legs = append(legs, Leg{URL: u})
		}
		switch s.labels["result"] {
		case "ok":
			legs[i].OK += s.value
		case "wasted":
			legs[i].Wasted += s.value
		case "refused":
			legs[i].Refused += s.value
		case "failed":
			legs[i].Failed += s.value
		}
	}
	return legs
}

// legsBetween is after minus before, leg by leg (matched by URL; a leg missing before counts
// from 0).
func legsBetween(before, after []Leg) []Leg {
	prev := map[string]Leg{}
	for _, l := range before {
		prev[l.URL] = l
	}
	out := make([]Leg, len(after))
	for i, a := range after {
		b := prev[a.URL]
		out[i] = Leg{URL: a.URL, OK: a.OK - b.OK, Wasted: a.Wasted - b.Wasted, Refused: a.Refused - b.Refused, Failed: a.Failed - b.Failed}
	}
	return out
}

// series is one sample of the Prometheus text format.
type series struct {
	labels map[string]string
	value  float64
}

// parseSeries returns the samples of metric name (exactly; not its _bucket or _sum) in the
// Prometheus text format.
func parseSeries(body []byte, name string) []series {
	var out []series
	for _, line := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		labels := map[string]string{}
		if rest[0] == '{' {
			var ok bool
			if labels, rest, ok = parseLabels(rest[1:]); !ok {
				continue
			}
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		out = append(out, series{labels, v})
	}
	return out
}

// parseLabels reads `a="x",b="y"}` and returns the labels and what follows the brace.
func parseLabels(s string) (map[string]string, string, bool) {
	labels := map[string]string{}
	for {
		s = strings.TrimLeft(s, ", ")
		if strings.HasPrefix(s, "}") {
			return labels, s[1:], true
		}
		name, rest, ok := strings.Cut(s, "=\"")
		if !ok {
			return nil, "", false
		}
		var v strings.Builder
		i := 0
		for ; i < len(rest) && rest[i] != '"'; i++ {
			if rest[i] == '\\' && i+1 < len(rest) {
				i++
				switch rest[i] {
				case 'n':
					v.WriteByte('\n')
				default:
					v.WriteByte(rest[i])
				}
				continue
			}
			v.WriteByte(rest[i])
		}
		if i == len(rest) {
			return nil, "", false
		}
		labels[name] = v.String()
		s = rest[i+1:]
	}
}

// metricSum adds the samples of name whose labels include match.
func metricSum(body []byte, name string, match map[string]string) float64 {
	var sum float64
	for _, s := range parseSeries(body, name) {
		if labelsMatch(s.labels, match) {
			sum += s.value
		}
	}
	return sum
}

// metricValue is the first sample of name whose labels include match.
func metricValue(body []byte, name string, match map[string]string) (float64, bool) {
	for _, s := range parseSeries(body, name) {
		if labelsMatch(s.labels, match) {
			return s.value, true
		}
	}
	return 0, false
}

func labelsMatch(labels, match map[string]string) bool {
	for k, v := range match {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// Settling: the level's final value is the mean of the samples in the last SettleFinal of the
// run, and it has settled at the first sample after the step from which every later sample stays
// within band of it.
const SettleFinal = time.Second

// settleTime is how long after stepAt (seconds) the level settled within band of its final
// value for good; nil when there are no samples after the step or it never did before the final
// window.
func settleTime(samples []LevelSample, stepAt, band float64) *float64 {
	if len(samples) == 0 {
		return nil
	}
	end := samples[len(samples)-1].T
	var sum float64
	n := 0
	for _, s := range samples {
		if s.T >= end-SettleFinal.Seconds() {
			sum += s.Level
			n++
		}
	}
	final := sum / float64(n)
	settled := -1
	for i := len(samples) - 1; i >= 0; i-- {
		d := samples[i].Level - final
		if samples[i].T < stepAt || d > band || d < -band {
			break
		}
		settled = i
	}
	if settled < 0 || samples[settled].T >= end-SettleFinal.Seconds() {
		return nil
	}
	t := samples[settled].T - stepAt
	return &t
}
