package harness

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/bench/k6summary"
)

func TestWorstSecondShed(t *testing.T) {
	s := &k6summary.Summary{Timeline: []k6summary.Second{
		{T: 0, Attempts: 5, Shed: 5},    // too few requests to count
		{T: 1, Attempts: 100, Shed: 50}, // 0.5
		{T: 2, Attempts: 100, Shed: 70}, // the worst counted second
		{T: 3, Attempts: 80, Shed: 40},  // 0.5
		{T: 4, Attempts: 9, Shed: 9},    // partial last second
	}}
	if got := worstSecondShed(s, 0); math.Abs(got-0.7) > 1e-9 {
		t.Fatalf("worst second = %v, want 0.7", got)
	}
	if got := worstSecondShed(s, 3); math.Abs(got-0.5) > 1e-9 {
		t.Fatalf("worst second from t=3 = %v, want 0.5", got)
	}
	if got := worstSecondShed(&k6summary.Summary{}, 0); !math.IsNaN(got) {
		t.Fatalf("no timeline: %v, want NaN", got)
	}
}

func TestLongScenariosAndReport(t *testing.T) {
	scs := LongScenarios(2, 3*time.Minute, 10*time.Second, time.Minute)
	if len(scs) != 2 || scs[0].Script != "long.js" || scs[0].Env["DURATION"] != "180" || scs[0].Warmup != 10*time.Second {
		t.Fatalf("long run: %+v", scs)
	}
	if scs[1].Script != "capacity-drop.js" || scs[1].Env["DROP_AT"] != "20" || scs[1].Warmup != 0 {
		t.Fatalf("halving run: %+v", scs[1])
	}
	good := 0.95
	r := &Result{Scenarios: scs, Targets: []Target{{Name: DefaultAdaptive}, {Name: EnvoyAdaptive}}}
	for _, tn := range []string{DefaultAdaptive, EnvoyAdaptive} {
		shed := int64(50)
		if tn == EnvoyAdaptive {
			shed = 90 // a probe second
		}
		r.Points = append(r.Points, Point{Target: tn, Scenario: scs[0].Name, Repeat: 1, Summary: &k6summary.Summary{
			Valid: true, GoodputRatio: &good, Requests: 200,
			Timeline: []k6summary.Second{{T: 0, Attempts: 100, Shed: 50}, {T: 1, Attempts: 100, Shed: shed}}}})
	}
	var w strings.Builder
	r.timelineSection(&w, r.Cells())
	out := w.String()
	for _, want := range []string{"| loadshed/adaptive | 1/1 | 0.950 |", "| 0.500 |", "| 0.900 |", "halving-2x", "| envoy/adaptive_concurrency | 0/0 | INVALID"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}
