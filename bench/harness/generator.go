package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/loadshed/loadshed/bench/k6summary"
	"github.com/loadshed/loadshed/internal/loadgen"
)

// Load generators of a point (Config.Generator).
const (
	// GeneratorK6 runs the point's k6 script (the default).
	GeneratorK6 = "k6"
	// GeneratorLoadgen runs the overload script's load with the project's own open-loop
	// generator (cmd/loadgen) instead: the same evenly spaced arrivals at K x the capacity,
	// with latency counted from each request's scheduled time, at a fraction of k6's CPU. At
	// 5x on two shared cores k6's iterations start tens of milliseconds late at p99, and that
	// noise lands on every target's tail alike.
	GeneratorLoadgen = "loadgen"
)

// runLoad runs one scenario with the configured generator and leaves its summary, in the k6
// scripts' schema, at summary.
func runLoad(ctx context.Context, cfg Config, l Limits, bins Binaries, cpu int, sc Scenario, url, summary, logPath string) error {
	if cfg.Generator != GeneratorLoadgen {
		return runK6(ctx, cfg, l, bins, cpu, sc, url, summary, logPath)
	}
	return runLoadgenScenario(ctx, cfg, l, bins, cpu, sc, url, summary, logPath, nil)
}

// warmsInRun reports whether the point's warm-up is the first part of its measured run (the
// loadgen generator) rather than a run of its own.
func warmsInRun(cfg Config, sc Scenario) bool {
	return sc.Warmup > 0 && cfg.Generator == GeneratorLoadgen
}

