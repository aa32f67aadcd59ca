package config

import (
	"strings"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

// Strategy names, as written in admission.strategy. The registry below is the one table that
// describes each; the constants exist for code that must name one.
const (
	StrategyNone         = "none"
	StrategyTokenBucket  = "token-bucket"
	StrategyLeakyBucket  = "leaky-bucket"
	StrategyBoundedQueue = "bounded-queue"
	StrategyInflight     = "inflight"
	StrategyAdaptive     = "adaptive"
	StrategyCoDel        = "codel"
	StrategyChain        = "chain"
)

// Kind describes one admission strategy, once: its name in the config file, the key and type of
// its settings block, its defaults (what New returns) and a line of documentation. Everything
// that lists strategies (validation, building, the chart's schema and helpers, the docs check,
// the lab) reads this table.
//
// Two kinds are structural and have no block type: "none" (admit everything) and "chain" (a list
// of other kinds' blocks under the key "chain").
type Kind struct {
	// Name is the value of admission.strategy ("bounded-queue").
	Name string
	// Block is the key of the settings block in the config file ("boundedQueue").
	Block string
	// Doc is one line on what the strategy does, for generated docs and schema descriptions.
	Doc string
	// New returns a settings block holding the strategy's defaults; nil for none and chain.
	New func() Block
	// Required: the block must be written when the strategy is selected, because its defaults
	// say nothing about the backend (a rate, a limit).
	Required bool
	// Concurrency: the strategy limits requests in flight, so priorities.reserved applies to it.
	Concurrency bool
	// size returns the strategy sized for a known backend (see Sized); nil for strategies told
	// nothing about the backend.
	size func(Backend) Admission
}

// Block is the settings block of one strategy. Its methods are unexported: every block type is
// declared in this package, next to its registry entry.
type Block interface {
	// kind returns the block's registry entry.
	kind() *Kind
	// validate appends every problem of the block to errs, each under path. It delegates to the
	// strategy's own Validate in pkg/admission; only rules about where a block may stand live here.
	validate(errs *Problems, path string, at placement)
	// build returns a fresh core for a validated block.
	build(env buildEnv) (admission.Core, error)
	// concurrencyHint estimates how many requests the strategy lets through at once (to size the
	// upstream connection pool).
	concurrencyHint(env buildEnv) int
}

// placement says where a block stands: at the top of an admission block, or as a chain stage.
type placement struct{ stage bool }

// buildEnv is what a block may use besides its own settings.
type buildEnv struct {
	prio admission.PriorityConfig
	// adaptive is the admission block's adaptive settings, which a codel block without a fixed
	// concurrency puts in front of its queue; nil inside a chain stage.
	adaptive *Adaptive
}

var registry = []Kind{
	{Name: StrategyNone, Doc: "no admission: every request is forwarded (the proxy still counts it)"},
	{Name: StrategyTokenBucket, Block: "tokenBucket", Required: true,
		Doc:  "rate per second with a burst; refused at once (429) with a Retry-After until the next token",
		New:  func() Block { return &TokenBucket{} },
		size: func(b Backend) Admission { return Use(&TokenBucket{Rate: sizedRate(b), Burst: b.Workers}) }},
	{Name: StrategyLeakyBucket, Block: "leakyBucket", Required: true,
		Doc:  "a queue drained at a constant rate up to a depth (nginx limit_req without nodelay)",
		New:  func() Block { return &LeakyBucket{} },
		size: func(b Backend) Admission { return Use(&LeakyBucket{Rate: sizedRate(b), Depth: int64(b.Workers)}) }},
	{Name: StrategyBoundedQueue, Block: "boundedQueue", Required: true, Concurrency: true,
		Doc:  "a fixed concurrency with a bounded wait queue, each wait at most maxWait (503)",
		New:  func() Block { return &BoundedQueue{} },
		size: func(b Backend) Admission { return Use(sizedQueue(b)) }},
	{Name: StrategyInflight, Block: "inflight", Required: true, Concurrency: true,
		Doc:  "at most limit requests in flight; the next one is refused at once (503)",
		New:  func() Block { return &Inflight{} },
		size: func(b Backend) Admission { return Use(&Inflight{Limit: int64(b.Workers)}) }},
	{Name: StrategyAdaptive, Block: "adaptive", Concurrency: true,
		Doc: "an in-flight limit found from latency by a limit algorithm; nothing about capacity configured",
		New: func() Block { b := DefaultAdaptive(); return &b }},
	{Name: StrategyCoDel, Block: "codel", Concurrency: true,
		Doc: "a controlled-delay queue (CoDel, adaptive LIFO) in front of a fixed or the adaptive limit",
		New: func() Block { b := DefaultCoDel(); return &b }},
	{Name: StrategyChain, Block: "chain",
		Doc: "stages that must all admit, in order (e.g. a token bucket, then a bounded queue)",
		size: func(b Backend) Admission {
			return ChainOf(&TokenBucket{Rate: sizedRate(b), Burst: b.Workers}, sizedQueue(b))
		}},
}

// Kinds returns the registry, in documentation order.
func Kinds() []Kind { return registry }

// Strategies lists the strategy names, in documentation order.
var Strategies = func() []string {
	out := make([]string, len(registry))
	for i, k := range registry {
		out[i] = k.Name
	}
	return out
}()

// NameOnly lists the strategies a configuration may select by name alone, with no settings
// block: those whose defaults say nothing about the backend (none, adaptive, codel). A
// configuration generated from a strategy's name (inject, the webhook) can only be one of these;
// the others need a rate or a limit sized for the service.
var NameOnly = func() []string {
	var out []string
	for _, k := range registry {
		if !k.Required && k.Name != StrategyChain {
			out = append(out, k.Name)
		}
	}
	return out
}()

// Lookup returns the kind called name.
func Lookup(name string) (*Kind, bool) {
	for i := range registry {
		if registry[i].Name == name {
			return &registry[i], true
		}
	}
	return nil, false
}

// kindOfBlock returns the kind whose settings block has the given key; false for keys that are
// not a block type's (including "chain").
func kindOfBlock(key string) (*Kind, bool) {
	for i := range registry {
		if k := &registry[i]; k.Block == key && k.New != nil {
			return k, true
		}
	}
	return nil, false
}

// blockKeys lists the keys of every block type, in registry order.
func blockKeys() []string {
	var out []string
	for _, k := range registry {
		if k.New != nil {
			out = append(out, k.Block)
		}
	}
	return out
}

func strategyList() string { return strings.Join(Strategies, ", ") }

// KindOf returns the registry entry of a settings block.
func KindOf(b Block) *Kind { return b.kind() }

// kindNamed returns the registry entry of a strategy this package names.
func kindNamed(name string) *Kind {
	k, ok := Lookup(name)
	if !ok {
		panic("config: no registry entry for " + name)
	}
	return k
}

// Backend is what an operator knows about the service behind the proxy: its workers W, their
// typical service time S and the latency objective. Strategies that must be told the capacity
// are sized from it by Little's law (see Sized).
type Backend struct {
	Workers int
	Service time.Duration
	SLO     time.Duration
}

// Capacity is the backend's throughput C = W / S, in requests per second.
func (b Backend) Capacity() float64 { return float64(b.Workers) / b.Service.Seconds() }

// Sized returns the admission block an operator who knows b would write for strategy k:
// in-flight L = C x S = W; a queue of Q = C x (SLO - S) waiting at most SLO - S; rates at 90% of
// C (a rate at the capacity itself lets a queue build inside the backend) with a burst of W; a
// chain of that token bucket and that bounded queue. The strategies that need no capacity
// (none, adaptive, codel) get their defaults: they are told nothing.
func Sized(k *Kind, b Backend) Admission {
	if k.size == nil {
		return Named(k.Name)
	}
	return k.size(b)
}

// ToldCapacity reports whether Sized tells the strategy the backend's capacity: false for the
// strategies that get their defaults (none, adaptive, codel).
func (k *Kind) ToldCapacity() bool { return k.size != nil }

func sizedRate(b Backend) float64 { return 0.9 * b.Capacity() }

func sizedQueue(b Backend) *BoundedQueue {
	wait := max(b.SLO-b.Service, time.Millisecond)
	depth := max(int64(b.Capacity()*wait.Seconds()), 1)
	return &BoundedQueue{Concurrency: int64(b.Workers), Depth: depth, MaxWait: Duration(wait)}
}
