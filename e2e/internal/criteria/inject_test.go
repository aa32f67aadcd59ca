package criteria

import (
	"slices"
	"strings"
	"testing"
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
