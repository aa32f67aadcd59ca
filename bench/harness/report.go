package harness

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

// resultFile holds a run's raw points, so the report can be rendered again (--report-from).
const resultFile = "points.json"

// Rerender reads dir/points.json of an earlier run (any scenario) and writes its report, CSVs
// and charts again into dir.
func Rerender(dir string, stdout io.Writer) error {
	b, err := os.ReadFile(filepath.Join(dir, resultFile))
	if err != nil {
		return err
	}
	// The cost and adaptive scenarios name their kind; the peers run's file has none.
	var kind struct{ Kind string }
	if err := json.Unmarshal(b, &kind); err != nil {
		return fmt.Errorf("%s: %w", resultFile, err)
	}
	switch kind.Kind {
	case "cost":
		var r CostResult
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("%s: %w", resultFile, err)
		}
		r.Config.OutDir = dir
		return r.writeOutputs(stdout)
	case "balancing":
		var r BalancingResult
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("%s: %w", resultFile, err)
		}
		r.Config.OutDir = dir
		return r.writeOutputs(stdout)
	case "adaptive":
		var r AdaptiveResult
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("%s: %w", resultFile, err)
		}
		r.Config.OutDir = dir
		return r.writeOutputs(stdout)
	}
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("%s: %w", resultFile, err)
	}
	r.Config.OutDir = dir
	return writeOutputs(&r, stdout)
}

// writeOutputs writes report.md, points.csv, summary.csv and the charts, and prints the report.
func writeOutputs(r *Result, stdout io.Writer) error {
	cells := r.Cells()
	var md strings.Builder
	r.markdown(&md, cells)
	if err := writeReport(r.Config.OutDir, r, md.String(), stdout); err != nil {
		return err
	}
	if err := r.writePointsCSV(filepath.Join(r.Config.OutDir, "points.csv")); err != nil {
		return err
	}
	if err := r.writeSummaryCSV(filepath.Join(r.Config.OutDir, "summary.csv"), cells); err != nil {
		return err
	}
	if err := r.writeTimelines(r.Config.OutDir); err != nil {
		return err
	}
	return r.writeCharts(r.Config.OutDir, cells)
}

func (r *Result) targetNames(pred func(Target) bool) []string {
	var out []string
	for _, t := range r.Targets {
		if pred(t) {
			out = append(out, t.Name)
		}
	}
	return out
}

func (r *Result) overloadScenarios() []Scenario {
	var out []Scenario
	for _, s := range r.Scenarios {
		if s.Script == "overload.js" {
			out = append(out, s)
		}
	}
	return out
}

// fmtNum prints a figure for the table; NaN is "n/a", +Inf "never".
func fmtNum(x float64, unit string) string {
	switch {
	case math.IsNaN(x):
		return "n/a"
	case math.IsInf(x, 1):
		return "never"
	}
	switch unit {
	case "":
		return strconv.FormatFloat(x, 'f', 3, 64)
	case "ms":
		if x < 10 {
			return strconv.FormatFloat(x, 'f', 2, 64)
		}
		return strconv.FormatFloat(x, 'f', 1, 64)
	default:
		return strconv.FormatFloat(x, 'f', 1, 64)
	}
}

func figureByKey(key string) Figure {
	for _, f := range Figures {
		if f.Key == key {
			return f
		}
	}
	return recoveryFigure
}

