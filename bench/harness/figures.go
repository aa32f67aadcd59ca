package harness

import (
	"math"
	"sort"

	"github.com/loadshed/loadshed/bench/k6summary"
)

// Better says which way a figure improves.
type Better int

// Directions.
const (
	Neutral Better = iota
	Higher
	Lower
)

// Figure is one number reported per point.
type Figure struct {
	Key    string // CSV column and chart file name
	Title  string
	Unit   string
	Better Better
	// LogY draws the chart with a logarithmic y axis.
	LogY bool
	get  func(p Point) float64
}

func v(p *float64) float64 { return k6summary.Value(p) }

func cpuPer1000(p Point) float64 {
	if p.Summary == nil || p.Summary.Requests == 0 || p.CPUNanos == 0 {
		return math.NaN()
	}
	return float64(p.CPUNanos) / 1e6 / float64(p.Summary.Requests) * 1000
}

// Figures are the per-point figures, in report order.
var Figures = []Figure{
	{"goodput_ratio", "goodput / min(offered, C)", "", Higher, false, func(p Point) float64 { return v(p.Summary.GoodputRatio) }},
	{"admitted_p50_ms", "admitted p50", "ms", Lower, true, func(p Point) float64 { return v(p.Summary.AdmittedMs.P50) }},
	{"admitted_p99_ms", "admitted p99", "ms", Lower, true, func(p Point) float64 { return v(p.Summary.AdmittedMs.P99) }},
	{"admitted_p999_ms", "admitted p99.9", "ms", Lower, true, func(p Point) float64 { return v(p.Summary.AdmittedMs.P999) }},
	{"shed_share", "shed share", "", Neutral, false, func(p Point) float64 { return p.Summary.ShedShare }},
	{"rejection_p99_ms", "rejection p99", "ms", Lower, true, func(p Point) float64 { return v(p.Summary.RejectionMs.P99) }},
	{"timeout_share", "client timeouts", "", Lower, false, func(p Point) float64 {
		if p.Summary.Requests == 0 {
			return math.NaN()
		}
		return float64(p.Summary.Timeouts) / float64(p.Summary.Requests)
	}},
	{"cpu_ms_per_1k", "proxy CPU per 1000 requests", "ms", Lower, false, cpuPer1000},
	{"peak_rss_mb", "proxy peak RSS", "MB", Lower, false, func(p Point) float64 {
		if p.PeakRSS == 0 {
			return math.NaN()
		}
		return float64(p.PeakRSS) / (1 << 20)
	}},
	{"retry_after_coverage", "Retry-After on refusals", "", Higher, false, func(p Point) float64 { return v(p.Summary.RetryAfterCoverage) }},
	{"unexpected", "unexpected errors", "", Lower, false, func(p Point) float64 { return float64(p.Summary.Unexpected) }},
}

// recoveryFigure is the spike's recovery time; a run that never recovered counts as +Inf.
var recoveryFigure = Figure{"recovery_s", "recovery after the spike", "s", Lower, false, func(p Point) float64 {
	if p.Summary.RecoveryS == nil {
		return math.Inf(1)
	}
	return *p.Summary.RecoveryS
}}

// Stat is a figure over the valid repeats of one target at one scenario.
type Stat struct {
	Median, Min, Max float64
	N                int // values that were not NaN
}

// Cell is one target at one scenario.
type Cell struct {
	Target, Scenario string
	Valid, Total     int
	Stats            map[string]Stat
	// Invalid lists why points were not used.
	Invalid []string
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	if math.IsInf(s[n/2-1], 1) || math.IsInf(s[n/2], 1) {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func statOf(xs []float64) Stat {
	var keep []float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			keep = append(keep, x)
		}
	}
	if len(keep) == 0 {
		return Stat{Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	st := Stat{Median: median(keep), Min: keep[0], Max: keep[0], N: len(keep)}
	for _, x := range keep {
		st.Min = math.Min(st.Min, x)
		st.Max = math.Max(st.Max, x)
	}
	return st
}

// Cells aggregates the points per target and scenario.
func (r *Result) Cells() map[string]map[string]*Cell {
	out := map[string]map[string]*Cell{}
	for _, t := range r.Targets {
		out[t.Name] = map[string]*Cell{}
		for _, sc := range r.Scenarios {
			c := &Cell{Target: t.Name, Scenario: sc.Name, Stats: map[string]Stat{}}
			var valid []Point
			for _, p := range r.Points {
				if p.Target != t.Name || p.Scenario != sc.Name {
					continue
				}
				c.Total++
				switch {
				case p.Err != "":
					c.Invalid = append(c.Invalid, "failed: "+p.Err)
				case !p.Summary.Valid:
					c.Invalid = append(c.Invalid, "INVALID: "+p.Summary.InvalidReason)
				default:
					valid = append(valid, p)
				}
			}
			c.Valid = len(valid)
			figs := append(append([]Figure(nil), Figures...), recoveryFigure)
			for _, f := range figs {
				if f.Key == recoveryFigure.Key && sc.Script != "spike.js" {
					continue
				}
				xs := make([]float64, 0, len(valid))
				for _, p := range valid {
					xs = append(xs, f.get(p))
				}
				c.Stats[f.Key] = statOf(xs)
			}
			out[t.Name][sc.Name] = c
		}
	}
	return out
}

// best returns the target among names with the best median of f at scenario, or "" when none
// has a value.
func best(cells map[string]map[string]*Cell, names []string, f Figure, scenario string) (string, Stat) {
	bestName, bestStat := "", Stat{Median: math.NaN()}
	for _, n := range names {
		c := cells[n][scenario]
		if c == nil {
			continue
		}
		st, ok := c.Stats[f.Key]
		if !ok || st.N == 0 {
			continue
		}
		if bestName == "" || (f.Better == Higher && st.Median > bestStat.Median) || (f.Better == Lower && st.Median < bestStat.Median) {
			bestName, bestStat = n, st
		}
	}
	return bestName, bestStat
}
