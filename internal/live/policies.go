package live

import (
	"fmt"
	"time"
)

// Capacity describes a backend: W workers, each request taking S.
type Capacity struct {
	Workers int
	Service time.Duration
}

// RPS is the backend's capacity C = W / S.
func (c Capacity) RPS() float64 { return float64(c.Workers) / c.Service.Seconds() }

// Policies returns, for each strategy, an admission block sized for the capacity and SLO by
// Little's law (in-flight L = C x S = W; queue Q = C x (SLO - S)), the way an operator who knows
// the backend would configure it; the rate-based ones at 90% of capacity (a rate at the
// capacity itself lets a queue build inside the backend). "adaptive" and "codel" are told
// nothing about the backend.
func Policies(c Capacity, slo time.Duration) map[string]string {
	rate := c.RPS()
	queue := max(int(rate*(slo-c.Service).Seconds()), 1)
	wait := slo - c.Service
	return map[string]string{
		"none":          "strategy: none",
		"token-bucket":  fmt.Sprintf("strategy: token-bucket\ntokenBucket: {rate: %g, burst: %d}", 0.9*rate, c.Workers),
		"leaky-bucket":  fmt.Sprintf("strategy: leaky-bucket\nleakyBucket: {rate: %g, depth: %d}", 0.9*rate, c.Workers),
		"bounded-queue": fmt.Sprintf("strategy: bounded-queue\nboundedQueue: {concurrency: %d, depth: %d, maxWait: %s}", c.Workers, queue, wait),
		"inflight":      fmt.Sprintf("strategy: inflight\ninflight: {limit: %d}", c.Workers),
		"adaptive":      "strategy: adaptive",
		"codel":         "strategy: codel",
	}
}

// StrategyOrder is the order strategies are shown in.
var StrategyOrder = []string{"none", "token-bucket", "leaky-bucket", "bounded-queue", "inflight", "adaptive", "codel"}