func (r *Result) markdown(w *strings.Builder, cells map[string]map[string]*Cell) {
	c := r.Config
	l := r.Limits
	fmt.Fprintf(w, "# loadshed vs peers\n\n")
	fmt.Fprintf(w, "Command: `%s`  \n", c.CommandLine)
	fmt.Fprintf(w, "Run: %s, %s, %d CPUs, %s elapsed; %d repeat(s), targets interleaved and rotated; medians of valid repeats.  \n",
		r.Started.UTC().Format(time.RFC3339), runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), r.Elapsed.Round(time.Second), c.Repeats)
	pin := "nothing pinned; each proxy runs one worker thread (nginx 1 worker, HAProxy nbthread 1, Go GOMAXPROCS=1)"
	if r.Pinned && c.Pin == PinProxy {
		pin = "target pinned to CPU 1 (taskset), backend and k6 free; each proxy runs one worker thread"
	} else if r.Pinned && c.Pin == PinSplit {
		pin = "backend and target pinned to CPU 1, k6 to CPU 0 (taskset); each proxy runs one worker thread"
	}
	fmt.Fprintf(w, "Backend: %d workers x %s constant = C %.0f rps; SLO %s; client timeout %s; %s per load point; %s.  \n",
		c.Backend.Workers, c.Backend.Service, l.CapacityRPS, c.SLO, c.ClientTimeout, c.PointDuration, pin)
	fmt.Fprintf(w, "Limits by Little's law: in-flight L = C*S = %d, queue Q = C*(SLO-S) = %d, max wait SLO-S = %s.\n\n", l.InFlight, l.Queue, l.MaxWait)

	fmt.Fprintf(w, "| target | settings | told capacity |\n|---|---|---|\n")
	for _, t := range r.Targets {
		told := "no"
		if t.ToldCapacity {
			told = "yes"
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", t.Name, t.Settings, told)
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "| %s | SKIPPED: %s | |\n", s.Target, s.Reason)
	}
	w.WriteString("\n")

	cols := []string{"goodput_ratio", "admitted_p50_ms", "admitted_p99_ms", "admitted_p999_ms", "shed_share", "rejection_p99_ms", "timeout_share", "cpu_ms_per_1k", "peak_rss_mb", "retry_after_coverage"}
	for _, sc := range r.overloadScenarios() {
		fmt.Fprintf(w, "## %s capacity (%.0f rps offered)\n\n", sc.Name, sc.Load*l.CapacityRPS)
		fmt.Fprintf(w, "| target | valid | goodput/C | p50 ms | p99 ms | p99.9 ms | shed | rejection p99 ms | timeouts | CPU ms/1k req | peak RSS MB | Retry-After |\n")
		fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, t := range r.Targets {
			cell := cells[t.Name][sc.Name]
			fmt.Fprintf(w, "| %s | %d/%d |", t.Name, cell.Valid, cell.Total)
			for _, k := range cols {
				f := figureByKey(k)
				if cell.Valid == 0 {
					w.WriteString(" INVALID |")
					continue
				}
				fmt.Fprintf(w, " %s |", fmtNum(cell.Stats[k].Median, f.Unit))
			}
			w.WriteString("\n")
		}
		w.WriteString("\n")
	}

	r.timelineSection(w, cells)
	for _, sc := range r.Scenarios {
		if sc.Script != "spike.js" {
			continue
		}
		fmt.Fprintf(w, "## Spike: 0.5x -> 5x for %s -> 0.5x\n\nRecovery: seconds after the spike until goodput stays at 0.9 x min(offered, C) for 3 s (never: not within %s).\n\n",
			c.SpikeHold, c.SpikeAfter)
		fmt.Fprintf(w, "| target | valid | recovery s | goodput/C over the run | admitted p99 ms | shed | timeouts |\n|---|---|---|---|---|---|---|\n")
		for _, t := range r.Targets {
			cell := cells[t.Name][sc.Name]
			if cell.Valid == 0 {
				fmt.Fprintf(w, "| %s | 0/%d | INVALID | | | | |\n", t.Name, cell.Total)
				continue
			}
			fmt.Fprintf(w, "| %s | %d/%d | %s | %s | %s | %s | %s |\n", t.Name, cell.Valid, cell.Total,
				fmtNum(cell.Stats["recovery_s"].Median, "s"), fmtNum(cell.Stats["goodput_ratio"].Median, ""),
				fmtNum(cell.Stats["admitted_p99_ms"].Median, "ms"), fmtNum(cell.Stats["shed_share"].Median, ""),
				fmtNum(cell.Stats["timeout_share"].Median, ""))
		}
		w.WriteString("\n")
	}

	if len(r.overloadScenarios()) > 0 {
		// The peers' comparisons and issue 6's goals are about the overload points.
		r.ratioSection(w, cells)
		r.overheadSection(w)
		r.goalsSection(w, cells)
	}

	pointsNotUsed(w, r.Points)
}

// pointsNotUsed lists the failed and invalid points, with the reason.
func pointsNotUsed(w *strings.Builder, points []Point) {
	var bad []string
	for _, p := range points {
		switch {
		case p.Err != "":
			bad = append(bad, fmt.Sprintf("- %s %s repeat %d: FAILED: %s", p.Target, p.Scenario, p.Repeat, firstLine(p.Err)))
		case !p.Summary.Valid:
			bad = append(bad, fmt.Sprintf("- %s %s repeat %d: INVALID: %s", p.Target, p.Scenario, p.Repeat, p.Summary.InvalidReason))
		}
	}
	if len(bad) > 0 {
		fmt.Fprintf(w, "## Points not used\n\n%s\n\n", strings.Join(bad, "\n"))
	}
}

