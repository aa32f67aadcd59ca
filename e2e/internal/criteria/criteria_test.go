package criteria

import (
	"slices"
	"strings"
	"testing"

	"github.com/loadshed/loadshed/bench/k6summary"
)

func f(v float64) *float64 { return &v }

// unloaded is a clean run at a quarter of capacity with a 24 ms p99.
func unloaded() *k6summary.Summary {
	return &k6summary.Summary{
		Script: "smoke", Valid: true, Requests: 500, OK: 500, Goodput: 500,
		AdmittedMs: k6summary.Latency{P50: f(21), P99: f(24)},
	}
}

// overload is a 3x run of a strategy that keeps goodput and latency; tests spoil one field.
func overload() *k6summary.Summary {
	return &k6summary.Summary{
		Script: "overload", OfferedRPS: 600, DurationS: 30, Valid: true, Requests: 18000, OK: 5400, Goodput: 5390, Shed: 12600,
		ShedByStatus: map[string]int64{"429": 0, "503": 12600}, ShedShare: 0.7,
		RetryAfter: 12600, RetryAfterCoverage: f(1),
		GoodputRPS: 179.7, GoodputRatio: f(0.898),
		AdmittedMs: k6summary.Latency{P50: f(22), P99: f(31)},
	}
}

func fired() Alert { return Alert{Fired: true, FiredAfterS: 12, Resolved: true, ResolvedAfterS: 24} }

func failedNames(cs []Check) string { return strings.Join(Failed(cs), "; ") }

func TestJudgePasses(t *testing.T) {
	for _, strategy := range []string{Inflight, Adaptive, BoundedQueue, CoDel} {
		cs := Judge(Outcome{Strategy: strategy, Unloaded: unloaded(), Overload: overload(), Alert: fired()}, DefaultLimits())
		if len(Failed(cs)) != 0 {
			t.Errorf("%s: failed %s", strategy, failedNames(cs))
		}
	}
	tb := overload()
	tb.ShedByStatus = map[string]int64{"429": 12600, "503": 0}
	if cs := Judge(Outcome{Strategy: TokenBucket, Unloaded: unloaded(), Overload: tb, Alert: fired()}, DefaultLimits()); len(Failed(cs)) != 0 {
		t.Errorf("token bucket: failed %s", failedNames(cs))
	}
	none := &k6summary.Summary{
		Script: "overload", Valid: true, Requests: 18000, OK: 400, Goodput: 60, Timeouts: 17600,
		GoodputRPS: 2, GoodputRatio: f(0.01), AdmittedMs: k6summary.Latency{P50: f(600), P99: f(990)},
	}
	if cs := Judge(Outcome{Strategy: None, Unloaded: unloaded(), Overload: none}, DefaultLimits()); len(Failed(cs)) != 0 {
		t.Errorf("none: failed %s", failedNames(cs))
	}
}

func TestJudgeFails(t *testing.T) {
	cases := []struct {
		name     string
		strategy string
		spoil    func(o *Outcome)
		want     string
		also     string // a second check that must fail with it, if any
	}{
		{"inflight goodput low", Inflight, func(o *Outcome) { o.Overload.GoodputRatio = f(0.79) }, "goodput >= 0.8 of capacity", ""},
		{"adaptive p99 over SLO", Adaptive, func(o *Outcome) { o.Unloaded.AdmittedMs.P99 = f(40); o.Overload.AdmittedMs.P99 = f(101) }, "admitted p99 within the SLO", ""},
		{"inflight p99 over 3x unloaded", Inflight, func(o *Outcome) { o.Overload.AdmittedMs.P99 = f(73) }, "admitted p99 <= 3x unloaded p99", ""},
		{"bounded queue over maxWait + service", BoundedQueue, func(o *Outcome) { o.Overload.AdmittedMs.P99 = f(104.5) }, "admitted p99 within maxWait + service", ""},
		{"bounded queue over maxWait + service under load", BoundedQueue, func(o *Outcome) { o.Overload.AdmittedMs.P99 = f(112) }, "admitted p99 within maxWait + service", ""},
		{"token bucket refuses with 503", TokenBucket, func(o *Outcome) {}, "refusals are 429", ""},
		{"missing Retry-After", CoDel, func(o *Outcome) { o.Overload.RetryAfterCoverage = f(0.99) }, "Retry-After on every refusal", ""},
		{"alert never fired", Inflight, func(o *Outcome) { o.Alert = Alert{} }, "high-shed alert fires during the overload", "high-shed alert resolves after the overload"},
		{"alert never resolved", Inflight, func(o *Outcome) { o.Alert.Resolved = false }, "high-shed alert resolves after the overload", ""},
		{"upstream errors", Adaptive, func(o *Outcome) { o.Overload.Unexpected = 3 }, "no timeouts or errors", ""},
		{"invalid run", Inflight, func(o *Outcome) { o.Overload.Valid, o.Overload.InvalidReason = false, "k6 dropped 5 iterations" }, "overload run valid", ""},
		{"unloaded run shed", Inflight, func(o *Outcome) { o.Unloaded.OK, o.Unloaded.Shed = 499, 1 }, "unloaded: every request 2xx", ""},
		{"nothing shed", BoundedQueue, func(o *Outcome) { o.Overload.Shed = 0; o.Overload.RetryAfterCoverage = nil }, "sheds under overload", "Retry-After on every refusal"},
		{"none keeps goodput", None, func(o *Outcome) { o.Overload.GoodputRatio = f(0.3) }, "goodput collapses", ""},
		{"none within the SLO", None, func(o *Outcome) { o.Overload.AdmittedMs.P99 = f(80) }, "admitted p99 exceeds the SLO", ""},
		{"none alert fired", None, func(o *Outcome) { o.Alert = fired() }, "high-shed alert stays quiet", ""},
		{"none refused", None, func(o *Outcome) { o.Overload.Shed = 3 }, "nothing shed", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := Outcome{Strategy: c.strategy, Unloaded: unloaded(), Overload: overload(), Alert: fired()}
			if c.strategy == None {
				// The baseline: nothing shed, goodput gone, latency at the client timeout.
				o.Alert = Alert{}
				o.Overload.Shed, o.Overload.ShedShare, o.Overload.RetryAfterCoverage = 0, 0, nil
				o.Overload.GoodputRatio, o.Overload.AdmittedMs.P99 = f(0.01), f(990)
			}
			c.spoil(&o)
			want := []string{c.want}
			if c.also != "" {
				want = append(want, c.also)
			}
			l := DefaultLimits()
			if strings.HasSuffix(c.name, "under load") {
				l.ServiceMs = 31 // the in-flight run's p99.9: 80 + 31 = 111 ms
			}
			got := Failed(Judge(o, l))
			if strings.Join(got, "|") != strings.Join(want, "|") {
				t.Fatalf("failed checks %q, want exactly %q", got, want)
			}
		})
	}
}

