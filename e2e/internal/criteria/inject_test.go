package criteria

import (
	"slices"
	"strings"
	"testing"

	"github.com/loadshed/loadshed/bench/k6summary"
)

func TestJudgeInjected(t *testing.T) {
	// No alert was watched: an injected workload is judged without it.
	o := Outcome{Strategy: InjectPrefix + "webhook", Unloaded: unloaded(), Overload: overload()}
	cs := JudgeInjected(o, DefaultLimits())
	if failed := Failed(cs); len(failed) != 0 {
		t.Fatalf("failed %q", failed)
	}
	var names []string
	for _, c := range cs {
		names = append(names, c.Name)
		if strings.Contains(c.Name, "alert") {
			t.Errorf("check %q: an injection row watches no alert", c.Name)
		}
	}
	for _, want := range []string{"sheds under overload", retryAfterCheck, "goodput >= 0.8 of capacity", "admitted p99 within the SLO"} {
		if !slices.Contains(names, want) {
			t.Errorf("no check %q in %q", want, names)
		}
	}
	cases := []struct {
		name  string
		spoil func(o *Outcome)
		want  string
	}{
		{"goodput lost", func(o *Outcome) { o.Overload.GoodputRatio = f(0.5) }, "goodput >= 0.8 of capacity"},
		{"slow", func(o *Outcome) { o.Overload.AdmittedMs.P99 = f(180) }, "admitted p99 within the SLO"},
		{"nothing shed", func(o *Outcome) { o.Overload.Shed = 0 }, "sheds under overload"},
	}
	for _, c := range cases {
		o := Outcome{Strategy: InjectPrefix + "cli", Unloaded: unloaded(), Overload: overload()}
		c.spoil(&o)
		if failed := Failed(JudgeInjected(o, DefaultLimits())); !slices.Contains(failed, c.want) {
			t.Errorf("%s: failed %q, want %q among them", c.name, failed, c.want)
		}
	}
}

func TestInjectedSteadyChecks(t *testing.T) {
	one := 1.0
	ok := &k6summary.Summary{Script: "overload", Valid: true, Requests: 4000, OK: 4000}
	if got := Failed(InjectedSteadyChecks("restart", ok)); len(got) != 0 {
		t.Fatalf("clean run failed %v", got)
	}
	// One honest refusal in 4000 (the adaptive limit's warm start) passes.
	s := *ok
	s.OK, s.Shed, s.RetryAfterCoverage = 3999, 1, &one
	if got := Failed(InjectedSteadyChecks("restart", &s)); len(got) != 0 {
		t.Fatalf("one refusal with Retry-After failed %v", got)
	}
	for name, c := range map[string]struct {
		spoil func(s *k6summary.Summary)
		want  string
	}{
		"a timeout":                 {func(s *k6summary.Summary) { s.OK--; s.Timeouts++ }, "restart: nothing lost to the replacement"},
		"an error":                  {func(s *k6summary.Summary) { s.OK--; s.Unexpected++ }, "restart: nothing lost to the replacement"},
		"dropped":                   {func(s *k6summary.Summary) { s.DroppedIterations = 2 }, "restart: nothing lost to the replacement"},
		"refusals beyond the bound": {func(s *k6summary.Summary) { s.OK -= 30; s.Shed += 30; s.RetryAfterCoverage = &one }, "restart: refusals rare, with Retry-After"},
		"a refusal without Retry-After": {func(s *k6summary.Summary) {
			zero := 0.0
			s.OK--
			s.Shed++
			s.RetryAfterCoverage = &zero
		}, "restart: refusals rare, with Retry-After"},
	} {
		s := *ok
		c.spoil(&s)
		if got := Failed(InjectedSteadyChecks("restart", &s)); !slices.Contains(got, c.want) {
			t.Errorf("%s: failed %v, want %q among them", name, got, c.want)
		}
	}
}
