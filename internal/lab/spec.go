package lab

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/loadgen"
	"github.com/loadshed/loadshed/internal/slowtail"
	"github.com/loadshed/loadshed/pkg/admission"
	"go.yaml.in/yaml/v3"
)

// A strategy spec is an admission block in the proxy config's own language, as it stands under
// "admission:" in the file, decoded by the same strict decoder and built by the same code
// (config.ParseAdmission, config.Admission.Build):
//
//	{strategy: inflight, inflight: {limit: 8}}
//	{strategy: bounded-queue, boundedQueue: {concurrency: 8, depth: 32, maxWait: 80ms}}
//	{strategy: adaptive, adaptive: {algorithm: vegas}}
//	{strategy: chain, chain: [{tokenBucket: {rate: 300, burst: 30}}, {inflight: {limit: 8}}]}
//
// A bare strategy name stands for {strategy: NAME}: the strategy with the config's own defaults,
// which only the strategies that need no capacity have (none, adaptive, codel).

// ParseStrategy parses one strategy spec. Its Name is the strategy, or the strategies of a
// chain's stages joined with "+".
func ParseStrategy(spec string) (Strategy, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return Strategy{}, fmt.Errorf("strategy: empty spec (want a strategy name or an admission block such as {strategy: inflight, inflight: {limit: 8}})")
	}
	text := spec
	if !strings.ContainsAny(spec, ":{ \n") {
		if _, ok := config.Lookup(spec); !ok {
			return Strategy{}, fmt.Errorf("strategy %q: unknown strategy (want one of %s, or an admission block such as {strategy: inflight, inflight: {limit: 8}})",
				spec, strings.Join(config.Strategies, ", "))
		}
		text = "strategy: " + spec
	}
	a, err := config.ParseAdmission([]byte(text))
	if err != nil {
		return Strategy{}, fmt.Errorf("strategy %q: %w", spec, err)
	}
	return FromAdmission(*a, spec), nil
}

// FromAdmission is the strategy an admission block describes, named by its strategy (a chain
// by its stages); spec describes it in reports. A dry-run block admits everything, as the proxy
// does with it.
func FromAdmission(a config.Admission, spec string) Strategy {
	name := a.Strategy
	if a.Strategy == config.StrategyChain {
		var kinds []string
		for i := range a.Chain {
			if b := a.Chain[i].Block(); b != nil {
				kinds = append(kinds, config.KindOf(b).Name)
			}
		}
		name = strings.Join(kinds, "+")
	}
	if a.DryRun {
		name += " dry run"
	}
	return Strategy{Name: name, Spec: spec, Admission: &a, New: func() (admission.Core, error) {
		if a.DryRun {
			return admission.NewNone(), nil
		}
		return a.Build()
	}}
}

// ParseStrategies parses several specs. Strategies whose names clash are named by their full
// spec instead, so every row of a report is distinct.
func ParseStrategies(specs []string) ([]Strategy, error) {
	out := make([]Strategy, 0, len(specs))
	count := map[string]int{}
	for _, sp := range specs {
		st, err := ParseStrategy(sp)
		if err != nil {
			return nil, err
		}
		count[st.Name]++
		out = append(out, st)
	}
	seen := map[string]bool{}
	for i := range out {
		if count[out[i].Name] > 1 {
			out[i].Name = out[i].Spec
		}
		if seen[out[i].Name] {
			return nil, fmt.Errorf("strategy %q given twice", out[i].Spec)
		}
		seen[out[i].Name] = true
	}
	return out, nil
}

// ScenarioSLO is the latency objective the scenario sizing assumes when a scenario sets none.
const ScenarioSLO = 100 * time.Millisecond

// ScenarioStrategies returns the named strategies sized for the scenario's own backend, the way
// an operator who knows it would configure them (config.Sized: Little's law from the scenario's
// servers, mean service time and SLO, ScenarioSLO when it has none). These are the scenario's
// sizing, not defaults of the strategies: without a server count there is nothing to size from.
func ScenarioStrategies(sc Scenario, names []string) ([]Strategy, error) {
	capacity := Capacity(sc)
	if !(capacity > 0) {
		return nil, fmt.Errorf("capacity unknown: strategies sized for the scenario need its servers; give --servers or a --strategy")
	}
	slo := sc.SLO
	if slo == 0 {
		slo = ScenarioSLO
	}
	b := config.Backend{Workers: sc.Servers, Service: time.Duration(float64(sc.Servers) / capacity * float64(time.Second)), SLO: slo}
	out := make([]Strategy, 0, len(names))
	for _, n := range names {
		k, ok := config.Lookup(n)
		if !ok {
			return nil, fmt.Errorf("strategy %q: unknown (want one of %s)", n, strings.Join(config.Strategies, ", "))
		}
		a := config.Sized(k, b)
		y, err := yaml.Marshal(a)
		if err != nil {
			return nil, err
		}
		st := FromAdmission(a, strings.TrimSpace(string(y)))
		st.Name = n
		out = append(out, st)
	}
	return out, nil
}

