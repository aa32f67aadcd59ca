package config

import (
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
	"github.com/loadshed/loadshed/pkg/admission/limit"
)

// DefaultAlgorithm is the limit algorithm of the adaptive strategy when none is named.
const DefaultAlgorithm = limit.NameGradient

// Adaptive configures the latency-driven concurrency limit. Nothing about the backend's capacity
// needs to be known: the algorithm finds the limit from latency samples.
type Adaptive struct {
	Algorithm    string   `yaml:"algorithm"`
	InitialLimit float64  `yaml:"initialLimit"`
	MinLimit     float64  `yaml:"minLimit"`
	MaxLimit     float64  `yaml:"maxLimit"`
	SlowStart    Duration `yaml:"slowStart"`
	Window       Duration `yaml:"window"`
	// Tolerance: a window whose median latency is at most this shows no overload, whatever its
	// MinRTT (scheduling noise in front of a backend that answers in microseconds).
	Tolerance Duration      `yaml:"tolerance"`
	Queue     AdaptiveQueue `yaml:"queue"`

	AIMD      limit.AIMD      `yaml:"aimd"`
	Vegas     limit.Vegas     `yaml:"vegas"`
	Gradient2 limit.Gradient2 `yaml:"gradient2"`
	Gradient  limit.Gradient  `yaml:"gradient"`
	Greed     limit.Greed     `yaml:"greed"`
}

// AdaptiveQueue is the adaptive limit's wait queue. When Depth is 0 its depth follows the limit
// (DepthPerLimit) and each wait is bounded by MaxWait and, when WaitPerRTT is set, by that share
// of the no-load latency; a fixed Depth is the user's own queue, bounded by MaxWait alone.
// Depth and DepthPerLimit both 0: refuse at once.
type AdaptiveQueue struct {
	Depth         int64    `yaml:"depth"`
	DepthPerLimit float64  `yaml:"depthPerLimit"`
	MaxWait       Duration `yaml:"maxWait"`
	WaitPerRTT    float64  `yaml:"waitPerRTT"`
	// Lead: a request in flight for the latency expected less Lead is about to finish and
	// lets the next one in, lending its slot once (admission.AdaptiveConfig.Lead), never more
	// than LeadShare of that latency. 0: off. The default, 2 ms, is measured in
	// docs/benchmarks.md ("The adaptive tail"): a sidecar's loopback hop and the wake-ups of
	// two processes on a busy node take some hundreds of microseconds, its timers fire some
	// hundreds late, and Envoy's external processor adds a round trip to the sidecar.
	Lead Duration `yaml:"lead"`
	// LeadShare: the lead in effect is at most this share of the latency expected (above 0, at
	// most 0.5; default 0.05, a twentieth), so that a backend answering in a millisecond or two
	// is not sent requests it cannot start yet. Behind Envoy's external processor, whose hop is
	// about twice a sidecar's, lead 4ms with leadShare 0.1 held the limit on a 40 ms backend's
	// workers where the defaults' climbed above them (a lower p99 at the same goodput), but held
	// it above them through one halving in two (docs/envoy-istio.md).
	LeadShare float64 `yaml:"leadShare"`
	// Order is fifo, lifo (newest first, within a priority level), or empty: lifo for the queue
	// that follows the limit, fifo for a fixed Depth.
	Order string `yaml:"order"`
}

// lifo: the order asked for, else newest first for the queue that follows the limit and first
// come first served for a fixed depth (the user's own queue, as before the share existed).
func (q AdaptiveQueue) lifo() bool {
	return q.Order == "lifo" || (q.Order == "" && q.Depth == 0)
}

// DefaultAdaptiveQueue is the adaptive limit's default queue: half the limit may wait, newest
// first (Order empty), each for at most a tenth of the no-load latency and never more than
// 50 ms, and a slot is handed over 2 ms before it frees (at most a twentieth of the latency,
// LeadShare).
// It fills a slot the moment it frees (without it the backend idles from a completion to the
// next arrival, a few per cent of its capacity under overload) and adds at most a tenth of a
// service time to an admitted request (a quarter before issue 35: with the limit on the
// backend's workers a longer wait only queues).
func DefaultAdaptiveQueue() AdaptiveQueue {
	return AdaptiveQueue{DepthPerLimit: 0.5, MaxWait: Duration(50e6), WaitPerRTT: 0.1, Lead: Duration(DefaultLead), LeadShare: admission.DefaultLeadShare}
}

// DefaultLead is the adaptive queue's default lead (AdaptiveQueue.Lead).
const DefaultLead = 2 * time.Millisecond

// DefaultTolerance is the adaptive limit's default tolerance: latency below 2 ms is never read as
// overload. A sidecar's own scheduling noise is of that order; a backend of a few milliseconds or
// more is judged on its latency as before.
const DefaultTolerance = 2 * time.Millisecond

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
		Tolerance:    Duration(DefaultTolerance),
		Queue:        DefaultAdaptiveQueue(),
		AIMD:         p.AIMD, Vegas: p.Vegas, Gradient2: p.Gradient2, Gradient: p.Gradient, Greed: p.Greed,
	}
}

// setDefaults: a block written in the file starts from the defaults, not from zero.
func (a *Adaptive) setDefaults() { *a = DefaultAdaptive() }

func (a *Adaptive) kind() *Kind { return kindNamed(StrategyAdaptive) }

