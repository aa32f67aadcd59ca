package config

import (
	"fmt"
	"strings"

	"github.com/loadshed/loadshed/pkg/admission"
)

// Strategy names, as written in the config file.
const (
	StrategyNone        = "none"
	StrategyTokenBucket = "token-bucket"
	StrategyLeakyBucket = "leaky-bucket"
	StrategyBoundedQ    = "bounded-queue"
	StrategyInflight    = "inflight"
	StrategyAdaptive    = "adaptive"
	StrategyCoDel       = "codel"
	StrategyChain       = "chain"
)

// Strategies lists the strategies the proxy offers, in documentation order.
var Strategies = []string{StrategyNone, StrategyTokenBucket, StrategyLeakyBucket, StrategyBoundedQ, StrategyInflight, StrategyAdaptive, StrategyCoDel, StrategyChain}

// Admission selects and tunes the admission strategy.
type Admission struct {
	Strategy string `yaml:"strategy"`
	// DryRun counts would-be sheds in metrics but admits every request.
	DryRun bool `yaml:"dryRun"`

	TokenBucket  *TokenBucket  `yaml:"tokenBucket"`
	LeakyBucket  *LeakyBucket  `yaml:"leakyBucket"`
	BoundedQueue *BoundedQueue `yaml:"boundedQueue"`
	Inflight     *Inflight     `yaml:"inflight"`
	Adaptive     Adaptive      `yaml:"adaptive"`
	CoDel        CoDel         `yaml:"codel"`
	Chain        []Stage       `yaml:"chain"`
	Priorities   Priorities    `yaml:"priorities"`
}

// Priorities shares a concurrency limit between priority levels: requests of priority
// reservedFor or more important may hold up to reserved x limit permits beyond the limit, while
// everyone may use the limit itself (less important levels borrow what the important ones leave
// idle). Queues always serve the most important first.
type Priorities struct {
	Reserved    float64 `yaml:"reserved"`
	ReservedFor string  `yaml:"reservedFor"`
}

// TokenBucket: rate tokens per second, burst stored; refuses at once (429).
type TokenBucket struct {
	Rate  float64 `yaml:"rate"`
	Burst int     `yaml:"burst"`
}

// LeakyBucket: a queue drained at a constant rate, depth bounded (429 on overflow).
type LeakyBucket struct {
	Rate  float64 `yaml:"rate"`
	Depth int64   `yaml:"depth"`
}

// BoundedQueue: concurrency served at once, depth waiting, each at most maxWait (503).
type BoundedQueue struct {
	Concurrency int64    `yaml:"concurrency"`
	Depth       int64    `yaml:"depth"`
	MaxWait     Duration `yaml:"maxWait"`
}

// Inflight: at most limit in progress; the next is refused at once (503).
type Inflight struct {
	Limit int64 `yaml:"limit"`
}

// Stage is one element of a chain: exactly one strategy block.
type Stage struct {
	TokenBucket  *TokenBucket  `yaml:"tokenBucket"`
	LeakyBucket  *LeakyBucket  `yaml:"leakyBucket"`
	BoundedQueue *BoundedQueue `yaml:"boundedQueue"`
	Inflight     *Inflight     `yaml:"inflight"`
	Adaptive     *Adaptive     `yaml:"adaptive"`
	CoDel        *CoDel        `yaml:"codel"`
}

