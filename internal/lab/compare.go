package lab

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
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

// Sensitivity of a prediction (issue "The lab near capacity").
const (
	// NearCapacity: a run whose admitted rate is at least this share below the backend's
	// effective capacity, or above it, sits where a few percent of capacity decide whether a
	// standing queue builds (within 10%), or how fast a backlog grows (above: its growth is the
	// difference of two close rates, until clients' timeouts cap it); the lab reports it as a band.
	NearCapacity = 0.10
	// BandSpeed: the band is the same run with the backend and the hop this share slower and
	// faster (capacity -5% and +5%).
	BandSpeed = 0.05
)

// Fragile reports whether a run's p99 sits on a boundary of its latency distribution (the edge
// of a slow tail, typically): its neighbours half a percentile either side (P99Lo, P99Hi) lie
// further apart than one prediction within the p99 tolerance could cover, so half a percent of
// the samples falling the other way moves p99 by more than the comparison allows.
func Fragile(s Summary) bool {
	return s.P99Lo > 0 && float64(s.P99Hi) > float64(s.P99Lo)*(1+P99Tolerance)/(1-P99Tolerance)
}

// CompareConfig describes one scenario run both in the lab and live.
type CompareConfig struct {
	// Scenario is the workload and backend; its Arrivals are replaced by Poisson arrivals at
	// Load x Capacity for Duration (Schedule below), the schedule the live load generator uses.
	Scenario Scenario
	// Capacity of the backend in requests per second; 0 derives it from the scenario (its
	// nominal capacity, Servers / mean service time). Offered loads are multiples of it.
	Capacity float64
	// Load is the offered load as a multiple of Capacity; Loads, when set, runs several.
	Load  float64
	Loads []float64
	// Duration is how long requests are offered.
	Duration time.Duration
	// Calibrate measures the hop with the live half (when it is a Calibrator) before the runs
	// and models it in the scenario, replacing Scenario.Hop.
	Calibrate bool
}

// Schedule returns the arrivals of the comparison: Poisson at Load x capacity for Duration,
// drawn from the scenario's seed. The live half must offer exactly this schedule.
func (c CompareConfig) Schedule(capacity float64) loadgen.Schedule {
	return c.scheduleAt(c.Load, capacity)
}

func (c CompareConfig) scheduleAt(load, capacity float64) loadgen.Schedule {
	return loadgen.Poisson(load*capacity, c.Duration, c.Scenario.Seed)
}

// MachineLoad is how busy the machine was with other work while something was measured.
type MachineLoad struct {
	// Known is false when the platform cannot tell.
	Known bool
	// Others is the share of the machine's CPU (0..1) other processes used.
	Others float64
	// CPUs is the number of cores.
	CPUs int
}

// BusyShare is the share of the machine's CPU taken by others above which a measurement is
// reported as taken on a busy machine.
const BusyShare = 0.25

// Busy reports whether others used more than BusyShare of the machine.
func (m MachineLoad) Busy() bool { return m.Known && m.Others > BusyShare }

func (m MachineLoad) String() string {
	if !m.Known {
		return "machine load unknown"
	}
	s := fmt.Sprintf("other processes used %.0f%% of %d cores", 100*m.Others, m.CPUs)
	if m.Busy() {
		s += " (busy)"
	}
	return s
}

