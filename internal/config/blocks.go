package config

import (
	"github.com/loadshed/loadshed/pkg/admission"
)

// TokenBucket: rate tokens per second, burst stored; refuses at once (429).
type TokenBucket struct {
	Rate  float64 `yaml:"rate"`
	Burst int     `yaml:"burst"`
}

func (b *TokenBucket) kind() *Kind { return kindNamed(StrategyTokenBucket) }

func (b *TokenBucket) core() admission.TokenBucketConfig {
	return admission.TokenBucketConfig{Rate: b.Rate, Burst: b.Burst}
}

func (b *TokenBucket) validate(errs *Problems, path string, _ placement) {
	errs.nest(path, b.core().Validate())
}

func (b *TokenBucket) build(buildEnv) (admission.Core, error) {
	return admission.NewTokenBucket(b.core())
}

func (b *TokenBucket) concurrencyHint(buildEnv) int { return b.Burst }

// LeakyBucket: a queue drained at a constant rate, depth bounded (429 on overflow).
type LeakyBucket struct {
	Rate  float64 `yaml:"rate"`
	Depth int64   `yaml:"depth"`
}

func (b *LeakyBucket) kind() *Kind { return kindNamed(StrategyLeakyBucket) }

func (b *LeakyBucket) core() admission.LeakyBucketConfig {
	return admission.LeakyBucketConfig{Rate: b.Rate, Depth: b.Depth}
}

func (b *LeakyBucket) validate(errs *Problems, path string, _ placement) {
	errs.nest(path, b.core().Validate())
}

func (b *LeakyBucket) build(buildEnv) (admission.Core, error) {
	return admission.NewLeakyBucket(b.core())
}

func (b *LeakyBucket) concurrencyHint(buildEnv) int { return int(b.Depth) }

// BoundedQueue: concurrency served at once, depth waiting, each at most maxWait (503).
type BoundedQueue struct {
	Concurrency int64    `yaml:"concurrency"`
	Depth       int64    `yaml:"depth"`
	MaxWait     Duration `yaml:"maxWait"`
}

func (q *BoundedQueue) kind() *Kind { return kindNamed(StrategyBoundedQueue) }

func (q *BoundedQueue) core(prio admission.PriorityConfig) admission.BoundedQueueConfig {
	return admission.BoundedQueueConfig{Concurrency: q.Concurrency, Depth: q.Depth, MaxWait: q.MaxWait.D(), Priorities: prio}
}

func (q *BoundedQueue) validate(errs *Problems, path string, _ placement) {
	errs.nest(path, q.core(admission.PriorityConfig{}).Validate())
}

func (q *BoundedQueue) build(env buildEnv) (admission.Core, error) {
	return admission.NewBoundedQueue(q.core(env.prio))
}

func (q *BoundedQueue) concurrencyHint(buildEnv) int { return int(q.Concurrency) }

// Inflight: at most limit in progress; the next is refused at once (503).
type Inflight struct {
	Limit int64 `yaml:"limit"`
}

func (f *Inflight) kind() *Kind { return kindNamed(StrategyInflight) }

func (f *Inflight) core(prio admission.PriorityConfig) admission.InflightConfig {
	return admission.InflightConfig{Limit: f.Limit, Priorities: prio}
}

func (f *Inflight) validate(errs *Problems, path string, _ placement) {
	errs.nest(path, f.core(admission.PriorityConfig{}).Validate())
}

func (f *Inflight) build(env buildEnv) (admission.Core, error) {
	return admission.NewInflight(f.core(env.prio))
}

func (f *Inflight) concurrencyHint(buildEnv) int { return int(f.Limit) }
