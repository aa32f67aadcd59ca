package results

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/bench/k6summary"
	"github.com/loadshed/loadshed/e2e/internal/criteria"
)

func f(v float64) *float64 { return &v }

func sample() *Results {
	over := &k6summary.Summary{
		Script: "overload", Valid: true, OfferedRPS: 600, Requests: 18000, OK: 5300, Goodput: 5290,
		GoodputRPS: 176.3, GoodputRatio: f(0.8817), Shed: 12700, ShedShare: 0.7056,
		ShedByStatus: map[string]int64{"429": 0, "503": 12700}, RetryAfterCoverage: f(1),
		AdmittedMs: k6summary.Latency{P50: f(22.1), P99: f(31.46)},
	}
	un := &k6summary.Summary{Script: "smoke", Valid: true, Requests: 500, OK: 500, AdmittedMs: k6summary.Latency{P99: f(24.2)}}
	good := criteria.Outcome{Strategy: criteria.Inflight, Unloaded: un, Overload: over, Attempts: 2,
		Earlier: []criteria.Earlier{{GoodputRatio: f(0.78), AdmittedP99Ms: f(96.2), UnloadedP99Ms: f(26.8), Missed: []string{"goodput >= 0.8 of capacity"},
			Limit: &criteria.LimitRange{Min: 4, Mean: 6.25, Max: 9}}},
		Limit: &criteria.LimitRange{Min: 4, Mean: 4.56, Max: 5.5},
		CPU:   map[string]float64{"k6": 0.61, "loadshed": 0.23, "app": 0.05},
		Alert: criteria.Alert{Fired: true, FiredAfterS: 11.2, Resolved: true, ResolvedAfterS: 23.8}}
	bad := good
	bad.Strategy = criteria.Adaptive
	bad.Alert = criteria.Alert{}
	bad.Attempts, bad.Earlier, bad.Limit = 1, nil, nil
	steady := &k6summary.Summary{Script: "overload", Valid: true, OfferedRPS: 100, Requests: 4000, OK: 4000, AdmittedMs: k6summary.Latency{P99: f(27)}}
	lost := &k6summary.Summary{Script: "overload", Valid: true, OfferedRPS: 100, Requests: 4001, OK: 3942, Unexpected: 59,
		UnexpectedByClass: map[string]int64{"network": 3, "4xx": 56}, AdmittedMs: k6summary.Latency{P99: f(22.6)}}
	return &Results{
		Command: "scripts/e2e.sh", Started: time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC), NodeImage: "kind-offline/node:v1.34.4",
		CapacityRPS: 200, SLOMs: 100, LoadFactor: 3, DurationS: 30,
		Strategies: []Row{
			NewRow(good, criteria.Judge(good, criteria.DefaultLimits())),
			NewRow(bad, criteria.Judge(bad, criteria.DefaultLimits())),
		},
		Steady: []Steady{
			NewSteady("kubectl rollout restart", steady, criteria.SteadyChecks("restart", steady)),
			NewSteady("two-step switch", lost, criteria.InjectedSteadyChecks("switch", lost)),
		},
		Timings: []Timing{{"cluster", 48.2}, {"total", 612}},
	}
}

func TestMarkdown(t *testing.T) {
	md := sample().Markdown()
	for _, want := range []string{
		"Produced by `scripts/e2e.sh`",
		"| inflight | 176 (88%) | 22.1 / 31.5 | 24.2 | 71% (0 / 12700) | 100% | 0 / 0 | after 11 s / 24 s after | 0.61 / 0.23 / 0.05 | pass (",
		"| adaptive | 176 (88%) |",
		"not fired | 0.61 / 0.23 / 0.05 | FAIL: high-shed alert fires during the overload; high-shed alert resolves after the overload |",
		"| kubectl rollout restart | 100 | 4000 | 4000 | 27.0 | pass (2 checks) |",
		// A failed steady row says what was lost, as its columns do not.
		"| two-step switch | 100 | 4001 | 3942 | 22.6 | FAIL: switch: nothing lost to the replacement (4001 requests, 3942 2xx, 0 refused, timeouts 0, other 59 (network 3, 4xx 56), 0 dropped iterations) |",
		"Timings: cluster 48 s, total 612 s.",
		"Row inflight, measured again: attempt 1 of 2 missed goodput >= 0.8 of capacity (goodput 78% of C, admitted p99 96.2 ms, unloaded p99 26.8 ms, adaptive limit 4.0 / 6.2 / 9.0); the row shows attempt 2.",
		"Adaptive limit over the overload (min / mean / max of Prometheus's scrapes): inflight 4.0 / 4.6 / 5.5.\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "Row adaptive, measured again") {
		t.Errorf("a row measured once has no earlier attempt:\n%s", md)
	}
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	r := sample()
	if err := r.Write(dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back Results
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Schema != Schema || len(back.Strategies) != 2 || !back.Strategies[0].Pass || back.Strategies[1].Pass {
		t.Fatalf("round trip: schema %q, %d rows, pass %v/%v", back.Schema, len(back.Strategies), back.Strategies[0].Pass, back.Strategies[1].Pass)
	}
	if back.Strategies[0].AdmittedP99Ms == nil || *back.Strategies[0].AdmittedP99Ms != 31.46 {
		t.Fatalf("admitted p99 %v", back.Strategies[0].AdmittedP99Ms)
	}
	md, err := os.ReadFile(filepath.Join(dir, "results.md"))
	if err != nil || string(md) != r.Markdown() {
		t.Fatalf("results.md differs from Markdown() (err %v)", err)
	}
}
