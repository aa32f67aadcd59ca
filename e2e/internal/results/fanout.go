package results

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/loadshed/loadshed/e2e/internal/criteria"
)

// FanoutRun is one run of the fan-out row (issue 32) in the results.
type FanoutRun struct {
	Run        string  `json:"run"`
	OfferedRPS float64 `json:"offered_rps"`
	// Users counts the frontend's user requests; Success is their end-to-end success, and
	// LoadSuccess the same seen by the load generator.
	Users       float64 `json:"user_requests"`
	Success     float64 `json:"success"`
	LoadSuccess float64 `json:"load_success"`
	// LegShares are the services' shares of legs answered 2xx; LeastLeg names the least.
	LegShares map[string]float64 `json:"leg_shares"`
	LeastLeg  string             `json:"least_leg"`
	// Wasted is the share of the admitted legs that served a failed user request.
	Wasted float64 `json:"wasted"`
	// Timeouts and Errors are user requests the load generator got no answer for.
	Timeouts int `json:"timeouts"`
	Errors   int `json:"errors"`
	// Levels are the sidecars' cohort admission levels as read during the run, by sidecar.
	Levels map[string][]float64 `json:"cohort_levels,omitempty"`
}

// Fanout is the fan-out row: cohorts off, then on, and the verdict.
type Fanout struct {
	Runs   []FanoutRun      `json:"runs"`
	Checks []criteria.Check `json:"checks"`
	Pass   bool             `json:"pass"`
	// AddedS is what the row added to the run's time (installs, both runs, the upgrade).
	AddedS float64 `json:"added_s"`
}

// NewFanout builds the fan-out row from its runs and checks.
func NewFanout(off, on criteria.FanoutRun, checks []criteria.Check, addedS float64) *Fanout {
	f := &Fanout{Checks: checks, Pass: len(criteria.Failed(checks)) == 0, AddedS: addedS}
	for _, r := range []criteria.FanoutRun{off, on} {
		least, _ := r.LeastLeg()
		row := FanoutRun{Run: r.Name(), OfferedRPS: r.Load.OfferedRPS, Users: r.Users(), Success: nanToZero(r.Success()),
			LoadSuccess: nanToZero(r.Load.SuccessShare()), LegShares: map[string]float64{}, LeastLeg: least,
			Wasted: nanToZero(r.WastedShare()), Timeouts: r.Load.Timeouts, Errors: r.Load.Errors, Levels: r.Levels}
		for svc, l := range r.Legs {
			row.LegShares[svc] = nanToZero(l.Share())
		}
		f.Runs = append(f.Runs, row)
	}
	return f
}

// writeFanout renders the fan-out row.
func (r *Results) writeFanout(b *strings.Builder) {
	f := r.Fanout
	if f == nil {
		return
	}
	b.WriteString("\nA frontend calling four services at once through their Services (each 4 workers, 20 ms mean, 5 ms stddev, 1% slow tail, " +
		"in-flight limit 4), Poisson user requests at 2x one service's capacity with a traceparent each, from loadshed's loadgen in the cluster; " +
		"cohorts off, then on (issue 32):\n\n")
	b.WriteString("| run | offered rps | user requests | end-to-end success (loadgen) | legs answered 2xx by service | wasted of admitted legs | timeouts / errors | cohort level by sidecar (min-max, mean) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, run := range f.Runs {
		var legs []string
		for _, svc := range sortedKeys(run.LegShares) {
			s := svc + " " + pctv(run.LegShares[svc])
			if svc == run.LeastLeg {
				s = "**" + s + "**" // the least-served leg
			}
			legs = append(legs, s)
		}
		fmt.Fprintf(b, "| %s | %.0f | %.0f | %s (%s) | %s | %s | %d / %d | %s |\n", run.Run, run.OfferedRPS, run.Users, pctv(run.Success),
			pctv(run.LoadSuccess), strings.Join(legs, ", "), pctv(run.Wasted), run.Timeouts, run.Errors, levels(run.Levels))
	}
	fmt.Fprintf(b, "\nFan-out row: %s; it added %.0f s to the run.\n", verdict(f.Pass, f.Checks), f.AddedS)
}

// levels renders the sidecars' cohort admission levels over the run (min-max, mean), "-" when
// none had any.
func levels(m map[string][]float64) string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		vs := m[n]
		if len(vs) == 0 {
			continue
		}
		lo, hi, sum := vs[0], vs[0], 0.0
		for _, v := range vs {
			lo, hi, sum = math.Min(lo, v), math.Max(hi, v), sum+v
		}
		parts = append(parts, fmt.Sprintf("%s %.2f-%.2f (mean %.2f)", n, lo, hi, sum/float64(len(vs))))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

func nanToZero(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}
