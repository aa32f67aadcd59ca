package harness

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Acceptance targets of issue 33, reported (never asserted).
const (
	// TargetWithinSLO is the least share of the offered load the weighted policy must serve
	// within the SLO with one replica slowed, and TargetOverRR how much more than round robin.
	TargetWithinSLO = 0.95
	TargetOverRR    = 0.08
	// TargetEqualSlack is how much less than round robin it may serve with equal replicas.
	TargetEqualSlack = 0.01
	// TargetRecovery is how soon the recovered replica's share must come back.
	TargetRecovery = 10 * time.Second
)

// balancingStat is a figure of one case and policy over the valid repeats.
func (r *BalancingResult) stat(cs, pol string, get func(BalancingPoint) float64) Stat {
	var xs []float64
	for _, p := range r.Points {
		if p.Case == cs && p.Policy == pol && p.Valid() {
			xs = append(xs, get(p))
		}
	}
	return statOf(xs)
}

func (r *BalancingResult) counts(cs, pol string) (valid, total int, why []string) {
	for _, p := range r.Points {
		if p.Case != cs || p.Policy != pol {
			continue
		}
		total++
		switch {
		case p.Err != "":
			why = append(why, fmt.Sprintf("repeat %d failed: %s", p.Repeat, firstLine(p.Err)))
		case p.Invalid != "":
			why = append(why, fmt.Sprintf("repeat %d INVALID: %s", p.Repeat, p.Invalid))
		default:
			valid++
		}
	}
	return valid, total, why
}

func shareOf(i int) func(BalancingPoint) float64 {
	return func(p BalancingPoint) float64 {
		if i >= len(p.Shares) {
			return math.NaN()
		}
		return p.Shares[i]
	}
}

// lastWeights are the per-host weights Envoy held at the end of the measured window.
func lastWeights(p BalancingPoint) string {
	i := nearestSample(p.Samples, p.WarmupS+1e9)
	if i < 0 {
		return ""
	}
	parts := make([]string, len(p.Samples[i].Weights))
	for k, w := range p.Samples[i].Weights {
		parts[k] = fmt.Sprint(w)
	}
	return strings.Join(parts, " / ")
}

func fmtStat(st Stat, prec int) string {
	if st.N == 0 {
		return "n/a"
	}
	if st.N == 1 || st.Min == st.Max {
		return fmt.Sprintf("%.*f", prec, st.Median)
	}
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, st.Median, prec, st.Min, prec, st.Max)
}

func replicaText(rs []Replica) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%d x %s (%.0f rps)", r.Workers, r.Service, r.CapacityRPS())
	}
	return strings.Join(parts, ", ")
}

