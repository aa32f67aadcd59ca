package criteria

import (
	"slices"
	"testing"
)

func envoyCounters() map[string]int64 {
	return map[string]int64{"streams_started": 18500, "message_timeouts": 0, "failure_mode_allowed": 0}
}

func TestJudgeEnvoy(t *testing.T) {
	o := Outcome{Strategy: EnvoyPrefix + EnvoyStrategy, Unloaded: unloaded(), Overload: overload(), Alert: fired(), EnvoyExtProc: envoyCounters()}
	cs := JudgeEnvoy(o, DefaultLimits())
	if len(Failed(cs)) != 0 {
		t.Fatalf("failed %s", failedNames(cs))
	}
	var names []string
	for _, c := range cs {
		names = append(names, c.Name)
	}
	// The HTTP row's checks of the strategy apply, Retry-After among them.
	for _, want := range []string{"goodput >= 0.8 of capacity", "admitted p99 within the SLO", retryAfterCheck, "no Envoy message timeouts"} {
		if !slices.Contains(names, want) {
			t.Errorf("no check %q in %q", want, names)
		}
	}

	cases := []struct {
		name  string
		spoil func(o *Outcome)
		want  string
	}{
		{"Envoy timed out", func(o *Outcome) { o.EnvoyExtProc["message_timeouts"] = 3 }, "no Envoy message timeouts"},
		{"failed open", func(o *Outcome) { o.EnvoyExtProc["failure_mode_allowed"] = 1 }, "nothing let through unadmitted (failure_mode_allowed)"},
		{"requests bypassed loadshed", func(o *Outcome) { o.EnvoyExtProc["streams_started"] = 100 }, "every request asked loadshed (an ext_proc stream each)"},
		{"no counters", func(o *Outcome) { o.EnvoyExtProc = nil }, "Envoy ext_proc counters read"},
		{"goodput lost", func(o *Outcome) { o.Overload.GoodputRatio = f(0.5) }, "goodput >= 0.8 of capacity"},
	}
	for _, c := range cases {
		o := Outcome{Strategy: EnvoyPrefix + EnvoyStrategy, Unloaded: unloaded(), Overload: overload(), Alert: fired(), EnvoyExtProc: envoyCounters()}
		c.spoil(&o)
		if failed := Failed(JudgeEnvoy(o, DefaultLimits())); !slices.Contains(failed, c.want) {
			t.Errorf("%s: failed %q, want %q among them", c.name, failed, c.want)
		}
	}
}

func TestEnvoyExtProcCounters(t *testing.T) {
	got := EnvoyExtProcCounters(map[string]int64{
		"http.ingress.ext_proc.streams_started":            7,
		"http.ingress.ext_proc.message_timeouts":           1,
		"http.admin.ext_proc.streams_started":              2,
		"cluster.loadshed.upstream_rq_total":               9,
		"http.ingress.ext_proc.some.nested.stat":           5,
		"cluster.ext_proc.streams_started":                 4,
		"http.ingress.downstream_rq_total":                 3,
		"http.ingress.ext_proc.failure_mode_allowed":       0,
		"http.ingress.ext_proc.override_message_timeout_r": 0,
	})
	want := map[string]int64{"streams_started": 9, "message_timeouts": 1, "failure_mode_allowed": 0, "override_message_timeout_r": 0}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d", k, got[k], v)
		}
	}
}
