package lab

import (
	"fmt"
	"strings"

	"github.com/loadshed/loadshed/internal/config"
	"go.yaml.in/yaml/v3"
)

// The acceptance matrix of the lab near capacity: every strategy that must be told the
// backend's capacity, with rate limits between 0.9x and 1.1x of the nominal capacity, at
// MatrixLoads, for each of MatrixServices (`lab compare --matrix`).
var (
	// MatrixServices are a constant service time and slow tails of 2% and 5% (the synthetic
	// backend's sampler: normal 20 ms +- 5 ms, else exponential 300 ms clamped to [100 ms, 2 s]).
	MatrixServices = []string{"constant:20ms", "slowtail:tailProb=0.02", "slowtail:tailProb=0.05"}
	// MatrixLoads are the offered loads, as multiples of the nominal capacity.
	MatrixLoads = []float64{1.5, 3, 5}
)

// MatrixStrategies returns the matrix's strategies sized for the scenario's backend the way
// config.Sized sizes them (Little's law; bursts and depths of one per worker), with the rates of
// the rate limits set to the given multiples of the nominal capacity: an in-flight limit, token
// buckets at 0.9x and 1.1x, a leaky bucket at 1.0x, a bounded queue, and a chain of a token
// bucket at 1.0x with that bounded queue.
func MatrixStrategies(sc Scenario) ([]Strategy, error) {
	capacity := Capacity(sc)
	if !(capacity > 0) {
		return nil, fmt.Errorf("capacity unknown: the matrix needs the scenario's servers")
	}
	sized, err := ScenarioStrategies(sc, []string{config.StrategyInflight, config.StrategyBoundedQueue, config.StrategyChain})
	if err != nil {
		return nil, err
	}
	w := sc.Servers
	// The sized chain's second stage is the sized bounded queue.
	queue := sized[2].Admission.Chain[1].Block()
	rate := func(f float64) float64 { return float64(int(f*capacity*10+0.5)) / 10 }
	out := []Strategy{sized[0]}
	for _, v := range []struct {
		name string
		adm  config.Admission
	}{
		{"token-bucket 0.9x", config.Use(&config.TokenBucket{Rate: rate(0.9), Burst: w})},
		{"token-bucket 1.1x", config.Use(&config.TokenBucket{Rate: rate(1.1), Burst: w})},
		{"leaky-bucket 1.0x", config.Use(&config.LeakyBucket{Rate: rate(1.0), Depth: int64(w)})},
	} {
		st, err := namedStrategy(v.name, v.adm)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	out = append(out, sized[1])
	chain, err := namedStrategy("token-bucket 1.0x+bounded-queue", config.ChainOf(&config.TokenBucket{Rate: rate(1.0), Burst: w}, queue))
	if err != nil {
		return nil, err
	}
	return append(out, chain), nil
}

// namedStrategy is the strategy an admission block describes, under name, with the block's
// YAML as its spec.
func namedStrategy(name string, a config.Admission) (Strategy, error) {
	y, err := yaml.Marshal(a)
	if err != nil {
		return Strategy{}, err
	}
	st := FromAdmission(a, strings.TrimSpace(string(y)))
	st.Name = name
	return st, nil
}