func (r *BalancingResult) markdown(w *strings.Builder) {
	c := r.Config
	fmt.Fprintf(w, "# Balancing over loadshed's load reports (issue 33)\n\n")
	fmt.Fprintf(w, "Command: `%s`  \nStarted %s on %s with %d CPUs (shared with other work), took %s, %d repeat(s).\n\n",
		c.CommandLine, r.Started.UTC().Format(time.RFC3339), runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), r.Elapsed.Round(time.Second), c.Repeats)
	fmt.Fprintf(w, "Envoy 1.40 (one worker) balances one cluster of three replicas; each replica is `cmd/backend` behind a loadshed sidecar with\n\n```yaml\n%s```\n\n", c.Loadshed)
	fmt.Fprintf(w, "Load: `cmd/loadgen`, Poisson arrivals (seed = repeat), client timeout %s, for %s of warm-up (not counted) then %s measured. "+
		"**Within SLO** is the share of the OFFERED requests answered 2xx within %s; **shed** the share refused (429/503); p99 is of the admitted answers, from their scheduled time. "+
		"Replica shares are each replica's share of the requests Envoy sent it over the measured window (Envoy's per-host `rq_total`, read every %s from `/clusters?format=json`), "+
		"weights Envoy's per-host weights at the end. Each cell is the median over the valid repeats (min–max in brackets). Every point starts fresh processes.\n\n",
		c.ClientTimeout, c.Warmup, c.Duration, c.SLO, c.SampleEvery)
	fmt.Fprintf(w, "Policies: `round_robin` (lb_policy ROUND_ROBIN), `client_side_weighted_round_robin` (in-band reports, blackout_period 1s, weight_update_period 1s, weight_expiration_period 180s, error_utilization_penalty 1), `least_request` (LEAST_REQUEST, 2 choices).\n\n")
	for _, cs := range c.Cases {
		fmt.Fprintf(w, "## %s: %s; %g rps offered (%.2f of their %.0f rps)\n\n", cs.Name, replicaText(cs.Replicas), cs.Rate, cs.Rate/cs.Capacity(), cs.Capacity())
		if cs.SwitchTo != nil {
			fmt.Fprintf(w, "The last replica's backend becomes %d x %s (through its admin endpoint) %s into the measured window. "+
				"Recovery: seconds from then until its share over the last %s first reaches %.1f of an equal share (%.3f) and its mean share over the next %s stays there.\n\n",
				cs.SwitchTo.Workers, cs.SwitchTo.Service, cs.SwitchAfter, RecoveryWindow, RecoveryShare, RecoveryShare/float64(len(cs.Replicas)), RecoveryHold)
		}
		hdr := "| policy | valid | within SLO | shed | p99 ms |"
		sep := "|---|---|---|---|---|"
		for i := range cs.Replicas {
			hdr += fmt.Sprintf(" replica %d share |", i+1)
			sep += "---|"
		}
		hdr += " weights at the end (first repeat) |"
		sep += "---|"
		if cs.SwitchTo != nil {
			hdr += " recovery s |"
			sep += "---|"
		}
		fmt.Fprintf(w, "%s\n%s\n", hdr, sep)
		var notes []string
		for _, pol := range cs.Policies {
			valid, total, why := r.counts(cs.Name, pol)
			notes = append(notes, why...)
			fmt.Fprintf(w, "| %s | %d/%d | %s | %s | %s |", pol, valid, total,
				fmtStat(r.stat(cs.Name, pol, BalancingPoint.WithinSLO), 3), fmtStat(r.stat(cs.Name, pol, BalancingPoint.ShedShare), 3),
				fmtStat(r.stat(cs.Name, pol, func(p BalancingPoint) float64 { return p.P99Ms }), 0))
			for i := range cs.Replicas {
				fmt.Fprintf(w, " %s |", fmtStat(r.stat(cs.Name, pol, shareOf(i)), 3))
			}
			weights := ""
			for _, p := range r.Points {
				if p.Case == cs.Name && p.Policy == pol && p.Valid() {
					weights = lastWeights(p)
					break
				}
			}
			fmt.Fprintf(w, " %s |", weights)
			if cs.SwitchTo != nil {
				var recs []string
				for _, p := range r.Points {
					if p.Case == cs.Name && p.Policy == pol && p.Valid() {
						recs = append(recs, strings.TrimSuffix(fmtSeconds(p.RecoveryS), " s"))
					}
				}
				fmt.Fprintf(w, " %s |", strings.Join(recs, ", "))
			}
			fmt.Fprintln(w)
		}
		for _, n := range notes {
			fmt.Fprintf(w, "\n- %s", n)
		}
		if len(notes) > 0 {
			fmt.Fprintln(w)
		}
		for _, p := range r.Points {
			if p.Case == cs.Name && p.Report != "" {
				fmt.Fprintf(w, "\nA direct request to replica %d before the load was answered with `endpoint-load-metrics: %s`.\n", len(cs.Replicas), p.Report)
				break
			}
		}
		fmt.Fprintln(w)
	}
	r.acceptance(w)
	fmt.Fprintf(w, "Charts: `within_slo.svg` (share of the offered load served within the SLO, per case and policy), `recovery_shares.svg` (each replica's share per second in the recovery case, first valid repeat of the weighted policy). Raw: `points.json`, `points.csv`, `loadgen/*.json`.\n")
}

