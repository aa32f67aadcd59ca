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

// FanoutLoads are the loads of the case (`lab fanout`): 1.5x, 2x and 3x of every
// service's capacity.
var FanoutLoads = []float64{1.5, 2, 3}

// FanoutConfig is a call graph run at several loads, with independent sidecars and with cohorts,
// in the lab and, when a live half is given, live on the same schedule.
type FanoutConfig struct {
	// Scenario is the call graph. Its Arrivals are replaced by Poisson user requests at
	// Load x Capacity for Duration, unless Loads is empty and Arrivals is set (then the
	// scenario's own arrivals run once per variant, lab only). Its Cohorts is ignored: the
	// variants decide.
	Scenario FanoutScenario
	// Cohorts are the options of the cohorts variant.
	Cohorts Cohorts
	// Variants says which to run: false for independent sidecars, true for cohorts (default
	// both, independent first).
	Variants []bool
	// Capacity is what loads are multiples of (0: FanoutCapacity, the least service's).
	Capacity float64
	Loads    []float64
	Duration time.Duration
	// Calibrate measures the hop with the live half (when it is a Calibrator, on the first
	// service's backend) and models it in every service, replacing their Hop.
	Calibrate bool
}

// FanoutLiveResult is what the live half measured: the same figures as the lab's, from the
// frontend's and the load generator's counts.
type FanoutLiveResult struct {
	FanoutResult
	// Invalid, when not empty, says why the figures cannot be trusted (the load generator fell
	// behind its schedule).
	Invalid string
	// Machine is how busy the machine was with other work during the run.
	Machine MachineLoad
}

// FanoutLive runs the live half of a call graph: a frontend calling every service at once
// (backend --call-all), each service's backend behind its own sidecar with the service's policy
// and, when sc.Cohorts is set, cohorts keyed by a fresh traceparent per user request, driven by
// the load generator with sched. sc.Services[i]'s backend must be seeded with
// FanoutServiceSeed(sc.Seed, i) (or its ServiceSeed) so that both halves draw the same service
// times.
type FanoutLive interface {
	RunFanoutLive(ctx context.Context, sc FanoutScenario, sched loadgen.Schedule) (FanoutLiveResult, error)
}

// FanoutBand is a call graph's sensitivity to capacity: the same run with every backend and hop
// BandSpeed slower and faster.
type FanoutBand struct {
	Slow, Fast FanoutResult
}

// FanoutRow is one variant at one load.
type FanoutRow struct {
	// Load is the offered load (0 for the scenario's own arrivals); Cohorts the variant.
	Load    float64
	Cohorts bool
	Lab     FanoutResult
	// Band is set when a service's admitted rate is within NearCapacity of its effective
	// capacity or above it.
	Band *FanoutBand
	// Live is nil when no live half ran.
	Live *FanoutLiveResult
}

// FanoutComparison is the outcome of CompareFanout.
type FanoutComparison struct {
	Rows []FanoutRow
	// Capacity is what loads are multiples of; Hop what the lab modelled in every service, and
	// Calibration the measurement it came from, when one ran.
	Capacity    float64
	Hop         Hop
	Calibration *Calibration
}

