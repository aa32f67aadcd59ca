package gate

import (
	"fmt"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/metrics"
	"github.com/loadshed/loadshed/internal/quota"
	"github.com/loadshed/loadshed/pkg/admission"
)

// Policy is the admission decision for one route: which strategy, and its live state.
type Policy struct {
	route    string
	strategy string             // the configured strategy name, the "strategy" label
	cfg      config.Admission   // what it was built from, to keep its state across reloads
	limiter  *admission.Limiter // the strategy's core; "none" admits everything
	stages   []string           // stage names, for the gauges
	dryRun   bool
	rate     float64 // the strategy's rate limit per second (0: none), for the load report
	// latency is a moving average of the route's upstream latency (successful, non-streaming
	// answers), used to refuse requests whose deadline is shorter than the expected service.
	latency ewma
	m       *policyMetrics
	// cohorts is the ranked admission wrapping the core and ranker computes the ranks, when the
	// block has cohorts; nil otherwise.
	cohorts *admission.Cohorts
	ranker  *ranker
}

func newPolicy(route string, a *config.Admission, m *metrics.Proxy, clock admission.Clock) (*Policy, error) {
	core, err := a.Build()
	if err != nil {
		return nil, err
	}
	var cohorts *admission.Cohorts
	if a.Cohorts != nil {
		if cohorts, err = admission.NewCohorts(core, a.Cohorts.Options()); err != nil {
			return nil, fmt.Errorf("cohorts: %w", err)
		}
		core = cohorts
	}
	p := &Policy{route: route, strategy: a.Strategy, cfg: *a, dryRun: a.DryRun, rate: a.Rate(),
		limiter: admission.NewLimiter(core, admission.WithClock(clock)), cohorts: cohorts}
	if cohorts != nil {
		p.ranker = newRanker(a.Cohorts)
	}
	for _, s := range admission.Stages(core) {
		p.stages = append(p.stages, s.Name())
	}
	p.m = newPolicyMetrics(m, route, p.strategy, p.stages)
	if cohorts != nil {
		p.m.cohortShed = m.CohortShed.MustCurryWith(prometheus.Labels{"route": route})
	}
	return p, nil
}

// Route is the name of the route the policy serves ("default" for the top-level one).
func (p *Policy) Route() string { return p.route }

// Strategy is the configured strategy's name.
func (p *Policy) Strategy() string { return p.strategy }

// CohortLevel is the cohort admission level now, and false when the policy has no cohorts.
func (p *Policy) CohortLevel() (admission.CohortLevel, bool) {
	if p.cohorts == nil {
		return admission.CohortLevel{}, false
	}
	return p.cohorts.Level(), true
}

// Stats is the strategy's current state.
func (p *Policy) Stats() admission.Stats { return p.limiter.Stats() }

// state reports the gauges of every stage of the policy; "none" has no state worth a gauge.
func (p *Policy) state() []metrics.StageState {
	if p.strategy == config.StrategyNone {
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
	rule    config.Route
	policy  *Policy
	clients quota.Limiter // the route's own quota, or the top-level one
}

// state is everything a reload may replace, swapped atomically as a whole.
type state struct {
	cfg     *config.Config
	spec    requestSpec
	clients quota.Limiter // the top-level clients block's quota; nil: none
	quotas  quotas
	routes  []route
	def     *Policy
	status  []int // by reason index (admission.AllReasons)
	grpc    []int // gRPC status by reason index
}

// match returns the policy, the route's cost, whether it is a streaming route and its
// per-client quota (nil: none).
func (st *state) match(method, path string) (*Policy, int64, bool, quota.Limiter) {
	for i := range st.routes {
		r := &st.routes[i]
		if r.rule.Matches(method, path) {
			return r.policy, r.rule.Cost, r.rule.Streaming, r.clients
		}
	}
	return st.def, 0, false, st.clients
}

// policies lists every distinct policy of the state, the default one first.
func (st *state) policies() []*Policy {
	out := []*Policy{st.def}
	for _, r := range st.routes {
		if r.policy != st.def {
			out = append(out, r.policy)
		}
	}
	return out
}

// buildState compiles a configuration. Policies of prev whose route name and admission
// configuration are unchanged are kept, with their state (in-flight permits, queues, learned
// limits). The per-client quotas are built apart (buildQuotas).
func buildState(cfg *config.Config, prev *state, m *metrics.Proxy, clock admission.Clock) (*state, error) {
	old := map[string]*Policy{}
	if prev != nil {
		for _, p := range prev.policies() {
			old[p.route] = p
		}
	}
	reuse := func(name string, a *config.Admission) (*Policy, error) {
		if p, ok := old[name]; ok && reflect.DeepEqual(p.cfg, *a) {
			return p, nil
		}
		p, err := newPolicy(name, a, m, clock)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return p, nil
	}
	st := &state{cfg: cfg}
	var err error
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
	h := cfg.Headers
	defPrio, _ := admission.ParsePriority(h.DefaultPriority)
	st.spec = requestSpec{
		priorityHeader: h.Priority, defaultPriority: defPrio,
		costHeader: h.Cost, maxCost: h.MaxCost,
		timeoutHeader: h.Timeout, grpcTimeout: h.GRPCTimeout,
		clientKeyHeader: h.ClientKey, foldKey: h.ClientKeyFold, trustForwarded: cfg.TrustForwardedHeaders,
		trust: newTrustRules(cfg.Trust),
	}
	if !cfg.Trust.ForwardAdmissionHeaders {
		for _, name := range []string{h.Priority, h.Cost} {
			if name != "" {
				st.spec.strip = append(st.spec.strip, name)
			}
		}
	}
	codes, grpcCodes := cfg.StatusCodes.ByReason(), cfg.GRPC.StatusCodes.ByReason()
	st.status, st.grpc = make([]int, len(admission.AllReasons)), make([]int, len(admission.AllReasons))
	for i, r := range admission.AllReasons {
		st.status[i], st.grpc[i] = codes[r], grpcCodes[r]
	}
	return st, nil
}

// ewma is a lock-free moving average of durations (weight 1/16), read by many requests.
type ewma struct{ v atomic.Int64 }

func (e *ewma) observe(d time.Duration) {
	for {
		old := e.v.Load()
		next := int64(d)
		if old > 0 {
			next = old + (int64(d)-old)/16
		}
		if e.v.CompareAndSwap(old, next) {
			return
		}
	}
}

func (e *ewma) value() time.Duration { return time.Duration(e.v.Load()) }
