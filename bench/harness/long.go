package harness

import (
	"encoding/csv"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/loadshed/loadshed/bench/k6summary"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// The long scenario (issue 13) runs the adaptive targets (loadshed adaptive as a sidecar, Envoy
// calling loadshed as its external processor, Envoy's adaptive_concurrency) for minutes at 2x,
// long enough for Envoy's periodic min-RTT probe, and through a capacity halving, and reads
// from each run's per-second timeline how steady the shed share was: its worst second.

// LongTargets are the long scenario's targets.
var LongTargets = []string{DefaultAdaptive, EnvoyLoadshed, EnvoyAdaptive}

// LongScenarios are the long scenario's runs: `load` x capacity for `long` (after `warmup`),
// and the same load through a halving of the backend's workers at a third of `halving`.
func LongScenarios(load float64, long, warmup, halving time.Duration) []Scenario {
	k := fmt.Sprint(load)
	return []Scenario{
		{Name: fmt.Sprintf("long-%gx", load), Script: "long.js", Load: load, Warmup: warmup,
			Env: map[string]string{"K": k, "DURATION": fmt.Sprint(int(long.Seconds()))}},
		{Name: fmt.Sprintf("halving-%gx", load), Script: "capacity-drop.js", Load: load,
			Env: map[string]string{"K": k, "DURATION": fmt.Sprint(int(halving.Seconds())), "DROP_AT": fmt.Sprint(int(halving.Seconds()) / 3)}},
	}
}

// minSecondAttempts is how many requests a second must have sent for its shed share to count
// (the first and last seconds of a run are partial).
const minSecondAttempts = 10

// worstSecondShed is the largest share of refusals among the requests sent in one second of
// the run, over the seconds from `from` on that sent at least minSecondAttempts; NaN without a
// timeline.
func worstSecondShed(s *k6summary.Summary, from int) float64 {
	worst := math.NaN()
	if s == nil {
		return worst
	}
	for _, b := range s.Timeline {
		if b.T < from || b.Attempts < minSecondAttempts {
			continue
		}
		share := float64(b.Shed) / float64(b.Attempts)
		if math.IsNaN(worst) || share > worst {
			worst = share
		}
	}
	return worst
}

// timelineScenarios are the scenarios whose script keeps a per-second timeline.
func (r *Result) timelineScenarios() []Scenario {
	var out []Scenario
	for _, sc := range r.Scenarios {
		if sc.Script == "long.js" || sc.Script == "capacity-drop.js" {
			out = append(out, sc)
		}
	}
	return out
}

// dropAt is the second at which a capacity-drop scenario halves the backend (0 for others).
func dropAt(sc Scenario) int {
	var n int
	fmt.Sscan(sc.Env["DROP_AT"], &n)
	return n
}

// timelineSection reports the timeline scenarios: the usual figures, the worst second's shed
// share (for a halving: before the drop and from it on, where the ideal share differs), and the
// CPU per request of the target's processes together.
func (r *Result) timelineSection(w *strings.Builder, cells map[string]map[string]*Cell) {
	for _, sc := range r.timelineScenarios() {
		ideal := math.Max(0, 1-1/sc.Load)
		if sc.Script == "capacity-drop.js" {
			fmt.Fprintf(w, "## %s: %gx of C, the backend's workers halved at %d s of %s s\n\n", sc.Name, sc.Load, dropAt(sc), sc.Env["DURATION"])
			fmt.Fprintf(w, "Ideal shed share %.2f before the drop and %.2f after it. Worst 1-second shed share over the seconds that sent at least %d requests.\n\n",
				ideal, math.Max(0, 1-0.5/sc.Load), minSecondAttempts)
		} else {
			fmt.Fprintf(w, "## %s: %gx of C for %s s (after %s of warm-up)\n\n", sc.Name, sc.Load, sc.Env["DURATION"], sc.Warmup)
			fmt.Fprintf(w, "Ideal shed share %.2f. Worst 1-second shed share over the seconds that sent at least %d requests.\n\n", ideal, minSecondAttempts)
		}
		fmt.Fprintf(w, "| target | valid | goodput / ideal | admitted p50 ms | admitted p99 ms | shed share | worst 1-s shed share | CPU ms per 1k requests (all its processes) | Retry-After |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, t := range r.Targets {
			cell := cells[t.Name][sc.Name]
			if cell == nil || cell.Valid == 0 {
				fmt.Fprintf(w, "| %s | 0/%d | INVALID | | | | | | |\n", t.Name, cellTotal(cell))
				continue
			}
			var worst []float64
			for _, p := range r.Points {
				if p.Target == t.Name && p.Scenario == sc.Name && p.Valid() {
					worst = append(worst, worstSecondShed(p.Summary, 0))
				}
			}
			fmt.Fprintf(w, "| %s | %d/%d | %s | %s | %s | %s | %s | %s | %s |\n", t.Name, cell.Valid, cell.Total,
				fmtNum(cell.Stats["goodput_ratio"].Median, ""), fmtNum(cell.Stats["admitted_p50_ms"].Median, "ms"),
				fmtNum(cell.Stats["admitted_p99_ms"].Median, "ms"), fmtNum(cell.Stats["shed_share"].Median, ""),
				fmtNum(statOf(worst).Median, ""), fmtNum(cell.Stats["cpu_ms_per_1k"].Median, "ms"),
				fmtNum(cell.Stats["retry_after_coverage"].Median, ""))
		}
		fmt.Fprintf(w, "\nChart: `%s_shed_per_second.png` (first valid repeat of each target); every second in `timeline.csv`.\n\n", sc.Name)
	}
}

func cellTotal(c *Cell) int {
	if c == nil {
		return 0
	}
	return c.Total
}

// writeTimelines writes timeline.csv (every second of every timeline point) and, per timeline
// scenario, a chart of each target's shed share per second.
func (r *Result) writeTimelines(dir string) error {
	scs := r.timelineScenarios()
	if len(scs) == 0 {
		return nil
	}
	f, err := os.Create(filepath.Join(dir, "timeline.csv"))
	if err != nil {
		return err
	}
	cw := csv.NewWriter(f)
	cw.Write([]string{"target", "scenario", "repeat", "t", "offered", "attempts", "good", "shed"})
	for _, p := range r.Points {
		if p.Summary == nil {
			continue
		}
		for _, b := range p.Summary.Timeline {
			cw.Write([]string{p.Target, p.Scenario, fmt.Sprint(p.Repeat), fmt.Sprint(b.T), fmt.Sprint(b.Offered), fmt.Sprint(b.Attempts), fmt.Sprint(b.Good), fmt.Sprint(b.Shed)})
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	for _, sc := range scs {
		if err := r.shedChart(filepath.Join(dir, sc.Name+"_shed_per_second.png"), sc); err != nil {
			return fmt.Errorf("chart %s: %w", sc.Name, err)
		}
	}
	return nil
}

// shedChart draws each target's shed share per second at sc (its first valid repeat).
func (r *Result) shedChart(path string, sc Scenario) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("shed share per second, %s", sc.Name)
	p.X.Label.Text = "second of the run"
	p.Y.Label.Text = "refused / sent"
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top = true
	for i, t := range r.Targets {
		for _, pt := range r.Points {
			if pt.Target != t.Name || pt.Scenario != sc.Name || !pt.Valid() {
				continue
			}
			var xys plotter.XYs
			for _, b := range pt.Summary.Timeline {
				if b.Attempts >= minSecondAttempts {
					xys = append(xys, plotter.XY{X: float64(b.T), Y: float64(b.Shed) / float64(b.Attempts)})
				}
			}
			if len(xys) == 0 {
				break
			}
			l, err := plotter.NewLine(xys)
			if err != nil {
				return err
			}
			l.Color = plotutil.Color(i)
			l.Dashes = plotutil.Dashes(i)
			p.Add(l)
			p.Legend.Add(t.Name, l)
			break
		}
	}
	return p.Save(10*vg.Inch, 5*vg.Inch, path)
}