// CompareFanout runs every variant at every load in the lab and, when live is not nil, live.
// progress, when set, is told what runs live.
func CompareFanout(ctx context.Context, cfg FanoutConfig, live FanoutLive, progress io.Writer) (*FanoutComparison, error) {
	if progress == nil {
		progress = io.Discard
	}
	sc := cfg.Scenario
	if len(sc.Services) == 0 {
		return nil, errors.New("services: none")
	}
	own := len(cfg.Loads) == 0 && sc.Arrivals != nil
	capacity := cfg.Capacity
	if capacity == 0 {
		capacity = FanoutCapacity(sc)
	}
	if !own {
		if !(capacity > 0) || math.IsInf(capacity, 0) {
			return nil, errors.New("capacity: unknown; give every service a number of servers or set the capacity")
		}
		if len(cfg.Loads) == 0 {
			return nil, errors.New("loads: none")
		}
		for _, l := range cfg.Loads {
			if !(l > 0) || l > 1000 {
				return nil, fmt.Errorf("load must be in (0, 1000], got %v", l)
			}
		}
		if cfg.Duration <= 0 {
			return nil, fmt.Errorf("duration must be positive, got %s", cfg.Duration)
		}
	}
	if own && live != nil {
		return nil, errors.New("a live call graph runs Poisson user requests at given loads, not the scenario's own arrivals")
	}
	variants := cfg.Variants
	if len(variants) == 0 {
		variants = []bool{false, true}
	}
	sc.Services = append([]FanoutService(nil), sc.Services...)
	for i := range sc.Services {
		if sc.Services[i].ServiceSeed == 0 {
			sc.Services[i].ServiceSeed = FanoutServiceSeed(sc.Seed, i)
		}
	}
	out := &FanoutComparison{Capacity: capacity, Hop: sc.Services[0].Hop}
	if cal, ok := live.(Calibrator); ok && cfg.Calibrate {
		fmt.Fprintln(progress, "calibrating: the first service's backend behind the proxy, unloaded and at capacity ...")
		s0 := sc.Services[0]
		c, err := cal.Calibrate(ctx, Scenario{Service: s0.Service, Servers: s0.Servers, Seed: sc.Seed})
		if err != nil {
			return nil, fmt.Errorf("calibrate: %w", err)
		}
		out.Calibration = &c
		out.Hop = c.Hop()
		for i := range sc.Services {
			sc.Services[i].Hop = out.Hop
		}
	}
	loads := cfg.Loads
	if own {
		loads = []float64{0}
	}
	for _, load := range loads {
		var sched loadgen.Schedule
		if !own {
			sched = loadgen.Poisson(load*capacity, cfg.Duration, sc.Seed)
			sc.Arrivals = ScheduleArrivals{Schedule: sched, Priority: admission.Critical}
		}
		for _, on := range variants {
			vsc := sc
			vsc.Cohorts = nil
			if on {
				c := cfg.Cohorts
				if c.Ranks == 0 {
					c.Ranks = DefaultCohortRanks
				}
				vsc.Cohorts = &c
			}
			row, err := predictFanout(vsc)
			if err != nil {
				return nil, err
			}
			row.Load = load
			if live != nil {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				fmt.Fprintf(progress, "live: call graph, %s, at %gx ...\n", variantName(on), load)
				lr, err := live.RunFanoutLive(ctx, vsc, sched)
				if err == nil && lr.Invalid != "" {
					fmt.Fprintf(progress, "live: call graph, %s, at %gx: invalid (%s); once more\n", variantName(on), load, lr.Invalid)
					lr, err = live.RunFanoutLive(ctx, vsc, sched)
				}
				if err != nil {
					return nil, fmt.Errorf("live call graph (%s, %gx): %w", variantName(on), load, err)
				}
				row.Live = &lr
			}
			out.Rows = append(out.Rows, row)
		}
	}
	return out, nil
}

func variantName(cohorts bool) string {
	if cohorts {
		return "cohorts"
	}
	return "independent"
}

// predictFanout runs the call graph and, when a service runs near or above its effective
// capacity, its band.
func predictFanout(sc FanoutScenario) (FanoutRow, error) {
	r, err := RunFanout(sc)
	if err != nil {
		return FanoutRow{}, err
	}
	row := FanoutRow{Cohorts: sc.Cohorts != nil, Lab: *r}
	near := false
	for i, s := range sc.Services {
		admitted := Summary{Accepted: r.Legs[i].Admitted, Span: r.Span}
		if nearCapacity(admitted, EffectiveCapacity(Scenario{Service: s.Service, Servers: s.Servers, Hop: s.Hop, Speed: sc.Speed})) {
			near = true
		}
	}
	if !near {
		return row, nil
	}
	var band FanoutBand
	for _, b := range []struct {
		speed float64
		dst   *FanoutResult
	}{{1 - BandSpeed, &band.Slow}, {1 + BandSpeed, &band.Fast}} {
		bsc := sc
		bsc.Speed = b.speed * speedOf(sc.Speed)
		br, err := RunFanout(bsc)
		if err != nil {
			return FanoutRow{}, err
		}
		*b.dst = *br
	}
	row.Band = &band
	return row, nil
}

// A share figure of a call graph: end-to-end success, a service's leg share, the least leg share
// or the wasted share.
type fanoutFigure struct {
	name string
	of   func(FanoutResult) float64
}

func fanoutFigures(n int) []fanoutFigure {
	figs := []fanoutFigure{
		{"end-to-end", FanoutResult.Success},
		{"least leg", func(r FanoutResult) float64 { s, _ := r.LeastLeg(); return s }},
		{"wasted", FanoutResult.WastedShare},
	}
	for i := range n {
		figs = append(figs, fanoutFigure{fmt.Sprintf("leg %d", i+1), func(r FanoutResult) float64 {
			if i >= len(r.Legs) {
				return math.NaN()
			}
			return r.Legs[i].Share()
		}})
	}
	return figs
}

// shareRange is a share figure's prediction: the run's own, widened to its band.
func (r FanoutRow) shareRange(of func(FanoutResult) float64) (lo, hi float64) {
	lo, hi = of(r.Lab), of(r.Lab)
	if r.Band != nil {
		for _, b := range []FanoutResult{r.Band.Slow, r.Band.Fast} {
			lo, hi = math.Min(lo, of(b)), math.Max(hi, of(b))
		}
	}
	return lo, hi
}

