package harness

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

const frontendMetrics = `# HELP backend_frontend_legs_total Legs.
# TYPE backend_frontend_legs_total counter
backend_frontend_legs_total{leg="http://127.0.0.1:1/",result="failed"} 1
backend_frontend_legs_total{leg="http://127.0.0.1:1/",result="ok"} 30
backend_frontend_legs_total{leg="http://127.0.0.1:1/",result="refused"} 50
backend_frontend_legs_total{leg="http://127.0.0.1:1/",result="wasted"} 19
backend_frontend_legs_total{leg="http://127.0.0.1:2/",result="failed"} 0
backend_frontend_legs_total{leg="http://127.0.0.1:2/",result="ok"} 30
backend_frontend_legs_total{leg="http://127.0.0.1:2/",result="refused"} 20
backend_frontend_legs_total{leg="http://127.0.0.1:2/",result="wasted"} 50
backend_frontend_legs_total_created{leg="x",result="ok"} 5
backend_frontend_requests_total{result="ok"} 30
`

func TestParseLegsAndTheWindow(t *testing.T) {
	after := parseLegs([]byte(frontendMetrics))
	if len(after) != 2 || after[0].URL != "http://127.0.0.1:1/" || after[1].URL != "http://127.0.0.1:2/" {
		t.Fatalf("legs %+v", after)
	}
	if l := after[0]; l.OK != 30 || l.Wasted != 19 || l.Refused != 50 || l.Failed != 1 || l.Total() != 100 {
		t.Fatalf("leg 1 %+v", l)
	}
	before := []Leg{{URL: "http://127.0.0.1:2/", OK: 10, Wasted: 10, Refused: 10}}
	w := legsBetween(before, after)
	if w[0] != after[0] {
		t.Errorf("a leg missing before counts from 0: %+v", w[0])
	}
	if l := w[1]; l.OK != 20 || l.Wasted != 40 || l.Refused != 10 || l.Failed != 0 {
		t.Errorf("leg 2 over the window %+v", l)
	}
	p := FanoutPoint{Kind: KindFanout, Offered: 100, Success: 30, Legs: after}
	if got := p.EndToEnd(); got != 0.3 {
		t.Errorf("end to end %v, want 0.3", got)
	}
	if got := p.LeastLeg(); got != 0.49 {
		t.Errorf("least leg %v, want 0.49 (leg 1: 49 of 100)", got)
	}
	if got := p.WastedShare(); math.Abs(got-69.0/129) > 1e-12 {
		t.Errorf("wasted share %v, want 69/129", got)
	}
	if !math.IsNaN((FanoutPoint{}).LeastLeg()) || !math.IsNaN((FanoutPoint{}).WastedShare()) {
		t.Error("a point without legs has leg figures")
	}
}

func TestMetricSumAndValue(t *testing.T) {
	body := []byte(`loadshed_shed_total{door="http",priority="critical",reason="cohort",route="default",strategy="cohorts"} 3
loadshed_shed_total{door="http",priority="sheddable",reason="cohort",route="default",strategy="cohorts"} 4
loadshed_shed_total{door="http",priority="critical",reason="concurrency_limit",route="default",strategy="inflight"} 10
loadshed_cohort_level{route="default"} 117
loadshed_cohort_level{route="other"} 5
weird{a="x\"y,z}"} 1
`)
	if got := metricSum(body, "loadshed_shed_total", map[string]string{"reason": CohortShedReason}); got != 7 {
		t.Errorf("cohort refusals %v, want 7", got)
	}
	if got := metricSum(body, "loadshed_shed_total", nil); got != 17 {
		t.Errorf("all refusals %v, want 17", got)
	}
	if v, ok := metricValue(body, CohortLevelMetric, map[string]string{"route": "default"}); !ok || v != 117 {
		t.Errorf("level %v %v, want 117", v, ok)
	}
	if _, ok := metricValue(body, "absent", nil); ok {
		t.Error("an absent metric has a value")
	}
	if s := parseSeries(body, "weird"); len(s) != 1 || s[0].labels["a"] != `x"y,z}` {
		t.Errorf("escaped label: %+v", s)
	}
}

