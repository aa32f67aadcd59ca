package lab

import (
	"strings"
	"time"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/loadgen"
	"github.com/loadshed/loadshed/internal/slowtail"
	"github.com/loadshed/loadshed/pkg/admission"
	"go.yaml.in/yaml/v3"
)

// Case is one row of a comparison: a strategy and the scenario it runs in.
type Case struct {
	Strategy Strategy
	Scenario Scenario
}

// The published deterministic comparison: 1000 requests arrive evenly over 5 s (one every 5 ms,
// the first at 0), the target admit rate is 100 rps and service takes 10 ms.
const (
	backpressureRate     = 200 // arrivals per second
	backpressureDuration = 5 * time.Second
	backpressureRequests = 1000
	backpressureService  = 10 * time.Millisecond
)

// BackpressureCases returns the five rows of the published comparison, each mapped onto the
// project's strategies:
//
//   - token-bucket: a token bucket of 100/s with burst 100 (capacity 100, starts full); an
//     admitted request is answered 10 ms after it arrives (unlimited servers).
//   - bounded-queue: "capacity 50, one server, FIFO" is a bounded queue with concurrency 1 (the
//     one in service) and depth 49 (the waiting); the strategy itself serialises service, so the
//     backend needs no server limit. The table states no maximum wait, and every wait in it is
//     bounded by the queue: the longest is 49 x 10 ms, so maxWait (which must be positive) is
//     set to the 500 ms a full queue ever takes, and no request is ever refused for waiting.
//   - leaky-bucket: a leaky bucket of 100/s and depth 25; a request waits until the water ahead
//     of it has drained, and its own 10 ms of water counts while it drains.
//   - load-shedder: an in-flight limit of 5; each admitted request is answered 5 x 10 ms = 50 ms
//     after it arrives (the backend shares its capacity among the 5).
//   - rate-limiter: a token bucket of 100/s with burst 1 (no burst allowance).
func BackpressureCases() []Case {
	sc := func(service time.Duration) Scenario {
		return Scenario{
			Arrivals: ScheduleArrivals{
				Schedule: loadgen.ConstantRate(backpressureRate, backpressureDuration),
				Priority: admission.Critical,
				Label:    "1000 requests, one every 5 ms",
			},
			MaxRequests: backpressureRequests,
			Service:     slowtail.Constant(service),
		}
	}
	row := func(name string, b config.Block) Strategy {
		a := config.Use(b)
		y, _ := yaml.Marshal(a)
		st := FromAdmission(a, strings.TrimSpace(string(y)))
		st.Name = name
		return st
	}
	return []Case{
		{row(config.StrategyTokenBucket, &config.TokenBucket{Rate: 100, Burst: 100}), sc(backpressureService)},
		{row(config.StrategyBoundedQueue, &config.BoundedQueue{Concurrency: 1, Depth: 49, MaxWait: config.Duration(50 * backpressureService)}), sc(backpressureService)},
		{row(config.StrategyLeakyBucket, &config.LeakyBucket{Rate: 100, Depth: 25}), sc(backpressureService)},
		{row("load-shedder", &config.Inflight{Limit: 5}), sc(5 * backpressureService)},
		{row("rate-limiter", &config.TokenBucket{Rate: 100, Burst: 1}), sc(backpressureService)},
	}
}

// RunCases runs every case in order.
func RunCases(cases []Case, opts RunOptions) ([]Named, error) {
	out := make([]Named, 0, len(cases))
	for _, c := range cases {
		r, err := Run(c.Scenario, c.Strategy, opts)
		if err != nil {
			return nil, err
		}
		out = append(out, Named{Strategy: c.Strategy.Name, Result: r})
	}
	return out, nil
}