// runLoadgenScenario runs overload.js's load (K, DURATION) with cmd/loadgen, keeps its own
// result next to summary (.loadgen.json) and writes the summary from it.
//
// A warm-up (sc.Warmup) is the same run's first part, sent like the rest and left out of the
// figures (loadgen --warmup), and measuring is called when it ends: the measured window then
// starts and ends with the requests in flight of a steady state. A window that starts empty,
// after a warm-up run of its own, credits each target with the requests it holds in flight
// when the load stops (they all finish and count): a limit that queues in the backend holds
// more of them than one that does not (Envoy 13, loadshed 8-9 on 8 workers), some 0.15% of an
// 8 s point at 5x, the size of the differences measured.
func runLoadgenScenario(ctx context.Context, cfg Config, l Limits, bins Binaries, cpu int, sc Scenario, url, summary, logPath string, measuring func()) error {
	if sc.Script != "overload.js" {
		return fmt.Errorf("generator %s runs overload.js's load only, not %s", GeneratorLoadgen, sc.Script)
	}
	k, err := strconv.ParseFloat(sc.Env["K"], 64)
	if err != nil || !(k > 0) {
		return fmt.Errorf("generator %s: K: want a number above 0, got %q", GeneratorLoadgen, sc.Env["K"])
	}
	d, err := time.ParseDuration(sc.Env["DURATION"])
	if err != nil || d <= 0 {
		return fmt.Errorf("generator %s: DURATION: want a positive duration, got %q", GeneratorLoadgen, sc.Env["DURATION"])
	}
	rate := math.Max(1, math.Round(k*l.CapacityRPS)) // as overload.js
	argv := []string{bins.Loadgen, "--target", url, "--rate", strconv.FormatFloat(rate, 'f', -1, 64),
		"--duration", (sc.Warmup + d).String(), "--timeout", cfg.ClientTimeout.String(), "--slo", l.SLO.String(), "--json"}
	if sc.Warmup > 0 {
		argv = append(argv, "--warmup", sc.Warmup.String())
	}
	if cpu >= 0 && bins.Taskset != "" {
		argv = append([]string{bins.Taskset, "-c", strconv.Itoa(cpu)}, argv...)
	}
	r, err := execLoadgenAt(ctx, argv, strings.TrimSuffix(summary, ".json")+".loadgen.json", logPath, sc.Warmup, measuring)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(loadgenSummary(r, url, l, cfg, rate, d), "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(summary, b, 0o644)
}

// loadgenSummary puts a cmd/loadgen run of overload.js's load in the k6 scripts' schema.
// Latencies are counted from each request's scheduled time (k6 counts from when it sent the
// request); there is no outside-the-backend latency and no thresholds. A run is invalid on
// loadgen's own grounds, or when requests started later than cfg.MaxLateMs at p99, as with k6.
func loadgenSummary(r *loadgen.Result, url string, l Limits, cfg Config, rate float64, d time.Duration) *k6summary.Summary {
	ms := func(x time.Duration) *float64 {
		v := float64(x) / float64(time.Millisecond)
		return &v
	}
	var unexpected int
	for code, n := range r.Codes {
		if (code < 200 || code > 299) && code != 429 && code != 503 {
			unexpected += n
		}
	}
	s := &k6summary.Summary{
		Schema: k6summary.Schema, Script: "overload", TargetURL: url,
		CapacityRPS: l.CapacityRPS, SLOMs: *ms(l.SLO), ClientTimeoutMs: *ms(cfg.ClientTimeout),
		LoadFactor: rate / l.CapacityRPS, OfferedRPS: r.OfferedRPS, DurationS: d.Seconds(),
		Valid: r.Valid, InvalidReason: r.InvalidReason,
		Iterations: int64(r.Offered), DroppedIterations: int64(r.Dropped), Requests: int64(r.Sent),
		OK: int64(r.Success), Slow: int64(r.Success - r.Goodput), Goodput: int64(r.Goodput), GoodputRPS: r.GoodputRPS,
		Shed:         int64(r.Codes[429] + r.Codes[503]),
		ShedByStatus: map[string]int64{"429": int64(r.Codes[429]), "503": int64(r.Codes[503])},
		RetryAfter:   int64(r.RetryAfterPresent),
		Timeouts:     int64(r.Timeouts),
		Unexpected:   int64(unexpected + r.TransportErrors + r.BuildErrors),
		AdmittedMs: k6summary.Latency{P50: ms(r.SuccessLatency.P50), P90: ms(r.SuccessLatency.P90),
			P99: ms(r.SuccessLatency.P99), P999: ms(r.SuccessLatency.P999), Max: ms(r.SuccessLatency.Max)},
		StartLateP99Ms: ms(r.LatenessP99),
		ThresholdsOK:   true,
	}
	if r.SuccessLatency.Count == 0 {
		s.AdmittedMs = k6summary.Latency{}
	}
	if r.Offered > 0 {
		s.ShedShare = float64(s.Shed) / float64(r.Offered)
	}
	if s.Shed > 0 {
		s.RejectionMs.P99 = ms(r.ShedLatencyP99)
	}
	if r.RetryAfterEligible > 0 {
		c := r.RetryAfterCoverage
		s.RetryAfterCoverage = &c
	}
	if den := math.Min(r.OfferedRPS, l.CapacityRPS); den > 0 {
		g := r.GoodputRPS / den
		s.GoodputRatio = &g
	}
	if late := *s.StartLateP99Ms; s.Valid && cfg.MaxLateMs > 0 && late > cfg.MaxLateMs {
		s.Valid, s.InvalidReason = false, fmt.Sprintf("requests started %.1f ms late at p99 (limit %g ms)", late, cfg.MaxLateMs)
	}
	if !s.Valid && s.InvalidReason == "" {
		s.InvalidReason = "loadgen marked the run invalid"
	}
	return s
}

// execLoadgen runs a cmd/loadgen command line (argv, with --json), keeps its stderr in logPath
// and its JSON result in out, and returns the result. An invalid run (late starts) exits 1 with
// its result printed: the result says why, so it is returned, not an error.
func execLoadgen(ctx context.Context, argv []string, out, logPath string) (*loadgen.Result, error) {
	return execLoadgenAt(ctx, argv, out, logPath, 0, nil)
}

// execLoadgenAt is execLoadgen calling at (when not nil) after the run has gone on for after,
// on the calling goroutine: a run with a warm-up marks where its measured window starts (to
// within loadgen's start-up, some milliseconds). A run that ends sooner never calls it.
func execLoadgenAt(ctx context.Context, argv []string, out, logPath string, after time.Duration, at func()) (*loadgen.Result, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Start()
	if err == nil {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		if at != nil {
			t := time.NewTimer(after)
			select {
			case <-t.C:
				at()
			case err = <-done:
				t.Stop()
				done <- err
			}
		}
		err = <-done
	}
	_ = os.WriteFile(logPath, stderr.Bytes(), 0o644)
	var r loadgen.Result
	if jerr := json.Unmarshal(stdout.Bytes(), &r); jerr != nil {
		if err != nil {
			return nil, fmt.Errorf("loadgen: %v: %s", err, tailString(stderr.String(), 5))
		}
		return nil, fmt.Errorf("loadgen output: %v", jerr)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(out, stdout.Bytes(), 0o644); err != nil {
		return nil, err
	}
	return &r, nil
}