// ParseService parses a service-time spec:
//
//	constant:10ms
//	exponential:20ms          (exponential with that mean, capped at slowtail.MaxDuration)
//	slowtail                  (slowtail.DefaultConfig: mean 20ms, stddev 5ms, 1% tail ~300ms)
//	slowtail:mean=20ms,stddev=5ms,tailProb=0.01,tailMean=300ms,tailMin=100ms,tailMax=2s,fanout=5
func ParseService(spec string) (slowtail.Config, error) {
	kind, args, _ := strings.Cut(strings.TrimSpace(spec), ":")
	var c slowtail.Config
	switch kind {
	case "constant", "exponential":
		if !strings.Contains(args, "=") {
			args = "mean=" + args
		}
		kv, err := parseKV(args, []string{"mean"})
		if err != nil {
			return c, fmt.Errorf("service %q: %w", spec, err)
		}
		if _, ok := kv["mean"]; !ok {
			return c, fmt.Errorf("service %q: mean: required (for example %s:20ms)", spec, kind)
		}
		d, err := durKey(kv, "mean")
		if err != nil {
			return c, fmt.Errorf("service %q: %w", spec, err)
		}
		c = slowtail.Constant(d)
		if kind == "exponential" {
			c = slowtail.Config{TailProb: 1, TailMean: d, TailMax: slowtail.MaxDuration, Fanout: 1}
		}
	case "slowtail":
		kv, err := parseKV(args, []string{"mean", "stddev", "tailProb", "tailMean", "tailMin", "tailMax", "fanout"})
		if err != nil {
			return c, fmt.Errorf("service %q: %w", spec, err)
		}
		c = slowtail.DefaultConfig()
		durs := map[string]*time.Duration{"mean": &c.Mean, "stddev": &c.Stddev, "tailMean": &c.TailMean, "tailMin": &c.TailMin, "tailMax": &c.TailMax}
		for key, dst := range durs {
			if _, ok := kv[key]; ok {
				if *dst, err = durKey(kv, key); err != nil {
					return c, fmt.Errorf("service %q: %w", spec, err)
				}
			}
		}
		if _, ok := kv["tailProb"]; ok {
			if c.TailProb, err = floatKey(kv, "tailProb"); err != nil {
				return c, fmt.Errorf("service %q: %w", spec, err)
			}
		}
		if _, ok := kv["fanout"]; ok {
			if c.Fanout, err = intKey(kv, "fanout"); err != nil {
				return c, fmt.Errorf("service %q: %w", spec, err)
			}
		}
	default:
		return c, fmt.Errorf("service %q: unknown kind %q (want constant, exponential or slowtail)", spec, kind)
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("service %q: %w", spec, err)
	}
	return c, nil
}

