package proxy

import (
	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/metrics"
	"github.com/loadshed/loadshed/pkg/admission"
)

// policy is the admission decision for one route: which strategy, and its live state.
type policy struct {
	route    string
	strategy string              // the configured strategy name, the "strategy" label
	limiter  *admission.Limiter  // nil for strategy "none"
	stages   []string            // stage names, for the gauges
	dryRun   bool
}

func newPolicy(route string, a *config.Admission) (*policy, error) {
	core, err := a.Build()
	if err != nil {
		return nil, err
	}
	p := &policy{route: route, strategy: a.Strategy, dryRun: a.DryRun}
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
		}
	}
	return out
}
