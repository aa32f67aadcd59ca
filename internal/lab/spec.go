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
)

// Strategy specs name a strategy and its settings in one flag value, with the field names of
// the proxy's YAML config:
//
//	none
//	inflight:limit=8
//	token-bucket:rate=400,burst=32
//	leaky-bucket:rate=400,depth=25
//	bounded-queue:concurrency=8,depth=32,maxWait=80ms
//	adaptive:algorithm=gradient2,initialLimit=4,minLimit=1,maxLimit=256,slowStart=10s,depth=0,maxWait=50ms
//	codel:concurrency=8,target=5ms,interval=100ms,depth=128,maxWait=100ms
//	token-bucket:rate=400,burst=32+bounded-queue:concurrency=8,depth=32   (a chain)
//
// Settings left out take the proxy config's defaults. The camelCase block names of the config
// file (tokenBucket, leakyBucket, boundedQueue) are accepted too.

// stageKind describes one strategy kind a spec can name.
type stageKind struct {
	name     string
	keys     []string
	defaults map[string]string
	build    func(kv map[string]string) (func() (admission.Core, error), error)
}

var stageKinds = []stageKind{
	{
		name: "token-bucket", keys: []string{"rate", "burst"},
		defaults: map[string]string{"rate": "400", "burst": "32"},
		build: func(kv map[string]string) (func() (admission.Core, error), error) {
			var c admission.TokenBucketConfig
			var err error
			if c.Rate, err = floatKey(kv, "rate"); err != nil {
				return nil, err
			}
			if c.Burst, err = intKey(kv, "burst"); err != nil {
				return nil, err
			}
			return func() (admission.Core, error) { return admission.NewTokenBucket(c) }, c.Validate()
		},
	},
	{
		name: "leaky-bucket", keys: []string{"rate", "depth"},
		defaults: map[string]string{"rate": "400", "depth": "25"},
		build: func(kv map[string]string) (func() (admission.Core, error), error) {
			var c admission.LeakyBucketConfig
			var err error
			if c.Rate, err = floatKey(kv, "rate"); err != nil {
				return nil, err
			}
			d, err := intKey(kv, "depth")
			if err != nil {
				return nil, err
			}
			c.Depth = int64(d)
			return func() (admission.Core, error) { return admission.NewLeakyBucket(c) }, c.Validate()
		},
	},
	{
		name: "bounded-queue", keys: []string{"concurrency", "depth", "maxWait"},
		defaults: map[string]string{"concurrency": "8", "depth": "32", "maxWait": "80ms"},
		build: func(kv map[string]string) (func() (admission.Core, error), error) {
			var c admission.BoundedQueueConfig
			n, err := intKey(kv, "concurrency")
			if err != nil {
				return nil, err
			}
			d, err := intKey(kv, "depth")
			if err != nil {
				return nil, err
			}
			c.Concurrency, c.Depth = int64(n), int64(d)
			if c.MaxWait, err = durKey(kv, "maxWait"); err != nil {
				return nil, err
			}
			return func() (admission.Core, error) { return admission.NewBoundedQueue(c) }, c.Validate()
		},
	},
	{
		name: "inflight", keys: []string{"limit"},
		defaults: map[string]string{"limit": "8"},
		build: func(kv map[string]string) (func() (admission.Core, error), error) {
			n, err := intKey(kv, "limit")
			if err != nil {
				return nil, err
			}
			c := admission.InflightConfig{Limit: int64(n)}
			return func() (admission.Core, error) { return admission.NewInflight(c) }, c.Validate()
		},
	},
	{
		// The latency-driven limit, built by the proxy's own config code so that defaults and
		// the algorithm's tuning are the proxy's.
		name: "adaptive", keys: []string{"algorithm", "initialLimit", "minLimit", "maxLimit", "slowStart", "window", "depth", "maxWait"},
		build: func(kv map[string]string) (func() (admission.Core, error), error) {
			a := config.DefaultAdaptive()
			if err := setAdaptive(&a, kv); err != nil {
				return nil, err
			}
			adm := config.Admission{Strategy: config.StrategyAdaptive, Adaptive: a}
			_, err := adm.Build()
			return adm.Build, err
		},
	},
	{
		// The controlled-delay queue; concurrency 0 puts the default adaptive limit in front.
		name: "codel", keys: []string{"concurrency", "target", "interval", "depth", "maxWait"},
		build: func(kv map[string]string) (func() (admission.Core, error), error) {
			c := config.DefaultCoDel()
			var err error
			for key, dst := range map[string]*config.Duration{"target": &c.Target, "interval": &c.Interval, "maxWait": &c.MaxWait} {
				if _, ok := kv[key]; ok {
					d, err := durKey(kv, key)
					if err != nil {
						return nil, err
					}
					*dst = config.Duration(d)
				}
			}
			for key, dst := range map[string]*int64{"concurrency": &c.Concurrency, "depth": &c.Depth} {
				if _, ok := kv[key]; ok {
					n, err := intKey(kv, key)
					if err != nil {
						return nil, err
					}
					*dst = int64(n)
				}
			}
			adm := config.Admission{Strategy: config.StrategyCoDel, CoDel: c, Adaptive: config.DefaultAdaptive()}
			_, err = adm.Build()
			return adm.Build, err
		},
	},
	{
		name: "none",
		build: func(map[string]string) (func() (admission.Core, error), error) {
			return func() (admission.Core, error) { return NewPassThrough(), nil }, nil
		},
	},
}

