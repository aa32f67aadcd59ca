package config

import (
	"fmt"
	"reflect"

	"go.yaml.in/yaml/v3"

	"github.com/loadshed/loadshed/pkg/admission"
)

// Admission selects and tunes the admission strategy: admission.strategy names a kind of the
// registry, and the kind's settings block sits beside it under its own key (tokenBucket,
// boundedQueue, adaptive, ...). Blocks that are written but not selected are still validated, so
// a typo does not wait for the day someone selects that strategy.
type Admission struct {
	Strategy string `yaml:"strategy"`
	// DryRun counts would-be sheds in metrics but admits every request.
	DryRun bool `yaml:"dryRun"`
	// Chain holds the stages of strategy "chain", each a single settings block.
	Chain      []Stage    `yaml:"chain"`
	Priorities Priorities `yaml:"priorities"`
	// Cohorts, when present, ranks the requests of each priority class and refuses the bottom of
	// the ranking first, alike in every sidecar of a call graph (docs/cohorts.md). It works with
	// every strategy; with none, the sidecar only assigns ranks (an entry sidecar).
	Cohorts *Cohorts `yaml:"cohorts"`

	// blocks holds the settings blocks written, by block key.
	blocks map[string]Block
}

// Priorities shares a concurrency limit between priority levels: requests of priority
// reservedFor or more important may hold up to reserved x limit permits beyond the limit, while
// everyone may use the limit itself (less important levels borrow what the important ones leave
// idle). Queues always serve the most important first.
type Priorities struct {
	Reserved    float64 `yaml:"reserved"`
	ReservedFor string  `yaml:"reservedFor"`
}

// Stage is one element of a chain: exactly one strategy's settings block.
type Stage struct {
	blocks map[string]Block
}

// Use returns an admission block that selects b's strategy with b's settings.
func Use(b Block) Admission { return Admission{Strategy: b.kind().Name}.With(b) }

// Named returns an admission block that selects the strategy called name with its defaults (for
// strategies whose defaults are complete: none, adaptive, codel).
func Named(name string) Admission { return Admission{Strategy: name} }

// ChainOf returns an admission block for a chain of the given stages, in order.
func ChainOf(stages ...Block) Admission {
	a := Admission{Strategy: StrategyChain}
	for _, b := range stages {
		a.Chain = append(a.Chain, Stage{blocks: map[string]Block{b.kind().Block: b}})
	}
	return a
}

// With returns a copy of a holding b as the settings block of b's strategy.
func (a Admission) With(b Block) Admission {
	m := make(map[string]Block, len(a.blocks)+1)
	for k, v := range a.blocks {
		m[k] = v
	}
	m[b.kind().Block] = b
	a.blocks = m
	return a
}

// BlockOf returns the settings block of type T in a: the one written, or the strategy's
// defaults when none was (the zero T when no registry entry has type T).
func BlockOf[T Block](a *Admission) T {
	for _, k := range registry {
		if k.New == nil {
			continue
		}
		if b, ok := a.blocks[k.Block].(T); ok {
			return b
		}
		if b, ok := k.New().(T); ok {
			return b
		}
	}
	var zero T
	return zero
}

// Block returns the stage's settings block (nil for an empty stage).
func (s *Stage) Block() Block {
	for _, key := range blockKeys() {
		if b := s.blocks[key]; b != nil {
			return b
		}
	}
	return nil
}

// block returns the settings block of kind k: the one written, or k's defaults.
func (a *Admission) block(k *Kind) Block {
	if b := a.blocks[k.Block]; b != nil {
		return b
	}
	return k.New()
}

// DefaultStrategy is the strategy of a configuration that names none: the file's admission
// block, a route's, or a file with no admission block at all. Adaptive needs no sizing, and
// protects a service whose capacity nobody measured; the chart and inject default to it too.
const DefaultStrategy = StrategyAdaptive

// setDefaults: a route's admission block starts without a strategy; defaultStrategy gives it
// one once it is decoded.
func (a *Admission) setDefaults() { *a = Admission{} }