// writeReport writes a scenario's points.json (v) and report.md (md) into dir and prints md.
func writeReport(dir string, v any, md string, stdout io.Writer) error {
	raw, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, resultFile), raw, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(md), 0o644); err != nil {
		return err
	}
	_, err = io.WriteString(stdout, md)
	return err
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// ratioSection compares loadshed's best strategy with the best peer, figure by figure.
func (r *Result) ratioSection(w *strings.Builder, cells map[string]map[string]*Cell) {
	ls := r.targetNames(func(t Target) bool { return t.Kind == KindLoadshed })
	peers := r.targetNames(func(t Target) bool { return t.Peer })
	if len(ls) == 0 || len(peers) == 0 {
		return
	}
	fmt.Fprintf(w, "## loadshed's best vs the best peer\n\nratio = loadshed's best strategy / best peer for that figure (goodput and Retry-After: higher is better; the rest: lower is better).\n\n")
	fmt.Fprintf(w, "| load | figure | loadshed best | value | peer best | value | ratio |\n|---|---|---|---|---|---|---|\n")
	scen := append([]Scenario(nil), r.overloadScenarios()...)
	for _, sc := range r.Scenarios {
		if sc.Script == "spike.js" {
			scen = append(scen, sc)
		}
	}
	for _, sc := range scen {
		figs := Figures
		if sc.Script == "spike.js" {
			figs = []Figure{recoveryFigure, Figures[0]}
		}
		for _, f := range figs {
			if f.Better == Neutral || f.Key == "unexpected" {
				continue
			}
			ln, lst := best(cells, ls, f, sc.Name)
			pn, pst := best(cells, peers, f, sc.Name)
			if ln == "" || pn == "" {
				continue
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", sc.Name, f.Title, ln, fmtNum(lst.Median, f.Unit), pn, fmtNum(pst.Median, f.Unit), fmtRatio(lst.Median, pst.Median))
		}
	}
	w.WriteString("\n")
}

func fmtRatio(a, b float64) string {
	switch {
	case math.IsNaN(a) || math.IsNaN(b):
		return "n/a"
	case math.IsInf(a, 1) && math.IsInf(b, 1):
		return "both never"
	case b == 0 && a == 0:
		return "1.00"
	case b == 0 || math.IsInf(a, 1):
		return "inf"
	}
	return strconv.FormatFloat(a/b, 'f', 2, 64)
}

// lowest returns the overload scenario with the lowest load (the overhead point).
func (r *Result) lowest() (Scenario, bool) {
	ov := r.overloadScenarios()
	if len(ov) == 0 {
		return Scenario{}, false
	}
	sort.SliceStable(ov, func(i, j int) bool { return ov[i].Load < ov[j].Load })
	return ov[0], true
}

// paired returns, per repeat, target's figure minus direct's at scenario, over repeats where
// both points are valid.
func (r *Result) addedOverDirect(target, scenario string, f Figure) Stat {
	byRep := map[int]Point{}
	for _, p := range r.Points {
		if p.Target == "direct" && p.Scenario == scenario && p.Valid() {
			byRep[p.Repeat] = p
		}
	}
	var xs []float64
	for _, p := range r.Points {
		if p.Target == target && p.Scenario == scenario && p.Valid() {
			if d, ok := byRep[p.Repeat]; ok {
				xs = append(xs, f.get(p)-f.get(d))
			}
		}
	}
	return statOf(xs)
}

func (r *Result) overheadSection(w *strings.Builder) {
	sc, ok := r.lowest()
	if !ok || sc.Load >= 1 {
		return // overhead is measured below capacity only
	}
	hasDirect := len(r.targetNames(func(t Target) bool { return t.Kind == KindDirect })) > 0
	cells := r.Cells()
	nginx := r.targetNames(func(t Target) bool { return t.Kind == KindNginx })
	cpu := figureByKey("cpu_ms_per_1k")
	nginxName, nginxCPU := best(cells, nginx, cpu, sc.Name)
	plainCPU := Stat{Median: math.NaN()}
	if c := cells["plainproxy"]; c != nil {
		plainCPU = c[sc.Name].Stats[cpu.Key]
	}
	fmt.Fprintf(w, "## Overhead at %s\n\nAdded latency = target minus direct (no proxy) in the same repeat, median over repeats. CPU per 1000 requests vs the cheaper nginx variant (%s) and vs the plain Go proxy.\n\n", sc.Name, orNA(nginxName))
	fmt.Fprintf(w, "| target | added p50 ms | added p99 ms | CPU ms/1k req | vs nginx | vs plainproxy |\n|---|---|---|---|---|---|\n")
	p50, p99 := figureByKey("admitted_p50_ms"), figureByKey("admitted_p99_ms")
	for _, t := range r.Targets {
		if t.Kind == KindDirect {
			continue
		}
		a50, a99 := Stat{Median: math.NaN()}, Stat{Median: math.NaN()}
		if hasDirect {
			a50, a99 = r.addedOverDirect(t.Name, sc.Name, p50), r.addedOverDirect(t.Name, sc.Name, p99)
		}
		c := cells[t.Name][sc.Name].Stats[cpu.Key]
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", t.Name, fmtNum(a50.Median, "ms"), fmtNum(a99.Median, "ms"), fmtNum(c.Median, "ms"),
			fmtRatio(c.Median, nginxCPU.Median), fmtRatio(c.Median, plainCPU.Median))
	}
	w.WriteString("\n")
}

