package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/loadshed/loadshed/internal/loadgen"
	"github.com/loadshed/loadshed/pkg/admission"
)

// Bounds within which a lab prediction counts as matching a live run (issue "Prediction must
// match reality"): acceptance within 5 percentage points, admitted p99 within 25 %.
const (
	AcceptanceTolerancePP = 5.0
	P99Tolerance          = 0.25
)

// CompareConfig describes one scenario run both in the lab and live.
type CompareConfig struct {
	// Scenario is the workload and backend; its Arrivals are replaced by Poisson arrivals at
	// Load x Capacity for Duration (Schedule below), the schedule the live load generator uses.
	Scenario Scenario
	// Capacity of the backend in requests per second; 0 derives it from the scenario.
	Capacity float64
	// Load is the offered load as a multiple of Capacity.
	Load float64
	// Duration is how long requests are offered.
	Duration time.Duration
}

// Schedule returns the arrivals of the comparison: Poisson at Load x capacity for Duration,
// drawn from the scenario's seed. The live half must offer exactly this schedule.
func (c CompareConfig) Schedule(capacity float64) loadgen.Schedule {
	return loadgen.Poisson(c.Load*capacity, c.Duration, c.Scenario.Seed)
}

// LiveResult is what the live half measured for one strategy.
type LiveResult struct {
	// Incoming is the number of requests sent; Accepted those the proxy admitted (every answer
	// that is not a refusal).
	Incoming, Accepted int64
	// P99 is the nearest-rank p99 latency of admitted requests.
	P99 time.Duration
}

// AcceptancePct is Accepted as a percentage of Incoming.
func (l LiveResult) AcceptancePct() float64 {
	if l.Incoming == 0 {
		return 0
	}
	return 100 * float64(l.Accepted) / float64(l.Incoming)
}

// Live runs the live half of a comparison: the real backend and proxy on loopback, driven by
// the load generator with sched, the proxy configured with strategy st (st.Spec is its
// --strategy text). It is supplied by the caller that can start a proxy.
type Live interface {
	RunLive(ctx context.Context, sc Scenario, sched loadgen.Schedule, st Strategy) (LiveResult, error)
}

// CompareRow is one strategy of a comparison.
type CompareRow struct {
	Strategy string
	Lab      Summary
	// Live is nil when no live half was run.
	Live *LiveResult
}

// AcceptanceDiffPP is lab minus live acceptance in percentage points.
func (r CompareRow) AcceptanceDiffPP() float64 {
	if r.Live == nil {
		return math.NaN()
	}
	return r.Lab.AcceptancePct() - r.Live.AcceptancePct()
}

// P99Ratio is lab p99 over live p99.
func (r CompareRow) P99Ratio() float64 {
	if r.Live == nil || r.Live.P99 <= 0 {
		return math.NaN()
	}
	return float64(r.Lab.P99) / float64(r.Live.P99)
}

// Within reports whether the lab's prediction is within the bounds of the live measurement.
func (r CompareRow) Within() bool {
	if r.Live == nil {
		return false
	}
	d := math.Abs(r.AcceptanceDiffPP())
	q := r.P99Ratio()
	return d <= AcceptanceTolerancePP && q >= 1-P99Tolerance && q <= 1+P99Tolerance
}

// DefaultCompareSpecs are the strategies the issue names for the comparison, sized for the
// synthetic backend's defaults (8 slow-tail workers, about 349 rps): the token bucket's rate sits
// below capacity, as a rate limit must to protect anything; the proxy's default of 400 rps would
// let the backend's own queue grow for the whole run, and a growing queue's p99 depends on the
// run's length more than on the strategy.
func DefaultCompareSpecs() []string {
	return []string{"{strategy: inflight, inflight: {limit: 8}}", "{strategy: token-bucket, tokenBucket: {rate: 300, burst: 30}}", "{strategy: bounded-queue, boundedQueue: {concurrency: 8, depth: 32, maxWait: 80ms}}"}
}

// DefaultCompareStrategies parses DefaultCompareSpecs.
func DefaultCompareStrategies() ([]Strategy, error) {
	return ParseStrategies(DefaultCompareSpecs())
}

// Compare runs every strategy in the lab and, when live is not nil, live, on the same schedule.
func Compare(ctx context.Context, cfg CompareConfig, strategies []Strategy, live Live) ([]CompareRow, float64, error) {
	capacity := cfg.Capacity
	if capacity == 0 {
		capacity = Capacity(cfg.Scenario)
	}
	if !(capacity > 0) || math.IsInf(capacity, 0) {
		return nil, 0, errors.New("capacity: unknown; give the backend a number of servers or set the capacity")
	}
	if !(cfg.Load > 0) || cfg.Duration <= 0 {
		return nil, 0, fmt.Errorf("load and duration must be positive, got %v and %s", cfg.Load, cfg.Duration)
	}
	sched := cfg.Schedule(capacity)
	sc := cfg.Scenario
	sc.Arrivals = ScheduleArrivals{Schedule: sched, Priority: admission.Critical}
	rows := make([]CompareRow, 0, len(strategies))
	for _, st := range strategies {
		r, err := Run(sc, st, RunOptions{})
		if err != nil {
			return nil, 0, err
		}
		row := CompareRow{Strategy: st.Name, Lab: r.Summary}
		if live != nil {
			if err := ctx.Err(); err != nil {
				return nil, 0, err
			}
			lr, err := live.RunLive(ctx, sc, sched, st)
			if err != nil {
				return nil, 0, fmt.Errorf("live %s: %w", st.Name, err)
			}
			row.Live = &lr
		}
		rows = append(rows, row)
	}
	return rows, capacity, nil
}

// WriteCompareTable prints the comparison side by side as a markdown table. Live columns show
// "-" when no live half ran.
func WriteCompareTable(w io.Writer, rows []CompareRow) error {
	var b strings.Builder
	b.WriteString("| strategy | lab acceptance % | live acceptance % | diff pp | lab p99 ms | live p99 ms | p99 lab/live | within bounds |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		liveAcc, diff, liveP99, ratio, ok := "-", "-", "-", "-", "-"
		if r.Live != nil {
			liveAcc = pct(r.Live.Accepted, r.Live.Incoming)
			diff = fmt.Sprintf("%+.1f", r.AcceptanceDiffPP())
			liveP99 = ms(r.Live.P99)
			if q := r.P99Ratio(); !math.IsNaN(q) {
				ratio = fmt.Sprintf("%.2f", q)
			}
			ok = "no"
			if r.Within() {
				ok = "yes"
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Strategy, pct(r.Lab.Accepted, r.Lab.Incoming),
			liveAcc, diff, ms(r.Lab.P99), liveP99, ratio, ok)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