// P99Range is the prediction of the p99 of successful user requests: the run's own, widened to
// its band and, when fragile (see Fragile), to its neighbours.
func (r FanoutRow) P99Range() (lo, hi time.Duration) {
	lo, hi = r.Lab.P99, r.Lab.P99
	if r.Band != nil {
		lo, hi = min(lo, r.Band.Slow.P99, r.Band.Fast.P99), max(hi, r.Band.Slow.P99, r.Band.Fast.P99)
	}
	if r.Fragile() {
		lo, hi = min(lo, r.Lab.P99Lo), max(hi, r.Lab.P99Hi)
	}
	return lo, hi
}

// Fragile reports whether the lab's p99 of successful user requests is fragile.
func (r FanoutRow) Fragile() bool { return Fragile(Summary{P99Lo: r.Lab.P99Lo, P99Hi: r.Lab.P99Hi}) }

// Misses lists the figures of the live run outside the bounds of the lab's prediction: every
// share (end-to-end success, each leg's share, the least leg's, the wasted share) within
// AcceptanceTolerancePP percentage points of its predicted range, and the p99 of successful user
// requests within P99Tolerance of some p99 in its range (when both halves had successes).
// It is nil when the row is within bounds; without a valid live half it says so.
func (r FanoutRow) Misses() []string {
	if r.Live == nil {
		return []string{"no live run"}
	}
	if r.Live.Invalid != "" {
		return []string{"live invalid"}
	}
	if len(r.Live.Legs) != len(r.Lab.Legs) {
		return []string{fmt.Sprintf("live has %d legs, the lab %d", len(r.Live.Legs), len(r.Lab.Legs))}
	}
	var miss []string
	for _, f := range fanoutFigures(len(r.Lab.Legs)) {
		lo, hi := r.shareRange(f.of)
		v := 100 * f.of(r.Live.FanoutResult)
		if v < 100*lo-AcceptanceTolerancePP || v > 100*hi+AcceptanceTolerancePP {
			miss = append(miss, f.name)
		}
	}
	if r.Lab.OK > 0 && r.Live.OK > 0 {
		plo, phi := r.P99Range()
		live := float64(r.Live.P99)
		if live < float64(plo)/(1+P99Tolerance) || live > float64(phi)/(1-P99Tolerance) {
			miss = append(miss, "p99")
		}
	}
	return miss
}

// Within reports whether the live run is within the bounds of the lab's prediction (Misses).
func (r FanoutRow) Within() bool { return len(r.Misses()) == 0 }

// rowName names a row in tables: "independent @ 2x".
func (r FanoutRow) rowName() string {
	if r.Load == 0 {
		return variantName(r.Cohorts)
	}
	return fmt.Sprintf("%s @ %gx", variantName(r.Cohorts), r.Load)
}

