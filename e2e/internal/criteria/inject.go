package criteria

import "strings"

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