// defaultStrategy gives a decoded block that names no strategy DefaultStrategy, unless it holds
// the settings of a strategy that needs them (an inflight block, a chain, ...): the writer
// surely meant that strategy, and running another instead would be a surprise.
func (a *Admission) defaultStrategy(errs *Problems, path string) {
	if a.Strategy != "" {
		return
	}
	if len(a.Chain) > 0 {
		errs.add(path+".strategy", "required with a chain: write strategy: chain (a block without a strategy runs %s)", DefaultStrategy)
		return
	}
	for _, k := range registry {
		if k.Required && a.blocks[k.Block] != nil {
			errs.add(path+".strategy", "required with the %s block: write strategy: %s (a block without a strategy runs %s)", k.Block, k.Name, DefaultStrategy)
			return
		}
	}
	a.Strategy = DefaultStrategy
}

// extraField decodes the registry's block keys: a block written in the file starts from its
// kind's defaults.
func (a *Admission) extraField(key string) (reflect.Value, bool) {
	return decodeBlock(&a.blocks, key)
}

func (s *Stage) extraField(key string) (reflect.Value, bool) { return decodeBlock(&s.blocks, key) }

func decodeBlock(m *map[string]Block, key string) (reflect.Value, bool) {
	k, ok := kindOfBlock(key)
	if !ok {
		return reflect.Value{}, false
	}
	if *m == nil {
		*m = map[string]Block{}
	}
	b := (*m)[key]
	if b == nil {
		b = k.New()
		(*m)[key] = b
	}
	return reflect.ValueOf(b).Elem(), true
}

func (a *Admission) validate(errs *Problems, path string) {
	k, known := Lookup(a.Strategy)
	switch {
	case a.Strategy == "":
		errs.add(path+".strategy", "required: one of %s", strategyList())
		return
	case !known:
		errs.add(path+".strategy", "unknown strategy %q (want one of %s)", a.Strategy, strategyList())
		return
	case k.Name == StrategyChain:
		if len(a.Chain) == 0 {
			errs.add(path+".chain", "required when strategy is chain: a list of strategy blocks, e.g. [{tokenBucket: {...}}, {boundedQueue: {...}}]")
		}
		for i := range a.Chain {
			a.Chain[i].validate(errs, fmt.Sprintf("%s.chain[%d]", path, i))
		}
	case k.Required && a.blocks[k.Block] == nil:
		errs.add(path+"."+k.Block, "required by the selected strategy")
	}
	for _, key := range blockKeys() {
		if b := a.blocks[key]; b != nil {
			b.validate(errs, path+"."+key, placement{})
		}
	}
	errs.nest(path+".priorities", admission.PriorityConfig{Reserved: a.Priorities.Reserved}.Validate())
	if a.Priorities.ReservedFor != "" {
		if _, err := admission.ParsePriority(a.Priorities.ReservedFor); err != nil {
			errs.add(path+".priorities.reservedFor", "%v", err)
		}
	}
	if a.Priorities.Reserved > 0 && k.New != nil && !k.Concurrency {
		errs.add(path+".priorities.reserved", "applies to concurrency limits (inflight, bounded-queue, adaptive, codel), not to %s", a.Strategy)
	}
	a.Cohorts.validate(errs, path+".cohorts")
}

func (s *Stage) validate(errs *Problems, path string) {
	n := 0
	for _, key := range blockKeys() {
		if b := s.blocks[key]; b != nil {
			n++
			b.validate(errs, path+"."+key, placement{stage: true})
		}
	}
	if n != 1 {
		errs.add(path, "each chain element must hold exactly one strategy block (%s), found %d", joinOr(blockKeys()), n)
	}
}

// Build returns the admission core the configuration describes. Call it on a validated
// configuration; each call returns fresh state.
func (a *Admission) Build() (admission.Core, error) {
	k, ok := Lookup(a.Strategy)
	if !ok {
		return nil, fmt.Errorf("unknown strategy %q", a.Strategy)
	}
	env := a.env()
	switch {
	case k.Name == StrategyChain:
		stages := make([]admission.Core, 0, len(a.Chain))
		for i := range a.Chain {
			b := a.Chain[i].Block()
			if b == nil {
				return nil, fmt.Errorf("chain[%d]: empty stage", i)
			}
			c, err := b.build(buildEnv{prio: env.prio})
			if err != nil {
				return nil, fmt.Errorf("chain[%d]: %w", i, err)
			}
			stages = append(stages, c)
		}
		return admission.NewChain(stages...)
	case k.New == nil:
		return admission.NewNone(), nil
	}
	return a.block(k).build(env)
}