// acceptance compares the figures with issue 33's targets.
func (r *BalancingResult) acceptance(w *strings.Builder) {
	fmt.Fprintf(w, "## Issue 33's targets\n\n")
	within := func(cs, pol string) Stat { return r.stat(cs, pol, BalancingPoint.WithinSLO) }
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	if w1, rr := within(CaseSlow, PolicyCSWRR), within(CaseSlow, PolicyRoundRobin); w1.N > 0 && rr.N > 0 {
		fmt.Fprintf(w, "- One replica slowed: weighted serves %.3f within the SLO (target >= %.2f): %s; round robin %.3f, difference %+.3f (target >= +%.2f): %s.\n",
			w1.Median, TargetWithinSLO, verdict(w1.Median >= TargetWithinSLO), rr.Median, w1.Median-rr.Median, TargetOverRR, verdict(w1.Median-rr.Median >= TargetOverRR))
	}
	if w1, rr := within(CaseEqual, PolicyCSWRR), within(CaseEqual, PolicyRoundRobin); w1.N > 0 && rr.N > 0 {
		fmt.Fprintf(w, "- Equal replicas: weighted %.3f, round robin %.3f, difference %+.3f (target >= -%.2f): %s.\n",
			w1.Median, rr.Median, w1.Median-rr.Median, TargetEqualSlack, verdict(w1.Median-rr.Median >= -TargetEqualSlack))
	}
	var recs []float64
	never := 0
	for _, p := range r.Points {
		if p.Case == CaseRecovery && p.Policy == PolicyCSWRR && p.Valid() {
			if p.RecoveryS == nil {
				never++
			} else {
				recs = append(recs, *p.RecoveryS)
			}
		}
	}
	if len(recs)+never > 0 {
		worst := math.Inf(1)
		if never == 0 {
			worst = statOf(recs).Max
		}
		fmt.Fprintf(w, "- Recovery (weighted, in-band): %d repeat(s), %d recovered, times %s s; worst %s (target <= %s): %s.\n",
			len(recs)+never, len(recs), fmtList(recs), fmtSecondsValue(worst), TargetRecovery, verdict(worst <= TargetRecovery.Seconds()))
	}
	fmt.Fprintln(w)
}

func fmtList(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.1f", x)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func fmtSecondsValue(x float64) string {
	if math.IsInf(x, 1) {
		return "never"
	}
	return fmt.Sprintf("%.1f s", x)
}

// writeOutputs writes report.md, points.json, points.csv and the charts, and prints the report.
func (r *BalancingResult) writeOutputs(stdout io.Writer) error {
	dir := r.Config.OutDir
	var md strings.Builder
	r.markdown(&md)
	if err := writeReport(dir, r, md.String(), stdout); err != nil {
		return err
	}
	if err := r.writeCSV(filepath.Join(dir, "points.csv")); err != nil {
		return err
	}
	if err := r.withinChart(filepath.Join(dir, "within_slo.svg")); err != nil {
		return fmt.Errorf("chart within_slo: %w", err)
	}
	if err := r.recoveryShareChart(filepath.Join(dir, "recovery_shares.svg")); err != nil {
		return fmt.Errorf("chart recovery_shares: %w", err)
	}
	return nil
}

func (r *BalancingResult) writeCSV(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	cw := csv.NewWriter(f)
	_ = cw.Write([]string{"case", "policy", "repeat", "valid", "offered", "goodput", "shed", "timeouts", "errors",
		"within_slo", "shed_share", "p99_ms", "shares", "recovery_s", "invalid", "error"})
	for _, p := range r.Points {
		rec := ""
		if p.RecoveryS != nil {
			rec = csvNum(*p.RecoveryS)
		}
		_ = cw.Write([]string{p.Case, p.Policy, fmt.Sprint(p.Repeat), fmt.Sprint(p.Valid()), fmt.Sprint(p.Offered), fmt.Sprint(p.Goodput),
			fmt.Sprint(p.Shed), fmt.Sprint(p.Timeouts), fmt.Sprint(p.Errors), csvNum(p.WithinSLO()), csvNum(p.ShedShare()), csvNum(p.P99Ms),
			fmtShares(p.Shares), rec, p.Invalid, firstLine(p.Err)})
	}
	cw.Flush()
	return cw.Error()
}