func (a *Admission) validate(errs *Problems, path string) {
	switch a.Strategy {
	case StrategyNone:
	case StrategyTokenBucket:
		a.TokenBucket.validate(errs, path+".tokenBucket", true)
	case StrategyLeakyBucket:
		a.LeakyBucket.validate(errs, path+".leakyBucket", true)
	case StrategyBoundedQ:
		a.BoundedQueue.validate(errs, path+".boundedQueue", true)
	case StrategyInflight:
		a.Inflight.validate(errs, path+".inflight", true)
	case StrategyAdaptive:
	case StrategyCoDel:
	case StrategyChain:
		if len(a.Chain) == 0 {
			errs.add(path+".chain", "required when strategy is chain: a list of strategy blocks, e.g. [{tokenBucket: {...}}, {boundedQueue: {...}}]")
		}
		for i := range a.Chain {
			a.Chain[i].validate(errs, fmt.Sprintf("%s.chain[%d]", path, i))
		}
	case "":
		errs.add(path+".strategy", "required: one of %s", strings.Join(Strategies, ", "))
		return
	default:
		errs.add(path+".strategy", "unknown strategy %q (want one of %s)", a.Strategy, strings.Join(Strategies, ", "))
		return
	}
	// Blocks that are present but unused are still checked, so a typo'd value does not wait
	// for the day someone selects that strategy.
	if a.Strategy != StrategyTokenBucket {
		a.TokenBucket.validate(errs, path+".tokenBucket", false)
	}
	if a.Strategy != StrategyLeakyBucket {
		a.LeakyBucket.validate(errs, path+".leakyBucket", false)
	}
	if a.Strategy != StrategyBoundedQ {
		a.BoundedQueue.validate(errs, path+".boundedQueue", false)
	}
	if a.Strategy != StrategyInflight {
		a.Inflight.validate(errs, path+".inflight", false)
	}
	a.Adaptive.validate(errs, path+".adaptive")
	a.CoDel.validate(errs, path+".codel")
	if !(a.Priorities.Reserved >= 0 && a.Priorities.Reserved <= 1) {
		errs.add(path+".priorities.reserved", "must be a share from 0 to 1, got %v", a.Priorities.Reserved)
	}
	if a.Priorities.ReservedFor != "" {
		if _, err := admission.ParsePriority(a.Priorities.ReservedFor); err != nil {
			errs.add(path+".priorities.reservedFor", "%v", err)
		}
	}
	if a.Priorities.Reserved > 0 && (a.Strategy == StrategyTokenBucket || a.Strategy == StrategyLeakyBucket) {
		errs.add(path+".priorities.reserved", "applies to concurrency limits (inflight, bounded-queue, adaptive, codel), not to %s", a.Strategy)
	}
}

func missing(errs *Problems, path string, required bool) {
	if required {
		errs.add(path, "required by the selected strategy")
	}
}

func (b *TokenBucket) validate(errs *Problems, path string, required bool) {
	if b == nil {
		missing(errs, path, required)
		return
	}
	if !(b.Rate > 0) {
		errs.add(path+".rate", "must be a positive number of requests per second, got %v", b.Rate)
	}
	if b.Burst < 1 {
		errs.add(path+".burst", "must be at least 1, got %d", b.Burst)
	}
}

func (b *LeakyBucket) validate(errs *Problems, path string, required bool) {
	if b == nil {
		missing(errs, path, required)
		return
	}
	if !(b.Rate > 0) {
		errs.add(path+".rate", "must be a positive number of requests per second, got %v", b.Rate)
	}
	if b.Depth < 1 {
		errs.add(path+".depth", "must be at least 1, got %d", b.Depth)
	}
}

func (q *BoundedQueue) validate(errs *Problems, path string, required bool) {
	if q == nil {
		missing(errs, path, required)
		return
	}
	if q.Concurrency < 1 {
		errs.add(path+".concurrency", "must be at least 1, got %d", q.Concurrency)
	}
	if q.Depth < 0 {
		errs.add(path+".depth", "must not be negative, got %d", q.Depth)
	}
	if q.MaxWait <= 0 {
		errs.add(path+".maxWait", "must be a positive duration (how long a request may wait), got %s", q.MaxWait)
	}
}

func (f *Inflight) validate(errs *Problems, path string, required bool) {
	if f == nil {
		missing(errs, path, required)
		return
	}
	if f.Limit < 1 {
		errs.add(path+".limit", "must be at least 1, got %d", f.Limit)
	}
}

func (s *Stage) validate(errs *Problems, path string) {
	n := 0
	if s.TokenBucket != nil {
		n++
		s.TokenBucket.validate(errs, path+".tokenBucket", true)
	}
	if s.LeakyBucket != nil {
		n++
		s.LeakyBucket.validate(errs, path+".leakyBucket", true)
	}
	if s.BoundedQueue != nil {
		n++
		s.BoundedQueue.validate(errs, path+".boundedQueue", true)
	}
	if s.Inflight != nil {
		n++
		s.Inflight.validate(errs, path+".inflight", true)
	}
	if s.Adaptive != nil {
		n++
		s.Adaptive.validate(errs, path+".adaptive")
	}
	if s.CoDel != nil {
		n++
		s.CoDel.validate(errs, path+".codel")
		if s.CoDel.Concurrency == 0 {
			errs.add(path+".codel.concurrency", "a chain stage needs a fixed concurrency (an adaptive CoDel reads the top-level adaptive block)")
		}
	}
	if n != 1 {
		errs.add(path, "each chain element must hold exactly one strategy block (tokenBucket, leakyBucket, boundedQueue, inflight, adaptive or codel), found %d", n)
	}
}