func TestSettleTime(t *testing.T) {
	var samples []LevelSample
	for i := range 61 { // every 250 ms for 15 s; the step at 5 s
		ts := float64(i) * 0.25
		level := 127.0
		switch {
		case ts >= 5 && ts < 6:
			level = 20 // overshoot right after the step
		case ts >= 6 && ts < 8:
			level = 60 + 10*math.Sin(ts*7) // wandering, beyond the band of 16 at times
		case ts >= 8:
			level = 70
		}
		samples = append(samples, LevelSample{T: ts, Level: level})
	}
	// 8.0 is the first at 70; 7.75 is 60+10*sin(54.25) = 52.4 (off by 17.6 > 16).
	got := settleTime(samples, 5, 16)
	if got == nil || *got != 3 {
		t.Fatalf("settle %v, want 3 s", got)
	}
	// A level that moves in its final second never settled.
	moving := append(append([]LevelSample{}, samples...), LevelSample{T: 15.25, Level: 127}, LevelSample{T: 15.5, Level: 0})
	if s := settleTime(moving, 5, 16); s != nil {
		t.Errorf("a moving level settled at %v", *s)
	}
	if settleTime(nil, 5, 16) != nil {
		t.Error("no samples settled")
	}
	// Within the band from the step on: settled at once.
	flat := []LevelSample{{0, 10}, {5, 11}, {6, 12}, {8, 10}, {10, 11}}
	if s := settleTime(flat, 5, 16); s == nil || *s != 0 {
		t.Errorf("a flat level: %v, want 0", s)
	}
}

func TestFanoutPlanInterleavesCohortsOffAndOn(t *testing.T) {
	c := DefaultFanoutConfig()
	p1, p2 := fanoutPlan(c, 1), fanoutPlan(c, 2)
	if len(p1) != 3*2+2+1+1+2 || len(p2) != len(p1) {
		t.Fatalf("plan of %d and %d points", len(p1), len(p2))
	}
	if p1[0] != (fanoutStep{KindFanout, 1.5, false}) || p1[1] != (fanoutStep{KindFanout, 1.5, true}) {
		t.Errorf("repeat 1 starts %+v %+v, want 1.5x off then on", p1[0], p1[1])
	}
	if p2[0] != (fanoutStep{KindFanout, 1.5, true}) || p2[1] != (fanoutStep{KindFanout, 1.5, false}) {
		t.Errorf("repeat 2 starts %+v %+v, want 1.5x on then off", p2[0], p2[1])
	}
	kinds := map[string]int{}
	for _, s := range p1 {
		kinds[s.Kind]++
		if (s.Kind == KindUnder || s.Kind == KindStep) && !s.Cohorts {
			t.Errorf("%s runs with cohorts off", s.Kind)
		}
	}
	if kinds[KindFanout] != 6 || kinds[KindOverload] != 2 || kinds[KindUnder] != 1 || kinds[KindStep] != 1 || kinds[KindCritical] != 2 {
		t.Errorf("kinds %v", kinds)
	}
	c.OverloadLoad, c.UnderLoad, c.StepFrom, c.StepTo, c.CriticalLoad = 0, 0, 0, 0, 0
	if n := len(fanoutPlan(c, 1)); n != 6 {
		t.Errorf("fan-out only: %d points, want 6", n)
	}
}

