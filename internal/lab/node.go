package lab

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// Node models a busy node: other processes on the same cores (the load generator, the
// cluster's control plane, a neighbour's build) stretch every service time and path hop that
// starts in a stretch of time by a factor of their own. Time is cut into epochs; each epoch's
// factor is 1 + Spread x |N(0, 1)|, or Stall when that epoch stalls (with probability
// StallProb). A factor is drawn from the run's seed and the epoch's index alone, so the same
// scenario slows the same moments down for every strategy. The zero value is a quiet node.
//
// What it stands for: on a two-core kind node under the e2e's load, the window medians of a
// 20 ms backend wandered 1-8% over the no-load estimate at a fixed limit, and about one window
// in fifty read 1.5-2x (docs/testing.md); Spread 0.04 with StallProb 0.02 and Stall 1.8 gives
// medians like those.
type Node struct {
	// Spread is the relative spread of the slowdown (0: none).
	Spread float64
	// Epoch is how long one factor lasts (default 100 ms when Spread or StallProb is set).
	Epoch time.Duration
	// StallProb is the chance that an epoch stalls, and Stall its factor (default 2).
	StallProb float64
	Stall     float64
}

// IsZero reports a quiet node.
func (n Node) IsZero() bool { return n.Spread == 0 && n.StallProb == 0 }

// String describes the node in the syntax ParseNode reads.
func (n Node) String() string {
	if n.IsZero() {
		return "quiet"
	}
	n = n.withDefaults()
	return fmt.Sprintf("spread=%s,epoch=%s,stall=%s,stallFactor=%s", fmtFloat(n.Spread), n.Epoch, fmtFloat(n.StallProb), fmtFloat(n.Stall))
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func (n Node) withDefaults() Node {
	if n.Epoch == 0 {
		n.Epoch = 100 * time.Millisecond
	}
	if n.Stall == 0 {
		n.Stall = 2
	}
	return n
}

// validate reports every problem, each naming its field under node.
func (n Node) validate(bad func(field, format string, args ...any)) {
	if !(n.Spread >= 0 && n.Spread <= 10) {
		bad("node.spread", "must be in [0, 10], got %v", n.Spread)
	}
	if n.Epoch < 0 || n.Epoch > time.Minute || (n.Epoch > 0 && n.Epoch < time.Millisecond) {
		bad("node.epoch", "must be in [1ms, 1m] (or 0 for 100ms), got %s", n.Epoch)
	}
	if !(n.StallProb >= 0 && n.StallProb <= 1) {
		bad("node.stall", "must be a probability in [0, 1], got %v", n.StallProb)
	}
	if n.Stall != 0 && !(n.Stall >= 1 && n.Stall <= 100) {
		bad("node.stallFactor", "must be in [1, 100] (or 0 for 2), got %v", n.Stall)
	}
}

// ParseNode parses a --node spec:
//
//	quiet | none                          no slowdown
//	busy                                  spread=0.04,epoch=100ms,stall=0.02,stallFactor=1.8
//	spread=0.05[,epoch=100ms][,stall=0.02][,stallFactor=2]
func ParseNode(spec string) (Node, error) {
	spec = strings.TrimSpace(spec)
	switch spec {
	case "", "quiet", "none":
		return Node{}, nil
	case "busy":
		return BusyNode(), nil
	}
	kv, err := parseKV(spec, []string{"spread", "epoch", "stall", "stallFactor"})
	if err != nil {
		return Node{}, fmt.Errorf("node %q: %w", spec, err)
	}
	var n Node
	for _, f := range []struct {
		key  string
		into *float64
	}{{"spread", &n.Spread}, {"stall", &n.StallProb}, {"stallFactor", &n.Stall}} {
		if _, ok := kv[f.key]; !ok {
			continue
		}
		if *f.into, err = floatKey(kv, f.key); err != nil {
			return Node{}, fmt.Errorf("node %q: %w", spec, err)
		}
	}
	if _, ok := kv["epoch"]; ok {
		if n.Epoch, err = durKey(kv, "epoch"); err != nil {
			return Node{}, fmt.Errorf("node %q: %w", spec, err)
		}
	}
	var errs []string
	n.validate(func(field, format string, args ...any) {
		errs = append(errs, field+": "+fmt.Sprintf(format, args...))
	})
	if len(errs) > 0 {
		return Node{}, fmt.Errorf("node %q: %s", spec, strings.Join(errs, "; "))
	}
	return n, nil
}

// BusyNode is the node the "busy" spec names: medians like a two-core kind node's under load.
func BusyNode() Node {
	return Node{Spread: 0.04, Epoch: 100 * time.Millisecond, StallProb: 0.02, Stall: 1.8}
}

// nodeClock gives the slowdown factor at a virtual time.
type nodeClock struct {
	n       Node
	seed    uint64
	last    int64 // index of the cached epoch, -1 before the first
	current float64
}

func newNodeClock(n Node, seed uint64) *nodeClock {
	return &nodeClock{n: n.withDefaults(), seed: seed ^ 0x6e0de5eed, last: -1, current: 1}
}

// factor returns the slowdown at virtual time t (nanoseconds from the start).
func (c *nodeClock) factor(t int64) float64 {
	if c.n.IsZero() {
		return 1
	}
	i := t / int64(c.n.Epoch)
	if i == c.last {
		return c.current
	}
	r := rand.New(rand.NewPCG(c.seed, uint64(i)))
	f := 1 + c.n.Spread*math.Abs(r.NormFloat64())
	if r.Float64() < c.n.StallProb {
		f = math.Max(f, c.n.Stall)
	}
	c.last, c.current = i, f
	return f
}