func TestBoundedQueueServiceUnderLoad(t *testing.T) {
	o := Outcome{Strategy: BoundedQueue, Unloaded: unloaded(), Overload: overload(), Alert: fired()}
	o.Overload.AdmittedMs.P99 = f(110)
	l := DefaultLimits()
	if got := Failed(Judge(o, l)); len(got) != 1 {
		t.Fatalf("with the unloaded p99 (80 + 24 = 104 ms) 110 ms must fail; failed %v", got)
	}
	l.ServiceMs = 31
	if got := Failed(Judge(o, l)); len(got) != 0 {
		t.Fatalf("with the no-queue service time under load (80 + 31 = 111 ms) 110 ms must pass; failed %v", got)
	}
}

// TestLateBaseline: only the unprotected baseline's overload run may be late, and only when it
// still sent nearly every scheduled request.
func TestLateBaseline(t *testing.T) {
	late := func(strategy string, sent int64) Outcome {
		o := Outcome{Strategy: strategy, Unloaded: unloaded(), Overload: overload()}
		if strategy == None {
			o.Overload.Shed, o.Overload.ShedShare, o.Overload.RetryAfterCoverage = 0, 0, nil
			o.Overload.GoodputRatio, o.Overload.AdmittedMs.P99 = f(0.01), f(990)
		} else {
			o.Alert = fired()
		}
		o.Overload.Valid, o.Overload.InvalidReason = false, "iterations started 161 ms late at p99 (limit 100 ms)"
		o.Overload.Requests = sent
		return o
	}
	for _, c := range []struct {
		name string
		o    Outcome
		ok   bool
	}{
		{"baseline late, all sent", late(None, 17748), true},
		{"baseline late, too few sent", late(None, 16000), false},
		{"inflight late, all sent", late(Inflight, 17748), false},
		{"adaptive late, all sent", late(Adaptive, 18000), false},
	} {
		err := Usable(c.o)
		if (err == nil) != c.ok {
			t.Errorf("%s: Usable = %v, want usable %v", c.name, err, c.ok)
		}
		failed := Failed(Judge(c.o, DefaultLimits()))
		if got := slices.Contains(failed, "overload run valid"); got == c.ok {
			t.Errorf("%s: failed checks %q: the validity check must agree with Usable", c.name, failed)
		}
	}
	// An unloaded baseline run gets no such exception.
	o := late(None, 17748)
	o.Unloaded.Valid, o.Unloaded.InvalidReason = false, "k6 dropped 2 iterations"
	if Usable(o) == nil {
		t.Error("a late unloaded run must not be usable, baseline or not")
	}
}

func TestJudgeMissingRun(t *testing.T) {
	cs := Judge(Outcome{Strategy: Inflight, Unloaded: unloaded()}, DefaultLimits())
	if len(cs) != 1 || cs[0].OK || cs[0].Name != "measured" {
		t.Fatalf("checks %+v, want one failed 'measured'", cs)
	}
}

