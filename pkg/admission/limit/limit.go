package limit

import (
	"math"
	"strings"
	"time"

	"github.com/loadshed/loadshed/pkg/admission/field"
)

// Window summarises the samples of one update interval, gathered by the enforcing limiter.
type Window struct {
	Samples int           // successful samples (RTT measured)
	Dropped int           // overload signals: 429, 5xx, timeouts, connection failures
	RTT     time.Duration // the window's latency statistic: p50 of the successful samples' RTT (0 if none)
	// RTTNoise is the sampling error of RTT: the standard error of a median of Samples samples
	// spread as this window's were (from their spread below the median), 0 if unknown. A window's
	// median wanders by about this much with no queue at all; a constant-time backend has
	// almost none, one whose service time spreads has a lot.
	RTTNoise time.Duration
	MinRTT   time.Duration // the no-load latency estimate from the MinRTT estimator (0 if unknown yet)
	// Skew is how far the successful samples' mean lies above their median (0 if not above): a
	// slow tail's share of the time the upstream spends per request, which a median leaves
	// out. With 1% of requests at 15 service times it is an eighth of the mean.
	Skew        time.Duration
	MaxInFlight int // the most requests in flight at once during the window
	Backlog     int // requests waiting in the limiter's own queue at the window's end
	// Blocked is how many requests found the limit taken during the window: they waited for a
	// permit or were refused for one. Demand above the limit, where Backlog is one instant's:
	// with a short wait the queue is empty at most instants however much is refused.
	Blocked  int
	Duration time.Duration // how long the window lasted (0 if unknown)
	// Held is the permits held through the whole window: admitted before it began and still in
	// flight at its end (a slow-tail request still being served, a client still streaming).
	// They take part of the limit without completing, so the window's completions leave them
	// out of the concurrency served.
	Held int
}

// MedianNoise estimates the standard error of the median of sorted (ascending) samples from
// their spread below the median: for a normal spread sigma = (p50 - p10)/1.2816 and the
// median's standard error is 1.2533 sigma/sqrt(n). The lower half is the service time's own
// spread: a queue inside the upstream lengthens only the samples that waited, which sit above
// the median while fewer than half of them wait (an interquartile range took one queued request
// at the knee for noise, and the noise then hid that queue for good), and a slow tail of a few
// per cent moves the median by a rank or two at most. Fewer than 4 samples: 0 (unknown).
func MedianNoise(sorted []time.Duration) time.Duration {
	n := len(sorted)
	if n < 4 {
		return 0
	}
	spread := float64(sorted[n/2] - sorted[n/10])
	return time.Duration(1.2533 * spread / 1.2816 / math.Sqrt(float64(n)))
}

// served is the concurrency the upstream actually served during the window by Little's law:
// completions per second times the no-load latency. With a queue inside the upstream it is the
// upstream's own concurrency, whatever the limit was. ok is false when the window does not say.
func (w Window) served(minRTT float64) (float64, bool) {
	if w.Duration <= 0 || w.Samples < 2 || !(minRTT > 0) {
		return 0, false
	}
	return float64(w.Samples) / w.Duration.Seconds() * minRTT, true
}

// Algorithm computes a new concurrency limit from the current one and a window of samples.
// Implementations are pure: no locks, no clock, no metrics, no goroutines; they may keep state
// of their own (e.g. an EMA), are not safe for concurrent use, and are deterministic.
type Algorithm interface {
	// Name is the algorithm's configuration name (NameAIMD, NameVegas, ...).
	Name() string
	// Update returns the next limit. The caller clamps it to [min, max] and enforces its whole
	// part always and its fractional part as a share of time (one permit more for that share),
	// so Update may return fractional values.
	Update(limit float64, w Window) float64
}

// QueueKeeper is implemented by an algorithm that may hold its limit above what a window's latency
// asks for, on purpose, keeping a request or two waiting inside the upstream (the gradient
// with a rest, on a service time that spreads). Such a window's median carries a queue
// the limit keeps, not the upstream's no-load latency, and an algorithm that reckons served
// concurrency with an estimate learned from it reads that queue as served concurrency and keeps
// a longer one. After each Update the enforcing limiter asks, and leaves a window it was told
// of out of its no-load estimate (see MinRTT.Peek), up to nine in a row.
type QueueKeeper interface {
	// KeptQueue reports whether the last Update held the limit up that way, with the
	// window's latency still within what such a queue explains.
	KeptQueue() bool
}

// Names of the algorithms, as written in the config file's adaptive.algorithm.
const (
	NameAIMD      = "aimd"
	NameVegas     = "vegas"
	NameGradient2 = "gradient2"
	NameGradient  = "gradient"
	NameGreed     = "greed"
)

// Names lists every algorithm name, in a stable order.
func Names() []string {
	return []string{NameAIMD, NameVegas, NameGradient2, NameGradient, NameGreed}
}

// MinMeaningfulRTT is the shortest latency treated as a measurement. Anything faster cannot
// have crossed a network to a backend doing work (a cached reply, a clock artefact), and would
// drag a minimum-based estimate towards zero. Netflix's limiters drop such samples too.
//
// Where it is applied: the enforcing limiter should leave samples below it out of
// Window.Samples and out of the p50 it reports as Window.RTT; MinRTT.Observe ignores a window
// statistic below it; and every Algorithm treats a Window.RTT or Window.MinRTT below it as
// unknown (the window then carries no latency information, only its drops).
const MinMeaningfulRTT = 100 * time.Microsecond

// MaxValue bounds every limit Update returns: no concurrency limit is larger than this, and the
// bound keeps multiplicative increases finite whatever the input.
const MaxValue = 1e9

