package criteria

import (
	"fmt"
	"strings"

	"github.com/loadshed/loadshed/bench/k6summary"
)

// GRPCPrefix starts the name of a gRPC row: "grpc/inflight" is the in-flight strategy measured
// with gRPC calls (issue 12).
const GRPCPrefix = "grpc/"

// GRPCStrategies are the strategies the e2e also measures with gRPC calls.
var GRPCStrategies = []string{Inflight, Adaptive}

// retryAfterCheck is the name of Judge's check that JudgeGRPC replaces.
const retryAfterCheck = "Retry-After on every refusal"

// JudgeGRPC judges a gRPC row (Outcome.Strategy "grpc/<strategy>") like Judge judges the
// strategy's HTTP row, with the gRPC form of an honest refusal in place of Retry-After: every
// refusal carries grpc-retry-pushback-ms and comes as a trailers-only response. Both runs must
// be gRPC runs (grpc-overload.js).
func JudgeGRPC(o Outcome, l Limits) []Check {
	inner := o
	inner.Strategy = strings.TrimPrefix(o.Strategy, GRPCPrefix)
	var cs []Check
	add := func(name string, ok bool, format string, args ...any) {
		cs = append(cs, Check{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	for _, r := range []*k6summary.Summary{o.Unloaded, o.Overload} {
		if r != nil {
			add(r.Script+" run is gRPC", r.Protocol == "grpc", "protocol %q", r.Protocol)
		}
	}
	for _, c := range Judge(inner, l) {
		if c.Name != retryAfterCheck {
			cs = append(cs, c)
			continue
		}
		s := o.Overload
		cov := k6summary.Value(s.PushbackCoverage)
		add("grpc-retry-pushback-ms on every refusal", cov == 1, "coverage %s (%d of %d refusals)", frac(cov), s.Pushback, s.Shed)
		add("every refusal trailers-only", s.Shed > 0 && s.TrailersOnly == s.Shed, "%d of %d refusals trailers-only", s.TrailersOnly, s.Shed)
	}
	return cs
}