// Build returns the admission core the configuration describes, or nil for strategy "none".
// Call it on a validated configuration; each call returns fresh state.
func (a *Admission) Build() (admission.Core, error) {
	prio := a.priorities()
	switch a.Strategy {
	case StrategyAdaptive:
		return a.Adaptive.build(prio)
	case StrategyCoDel:
		return a.CoDel.build(&a.Adaptive, prio)
	case StrategyNone:
		return nil, nil
	case StrategyTokenBucket:
		return a.TokenBucket.build()
	case StrategyLeakyBucket:
		return a.LeakyBucket.build()
	case StrategyBoundedQ:
		return a.BoundedQueue.build(prio)
	case StrategyInflight:
		return a.Inflight.build(prio)
	case StrategyChain:
		stages := make([]admission.Core, 0, len(a.Chain))
		for i := range a.Chain {
			c, err := a.Chain[i].build(prio)
			if err != nil {
				return nil, fmt.Errorf("chain[%d]: %w", i, err)
			}
			stages = append(stages, c)
		}
		return admission.NewChain(stages...)
	}
	return nil, fmt.Errorf("unknown strategy %q", a.Strategy)
}

func (b *TokenBucket) build() (admission.Core, error) {
	return admission.NewTokenBucket(admission.TokenBucketConfig{Rate: b.Rate, Burst: b.Burst})
}

func (b *LeakyBucket) build() (admission.Core, error) {
	return admission.NewLeakyBucket(admission.LeakyBucketConfig{Rate: b.Rate, Depth: b.Depth})
}

func (q *BoundedQueue) build(prio admission.PriorityConfig) (admission.Core, error) {
	return admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: q.Concurrency, Depth: q.Depth, MaxWait: q.MaxWait.D(), Priorities: prio})
}

func (f *Inflight) build(prio admission.PriorityConfig) (admission.Core, error) {
	return admission.NewInflight(admission.InflightConfig{Limit: f.Limit, Priorities: prio})
}

func (s *Stage) build(prio admission.PriorityConfig) (admission.Core, error) {
	switch {
	case s.TokenBucket != nil:
		return s.TokenBucket.build()
	case s.LeakyBucket != nil:
		return s.LeakyBucket.build()
	case s.BoundedQueue != nil:
		return s.BoundedQueue.build(prio)
	case s.Inflight != nil:
		return s.Inflight.build(prio)
	case s.Adaptive != nil:
		return s.Adaptive.build(prio)
	case s.CoDel != nil:
		return s.CoDel.build(nil, prio)
	}
	return nil, fmt.Errorf("empty chain stage")
}

func (a *Admission) priorities() admission.PriorityConfig {
	p := admission.PriorityConfig{Reserved: a.Priorities.Reserved}
	if a.Priorities.ReservedFor != "" {
		p.ReservedFor, _ = admission.ParsePriority(a.Priorities.ReservedFor)
	}
	return p
}

// ConcurrencyHint estimates how many requests the strategy lets through at once, to size the
// upstream connection pool.
func (a *Admission) ConcurrencyHint() int {
	hint := 0
	one := func(s Stage) {
		switch {
		case s.Inflight != nil:
			hint = max(hint, int(s.Inflight.Limit))
		case s.BoundedQueue != nil:
			hint = max(hint, int(s.BoundedQueue.Concurrency))
		case s.TokenBucket != nil:
			hint = max(hint, s.TokenBucket.Burst)
		case s.LeakyBucket != nil:
			hint = max(hint, int(s.LeakyBucket.Depth))
		case s.Adaptive != nil:
			hint = max(hint, int(s.Adaptive.MaxLimit))
		case s.CoDel != nil:
			hint = max(hint, int(s.CoDel.Concurrency))
		}
	}
	switch a.Strategy {
	case StrategyChain:
		for _, s := range a.Chain {
			one(s)
		}
	case StrategyInflight:
		one(Stage{Inflight: a.Inflight})
	case StrategyBoundedQ:
		one(Stage{BoundedQueue: a.BoundedQueue})
	case StrategyTokenBucket:
		one(Stage{TokenBucket: a.TokenBucket})
	case StrategyLeakyBucket:
		one(Stage{LeakyBucket: a.LeakyBucket})
	case StrategyAdaptive:
		one(Stage{Adaptive: &a.Adaptive})
	case StrategyCoDel:
		if a.CoDel.Concurrency > 0 {
			one(Stage{CoDel: &a.CoDel})
		} else {
			one(Stage{Adaptive: &a.Adaptive})
		}
	default:
		hint = 128
	}
	return min(max(hint, 1), 4096)
}
