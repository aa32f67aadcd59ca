package criteria

import (
	"fmt"
	"strings"
)

// EnvoyPrefix starts the name of an Envoy row: "envoy/adaptive" is the adaptive strategy in a
// pod whose Envoy calls loadshed as its external processor (issue 13).
const EnvoyPrefix = "envoy/"

// EnvoyStrategy is the strategy of the Envoy row: adaptive, nothing about capacity configured.
const EnvoyStrategy = Adaptive

// JudgeEnvoy judges an Envoy row (Outcome.Strategy "envoy/<strategy>") like Judge judges the
// strategy's HTTP row, and adds what the ext_proc door owes on top, from the Envoy's own
// counters over both runs: every request went through loadshed (an ext_proc stream each), and
// none was answered by Envoy itself at its message timeout or let through unadmitted by
// failure_mode_allow.
func JudgeEnvoy(o Outcome, l Limits) []Check {
	inner := o
	inner.Strategy = strings.TrimPrefix(o.Strategy, EnvoyPrefix)
	cs := Judge(inner, l)
	add := func(name string, ok bool, format string, args ...any) {
		cs = append(cs, Check{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	c := o.EnvoyExtProc
	if c == nil {
		add("Envoy ext_proc counters read", false, "no counters from the pod's Envoy")
		return cs
	}
	var requests int64
	if o.Unloaded != nil && o.Overload != nil {
		requests = o.Unloaded.Requests + o.Overload.Requests
	}
	started, ok := c["streams_started"]
	add("every request asked loadshed (an ext_proc stream each)", ok && requests > 0 && started >= requests,
		"%d ext_proc streams for %d requests", started, requests)
	add("no Envoy message timeouts", c["message_timeouts"] == 0, "message_timeouts %d", c["message_timeouts"])
	add("nothing let through unadmitted (failure_mode_allowed)", c["failure_mode_allowed"] == 0,
		"failure_mode_allowed %d", c["failure_mode_allowed"])
	return cs
}

// EnvoyExtProcCounters picks the ext_proc counters out of Envoy's stats
// ("http.<stat_prefix>.ext_proc.<name>"), by name, summed over listeners.
func EnvoyExtProcCounters(stats map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for name, v := range stats {
		if !strings.HasPrefix(name, "http.") {
			continue
		}
		_, last, ok := strings.Cut(name, ".ext_proc.")
		if !ok || strings.Contains(last, ".") {
			continue
		}
		out[last] += v
	}
	return out
}