func (a *Admission) env() buildEnv {
	p := admission.PriorityConfig{Reserved: a.Priorities.Reserved}
	if a.Priorities.ReservedFor != "" {
		p.ReservedFor, _ = admission.ParsePriority(a.Priorities.ReservedFor)
	}
	return buildEnv{prio: p, adaptive: BlockOf[*Adaptive](a)}
}

// ConcurrencyHint estimates how many requests the strategy lets through at once, to size the
// upstream connection pool.
func (a *Admission) ConcurrencyHint() int {
	hint := 128 // none, or a strategy this build does not know
	if k, ok := Lookup(a.Strategy); ok {
		switch {
		case k.Name == StrategyChain:
			hint = 0
			for i := range a.Chain {
				if b := a.Chain[i].Block(); b != nil {
					hint = max(hint, b.concurrencyHint(buildEnv{}))
				}
			}
		case k.New != nil:
			hint = a.block(k).concurrencyHint(a.env())
		}
	}
	return min(max(hint, 1), 4096)
}

// MarshalYAML writes the block as the config file spells it: the strategy, the settings blocks
// that are set (in registry order), the chain and the priorities.
func (a Admission) MarshalYAML() (any, error) {
	n := &yaml.Node{Kind: yaml.MappingNode}
	if err := addYAML(n, "strategy", a.Strategy); err != nil {
		return nil, err
	}
	if a.DryRun {
		if err := addYAML(n, "dryRun", true); err != nil {
			return nil, err
		}
	}
	for _, key := range blockKeys() {
		if b := a.blocks[key]; b != nil {
			if err := addYAML(n, key, b); err != nil {
				return nil, err
			}
		}
	}
	if len(a.Chain) > 0 {
		if err := addYAML(n, "chain", a.Chain); err != nil {
			return nil, err
		}
	}
	if a.Priorities != (Priorities{}) {
		if err := addYAML(n, "priorities", a.Priorities); err != nil {
			return nil, err
		}
	}
	if a.Cohorts != nil {
		if err := addYAML(n, "cohorts", a.Cohorts); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// MarshalYAML writes the stage as a one-key mapping.
func (s Stage) MarshalYAML() (any, error) {
	n := &yaml.Node{Kind: yaml.MappingNode}
	for _, key := range blockKeys() {
		if b := s.blocks[key]; b != nil {
			if err := addYAML(n, key, b); err != nil {
				return nil, err
			}
		}
	}
	return n, nil
}

func addYAML(m *yaml.Node, key string, v any) error {
	var val yaml.Node
	if err := val.Encode(v); err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: key}, &val)
	return nil
}

func joinOr(items []string) string {
	switch len(items) {
	case 0:
		return ""
	case 1:
		return items[0]
	}
	s := ""
	for i, it := range items[:len(items)-1] {
		if i > 0 {
			s += ", "
		}
		s += it
	}
	return s + " or " + items[len(items)-1]
}

// rated is a settings block that admits at a configured rate (token-bucket, leaky-bucket).
type rated interface{ rate() float64 }

func (b *TokenBucket) rate() float64 { return b.Rate }
func (b *LeakyBucket) rate() float64 { return b.Rate }

// Rate is the request rate the strategy admits at most, per second (for a chain, its lowest
// rate stage); 0 for a strategy that limits no rate. A load report's utilization of a rate
// strategy is the admitted share of it.
func (a *Admission) Rate() float64 {
	k, ok := Lookup(a.Strategy)
	if !ok {
		return 0
	}
	var blocks []Block
	switch {
	case k.Name == StrategyChain:
		for i := range a.Chain {
			blocks = append(blocks, a.Chain[i].Block())
		}
	case k.New != nil:
		blocks = append(blocks, a.block(k))
	}
	lowest := 0.0
	for _, b := range blocks {
		if r, ok := b.(rated); ok && r.rate() > 0 && (lowest == 0 || r.rate() < lowest) {
			lowest = r.rate()
		}
	}
	return lowest
}