func (a *Adaptive) params() limit.Params {
	return limit.Params{AIMD: a.AIMD, Vegas: a.Vegas, Gradient2: a.Gradient2, Gradient: a.Gradient, Greed: a.Greed}
}

func (a *Adaptive) core(algo limit.Algorithm, prio admission.PriorityConfig) admission.AdaptiveConfig {
	return admission.AdaptiveConfig{
		Algorithm: algo, InitialLimit: a.InitialLimit, MinLimit: a.MinLimit, MaxLimit: a.MaxLimit,
		SlowStart: a.SlowStart.D(), Window: a.Window.D(), Tolerance: a.Tolerance.D(),
		QueueDepth: a.Queue.Depth, QueuePerLimit: a.Queue.DepthPerLimit, MaxWait: a.Queue.MaxWait.D(),
		WaitPerRTT: a.Queue.WaitPerRTT, Lead: a.Queue.Lead.D(), LeadShare: a.Queue.LeadShare, QueueLIFO: a.Queue.lifo(), Priorities: prio,
	}
}

// config returns the strategy's configuration with its algorithm built from the tuning blocks.
func (a *Adaptive) config(prio admission.PriorityConfig) (admission.AdaptiveConfig, error) {
	algo, err := limit.New(a.Algorithm, a.params())
	if err != nil {
		return admission.AdaptiveConfig{}, err
	}
	return a.core(algo, prio), nil
}

func (a *Adaptive) validate(errs *Problems, path string, _ placement) {
	algo, err := limit.New(a.Algorithm, a.params())
	errs.nest(path, err)
	if algo == nil {
		// The algorithm's own problems are reported above; check the other fields with a stand-in
		// so that a bad algorithm does not hide them.
		algo, _ = limit.New(DefaultAlgorithm, limit.DefaultParams())
	}
	errs.nest(path, a.core(algo, admission.PriorityConfig{}).Validate())
	if a.Queue.LeadShare == 0 {
		// The admission core reads 0 as its default; in the file it is a mistake (lead: 0s is off).
		errs.add(path+".queue.leadShare", "must be above 0 and at most %v (lead: 0s turns the lead off), got 0", admission.MaxLeadShare)
	}
	if o := a.Queue.Order; o != "" && o != "fifo" && o != "lifo" {
		errs.add(path+".queue.order", "must be fifo or lifo (or empty: lifo unless depth is fixed), got %q", o)
	}
}

func (a *Adaptive) build(env buildEnv) (admission.Core, error) {
	c, err := a.config(env.prio)
	if err != nil {
		return nil, err
	}
	return admission.NewAdaptive(c)
}

func (a *Adaptive) concurrencyHint(buildEnv) int { return int(a.MaxLimit) }

// CoDel configures the controlled-delay queue. Concurrency 0 puts the adaptive limit (the
// admission block's adaptive settings) in front of the queue instead of a fixed one.
type CoDel struct {
	Concurrency int64    `yaml:"concurrency"`
	Target      Duration `yaml:"target"`
	Interval    Duration `yaml:"interval"`
	Depth       int64    `yaml:"depth"`
	// MaxWait bounds a wait while the queue is not overloaded; 0 means two intervals.
	MaxWait Duration `yaml:"maxWait"`
}

// DefaultCoDel is the codel block's defaults: CoDel's own 5 ms target and 100 ms interval, an
// adaptive limit, and a queue of 128.
func DefaultCoDel() CoDel {
	return CoDel{Concurrency: 0, Target: Duration(5e6), Interval: Duration(100e6), Depth: 128}
}

// setDefaults: a block written in the file starts from the defaults, not from zero.
func (c *CoDel) setDefaults() { *c = DefaultCoDel() }

func (c *CoDel) kind() *Kind { return kindNamed(StrategyCoDel) }

func (c *CoDel) core(adaptive *admission.AdaptiveConfig, prio admission.PriorityConfig) admission.CoDelConfig {
	return admission.CoDelConfig{
		Concurrency: c.Concurrency, Adaptive: adaptive, Target: c.Target.D(), Interval: c.Interval.D(),
		Depth: c.Depth, MaxWait: c.MaxWait.D(), Priorities: prio,
	}
}

func (c *CoDel) validate(errs *Problems, path string, at placement) {
	// The adaptive limit in front of the queue has a block of its own, validated where it is
	// written; the defaults stand in for it here.
	stand, _ := (&Adaptive{}).standIn()
	errs.nest(path, c.core(&stand, admission.PriorityConfig{}).Validate())
	if at.stage && c.Concurrency == 0 {
		errs.add(path+".concurrency", "a chain stage needs a fixed concurrency (an adaptive CoDel reads the top-level adaptive block)")
	}
}

// standIn returns the default adaptive configuration, which is always valid.
func (*Adaptive) standIn() (admission.AdaptiveConfig, error) {
	d := DefaultAdaptive()
	return d.config(admission.PriorityConfig{})
}

func (c *CoDel) build(env buildEnv) (admission.Core, error) {
	var ac *admission.AdaptiveConfig
	if c.Concurrency == 0 && env.adaptive != nil {
		cfg, err := env.adaptive.config(env.prio)
		if err != nil {
			return nil, err
		}
		ac = &cfg
	}
	return admission.NewCoDel(c.core(ac, env.prio))
}

func (c *CoDel) concurrencyHint(env buildEnv) int {
	if c.Concurrency == 0 && env.adaptive != nil {
		return env.adaptive.concurrencyHint(env)
	}
	return int(c.Concurrency)
}