// LiveResult is what the live half measured for one strategy.
type LiveResult struct {
	// Incoming is the number of requests sent; Accepted those the proxy admitted (every answer
	// that is not a refusal).
	Incoming, Accepted int64
	// P99 is the nearest-rank p99 latency of admitted requests.
	P99 time.Duration
	// Invalid, when not empty, says why the figures cannot be trusted (the load generator fell
	// behind its schedule).
	Invalid string
	// Machine is how busy the machine was with other work during the run.
	Machine MachineLoad
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

// Calibrator is a live half that can also measure the hop: it runs the real backend and proxy
// briefly, unloaded and at capacity.
type Calibrator interface {
	Calibrate(ctx context.Context, sc Scenario) (Calibration, error)
}

// Calibration is what a calibration measured: the backend (Workers workers, a constant service
// time of Service, the scenario's mean) behind the proxy admitting everything, first with a
// worker always free, then with every worker busy.
type Calibration struct {
	Workers int
	Service time.Duration
	// Unloaded and Loaded are the path hops measured in each phase: a request's latency at the
	// client minus the backend's own wait and service.
	Unloaded, Loaded HopDist
	// Throughput is the backend's answers per second with every worker busy: its effective
	// capacity with this service time.
	Throughput float64
	// Overshoot is how much longer than asked the backend held a worker on average.
	Overshoot time.Duration
	// Took is how long the calibration ran; Machine how busy the machine was meanwhile.
	Took    time.Duration
	Machine MachineLoad
}

// Hop is the hop a calibration measured: the path hops at capacity, and the worker overhead
// that brings the modelled backend's capacity to the measured one (Workers / Throughput minus
// the service time).
func (c Calibration) Hop() Hop {
	h := Hop{Path: c.Loaded}
	if c.Throughput > 0 && c.Workers > 0 {
		per := time.Duration(float64(c.Workers) / c.Throughput * float64(time.Second))
		h.Worker = max(0, per-c.Service).Round(time.Microsecond)
	}
	return h
}

// EffectiveCapacity is the backend's throughput with every worker busy once the hop's worker
// overhead is paid, at the scenario's speed: Servers / (mean service time + Hop.Worker). It is 0
// when Servers is unlimited.
func EffectiveCapacity(sc Scenario) float64 {
	if sc.Servers == 0 {
		return 0
	}
	per := MeanService(sc.Service) + sc.Hop.Worker
	if per <= 0 {
		return 0
	}
	speed := sc.Speed
	if speed == 0 {
		speed = 1
	}
	return float64(sc.Servers) / per.Seconds() * speed
}

// Band is a prediction's sensitivity to capacity: the same run with the backend and the hop
// BandSpeed slower and faster.
type Band struct {
	Slow, Fast Summary
}

// CompareRow is one strategy at one load of a comparison.
type CompareRow struct {
	Strategy string
	// Service describes the service-time model, when the caller names it (for the CSV).
	Service string
	// Load is the offered load, a multiple of the comparison's capacity.
	Load float64
	Lab  Summary
	// Band is set when the lab's admitted rate is within NearCapacity of the effective
	// capacity or above it.
	Band *Band
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

// Fragile reports whether the lab's p99 is fragile (see Fragile).
func (r CompareRow) Fragile() bool { return Fragile(r.Lab) }

// AcceptanceRange is the lab's acceptance prediction: the run's own, widened to its band.
func (r CompareRow) AcceptanceRange() (lo, hi float64) {
	lo, hi = r.Lab.AcceptancePct(), r.Lab.AcceptancePct()
	if r.Band != nil {
		for _, s := range []Summary{r.Band.Slow, r.Band.Fast} {
			lo, hi = math.Min(lo, s.AcceptancePct()), math.Max(hi, s.AcceptancePct())
		}
	}
	return lo, hi
}

// P99Range is the lab's p99 prediction: the run's own, widened to its band and, when it is
// fragile, to its neighbours.
func (r CompareRow) P99Range() (lo, hi time.Duration) {
	lo, hi = r.Lab.P99, r.Lab.P99
	if r.Band != nil {
		lo, hi = min(lo, r.Band.Slow.P99, r.Band.Fast.P99), max(hi, r.Band.Slow.P99, r.Band.Fast.P99)
	}
	if r.Fragile() {
		lo, hi = min(lo, r.Lab.P99Lo), max(hi, r.Lab.P99Hi)
	}
	return lo, hi
}

// PointWithin reports whether the run's own prediction is within the bounds of the live
// measurement: acceptance within AcceptanceTolerancePP, p99 within P99Tolerance.
func (r CompareRow) PointWithin() bool {
	if r.Live == nil || r.Live.Invalid != "" {
		return false
	}
	d := math.Abs(r.AcceptanceDiffPP())
	q := r.P99Ratio()
	return d <= AcceptanceTolerancePP && q >= 1-P99Tolerance && q <= 1+P99Tolerance
}

// Within reports whether the lab's prediction is within the bounds of the live measurement:
// the live acceptance within AcceptanceTolerancePP of the predicted range, and the live p99
// within P99Tolerance of some p99 in the predicted range. Without a band and a fragile p99
// the range is the run's own figure, and Within is PointWithin.
func (r CompareRow) Within() bool {
	if r.Live == nil || r.Live.Invalid != "" || r.Live.P99 <= 0 {
		return false
	}
	alo, ahi := r.AcceptanceRange()
	acc := r.Live.AcceptancePct()
	if acc < alo-AcceptanceTolerancePP || acc > ahi+AcceptanceTolerancePP {
		return false
	}
	plo, phi := r.P99Range()
	live := float64(r.Live.P99)
	// lab/live in [1-tol, 1+tol] for some lab in [plo, phi].
	return live >= float64(plo)/(1+P99Tolerance) && live <= float64(phi)/(1-P99Tolerance)
}

// Comparison is the outcome of CompareAll.
type Comparison struct {
	Rows []CompareRow
	// Capacity is the nominal capacity offered loads are multiples of; Effective the lab
	// backend's capacity with the hop's worker overhead (EffectiveCapacity).
	Capacity, Effective float64
	// Hop is the hop the lab modelled; Calibration, when set, the measurement it came from.
	Hop         Hop
	Calibration *Calibration
}

// Compare runs every strategy in the lab and, when live is not nil, live, on the same schedule.
// It returns the rows and the nominal capacity; CompareAll returns everything.
func Compare(ctx context.Context, cfg CompareConfig, strategies []Strategy, live Live) ([]CompareRow, float64, error) {
	c, err := CompareAll(ctx, cfg, strategies, live, nil)
	if err != nil {
		return nil, 0, err
	}
	return c.Rows, c.Capacity, nil
}

// CompareAll runs every strategy at every load in the lab and, when live is not nil, live, on
// the same schedule. With cfg.Calibrate and a live half that is a Calibrator it first measures
// the hop. The lab draws service times from the live backend's own seed (Scenario.ServiceSeed),
// so the two differ by the model and not by the luck of the draw. Runs near capacity get a band.
// A live run whose load generator fell behind is run once more before it is reported invalid.
// progress, when set, is told what runs.
func CompareAll(ctx context.Context, cfg CompareConfig, strategies []Strategy, live Live, progress io.Writer) (*Comparison, error) {
	capacity := cfg.Capacity
	if capacity == 0 {
		capacity = Capacity(cfg.Scenario)
	}
	if !(capacity > 0) || math.IsInf(capacity, 0) {
		return nil, errors.New("capacity: unknown; give the backend a number of servers or set the capacity")
	}
	loads := cfg.Loads
	if len(loads) == 0 {
		loads = []float64{cfg.Load}
	}
	for _, l := range loads {
		if !(l > 0) || l > 1000 {
			return nil, fmt.Errorf("load must be in (0, 1000], got %v", l)
		}
	}
	if cfg.Duration <= 0 {
		return nil, fmt.Errorf("duration must be positive, got %s", cfg.Duration)
	}
	if progress == nil {
		progress = io.Discard
	}
	sc := cfg.Scenario
	if sc.ServiceSeed == 0 {
		sc.ServiceSeed = BackendSeed(sc.Seed)
	}
	cmp := &Comparison{Capacity: capacity}
	if cal, ok := live.(Calibrator); ok && cfg.Calibrate {
		fmt.Fprintln(progress, "calibrating: the backend behind the proxy, unloaded and at capacity ...")
		c, err := cal.Calibrate(ctx, sc)
		if err != nil {
			return nil, fmt.Errorf("calibrate: %w", err)
		}
		cmp.Calibration = &c
		sc.Hop = c.Hop()
	}
	cmp.Hop = sc.Hop
	cmp.Effective = EffectiveCapacity(sc)
	for _, load := range loads {
		sched := cfg.scheduleAt(load, capacity)
		lsc := sc
		lsc.Arrivals = ScheduleArrivals{Schedule: sched, Priority: admission.Critical}
		for _, st := range strategies {
			row, err := predict(lsc, st, cmp.Effective)
			if err != nil {
				return nil, err
			}
			row.Load = load
			if live != nil {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				fmt.Fprintf(progress, "live: %s at %gx ...\n", st.Name, load)
				lr, err := live.RunLive(ctx, lsc, sched, st)
				if err == nil && lr.Invalid != "" {
					fmt.Fprintf(progress, "live: %s at %gx: invalid (%s); once more\n", st.Name, load, lr.Invalid)
					lr, err = live.RunLive(ctx, lsc, sched, st)
				}
				if err != nil {
					return nil, fmt.Errorf("live %s: %w", st.Name, err)
				}
				row.Live = &lr
			}
			cmp.Rows = append(cmp.Rows, row)
		}
	}
	return cmp, nil
}

// BackendSeed is the seed the synthetic backend's sampler uses for a scenario seed (the live
// half passes the scenario's seed, and the backend's default is 1).
func BackendSeed(seed uint64) uint64 {
	if seed == 0 {
		return 1
	}
	return seed
}

// predict runs st in sc and, when its admitted rate is near the effective capacity, its band.
func predict(sc Scenario, st Strategy, effective float64) (CompareRow, error) {
	r, err := Run(sc, st, RunOptions{})
	if err != nil {
		return CompareRow{}, err
	}
	row := CompareRow{Strategy: st.Name, Lab: r.Summary}
	if !nearCapacity(r.Summary, effective) {
		return row, nil
	}
	var band Band
	for _, b := range []struct {
		speed float64
		dst   *Summary
	}{{1 - BandSpeed, &band.Slow}, {1 + BandSpeed, &band.Fast}} {
		bsc := sc
		bsc.Speed = b.speed * speedOf(sc.Speed)
		br, err := Run(bsc, st, RunOptions{})
		if err != nil {
			return CompareRow{}, err
		}
		*b.dst = br.Summary
	}
	row.Band = &band
	return row, nil
}

// speedOf is a scenario's Speed, 0 meaning 1.
func speedOf(speed float64) float64 {
	if speed == 0 {
		return 1
	}
	return speed
}

// nearCapacity reports whether a run's admitted rate is within NearCapacity of capacity or
// above it.
func nearCapacity(s Summary, capacity float64) bool {
	if !(capacity > 0) || s.Span <= 0 {
		return false
	}
	admitted := float64(s.Accepted) / s.Span.Seconds()
	return admitted >= (1-NearCapacity)*capacity
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

// WriteCompareTable prints the comparison side by side as a markdown table. Live columns show
// "-" when no live half ran. When the rows are at several loads, each strategy is named with
// its load ("inflight @ 3x"). A lab figure with a band or a fragile p99 shows its range in
// brackets, and the flags column says which: "band" (near capacity: the range is the run at
// capacity -5% and +5%), "fragile p99" with the neighbouring percentiles, and "judged on the
// range" when only the range, not the run's own figure, is within the bounds.
func WriteCompareTable(w io.Writer, rows []CompareRow) error {
	loads := map[float64]bool{}
	for _, r := range rows {
		loads[r.Load] = true
	}
	var b strings.Builder
	b.WriteString("| strategy | lab acceptance % | live acceptance % | diff pp | lab p99 ms | live p99 ms | p99 lab/live | flags | within bounds |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
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
		labAcc := pct(r.Lab.Accepted, r.Lab.Incoming)
		if r.Band != nil {
			lo, hi := r.AcceptanceRange()
			labAcc += fmt.Sprintf(" [%.1f, %.1f]", lo, hi)
		}
		labP99 := ms(r.Lab.P99)
		if lo, hi := r.P99Range(); lo != hi {
			labP99 += fmt.Sprintf(" [%s, %s]", ms(lo), ms(hi))
		}
		name := r.Strategy
		if len(loads) > 1 {
			name += fmt.Sprintf(" @ %gx", r.Load)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", name, labAcc,
			liveAcc, diff, labP99, liveP99, ratio, flags(r), ok)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// flags describes what the table's brackets mean for a row.
func flags(r CompareRow) string {
	var f []string
	if r.Band != nil {
		f = append(f, "band")
	}
	if r.Fragile() {
		f = append(f, fmt.Sprintf("fragile p99 (p98.5 %s, p99.5 %s)", ms(r.Lab.P99Lo), ms(r.Lab.P99Hi)))
	}
	if r.Live != nil && r.Live.Invalid != "" {
		f = append(f, "live invalid: "+r.Live.Invalid)
	} else if r.Within() && !r.PointWithin() {
		f = append(f, "judged on the range")
	}
	if len(f) == 0 {
		return "-"
	}
	return strings.Join(f, "; ")
}

// CompareColumns are the columns of compare.csv. The lab's ranges (lo, hi) are the run's own
// figure widened to its band and, for p99, to its neighbours when it is fragile.
var CompareColumns = []string{"strategy", "service", "load", "lab_acceptance_pct", "lab_acceptance_lo", "lab_acceptance_hi",
	"live_acceptance_pct", "diff_pp", "lab_p99_ms", "lab_p99_lo_ms", "lab_p99_hi_ms", "lab_p98_5_ms", "lab_p99_5_ms",
	"live_p99_ms", "p99_ratio", "near_capacity", "p99_fragile", "within", "point_within", "live_invalid", "machine_others_pct"}

// WriteCompareCSV writes one row per strategy and load. Live columns are empty when no live
// half ran.
func WriteCompareCSV(w io.Writer, rows []CompareRow) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CompareColumns); err != nil {
		return err
	}
	for _, r := range rows {
		alo, ahi := r.AcceptanceRange()
		plo, phi := r.P99Range()
		liveAcc, diff, liveP99, ratio, within, point, invalid, others := "", "", "", "", "", "", "", ""
		if r.Live != nil {
			liveAcc = pct(r.Live.Accepted, r.Live.Incoming)
			diff = strconv.FormatFloat(r.AcceptanceDiffPP(), 'f', 1, 64)
			liveP99 = ms(r.Live.P99)
			if q := r.P99Ratio(); !math.IsNaN(q) {
				ratio = strconv.FormatFloat(q, 'f', 2, 64)
			}
			within, point, invalid = strconv.FormatBool(r.Within()), strconv.FormatBool(r.PointWithin()), r.Live.Invalid
			if r.Live.Machine.Known {
				others = strconv.FormatFloat(100*r.Live.Machine.Others, 'f', 0, 64)
			}
		}
		if err := cw.Write([]string{r.Strategy, r.Service, strconv.FormatFloat(r.Load, 'g', -1, 64),
			pct(r.Lab.Accepted, r.Lab.Incoming), strconv.FormatFloat(alo, 'f', 1, 64), strconv.FormatFloat(ahi, 'f', 1, 64),
			liveAcc, diff, ms(r.Lab.P99), ms(plo), ms(phi), ms(r.Lab.P99Lo), ms(r.Lab.P99Hi),
			liveP99, ratio, strconv.FormatBool(r.Band != nil), strconv.FormatBool(r.Fragile()), within, point, invalid, others}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
