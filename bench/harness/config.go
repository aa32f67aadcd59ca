package harness

import (
	"errors"
	"fmt"
	"time"
)

// Config is one harness run.
type Config struct {
	// RepoRoot is the repository checkout (for go build, the k6 scripts and install-tools.sh).
	// Paths on the machine that ran are left out of points.json.
	RepoRoot string `json:"-"`
	// OutDir receives report.md, points.csv, summary.csv, the charts and the raw k6 summaries.
	OutDir string `json:"-"`
	// WorkDir holds generated configs and logs; empty: a new temporary directory, removed at
	// the end unless KeepWork is set.
	WorkDir  string `json:"-"`
	KeepWork bool

	// Binaries; an empty path is built (Go binaries) or looked up / installed (peers, k6).
	Bins Binaries `json:"-"`
	// InstallPeers lets the harness apt-get install nginx and HAProxy when they are missing.
	InstallPeers bool

	Backend       Backend
	SLO           time.Duration
	ClientTimeout time.Duration
	// Loads are the overload points, as multiples of the backend's capacity.
	Loads         []float64
	PointDuration time.Duration
	// Spike runs loadtest/k6/spike.js per target: 0.5x for SpikeBase, 5x for SpikeHold, 0.5x for
	// SpikeAfter.
	Spike                            bool
	SpikeBase, SpikeHold, SpikeAfter time.Duration
	// Extra are further scenarios run after the loads and the spike (the long scenario's).
	Extra []Scenario `json:",omitempty"`
	// Variants are extra loadshed adaptive targets, each with its own adaptive block, for
	// tuning runs next to the defaults: "loadshed/adaptive~NAME" (the sidecar) and, in the
	// peers and long scenarios, "envoy+loadshed~NAME" (Envoy's external processor; the adaptive
	// scenario runs no ext_proc door).
	Variants []AdaptiveVariant `json:",omitempty"`
	Repeats  int
	// Targets selects targets by comma-separated name prefixes ("" = all).
	Targets string
	// Pin is the CPU placement: PinNone (default: nothing pinned; every proxy gets one worker
	// thread: nginx and HAProxy one worker, Go proxies GOMAXPROCS=1), PinProxy (the target on
	// CPU 1, the rest free) or PinSplit (backend and target on CPU 1, k6 on CPU 0).
	Pin string
	// MaxLateMs marks a point invalid when iterations start later than this at p99.
	MaxLateMs float64
	// Generator drives each point: GeneratorK6 (empty: the default) or GeneratorLoadgen
	// (overload.js's load only; the adaptive scenario).
	Generator string `json:",omitempty"`
	// Quick marks a CI smoke run: any point that fails to start fails the whole run at once.
	Quick bool
	// TraceEvery, when above 0, reads every target's concurrency limit (loadshed's
	// loadshed_limit, Envoy's adaptive concurrency_limit) at this interval during each point.
	TraceEvery time.Duration

	// fastUpstream replaces the backend with nginx answering 200 at once (the cost scenario's
	// forwarding ceiling).
	fastUpstream bool
	// CommandLine is echoed in the report.
	CommandLine string
}

// CPU placements (Config.Pin).
const (
	PinNone  = "none"
	PinProxy = "proxy"
	PinSplit = "split"
	// pinCost is the cost scenario's placement: backend (and load generator) on CPU 0, target
	// on CPU 1.
	pinCost = "cost"
)

// Binaries are the programs the harness runs.
type Binaries struct {
	Proxy, Backend, PlainProxy  string
	Nginx, HAProxy, K6, Taskset string
	// Envoy defaults to scripts/install-tools.sh envoy; Wrk (the cost scenario) to Debian's wrk.
	Envoy, Wrk string
	// Loadgen is the project's open-loop load generator (cmd/loadgen), which the cost scenario
	// times added latency with; built from the checkout when empty.
	Loadgen string
}

// Validate reports every problem, naming the field.
func (c Config) Validate() error {
	var errs []error
	if c.RepoRoot == "" {
		errs = append(errs, errors.New("RepoRoot: required"))
	}
	if c.OutDir == "" {
		errs = append(errs, errors.New("OutDir: required"))
	}
	if c.ClientTimeout <= 0 {
		errs = append(errs, fmt.Errorf("ClientTimeout: must be above 0, got %s", c.ClientTimeout))
	}
	if len(c.Loads) == 0 && !c.Spike && len(c.Extra) == 0 {
		errs = append(errs, errors.New("Loads: need at least one load point or the spike"))
	}
	for _, l := range c.Loads {
		if l <= 0 || l > 100 {
			errs = append(errs, fmt.Errorf("Loads: %g is not in (0, 100]", l))
		}
	}
	if c.PointDuration < time.Second {
		errs = append(errs, fmt.Errorf("PointDuration: must be at least 1s, got %s", c.PointDuration))
	}
	if c.Spike && (c.SpikeBase < time.Second || c.SpikeHold < time.Second || c.SpikeAfter < time.Second) {
		errs = append(errs, errors.New("SpikeBase, SpikeHold, SpikeAfter: each must be at least 1s"))
	}
	switch c.Generator {
	case "", GeneratorK6, GeneratorLoadgen:
	default:
		errs = append(errs, fmt.Errorf("Generator: want %q or %q, got %q", GeneratorK6, GeneratorLoadgen, c.Generator))
	}
	switch c.Pin {
	case PinNone, PinProxy, PinSplit:
	default:
		errs = append(errs, fmt.Errorf("Pin: want %q, %q or %q, got %q", PinNone, PinProxy, PinSplit, c.Pin))
	}
	if c.Repeats < 1 {
		errs = append(errs, fmt.Errorf("Repeats: must be at least 1, got %d", c.Repeats))
	}
	if c.MaxLateMs <= 0 {
		errs = append(errs, fmt.Errorf("MaxLateMs: must be above 0, got %g", c.MaxLateMs))
	}
	if _, err := DeriveLimits(c.Backend, c.SLO); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Scenario is one k6 script run with its parameters.
type Scenario struct {
	// Name is "0.5x", "2x", ... or "spike".
	Name   string
	Script string
	Load   float64
	Env    map[string]string
	// Warmup, when above 0, runs the same script and load for this long first, unmeasured.
	Warmup time.Duration `json:",omitempty"`
}

func (c Config) scenarios() []Scenario {
	var out []Scenario
	for _, l := range c.Loads {
		out = append(out, Scenario{Name: fmt.Sprintf("%gx", l), Script: "overload.js", Load: l,
			Env: map[string]string{"K": fmt.Sprint(l), "DURATION": c.PointDuration.String()}})
	}
	if c.Spike {
		out = append(out, Scenario{Name: "spike", Script: "spike.js", Load: 5, Env: map[string]string{
			"SPIKE_K": "5", "RAMP_S": "1",
			"BASE_S":  fmt.Sprint(int(c.SpikeBase.Seconds())),
			"HOLD_S":  fmt.Sprint(int(c.SpikeHold.Seconds())),
			"AFTER_S": fmt.Sprint(int(c.SpikeAfter.Seconds())),
		}})
	}
	return append(out, c.Extra...)
}
