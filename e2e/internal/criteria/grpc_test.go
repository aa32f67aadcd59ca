package criteria

import (
	"slices"
	"strings"
	"testing"

	"github.com/loadshed/loadshed/bench/k6summary"
)

// grpcRuns are an unloaded and a 3x gRPC run that keep goodput and latency, at C = 100 calls/s.
func grpcRuns() (u, s *k6summary.Summary) {
	u = unloaded()
	u.Script, u.Protocol = "grpc-overload", "grpc"
	s = &k6summary.Summary{
		Script: "grpc-overload", Protocol: "grpc", OfferedRPS: 300, DurationS: 30, Valid: true, Requests: 9000, OK: 2700, Goodput: 2690,
		Shed: 6300, ShedByStatus: map[string]int64{}, ShedByGRPCStatus: map[string]int64{"UNAVAILABLE": 6300}, ShedShare: 0.7,
		Pushback: 6300, PushbackCoverage: f(1), TrailersOnly: 6300,
		GoodputRPS: 89.7, GoodputRatio: f(0.897), AdmittedMs: k6summary.Latency{P50: f(22), P99: f(31)},
	}
	return u, s
}

func TestJudgeGRPC(t *testing.T) {
	for _, strategy := range GRPCStrategies {
		u, s := grpcRuns()
		cs := JudgeGRPC(Outcome{Strategy: GRPCPrefix + strategy, Unloaded: u, Overload: s, Alert: fired()}, DefaultLimits())
		if len(Failed(cs)) != 0 {
			t.Errorf("%s: failed %s", strategy, failedNames(cs))
		}
		var names []string
		for _, c := range cs {
			names = append(names, c.Name)
		}
		// The strategy's own checks apply (goodput, p99), Retry-After does not.
		for _, want := range []string{"goodput >= 0.8 of capacity", "admitted p99 within the SLO", "grpc-retry-pushback-ms on every refusal", "every refusal trailers-only"} {
			if !slices.Contains(names, want) {
				t.Errorf("%s: no check %q in %q", strategy, want, names)
			}
		}
		if slices.Contains(names, retryAfterCheck) {
			t.Errorf("%s: Retry-After judged in a gRPC row", strategy)
		}
	}
	// JudgeGRPC replaces Judge's check by its name: the name must still be Judge's.
	var judged []string
	for _, c := range Judge(Outcome{Strategy: Inflight, Unloaded: unloaded(), Overload: overload(), Alert: fired()}, DefaultLimits()) {
		judged = append(judged, c.Name)
	}
	if !slices.Contains(judged, retryAfterCheck) {
		t.Fatalf("Judge has no check %q any more: %q", retryAfterCheck, judged)
	}

	cases := []struct {
		name  string
		spoil func(u, s *k6summary.Summary)
		want  string
	}{
		{"no pushback", func(_, s *k6summary.Summary) { s.Pushback, s.PushbackCoverage = 6000, f(0.952) }, "grpc-retry-pushback-ms on every refusal"},
		{"headers before the status", func(_, s *k6summary.Summary) { s.TrailersOnly = 10 }, "every refusal trailers-only"},
		{"an HTTP run", func(u, _ *k6summary.Summary) { u.Protocol = "" }, "grpc-overload run is gRPC"},
		{"goodput lost", func(_, s *k6summary.Summary) { s.GoodputRatio = f(0.5) }, "goodput >= 0.8 of capacity"},
		{"upstream errors", func(_, s *k6summary.Summary) { s.Unexpected = 5 }, "no timeouts or errors"},
	}
	for _, tc := range cases {
		u, s := grpcRuns()
		tc.spoil(u, s)
		cs := JudgeGRPC(Outcome{Strategy: GRPCPrefix + Inflight, Unloaded: u, Overload: s, Alert: fired()}, DefaultLimits())
		if got := failedNames(cs); !strings.Contains(got, tc.want) {
			t.Errorf("%s: failed %q, want %q among them", tc.name, got, tc.want)
		}
	}
}