// Params tunes the algorithms: one block per algorithm, each the config file's knobs for it.
// Only the block of the selected algorithm is read and validated by New.
type Params struct {
	AIMD      AIMD      `yaml:"aimd" json:"aimd"`
	Vegas     Vegas     `yaml:"vegas" json:"vegas"`
	Gradient2 Gradient2 `yaml:"gradient2" json:"gradient2"`
	Gradient  Gradient  `yaml:"gradient" json:"gradient"`
	Greed     Greed     `yaml:"greed" json:"greed"`
}

// DefaultParams returns the sidecar defaults of every algorithm (see the package documentation
// for where and why they depart from the field's values).
func DefaultParams() Params {
	return Params{
		AIMD:      DefaultAIMD(),
		Vegas:     DefaultVegas(),
		Gradient2: DefaultGradient2(),
		Gradient:  DefaultGradient(),
		Greed:     DefaultGreed(),
	}
}

// FieldParams returns the values the algorithms have where they come from (Netflix
// concurrency-limits, Envoy, the greed paper), for operators who want the original behaviour.
func FieldParams() Params {
	return Params{
		AIMD:      FieldAIMD(),
		Vegas:     FieldVegas(),
		Gradient2: FieldGradient2(),
		Gradient:  FieldGradient(),
		Greed:     FieldGreed(),
	}
}

// Validate reports every problem in every block, each naming its field ("aimd.backoff").
func (p Params) Validate() error {
	var errs fieldErrors
	errs.merge(p.AIMD.Validate())
	errs.merge(p.Vegas.Validate())
	errs.merge(p.Gradient2.Validate())
	errs.merge(p.Gradient.Validate())
	errs.merge(p.Greed.Validate())
	return errs.err()
}

// New returns the algorithm called name, tuned by the matching block of p. It validates that
// block only; an unknown name is an error naming the field "algorithm".
func New(name string, p Params) (Algorithm, error) {
	switch name {
	case NameAIMD:
		return NewAIMD(p.AIMD)
	case NameVegas:
		return NewVegas(p.Vegas)
	case NameGradient2:
		return NewGradient2(p.Gradient2)
	case NameGradient:
		return NewGradient(p.Gradient)
	case NameGreed:
		return NewGreed(p.Greed)
	}
	var errs fieldErrors
	errs.add("algorithm", "must be one of %s, got %q", strings.Join(Names(), ", "), name)
	return nil, errs.err()
}

// ConfigError lists every problem found in the parameters, each naming the field it concerns,
// such as "gradient.buffer: must not be negative, got -0.1". It is the shared field error type
// of package field.
type ConfigError = field.Errors

// fieldErrors collects problems with the checks the algorithms' validators share.
type fieldErrors struct{ list field.Errors }

func (e *fieldErrors) add(name, format string, args ...any) { e.list.Add(name, format, args...) }

func (e *fieldErrors) merge(err error) { e.list.Nest("", err) }

func (e *fieldErrors) err() error { return e.list.Err() }

// checkRange reports a value that must be within [lo, hi] (NaN never is).
func (e *fieldErrors) checkRange(field string, v, lo, hi float64) {
	if math.IsNaN(v) || v < lo || v > hi {
		e.add(field, "must be between %v and %v, got %v", lo, hi, v)
	}
}

// checkFraction reports a factor that must lie strictly between 0 and 1 (or be exactly 1 when
// allowOne is set).
func (e *fieldErrors) checkFraction(field string, v float64, allowOne bool) {
	if math.IsNaN(v) || v <= 0 || v > 1 || (v == 1 && !allowOne) {
		if allowOne {
			e.add(field, "must be greater than 0 and at most 1, got %v", v)
		} else {
			e.add(field, "must be greater than 0 and less than 1, got %v", v)
		}
	}
}

// sanitize makes any incoming limit usable: NaN and negative values become 0, values above
// MaxValue (including +Inf) become MaxValue.
func sanitize(limit float64) float64 {
	switch {
	case math.IsNaN(limit) || limit < 0:
		return 0
	case limit > MaxValue:
		return MaxValue
	}
	return limit
}

// seconds returns d in seconds, or 0 when d is below MinMeaningfulRTT (unknown).
func seconds(d time.Duration) float64 {
	if d < MinMeaningfulRTT {
		return 0
	}
	return d.Seconds()
}

// demanded reports whether requests asked for more than the limit during the window: some
// found it taken, or some wait at its end.
func (w Window) demanded() bool {
	return w.Backlog > 0 || w.Blocked > 0
}

// latency returns the window's RTT and MinRTT in seconds; ok is false unless both are known
// and the window has successful samples.
func (w Window) latency() (rtt, minRTT float64, ok bool) {
	rtt, minRTT = seconds(w.RTT), seconds(w.MinRTT)
	return rtt, minRTT, w.Samples > 0 && rtt > 0 && minRTT > 0
}

// appLimited reports whether the demand in the window used less than half of the limit, the
// field's test (Netflix) for "the limit was not tested, do not grow it".
func (w Window) appLimited(limit float64) bool {
	return float64(max(w.MaxInFlight, 0))*2 < limit
}

// queued estimates how many of n requests in flight were waiting rather than being served,
// from Little's law: the served share is minRTT/rtt. A tiny epsilon keeps float noise from
// rounding an exact integer up (9*(1-8/9) must be 1, not 2).
//
// An RTT within band (a share) of MinRTT counts as no queue at all: a window's median wanders
// that much on a busy node or a backend whose service time varies, and reading it as a queue of
// one makes the backlog-driven algorithms (vegas, greed) drain a healthy limit to its floor.
func queued(n, rtt, minRTT, band float64) float64 {
	if rtt <= minRTT*(1+band) {
		return 0
	}
	return math.Max(0, math.Ceil(n*(1-minRTT/rtt)-1e-9))
}
