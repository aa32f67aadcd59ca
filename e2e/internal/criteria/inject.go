package criteria

import (
	"fmt"
	"strings"

	"github.com/loadshed/loadshed/bench/k6summary"
)

// InjectPrefix starts the name of an injection row (issue 14): "inject/webhook" is a plain
// workload that the injector's webhook gave the sidecar, "inject/cli" one piped through
// `inject` into `kubectl apply`. Both get the generated configuration: strategy adaptive,
// nothing about capacity configured.
const InjectPrefix = "inject/"

// JudgeInjected judges an injection row like the adaptive HTTP row (sheds with Retry-After,
// no timeouts, goodput and admitted p99 within the limits) except for the high-shed alert: the
// e2e's Prometheus scrapes the chart's releases by their headless metrics Services, which an
// injected workload does not have. The caller adds what the injection owes on top (the sidecar
// is there, the Service reaches it).
func JudgeInjected(o Outcome, l Limits) []Check {
	inner := o
	inner.Strategy = Adaptive
	var out []Check
	for _, c := range Judge(inner, l) {
		if !strings.HasPrefix(c.Name, "high-shed alert") {
			out = append(out, c)
		}
	}
	return out
}

// MaxWarmStartShed bounds the share of requests an injected (adaptive) sidecar may refuse under
// steady load at half the capacity while its pods are replaced. A new pod starts at the adaptive
// default's warm limit (4, a 10 s slow start), and a burst there, on a node busy starting it, is
// refused honestly (503 with Retry-After): 0, 0, 1 and 4 of about 4000 requests in four runs.
const MaxWarmStartShed = 0.005

// InjectedSteadyChecks judges a steady run across a replacement of injected pods: nothing may be
// lost to the replacement (no timeout, error or dropped iteration: every request answered 2xx or
// refused), and refusals, the adaptive limit's warm start, must be rare and carry Retry-After.
// The chart's steady rows keep SteadyChecks (no refusal at all): they run strategies that admit
// everything at half the capacity.
func InjectedSteadyChecks(name string, s *k6summary.Summary) []Check {
	checks := steadyRun(name, s)
	if s == nil {
		return checks
	}
	cov := k6summary.Value(s.RetryAfterCoverage)
	return append(checks, []Check{
		{Name: name + ": nothing lost to the replacement", OK: s.Requests > 0 && s.OK+s.Shed == s.Requests && s.Timeouts == 0 && s.Unexpected == 0 && s.DroppedIterations == 0,
			Detail: fmt.Sprintf("%d requests, %d 2xx, %d refused, timeouts %d, other %s, %d dropped iterations",
				s.Requests, s.OK, s.Shed, s.Timeouts, s.UnexpectedDetail(), s.DroppedIterations)},
		{Name: name + ": refusals rare, with Retry-After", OK: float64(s.Shed) <= MaxWarmStartShed*float64(s.Requests) && (s.Shed == 0 || cov == 1),
			Detail: fmt.Sprintf("%d refused of %d (at most %g), Retry-After on %s", s.Shed, s.Requests, MaxWarmStartShed, frac(cov))},
	}...)
}