func TestFanoutSidecarConfig(t *testing.T) {
	spec := sidecarSpec{Listen: "127.0.0.1:1", Admin: "127.0.0.1:2", Upstream: "127.0.0.1:3", Strategy: "inflight", Limit: 4,
		Cohorts: DefaultFanoutConfig().Cohorts, SecretFile: "/tmp/x/cohort.key"}
	var on map[string]any
	if err := yaml.Unmarshal([]byte(fanoutSidecarConfig(spec)), &on); err != nil {
		t.Fatalf("not YAML: %v\n%s", err, fanoutSidecarConfig(spec))
	}
	adm := on["admission"].(map[string]any)
	co, ok := adm["cohorts"].(map[string]any)
	if !ok || co["key"] != "traceparent" || co["count"] != 128 || co["rotate"] != "1h" || co["secretFile"] != "/tmp/x/cohort.key" {
		t.Errorf("cohorts block %v", adm["cohorts"])
	}
	if adm["strategy"] != "inflight" || adm["inflight"].(map[string]any)["limit"] != 4 {
		t.Errorf("admission %v", adm)
	}
	if on["upstream"] != "http://127.0.0.1:3" || on["trust"].(map[string]any)["sources"].([]any)[0] != "127.0.0.0/8" {
		t.Errorf("config %v", on)
	}
	spec.Cohorts, spec.Strategy = "", "none"
	text := fanoutSidecarConfig(spec)
	if strings.Contains(text, "cohorts") || !strings.Contains(text, "strategy: none") {
		t.Errorf("cohorts off, strategy none:\n%s", text)
	}
}