// ParseArrivals parses an arrival spec; generated processes offer requests for duration:
//
//	constant:rate=200                    evenly spaced
//	poisson:rate=200                     Poisson
//	ramp:from=50,to=400[,steps=50]       rate rising linearly (in steps) over the duration
//	spike:base=100,peak=1000,at=2s,for=500ms
//	trace:FILE                           recorded arrivals (see ReadTrace)
//
// ramp and spike take poisson=true for Poisson arrivals at the same rates.
func ParseArrivals(spec string, duration time.Duration) (Arrivals, error) {
	kind, args, _ := strings.Cut(strings.TrimSpace(spec), ":")
	if kind == "trace" {
		if args == "" {
			return nil, fmt.Errorf("arrivals %q: trace needs a file (trace:FILE)", spec)
		}
		f, err := os.Open(args)
		if err != nil {
			return nil, fmt.Errorf("arrivals %q: %w", spec, err)
		}
		defer f.Close()
		recs, err := ReadTrace(f)
		if err != nil {
			return nil, fmt.Errorf("arrivals %q: %w", spec, err)
		}
		return TraceArrivals{Records: recs, Name: filepath.Base(args)}, nil
	}
	if duration <= 0 {
		return nil, fmt.Errorf("arrivals %q: duration must be positive, got %s", spec, duration)
	}
	var keys []string
	switch kind {
	case "constant", "poisson":
		keys = []string{"rate"}
		if args != "" && !strings.Contains(args, "=") {
			args = "rate=" + args
		}
	case "ramp":
		keys = []string{"from", "to", "steps", "poisson"}
	case "spike":
		keys = []string{"base", "peak", "at", "for", "poisson"}
	default:
		return nil, fmt.Errorf("arrivals %q: unknown kind %q (want constant, poisson, ramp, spike or trace)", spec, kind)
	}
	kv, err := parseKV(args, keys)
	if err != nil {
		return nil, fmt.Errorf("arrivals %q: %w", spec, err)
	}
	for _, k := range keys {
		if _, ok := kv[k]; !ok && k != "steps" && k != "poisson" {
			return nil, fmt.Errorf("arrivals %q: %s: required", spec, k)
		}
	}
	fail := func(err error) (Arrivals, error) { return nil, fmt.Errorf("arrivals %q: %w", spec, err) }
	rate := func(key string) (float64, error) {
		r, err := floatKey(kv, key)
		if err == nil && (r < 0 || math.IsInf(r, 0)) {
			err = fmt.Errorf("%s: must be a finite rate >= 0, got %v", key, r)
		}
		return r, err
	}
	poisson := kind == "poisson"
	if v, ok := kv["poisson"]; ok {
		if poisson, err = strconv.ParseBool(v); err != nil {
			return fail(fmt.Errorf("poisson: %q is not true or false", v))
		}
	}
	var sched loadgen.Schedule
	switch kind {
	case "constant", "poisson":
		r, err := rate("rate")
		if err != nil {
			return fail(err)
		}
		sched = loadgen.ConstantRate(r, duration)
	case "ramp":
		from, err := rate("from")
		if err != nil {
			return fail(err)
		}
		to, err := rate("to")
		if err != nil {
			return fail(err)
		}
		steps := int(min(max(duration/(100*time.Millisecond), 10), 1000))
		if _, ok := kv["steps"]; ok {
			if steps, err = intKey(kv, "steps"); err != nil {
				return fail(err)
			}
			if steps < 1 || steps > 10000 {
				return fail(fmt.Errorf("steps: must be in [1, 10000], got %d", steps))
			}
		}
		sched = Ramp(from, to, duration, steps)
	case "spike":
		base, err := rate("base")
		if err != nil {
			return fail(err)
		}
		peak, err := rate("peak")
		if err != nil {
			return fail(err)
		}
		at, err := durKey(kv, "at")
		if err != nil {
			return fail(err)
		}
		dur, err := durKey(kv, "for")
		if err != nil {
			return fail(err)
		}
		if at < 0 || dur <= 0 || at+dur > duration {
			return fail(fmt.Errorf("at, for: the spike [%s, %s) must lie within the duration %s", at, at+dur, duration))
		}
		var phases []loadgen.Phase
		if at > 0 {
			phases = append(phases, loadgen.Phase{Rate: base, Duration: at})
		}
		phases = append(phases, loadgen.Phase{Rate: peak, Duration: dur})
		if rest := duration - at - dur; rest > 0 {
			phases = append(phases, loadgen.Phase{Rate: base, Duration: rest})
		}
		sched = loadgen.Phases(phases...)
	}
	if poisson {
		sched = sched.WithPoisson(0)
	}
	if err := sched.Validate(); err != nil {
		return fail(err)
	}
	return ScheduleArrivals{Schedule: sched, Priority: admission.Critical, Label: spec + " for " + duration.String()}, nil
}

// Ramp returns evenly spaced arrivals whose rate rises linearly from `from` to `to` over d, as
// steps phases of constant rate, each at the ramp's rate at its midpoint (so the expected count
// equals the linear ramp's).
func Ramp(from, to float64, d time.Duration, steps int) loadgen.Schedule {
	steps = max(steps, 1)
	phases := make([]loadgen.Phase, 0, steps)
	var done time.Duration
	for i := 0; i < steps; i++ {
		end := time.Duration(int64(d) * int64(i+1) / int64(steps))
		mid := (float64(i) + 0.5) / float64(steps)
		phases = append(phases, loadgen.Phase{Rate: from + (to-from)*mid, Duration: end - done})
		done = end
	}
	return loadgen.Phases(phases...)
}

// parseKV parses "k=v,k=v" and rejects keys not in allowed (naming the allowed ones).
func parseKV(s string, allowed []string) (map[string]string, error) {
	kv := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return kv, nil
	}
	for _, item := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q: want key=value", item)
		}
		if !slices.Contains(allowed, k) {
			if len(allowed) == 0 {
				return nil, fmt.Errorf("%s: unknown key (this kind takes none)", k)
			}
			return nil, fmt.Errorf("%s: unknown key (want %s)", k, strings.Join(allowed, ", "))
		}
		if _, dup := kv[k]; dup {
			return nil, fmt.Errorf("%s: given twice", k)
		}
		kv[k] = strings.TrimSpace(v)
	}
	return kv, nil
}

func floatKey(kv map[string]string, k string) (float64, error) {
	v, err := strconv.ParseFloat(kv[k], 64)
	if err != nil || math.IsNaN(v) {
		return 0, fmt.Errorf("%s: %q is not a number", k, kv[k])
	}
	return v, nil
}

func intKey(kv map[string]string, k string) (int, error) {
	v, err := strconv.Atoi(kv[k])
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not an integer", k, kv[k])
	}
	return v, nil
}

func durKey(kv map[string]string, k string) (time.Duration, error) {
	v, err := time.ParseDuration(kv[k])
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a duration (like 80ms)", k, kv[k])
	}
	return v, nil
}