// WriteFanoutTable prints the rows as a markdown table: end-to-end success, the product of the
// leg shares (what independent legs would give), the least-served leg, every leg's share, wasted
// legs over admitted legs and the p99 of successful user requests. A figure with a band shows
// its range in brackets. With a live half, the live figures follow and the last column says
// whether the row is within bounds (or which figures are not).
func WriteFanoutTable(w io.Writer, rows []FanoutRow) error {
	live := false
	for _, r := range rows {
		live = live || r.Live != nil
	}
	var b strings.Builder
	b.WriteString("| sidecars | end-to-end % | product of legs % | least leg % | legs % | wasted/admitted % | p99 ok ms |")
	if live {
		b.WriteString(" live end-to-end % | live least leg % | live legs % | live wasted % | live p99 ms | within bounds |")
	}
	b.WriteString("\n|---|---|---|---|---|---|---|")
	if live {
		b.WriteString("---|---|---|---|---|---|")
	}
	b.WriteString("\n")
	for _, r := range rows {
		least := func(x FanoutResult) float64 { s, _ := x.LeastLeg(); return s }
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |", r.rowName(), r.shareCell(FanoutResult.Success),
			pct1(r.Lab.ProductOfLegs()), r.shareCell(least), legCells(r.Lab), r.shareCell(FanoutResult.WastedShare), r.p99Cell())
		if live {
			if r.Live == nil {
				b.WriteString(" - | - | - | - | - | - |")
			} else {
				l := r.Live.FanoutResult
				ok := "yes"
				if m := r.Misses(); len(m) > 0 {
					ok = "no: " + strings.Join(m, ", ")
				}
				fmt.Fprintf(&b, " %s | %s | %s | %s | %s | %s |", pct1(l.Success()), pct1(least(l)), legCells(l), pct1(l.WastedShare()), okP99(l), ok)
			}
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func pct1(v float64) string { return strconv.FormatFloat(100*v, 'f', 1, 64) }

func (r FanoutRow) shareCell(of func(FanoutResult) float64) string {
	s := pct1(of(r.Lab))
	if r.Band != nil {
		lo, hi := r.shareRange(of)
		s += fmt.Sprintf(" [%s, %s]", pct1(lo), pct1(hi))
	}
	return s
}

func (r FanoutRow) p99Cell() string {
	if r.Lab.OK == 0 {
		return "-"
	}
	s := ms(r.Lab.P99)
	if lo, hi := r.P99Range(); lo != hi {
		s += fmt.Sprintf(" [%s, %s]", ms(lo), ms(hi))
	}
	return s
}

func okP99(r FanoutResult) string {
	if r.OK == 0 {
		return "-"
	}
	return ms(r.P99)
}

func legCells(r FanoutResult) string {
	parts := make([]string, len(r.Legs))
	for i, l := range r.Legs {
		parts[i] = pct1(l.Share())
	}
	return strings.Join(parts, " / ")
}

// FanoutColumns are the fixed columns of fanout.csv; after them come, per service i (from 1),
// leg_i_pct, leg_i_admitted, leg_i_refused, leg_i_cohort_refused, leg_i_timed_out, then the live
// columns (FanoutLiveColumns, each leg's live_leg_i_pct after them).
var FanoutColumns = []string{"load", "sidecars", "users", "ok", "end_to_end_pct", "end_to_end_lo", "end_to_end_hi",
	"product_of_legs_pct", "least_leg_pct", "least_leg", "admitted_legs", "wasted_legs", "wasted_pct", "wasted_lo", "wasted_hi",
	"p50_ok_ms", "p99_ok_ms", "p99_ok_lo_ms", "p99_ok_hi_ms", "near_capacity"}

// FanoutLiveColumns are the live columns of fanout.csv, empty when no live half ran.
var FanoutLiveColumns = []string{"live_users", "live_end_to_end_pct", "live_least_leg_pct", "live_wasted_pct", "live_p99_ok_ms",
	"within", "misses", "live_invalid", "machine_others_pct"}

// WriteFanoutCSV writes one row per variant and load.
func WriteFanoutCSV(w io.Writer, rows []FanoutRow) error {
	cw := csv.NewWriter(w)
	n := 0
	for _, r := range rows {
		n = max(n, len(r.Lab.Legs))
	}
	header := append([]string(nil), FanoutColumns...)
	for i := 1; i <= n; i++ {
		for _, c := range []string{"pct", "admitted", "refused", "cohort_refused", "timed_out"} {
			header = append(header, fmt.Sprintf("leg_%d_%s", i, c))
		}
	}
	header = append(header, FanoutLiveColumns...)
	for i := 1; i <= n; i++ {
		header = append(header, fmt.Sprintf("live_leg_%d_pct", i))
	}
	if err := cw.Write(header); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(100*v, 'f', 2, 64) }
	for _, r := range rows {
		l := r.Lab
		elo, ehi := r.shareRange(FanoutResult.Success)
		wlo, whi := r.shareRange(FanoutResult.WastedShare)
		least, at := l.LeastLeg()
		plo, phi := r.P99Range()
		rec := []string{strconv.FormatFloat(r.Load, 'g', -1, 64), variantName(r.Cohorts), i64(l.Users), i64(l.OK),
			f(l.Success()), f(elo), f(ehi), f(l.ProductOfLegs()), f(least), l.Legs[at].Name, i64(l.Admitted), i64(l.Wasted),
			f(l.WastedShare()), f(wlo), f(whi), ms(l.P50), ms(l.P99), ms(plo), ms(phi), strconv.FormatBool(r.Band != nil)}
		for i := 0; i < n; i++ {
			if i >= len(l.Legs) {
				rec = append(rec, "", "", "", "", "")
				continue
			}
			g := l.Legs[i]
			rec = append(rec, f(g.Share()), i64(g.Admitted), i64(g.Refused), i64(g.Refusals[reasonCohort]), i64(g.TimedOut))
		}
		live := make([]string, len(FanoutLiveColumns)+n)
		if r.Live != nil {
			v := r.Live.FanoutResult
			vl, _ := v.LeastLeg()
			others := ""
			if r.Live.Machine.Known {
				others = strconv.FormatFloat(100*r.Live.Machine.Others, 'f', 0, 64)
			}
			copy(live, []string{i64(v.Users), f(v.Success()), f(vl), f(v.WastedShare()), ms(v.P99),
				strconv.FormatBool(r.Within()), strings.Join(r.Misses(), ";"), r.Live.Invalid, others})
			for i := 0; i < n && i < len(v.Legs); i++ {
				live[len(FanoutLiveColumns)+i] = f(v.Legs[i].Share())
			}
		}
		if err := cw.Write(append(rec, live...)); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
