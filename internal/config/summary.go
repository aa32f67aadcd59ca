package config

import (
	"fmt"
	"strings"
)

// Summary says in one line what a valid configuration sheds and how: the strategy and its main
// settings, where it applies (the data port, Envoy's ext_proc), the routes and the per-client
// quotas, e.g. "strategy adaptive (gradient2, initial limit 4) on the data port; 2 routes
// (1 with its own strategy); quotas off". proxy --check-config prints it.
func Summary(c *Config) string {
	var doors []string
	if c.Listen != "" {
		doors = append(doors, "the data port")
	}
	if c.ExtProc.Listen != "" {
		doors = append(doors, "Envoy's ext_proc")
	}
	parts := []string{"strategy " + describeAdmission(&c.Admission) + " on " + strings.Join(doors, " and ")}
	if c.Admission.DryRun {
		parts[0] += " (dry run: counted, never shed)"
	}
	own := 0
	for _, r := range c.Routes {
		if r.Admission != nil {
			own++
		}
	}
	switch n := len(c.Routes); {
	case n == 0:
		parts = append(parts, "no routes")
	case n == 1:
		parts = append(parts, fmt.Sprintf("1 route (%d with its own strategy)", own))
	default:
		parts = append(parts, fmt.Sprintf("%d routes (%d with their own strategy)", n, own))
	}
	switch cl := c.Clients; {
	case cl == nil:
		parts = append(parts, "quotas off")
	case cl.Store != nil && cl.Store.Redis != nil:
		parts = append(parts, fmt.Sprintf("quotas %g rps per client (burst %d), shared through Redis", cl.Rate, cl.Burst))
	default:
		parts = append(parts, fmt.Sprintf("quotas %g rps per client (burst %d), per replica", cl.Rate, cl.Burst))
	}
	return strings.Join(parts, "; ")
}

// describeAdmission names a's strategy and its main settings: "inflight (limit 8)".
func describeAdmission(a *Admission) string {
	if a.Strategy == StrategyChain {
		stages := make([]string, len(a.Chain))
		for i := range a.Chain {
			stages[i] = describeBlock(a.Chain[i].Block())
		}
		return "chain (" + strings.Join(stages, ", then ") + ")"
	}
	k, ok := Lookup(a.Strategy)
	if !ok || k.New == nil {
		return a.Strategy
	}
	return describeBlock(a.block(k))
}

func describeBlock(b Block) string {
	switch b := b.(type) {
	case *TokenBucket:
		return fmt.Sprintf("token-bucket (%g rps, burst %d)", b.Rate, b.Burst)
	case *LeakyBucket:
		return fmt.Sprintf("leaky-bucket (%g rps, depth %d)", b.Rate, b.Depth)
	case *BoundedQueue:
		return fmt.Sprintf("bounded-queue (concurrency %d, depth %d, max wait %s)", b.Concurrency, b.Depth, b.MaxWait)
	case *Inflight:
		return fmt.Sprintf("inflight (limit %d)", b.Limit)
	case *Adaptive:
		return fmt.Sprintf("adaptive (%s, initial limit %g, between %g and %g)", b.Algorithm, b.InitialLimit, b.MinLimit, b.MaxLimit)
	case *CoDel:
		limit := "the adaptive limit"
		if b.Concurrency > 0 {
			limit = fmt.Sprintf("concurrency %d", b.Concurrency)
		}
		return fmt.Sprintf("codel (target %s, interval %s, %s)", b.Target, b.Interval, limit)
	case nil:
		return "none"
	default:
		return b.kind().Name
	}
}
