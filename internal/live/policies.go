package live

import (
	"time"

	"github.com/loadshed/loadshed/internal/config"
)

// Capacity describes a backend: W workers, each request taking S.
type Capacity struct {
	Workers int
	Service time.Duration
}

// RPS is the backend's capacity C = W / S.
func (c Capacity) RPS() float64 { return float64(c.Workers) / c.Service.Seconds() }

// Policies returns, for each strategy of the registry, its admission block sized for the
// capacity and SLO the way an operator who knows the backend would configure it (config.Sized:
// Little's law, rates at 90% of capacity); the strategies that find their limit by themselves
// are told nothing (config.Kind.ToldCapacity).
func Policies(c Capacity, slo time.Duration) map[string]config.Admission {
	b := config.Backend{Workers: c.Workers, Service: c.Service, SLO: slo}
	out := map[string]config.Admission{}
	for _, k := range config.Kinds() {
		out[k.Name] = config.Sized(&k, b)
	}
	return out
}

// StrategyOrder is the order strategies are shown in: every strategy of the registry but the
// chain, which is a composition of the others.
var StrategyOrder = func() []string {
	var out []string
	for _, name := range config.Strategies {
		if name != config.StrategyChain {
			out = append(out, name)
		}
	}
	return out
}()