func TestSteadyChecks(t *testing.T) {
	ok := &k6summary.Summary{Script: "overload", Valid: true, Requests: 4000, OK: 4000}
	if got := Failed(SteadyChecks("restart", ok)); len(got) != 0 {
		t.Fatalf("clean run failed %v", got)
	}
	for name, spoil := range map[string]func(s *k6summary.Summary){
		"one shed":    func(s *k6summary.Summary) { s.OK--; s.Shed++ },
		"one timeout": func(s *k6summary.Summary) { s.OK--; s.Timeouts++ },
		"one error":   func(s *k6summary.Summary) { s.OK--; s.Unexpected++ },
		"dropped":     func(s *k6summary.Summary) { s.DroppedIterations = 2 },
		"no requests": func(s *k6summary.Summary) { s.Requests, s.OK = 0, 0 },
	} {
		s := *ok
		spoil(&s)
		if got := Failed(SteadyChecks("restart", &s)); len(got) != 1 || got[0] != "restart: no failed request" {
			t.Errorf("%s: failed %v, want the no-failure check", name, got)
		}
	}
	if got := Failed(SteadyChecks("restart", nil)); len(got) != 1 {
		t.Errorf("nil summary: failed %v", got)
	}
}

func TestRemeasure(t *testing.T) {
	judge := func(strategy string, spoil func(o *Outcome)) []Check {
		o := Outcome{Strategy: strategy, Unloaded: unloaded(), Overload: overload(), Alert: fired()}
		spoil(&o)
		return Judge(o, DefaultLimits())
	}
	cases := []struct {
		name  string
		spoil func(o *Outcome)
		want  []string
	}{
		{"passes", func(*Outcome) {}, nil},
		{"tail over its bounds", func(o *Outcome) { o.Overload.AdmittedMs.P99 = f(101) },
			[]string{"admitted p99 within the SLO", "admitted p99 <= 3x unloaded p99"}},
		{"goodput low", func(o *Outcome) { o.Overload.GoodputRatio = f(0.78) }, []string{"goodput >= 0.8 of capacity"}},
		// A failure the node's timing cannot explain is no reason to measure again, also when
		// timed checks failed with it.
		{"refusals without Retry-After", func(o *Outcome) { o.Overload.RetryAfterCoverage = f(0.9) }, nil},
		{"slow and timeouts", func(o *Outcome) { o.Overload.AdmittedMs.P99 = f(101); o.Overload.Timeouts = 3 }, nil},
		{"alert never fired", func(o *Outcome) { o.Alert = Alert{} }, nil},
	}
	for _, c := range cases {
		// The in-flight row measures a timed miss again.
		if got := Remeasure(judge(Inflight, c.spoil)); !slices.Equal(got, c.want) {
			t.Errorf("inflight, %s: Remeasure = %q, want %q", c.name, got, c.want)
		}
		// An adaptive row is measured once: its misses fail it, and nothing is measured again.
		checks := judge(Adaptive, c.spoil)
		if got := Remeasure(checks); got != nil {
			t.Errorf("adaptive, %s: Remeasure = %q, want nothing", c.name, got)
		}
		if got, want := Failed(checks), Failed(judge(Inflight, c.spoil)); !slices.Equal(got, want) {
			t.Errorf("adaptive, %s: failed %q, the in-flight row %q", c.name, got, want)
		}
	}
	// gRPC and Envoy rows keep Judge's checks: timed for a fixed limit, once for an adaptive one.
	u, s := grpcRuns()
	s.GoodputRatio = f(0.7)
	o := Outcome{Strategy: GRPCPrefix + Inflight, Unloaded: u, Overload: s, Alert: fired()}
	if got := Remeasure(JudgeGRPC(o, DefaultLimits())); !slices.Equal(got, []string{"goodput >= 0.8 of capacity"}) {
		t.Errorf("gRPC in-flight row: Remeasure = %q", got)
	}
	o.Strategy = GRPCPrefix + Adaptive
	if checks := JudgeGRPC(o, DefaultLimits()); Remeasure(checks) != nil || !slices.Contains(Failed(checks), "goodput >= 0.8 of capacity") {
		t.Errorf("gRPC adaptive row: Remeasure = %q, failed %q", Remeasure(checks), Failed(checks))
	}
}

func TestEarlierOf(t *testing.T) {
	o := Outcome{Strategy: Adaptive, Unloaded: unloaded(), Overload: overload(), Limit: &LimitRange{Min: 4, Mean: 5, Max: 7}}
	e := EarlierOf(o, []string{"admitted p99 within the SLO"})
	if *e.AdmittedP99Ms != 31 || *e.UnloadedP99Ms != 24 || *e.GoodputRatio != 0.898 || !slices.Equal(e.Missed, []string{"admitted p99 within the SLO"}) || e.Limit != o.Limit {
		t.Errorf("EarlierOf = %+v", e)
	}
}