// withinChart draws the share of the offered load served within the SLO, a bar per policy,
// grouped by case (the cases with every policy).
func (r *BalancingResult) withinChart(path string) error {
	var cases []BalancingCase
	for _, cs := range r.Config.Cases {
		if cs.SwitchTo == nil {
			cases = append(cases, cs)
		}
	}
	if len(cases) == 0 {
		return nil
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("answered 2xx within %s / offered", r.Config.SLO)
	p.Y.Label.Text = "share of offered"
	p.Y.Min, p.Y.Max = 0, 1.1
	// The legend sits low on the left, clear of the bars.
	p.Legend.Left = true
	p.Legend.YOffs = vg.Points(40)
	p.Add(plotter.NewGrid())
	names := make([]string, len(cases))
	for i, cs := range cases {
		names[i] = fmt.Sprintf("%s (%g rps of %.0f)", cs.Name, cs.Rate, cs.Capacity())
	}
	width := vg.Points(28)
	drawn := 0
	for k, pol := range BalancingPolicies {
		vals := make(plotter.Values, len(cases))
		some := false
		for i, cs := range cases {
			st := r.stat(cs.Name, pol.Name, BalancingPoint.WithinSLO)
			if st.N > 0 {
				vals[i], some = st.Median, true
			}
		}
		if !some {
			continue
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return err
		}
		bars.Color = plotutil.Color(k)
		bars.Offset = vg.Length(k-1) * width
		p.Add(bars)
		p.Legend.Add(pol.Name, bars)
		drawn++
	}
	if drawn == 0 {
		return nil
	}
	target, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: TargetWithinSLO}, {X: float64(len(cases)) - 0.5, Y: TargetWithinSLO}})
	if err != nil {
		return err
	}
	target.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(target)
	p.Legend.Add(fmt.Sprintf("target %.2f", TargetWithinSLO), target)
	p.NominalX(names...)
	return p.Save(10*vg.Inch, 5*vg.Inch, path)
}

// recoveryShareChart draws each replica's share of Envoy's requests per second in the first
// valid recovery point of the weighted policy, with the switch marked.
func (r *BalancingResult) recoveryShareChart(path string) error {
	var pt *BalancingPoint
	var cs BalancingCase
	for i := range r.Points {
		if r.Points[i].Case == CaseRecovery && r.Points[i].Policy == PolicyCSWRR && r.Points[i].Valid() {
			pt = &r.Points[i]
			break
		}
	}
	for _, c := range r.Config.Cases {
		if c.Name == CaseRecovery {
			cs = c
		}
	}
	if pt == nil || len(pt.Samples) < 2 || cs.SwitchTo == nil {
		return nil
	}
	p := plot.New()
	switchAt := pt.WarmupS + cs.SwitchAfter.Seconds()
	p.Title.Text = fmt.Sprintf("weighted round robin: replica 3 turns %d x %s at %.0f s", cs.SwitchTo.Workers, cs.SwitchTo.Service, switchAt)
	p.X.Label.Text = "seconds since the load started"
	p.Y.Label.Text = "share of requests, last second"
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	n := len(pt.Samples[0].Requests)
	for i := range n {
		var xys plotter.XYs
		for _, s := range pt.Samples {
			if s.T < RecoveryWindow.Seconds() {
				continue
			}
			if sh := sharesBetween(pt.Samples, s.T-RecoveryWindow.Seconds(), s.T); sh != nil {
				xys = append(xys, plotter.XY{X: s.T, Y: sh[i]})
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("replica %d", i+1), l)
	}
	mark, err := plotter.NewLine(plotter.XYs{{X: switchAt, Y: 0}, {X: switchAt, Y: 1}})
	if err != nil {
		return err
	}
	mark.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
	p.Add(mark)
	p.Legend.Add("switch", mark)
	return p.Save(10*vg.Inch, 5*vg.Inch, path)
}
