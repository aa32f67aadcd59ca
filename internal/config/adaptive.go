package config

import (
	"errors"
	"strings"

	"github.com/loadshed/loadshed/pkg/admission"
	"github.com/loadshed/loadshed/pkg/admission/limit"
)

// DefaultAlgorithm is the limit algorithm of the adaptive strategy when none is named.
const DefaultAlgorithm = limit.NameGradient

// Adaptive configures the latency-driven concurrency limit. Nothing about the backend's capacity
// needs to be known: the algorithm finds the limit from latency samples.
type Adaptive struct {
	Algorithm    string        `yaml:"algorithm"`
	InitialLimit float64       `yaml:"initialLimit"`
	MinLimit     float64       `yaml:"minLimit"`
	MaxLimit     float64       `yaml:"maxLimit"`
	SlowStart    Duration      `yaml:"slowStart"`
	Window       Duration      `yaml:"window"`
	Queue        AdaptiveQueue `yaml:"queue"`

	AIMD      limit.AIMD      `yaml:"aimd"`
	Vegas     limit.Vegas     `yaml:"vegas"`
	Gradient2 limit.Gradient2 `yaml:"gradient2"`
	Gradient  limit.Gradient  `yaml:"gradient"`
	Greed     limit.Greed     `yaml:"greed"`
}

// AdaptiveQueue is the adaptive limit's optional wait queue (depth 0: refuse at once).
type AdaptiveQueue struct {
	Depth   int64    `yaml:"depth"`
	MaxWait Duration `yaml:"maxWait"`
}

// DefaultAdaptive is the adaptive block's defaults: sized for a sidecar in front of a small
// backend (a floor of 1, a warm start at 4 with a 10 s slow-start ramp).
func DefaultAdaptive() Adaptive {
	p := limit.DefaultParams()
	return Adaptive{
		Algorithm:    DefaultAlgorithm,
		InitialLimit: 4,
		MinLimit:     1,
		MaxLimit:     256,
		SlowStart:    Duration(10e9),
		Window:       Duration(100e6),
		Queue:        AdaptiveQueue{Depth: 0, MaxWait: Duration(50e6)},
		AIMD:         p.AIMD, Vegas: p.Vegas, Gradient2: p.Gradient2, Gradient: p.Gradient, Greed: p.Greed,
	}
}

func (a *Adaptive) setDefaults() { *a = DefaultAdaptive() }

func (a *Adaptive) params() limit.Params {
	return limit.Params{AIMD: a.AIMD, Vegas: a.Vegas, Gradient2: a.Gradient2, Gradient: a.Gradient, Greed: a.Greed}
}

func (a *Adaptive) validate(errs *Problems, path string) {
	if _, err := limit.New(a.Algorithm, a.params()); err != nil {
		var ce *limit.ConfigError
		if errors.As(err, &ce) {
			for _, p := range ce.Problems {
				field, msg, _ := strings.Cut(p, ": ")
				errs.add(path+"."+field, "%s", msg)
			}
		} else {
			errs.add(path+".algorithm", "%v", err)
		}
	}
	if !(a.MinLimit >= 1) {
		errs.add(path+".minLimit", "must be at least 1, got %v", a.MinLimit)
	}
	if !(a.MaxLimit >= a.MinLimit) {
		errs.add(path+".maxLimit", "must be at least minLimit (%v), got %v", a.MinLimit, a.MaxLimit)
	}
	if !(a.InitialLimit >= a.MinLimit && a.InitialLimit <= a.MaxLimit) {
		errs.add(path+".initialLimit", "must lie within [minLimit, maxLimit] = [%v, %v], got %v", a.MinLimit, a.MaxLimit, a.InitialLimit)
	}
	nonNegative(errs, path+".slowStart", a.SlowStart)
	positive(errs, path+".window", a.Window)
	if a.Queue.Depth < 0 {
		errs.add(path+".queue.depth", "must not be negative, got %d", a.Queue.Depth)
	}
	if a.Queue.Depth > 0 {
		positive(errs, path+".queue.maxWait", a.Queue.MaxWait)
	}
}

func (a *Adaptive) config(prio admission.PriorityConfig) (admission.AdaptiveConfig, error) {
	algo, err := limit.New(a.Algorithm, a.params())
	if err != nil {
		return admission.AdaptiveConfig{}, err
	}
	return admission.AdaptiveConfig{
		Algorithm: algo, InitialLimit: a.InitialLimit, MinLimit: a.MinLimit, MaxLimit: a.MaxLimit,
		SlowStart: a.SlowStart.D(), Window: a.Window.D(),
		QueueDepth: a.Queue.Depth, MaxWait: a.Queue.MaxWait.D(), Priorities: prio,
	}, nil
}

func (a *Adaptive) build(prio admission.PriorityConfig) (admission.Core, error) {
	c, err := a.config(prio)
	if err != nil {
		return nil, err
	}
	return admission.NewAdaptive(c)
}

// CoDel configures the controlled-delay queue. Concurrency 0 puts the adaptive limit (the
// admission.adaptive block) in front of the queue instead of a fixed one.
type CoDel struct {
	Concurrency int64    `yaml:"concurrency"`
	Target      Duration `yaml:"target"`
	Interval    Duration `yaml:"interval"`
	Depth       int64    `yaml:"depth"`
	MaxWait     Duration `yaml:"maxWait"`
}

// DefaultCoDel is the codel block's defaults: CoDel's own 5 ms target and 100 ms interval, an
// adaptive limit, and a queue of 128.
func DefaultCoDel() CoDel {
	return CoDel{Concurrency: 0, Target: Duration(5e6), Interval: Duration(100e6), Depth: 128}
}

func (c *CoDel) setDefaults() { *c = DefaultCoDel() }

func (c *CoDel) validate(errs *Problems, path string) {
	if c.Concurrency < 0 {
		errs.add(path+".concurrency", "must not be negative (0 means an adaptive limit), got %d", c.Concurrency)
	}
	positive(errs, path+".target", c.Target)
	if c.Interval <= c.Target {
		errs.add(path+".interval", "must exceed target (%s), got %s", c.Target, c.Interval)
	}
	if c.Depth < 1 {
		errs.add(path+".depth", "must be at least 1, got %d", c.Depth)
	}
	nonNegative(errs, path+".maxWait", c.MaxWait)
}

func (c *CoDel) build(adaptive *Adaptive, prio admission.PriorityConfig) (admission.Core, error) {
	cc := admission.CoDelConfig{
		Concurrency: c.Concurrency, Target: c.Target.D(), Interval: c.Interval.D(),
		Depth: c.Depth, MaxWait: c.MaxWait.D(), Priorities: prio,
	}
	if c.Concurrency == 0 && adaptive != nil {
		ac, err := adaptive.config(prio)
		if err != nil {
			return nil, err
		}
		cc.Adaptive = &ac
	}
	return admission.NewCoDel(cc)
}