var kindAliases = map[string]string{
	"tokenBucket": "token-bucket", "leakyBucket": "leaky-bucket", "boundedQueue": "bounded-queue",
	"token_bucket": "token-bucket", "leaky_bucket": "leaky-bucket", "bounded_queue": "bounded-queue",
}

func findKind(name string) (*stageKind, bool) {
	if a, ok := kindAliases[name]; ok {
		name = a
	}
	for i := range stageKinds {
		if stageKinds[i].name == name {
			return &stageKinds[i], true
		}
	}
	return nil, false
}

func kindNames() string {
	names := make([]string, len(stageKinds))
	for i, k := range stageKinds {
		names[i] = k.name
	}
	return strings.Join(names, ", ")
}

// ParseStrategy parses one strategy spec (see the grammar above). Its Name is the strategy's
// kind, or the kinds of a chain joined with "+".
func ParseStrategy(spec string) (Strategy, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return Strategy{}, fmt.Errorf("strategy: empty spec (want one of %s)", kindNames())
	}
	parts := strings.Split(spec, "+")
	builders := make([]func() (admission.Core, error), 0, len(parts))
	names := make([]string, 0, len(parts))
	for _, part := range parts {
		kindName, args, _ := strings.Cut(strings.TrimSpace(part), ":")
		k, ok := findKind(kindName)
		if !ok {
			return Strategy{}, fmt.Errorf("strategy %q: unknown kind %q (want one of %s)", spec, kindName, kindNames())
		}
		if k.name == "none" && len(parts) > 1 {
			return Strategy{}, fmt.Errorf("strategy %q: none cannot be a stage of a chain", spec)
		}
		kv, err := parseKV(args, k.keys)
		if err != nil {
			return Strategy{}, fmt.Errorf("strategy %q: %s: %w", spec, k.name, err)
		}
		for key, v := range k.defaults {
			if _, set := kv[key]; !set {
				kv[key] = v
			}
		}
		b, err := k.build(kv)
		if err != nil {
			return Strategy{}, fmt.Errorf("strategy %q: %s: %w", spec, k.name, err)
		}
		builders = append(builders, b)
		names = append(names, k.name)
	}
	st := Strategy{Name: strings.Join(names, "+"), Spec: spec}
	if len(builders) == 1 {
		st.New = builders[0]
		return st, nil
	}
	st.New = func() (admission.Core, error) {
		stages := make([]admission.Core, len(builders))
		for i, b := range builders {
			c, err := b()
			if err != nil {
				return nil, err
			}
			stages[i] = c
		}
		return admission.NewChain(stages...)
	}
	return st, nil
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

// DefaultStrategies are the proxy config's default settings of every strategy, plus none.
func DefaultStrategies() []Strategy {
	specs := []string{"none", "token-bucket", "leaky-bucket", "bounded-queue", "inflight"}
	out, err := ParseStrategies(specs)
	if err != nil {
		// The specs are constants of this package; a failure is a programming error caught
		// by the tests, so report it as a strategy that cannot be built.
		return []Strategy{{Name: "invalid", New: func() (admission.Core, error) { return nil, err }}}
	}
	return out
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

// setAdaptive applies the settings of an adaptive spec to a.
func setAdaptive(a *config.Adaptive, kv map[string]string) error {
	if v, ok := kv["algorithm"]; ok {
		a.Algorithm = v
	}
	for key, dst := range map[string]*float64{"initialLimit": &a.InitialLimit, "minLimit": &a.MinLimit, "maxLimit": &a.MaxLimit} {
		if _, ok := kv[key]; ok {
			v, err := floatKey(kv, key)
			if err != nil {
				return err
			}
			*dst = v
		}
	}
	for key, dst := range map[string]*config.Duration{"slowStart": &a.SlowStart, "window": &a.Window, "maxWait": &a.Queue.MaxWait} {
		if _, ok := kv[key]; ok {
			d, err := durKey(kv, key)
			if err != nil {
				return err
			}
			*dst = config.Duration(d)
		}
	}
	if _, ok := kv["depth"]; ok {
		n, err := intKey(kv, "depth")
		if err != nil {
			return err
		}
		a.Queue.Depth = int64(n)
	}
	return nil
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

// StageSpec is one parsed stage of a strategy spec: its kind and its settings, with the kind's
// defaults filled in. Drivers that rebuild a strategy elsewhere (the live half of compare) use it.
type StageSpec struct {
	Kind string
	Args map[string]string
}

// ParseStages splits a strategy spec into its stages.
func ParseStages(spec string) ([]StageSpec, error) {
	if _, err := ParseStrategy(spec); err != nil {
		return nil, err
	}
	var out []StageSpec
	for _, part := range strings.Split(strings.TrimSpace(spec), "+") {
		kindName, args, _ := strings.Cut(strings.TrimSpace(part), ":")
		k, _ := findKind(kindName)
		kv, _ := parseKV(args, k.keys)
		for key, v := range k.defaults {
			if _, set := kv[key]; !set {
				kv[key] = v
			}
		}
		out = append(out, StageSpec{Kind: k.name, Args: kv})
	}
	return out, nil
}