func TestFanoutConfigValidate(t *testing.T) {
	c := DefaultFanoutConfig()
	c.RepoRoot, c.OutDir = "r", "o"
	if err := c.Validate(); err != nil {
		t.Fatalf("the default: %v", err)
	}
	c.Loads = []float64{2, 40}
	c.StepTo = 0
	c.Cohorts = "key: traceparent, secretFile: /x"
	c.Repeats = 0
	err := c.Validate()
	for _, want := range []string{"Loads:", "StepFrom, StepTo:", "Cohorts:", "Repeats:"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
}

// fakeRun is a run whose cohorts-on points meet issue 32's acceptance and whose
// cohorts-off points show the product of the legs' shares.
func fakeRun(t *testing.T) *FanoutResult {
	t.Helper()
	c := DefaultFanoutConfig()
	c.OutDir = t.TempDir()
	c.CommandLine = "go run ./bench/cmd/bench --scenario fanout"
	legs := func(share, wasted float64) []Leg {
		var out []Leg
		for i := range 4 {
			ok := 1000 * share * (1 - wasted)
			out = append(out, Leg{URL: "http://127.0.0.1:" + string(rune('1'+i)) + "/", OK: ok, Wasted: 1000*share - ok, Refused: 1000 * (1 - share)})
		}
		return out
	}
	r := &FanoutResult{Kind: "fanout", Config: c, Started: time.Unix(0, 0), Elapsed: time.Minute}
	for _, l := range c.Loads {
		share := 1 / l * 0.9
		r.Points = append(r.Points,
			FanoutPoint{Kind: KindFanout, Load: l, Repeat: 1, Offered: 1000, Success: int(1000 * math.Pow(share, 4)), Legs: legs(share, 0.8), SuccessP99Ms: 80},
			FanoutPoint{Kind: KindFanout, Load: l, Cohorts: true, Repeat: 1, Offered: 1000, Success: int(1000 * share * 0.9), Legs: legs(share, 0.1), SuccessP99Ms: 70})
	}
	settle := 2.5
	r.Points = append(r.Points,
		FanoutPoint{Kind: KindOverload, Load: 5, Repeat: 1, Goodput: 2850, MeasuredS: 15, AdmittedP99Ms: 40},
		FanoutPoint{Kind: KindOverload, Load: 5, Cohorts: true, Repeat: 1, Goodput: 2800, MeasuredS: 15, AdmittedP99Ms: 45},
		FanoutPoint{Kind: KindUnder, Load: 0.8, Cohorts: true, Repeat: 1, Refusals: 12},
		FanoutPoint{Kind: KindStep, Load: 3, Cohorts: true, Repeat: 1, SettleS: &settle},
		FanoutPoint{Kind: KindCritical, Load: 3, Repeat: 1, CriticalOffered: 1800, CriticalSuccess: 1000},
		FanoutPoint{Kind: KindCritical, Load: 3, Cohorts: true, Repeat: 1, CriticalOffered: 1800, CriticalSuccess: 1790},
	)
	return r
}

func verdicts(r *FanoutResult) map[string]string {
	out := map[string]string{}
	for _, c := range r.Criteria() {
		out[c.Name] = c.verdict()
	}
	return out
}

func TestFanoutCriteria(t *testing.T) {
	r := fakeRun(t)
	v := verdicts(r)
	if len(v) != 3+2+2+1+1+1 {
		t.Fatalf("%d criteria: %v", len(v), v)
	}
	for name, got := range v {
		if got != "PASS" {
			t.Errorf("%s: %s, want PASS", name, got)
		}
	}

	// Break each: cohorts no better than independent sidecars, wasted legs, goodput, p99, a
	// cohort refusal below capacity, no settling, critical traffic lost.
	for i := range r.Points {
		p := &r.Points[i]
		switch {
		case p.Kind == KindFanout && p.Cohorts && p.Load == 2:
			p.Success, p.Legs[0].Wasted, p.Legs[0].OK = 50, p.Legs[0].Admitted(), 0
			for k := range p.Legs {
				p.Legs[k].Wasted, p.Legs[k].OK = p.Legs[k].Admitted(), 0
			}
		case p.Kind == KindOverload && p.Cohorts:
			p.Goodput, p.AdmittedP99Ms = 2000, 90
		case p.Kind == KindUnder:
			p.CohortRefusals = 1
		case p.Kind == KindStep:
			p.SettleS = nil
		case p.Kind == KindCritical && p.Cohorts:
			p.CriticalSuccess = 900
		}
	}
	v = verdicts(r)
	fails := 0
	for name, got := range v {
		if got == "FAIL" {
			fails++
		} else if !strings.HasPrefix(name, "fan-out 1.5x") && !strings.HasPrefix(name, "fan-out 3x") {
			t.Errorf("%s: %s, want FAIL", name, got)
		}
	}
	if fails != 8 {
		t.Errorf("%d failures, want 8: %v", fails, v)
	}

	// Missing or invalid figures are n/a, not a pass.
	for i := range r.Points {
		r.Points[i].Invalid = "late starts"
	}
	for name, got := range verdicts(r) {
		if got != "n/a" {
			t.Errorf("invalid points: %s is %s, want n/a", name, got)
		}
	}
}

func TestFanoutOutputs(t *testing.T) {
	r := fakeRun(t)
	r.Points = append(r.Points, FanoutPoint{Kind: KindFanout, Load: 3, Cohorts: true, Repeat: 2, Err: "loadshed s1 exited early\nlog..."})
	var out strings.Builder
	if err := r.writeOutputs(&out); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(r.Config.OutDir, "report.md"))
	if err != nil || string(md) != out.String() {
		t.Fatalf("report.md: %v", err)
	}
	for _, want := range []string{
		"Command: `go run ./bench/cmd/bench --scenario fanout`",
		"| 2x | on | 0.405 | 0.450 / 0.450 / 0.450 / 0.450 | 0.450 | 0.90 | 0.100 | 70 | 1/1 |",
		"| 3x | on |", "1/2 |",
		"fan-out 2x: end to end with cohorts >= 3 x without | 0.405 vs 3 x 0.041 = 0.123 | PASS |",
		"| under 0.8x (repeat 1) | on | cohort refusals 0, all refusals 12 | true |",
		"fanout 3x cohorts on repeat 2 failed: loadshed s1 exited early",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	csvText, err := os.ReadFile(filepath.Join(r.Config.OutDir, "points.csv"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(csvText)), "\n")
	if len(lines) != 1+len(r.Points) || !strings.HasPrefix(lines[0], "kind,load,cohorts,repeat,valid,") {
		t.Fatalf("points.csv: %d lines\n%s", len(lines), csvText)
	}
	if !strings.Contains(string(csvText), "overload,5,on,1,true,0,0,2800,0,,,,,0,45,0.933333,") {
		t.Errorf("points.csv lacks the overload point's goodput/C:\n%s", csvText)
	}
	if _, err := os.Stat(filepath.Join(r.Config.OutDir, resultFile)); err != nil {
		t.Errorf("raw result: %v", err)
	}
}
