package proxy

import (
	"fmt"
	"net/url"
	"reflect"
	"time"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/metrics"
	"github.com/loadshed/loadshed/pkg/admission"
)

// policy is the admission decision for one route: which strategy, and its live state.
type policy struct {
	route    string
	strategy string             // the configured strategy name, the "strategy" label
	cfg      config.Admission   // what it was built from, to keep its state across reloads
	limiter  *admission.Limiter // nil for strategy "none"
	stages   []string           // stage names, for the gauges
	dryRun   bool
	// latency is a moving average of upstream latency for routes whose strategy keeps none,
	// used to refuse requests whose deadline is shorter than the expected service.
	latency ewma
}

func newPolicy(route string, a *config.Admission) (*policy, error) {
	core, err := a.Build()
	if err != nil {
		return nil, err
	}
	p := &policy{route: route, strategy: a.Strategy, cfg: *a, dryRun: a.DryRun}
	if core != nil {
		p.limiter = admission.NewLimiter(core)
		for _, s := range admission.Stages(core) {
			p.stages = append(p.stages, s.Name())
		}
	}
	return p, nil
}

// state reports the gauges of every stage of the policy.
func (p *policy) state() []metrics.StageState {
	if p.limiter == nil {
		return nil
	}
	stats := p.limiter.StageStats()
	out := make([]metrics.StageState, len(stats))
	for i, st := range stats {
		out[i] = metrics.StageState{
			Route: p.route, Strategy: p.stages[i],
			InFlight: float64(st.InFlight), QueueDepth: float64(st.QueuedRequests),
			Limit: st.Limit, Tokens: st.Tokens,
			LimitFloor: st.LimitFloor, LimitCeiling: st.LimitCeiling,
			MinRTT: st.MinRTT.Seconds(), SampleRTT: st.SampleRTT.Seconds(),
		}
	}
	return out
}

// route is a compiled route rule.
type route struct {
	rule   config.Route
	policy *policy
}

// runtimeState is everything a reload may replace, swapped atomically as a whole.
type runtimeState struct {
	cfg      *config.Config
	upstream *url.URL
	spec     requestSpec
	clients  *admission.ClientLimits
	routes   []route
	def      *policy
}

// match returns the policy and route cost for a request.
func (st *runtimeState) match(method, path string) (*policy, int64) {
	for i := range st.routes {
		r := &st.routes[i]
		if r.rule.Matches(method, path) {
			return r.policy, r.rule.Cost
		}
	}
	return st.def, 0
}

// policies lists every distinct policy of the state.
func (st *runtimeState) policies() []*policy {
	out := []*policy{st.def}
	for _, r := range st.routes {
		if r.policy != st.def {
			out = append(out, r.policy)
		}
	}
	return out
}

// buildState compiles a configuration. Policies of prev whose route name and admission
// configuration are unchanged are kept, with their state (in-flight permits, queues, learned
// limits); so are the per-client buckets when their configuration is unchanged.
func buildState(cfg *config.Config, prev *runtimeState) (*runtimeState, error) {
	u, err := url.Parse(cfg.Upstream)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	old := map[string]*policy{}
	if prev != nil {
		for _, p := range prev.policies() {
			old[p.route] = p
		}
	}
	reuse := func(name string, a *config.Admission) (*policy, error) {
		if p, ok := old[name]; ok && reflect.DeepEqual(p.cfg, *a) {
			return p, nil
		}
		p, err := newPolicy(name, a)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return p, nil
	}
	st := &runtimeState{cfg: cfg, upstream: u}
	if st.def, err = reuse("default", &cfg.Admission); err != nil {
		return nil, err
	}
	for _, r := range cfg.Routes {
		p := st.def
		if r.Admission != nil {
			if p, err = reuse(r.Name, r.Admission); err != nil {
				return nil, err
			}
		}
		st.routes = append(st.routes, route{rule: r, policy: p})
	}
	if prev != nil && reflect.DeepEqual(prev.cfg.Clients, cfg.Clients) {
		st.clients = prev.clients
	} else if st.clients, err = cfg.Clients.ClientLimits(); err != nil {
		return nil, fmt.Errorf("clients: %w", err)
	}
	h := cfg.Headers
	defPrio, _ := admission.ParsePriority(h.DefaultPriority)
	st.spec = requestSpec{
		priorityHeader: h.Priority, defaultPriority: defPrio,
		costHeader: h.Cost, maxCost: h.MaxCost,
		timeoutHeader: h.Timeout, grpcTimeout: h.GRPCTimeout,
		clientKeyHeader: h.ClientKey, trustForwarded: cfg.TrustForwardedHeaders,
	}
	return st, nil
}

// ewma is a lock-free moving average of durations (weight 1/16), read by many requests.
type ewma struct{ v atomicDuration }

func (e *ewma) observe(d time.Duration) {
	for {
		old := e.v.Load()
		next := d
		if old > 0 {
			next = old + (d-old)/16
		}
		if e.v.CompareAndSwap(old, next) {
			return
		}
	}
}

func (e *ewma) value() time.Duration { return e.v.Load() }
