package results

import (
	"strings"
	"testing"

	"github.com/loadshed/loadshed/e2e/internal/criteria"
)

func fanRun(cohorts bool, ok float64, shares ...float64) criteria.FanoutRun {
	const users = 10000
	r := criteria.FanoutRun{Cohorts: cohorts, UsersOK: ok, UsersFailed: users - ok, Legs: map[string]criteria.Legs{}, Measured: true,
		Load: criteria.Load{Valid: true, OfferedRPS: 400, Offered: users, Success: int(ok) - 10, Timeouts: 3}}
	for i, s := range shares {
		r.Legs[string(rune('a'+i))] = criteria.Legs{OK: ok, Wasted: s*users - ok, Refused: users - s*users}
	}
	if cohorts {
		r.Levels = map[string][]float64{"a": {1.5, 1.25, 1.75, 1.5}, "b": nil}
	}
	return r
}

func TestFanoutMarkdown(t *testing.T) {
	off, on := fanRun(false, 500, 0.4, 0.35, 0.45, 0.4), fanRun(true, 3000, 0.4, 0.35, 0.45, 0.4)
	r := sample()
	r.Fanout = NewFanout(off, on, criteria.FanoutChecks(off, on, criteria.DefaultFanoutLimits()), 187.4)
	md := r.Markdown()
	for _, want := range []string{
		"| cohorts off | 400 | 10000 | 5% (5%) | a 40%, **b 35%**, c 45%, d 40% | 88% | 3 / 0 | - |",
		"| cohorts on | 400 | 10000 | 30% (30%) | a 40%, **b 35%**, c 45%, d 40% | 25% | 3 / 0 | a 1.25-1.75 (mean 1.50) |",
		// Five sidecars should show their level with cohorts on; the sample has one.
		"Fan-out row: FAIL: fan-out: cohorts on: cohort metrics present exactly with cohorts; it added 187 s to the run.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if r.Fanout.Runs[1].LeastLeg != "b" || r.Fanout.Pass {
		t.Errorf("row %+v", r.Fanout)
	}
	if strings.Contains(sample().Markdown(), "Fan-out row") {
		t.Error("a run without the fan-out row reports one")
	}
}