func orNA(s string) string {
	if s == "" {
		return "n/a"
	}
	return s
}

// goal is one line of the goals table for one strategy.
type goal struct {
	name  string
	check func(t string) (value string, pass string)
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

func (r *Result) scenarioByLoad(load float64) (Scenario, bool) {
	for _, s := range r.overloadScenarios() {
		if s.Load == load {
			return s, true
		}
	}
	return Scenario{}, false
}

// goalsSection evaluates issue 6's goals for every loadshed strategy. They are reported, not
// enforced.
func (r *Result) goalsSection(w *strings.Builder, cells map[string]map[string]*Cell) {
	ls := r.targetNames(func(t Target) bool { return t.Kind == KindLoadshed })
	if len(ls) == 0 {
		return
	}
	peers := r.targetNames(func(t Target) bool { return t.Peer })
	untold := r.targetNames(func(t Target) bool { return t.Peer && !t.ToldCapacity })
	gp := Figures[0]
	p99 := figureByKey("admitted_p99_ms")
	cpu := figureByKey("cpu_ms_per_1k")
	nginx := r.targetNames(func(t Target) bool { return t.Kind == KindNginx })
	na := func() (string, string) { return "n/a", "n/a" }
	stat := func(t string, sc Scenario, f Figure) (Stat, bool) {
		c := cells[t][sc.Name]
		if c == nil || c.Stats[f.Key].N == 0 {
			return Stat{}, false
		}
		return c.Stats[f.Key], true
	}
	atLeast := func(load, min float64) func(string) (string, string) {
		return func(t string) (string, string) {
			sc, ok := r.scenarioByLoad(load)
			if !ok {
				return na()
			}
			st, ok := stat(t, sc, gp)
			if !ok {
				return "INVALID", "n/a"
			}
			return fmtNum(st.Median, ""), verdict(st.Median >= min)
		}
	}
	goals := []goal{
		{"goodput/C >= 0.95 at 2x", atLeast(2, 0.95)},
		{"goodput/C >= 0.90 at 10x", atLeast(10, 0.90)},
		{"goodput >= best peer at every load (within spread); worst ratio", func(t string) (string, string) {
			worst, pass, n := math.Inf(1), true, 0
			for _, sc := range r.overloadScenarios() {
				st, ok := stat(t, sc, gp)
				_, pst := best(cells, peers, gp, sc.Name)
				if !ok || pst.N == 0 {
					continue
				}
				n++
				worst = math.Min(worst, st.Median/pst.Median)
				if st.Median < pst.Median && st.Max < pst.Min {
					pass = false
				}
			}
			if n == 0 {
				return na()
			}
			return fmtNum(worst, ""), verdict(pass)
		}},
		{"goodput >= 1.10 x best peer not told the capacity, at 5x and 10x; worst ratio", func(t string) (string, string) {
			worst, n := math.Inf(1), 0
			for _, load := range []float64{5, 10} {
				sc, ok := r.scenarioByLoad(load)
				if !ok {
					continue
				}
				st, ok := stat(t, sc, gp)
				_, pst := best(cells, untold, gp, sc.Name)
				if !ok || pst.N == 0 {
					continue
				}
				n++
				worst = math.Min(worst, st.Median/pst.Median)
			}
			if n == 0 {
				return na()
			}
			return fmtNum(worst, ""), verdict(worst >= 1.10)
		}},
		{"admitted p99 <= 2 x unloaded p99 (direct at the lowest load), every load; worst multiple", func(t string) (string, string) {
			low, ok := r.lowest()
			if !ok || low.Load >= 1 || cells["direct"] == nil {
				return na()
			}
			base, ok := stat("direct", low, p99)
			if !ok {
				return na()
			}
			worst, n := 0.0, 0
			for _, sc := range r.overloadScenarios() {
				st, ok := stat(t, sc, p99)
				if !ok {
					continue
				}
				n++
				worst = math.Max(worst, st.Median/base.Median)
			}
			if n == 0 {
				return na()
			}
			return fmtNum(worst, ""), verdict(worst <= 2)
		}},
		{"added p99 at 0.5x (the lowest load) <= plainproxy's and < 1 ms", func(t string) (string, string) {
			low, ok := r.lowest()
			if !ok || low.Load >= 1 || cells["direct"] == nil {
				return na()
			}
			a := r.addedOverDirect(t, low.Name, p99)
			if a.N == 0 {
				return na()
			}
			pass := a.Median < 1
			if cells["plainproxy"] != nil {
				if pa := r.addedOverDirect("plainproxy", low.Name, p99); pa.N > 0 {
					pass = pass && a.Median <= pa.Median
				}
			}
			return fmtNum(a.Median, "ms") + " ms", verdict(pass)
		}},
		{"CPU per request <= 1.5 x nginx, every load; worst ratio", func(t string) (string, string) {
			worst, n := 0.0, 0
			for _, sc := range r.overloadScenarios() {
				st, ok := stat(t, sc, cpu)
				_, nst := best(cells, nginx, cpu, sc.Name)
				if !ok || nst.N == 0 {
					continue
				}
				n++
				worst = math.Max(worst, st.Median/nst.Median)
			}
			if n == 0 {
				return na()
			}
			return fmtNum(worst, ""), verdict(worst <= 1.5)
		}},
	}
	fmt.Fprintf(w, "## Goals (issue 6; reported, not enforced)\n\n| goal |")
	for _, t := range ls {
		fmt.Fprintf(w, " %s |", strings.TrimPrefix(t, "loadshed/"))
	}
	w.WriteString("\n|---|")
	for range ls {
		w.WriteString("---|")
	}
	w.WriteString("\n")
	for _, g := range goals {
		fmt.Fprintf(w, "| %s |", g.name)
		for _, t := range ls {
			v, p := g.check(t)
			switch {
			case v == "n/a" || v == "INVALID":
				fmt.Fprintf(w, " %s |", v)
			default:
				fmt.Fprintf(w, " %s %s |", v, p)
			}
		}
		w.WriteString("\n")
	}
	w.WriteString("\n")
}

func (r *Result) writePointsCSV(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	cw := csv.NewWriter(f)
	head := []string{"target", "scenario", "load", "repeat", "valid", "invalid_reason", "requests", "offered_rps", "goodput_rps"}
	for _, fg := range Figures {
		head = append(head, fg.Key)
	}
	head = append(head, "recovery_s", "dropped_iterations", "start_late_p99_ms")
	_ = cw.Write(head)
	for _, p := range r.Points {
		row := []string{p.Target, p.Scenario, fmt.Sprint(p.Load), fmt.Sprint(p.Repeat)}
		if p.Summary == nil {
			row = append(row, "false", p.Err)
			_ = cw.Write(row)
			continue
		}
		s := p.Summary
		row = append(row, strconv.FormatBool(s.Valid && p.Err == ""), s.InvalidReason, fmt.Sprint(s.Requests), csvNum(s.OfferedRPS), csvNum(s.GoodputRPS))
		for _, fg := range Figures {
			row = append(row, csvNum(fg.get(p)))
		}
		rec := ""
		if s.Script == "spike" {
			rec = csvNum(recoveryFigure.get(p))
		}
		row = append(row, rec, fmt.Sprint(s.DroppedIterations), csvNum(v(s.StartLateP99Ms)))
		_ = cw.Write(row)
	}
	cw.Flush()
	return cw.Error()
}

func csvNum(x float64) string {
	switch {
	case math.IsNaN(x):
		return ""
	case math.IsInf(x, 1):
		return "inf"
	}
	return strconv.FormatFloat(x, 'g', 6, 64)
}

func (r *Result) writeSummaryCSV(path string, cells map[string]map[string]*Cell) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	cw := csv.NewWriter(f)
	_ = cw.Write([]string{"target", "scenario", "load", "figure", "median", "min", "max", "n", "valid_points", "points"})
	for _, t := range r.Targets {
		for _, sc := range r.Scenarios {
			c := cells[t.Name][sc.Name]
			keys := make([]string, 0, len(c.Stats))
			for k := range c.Stats {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				st := c.Stats[k]
				_ = cw.Write([]string{t.Name, sc.Name, fmt.Sprint(sc.Load), k, csvNum(st.Median), csvNum(st.Min), csvNum(st.Max), fmt.Sprint(st.N), fmt.Sprint(c.Valid), fmt.Sprint(c.Total)})
			}
		}
	}
	cw.Flush()
	return cw.Error()
}
