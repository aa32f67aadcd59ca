package limit

import (
	"math"
	"time"
)

// AIMD tunes the additive-increase / multiplicative-decrease algorithm (Netflix AIMDLimit).
//
// The field's rule, per window: a drop, or a window RTT above Timeout, multiplies the limit by
// Backoff; otherwise the limit grows by 1 when the demand tested it (MaxInFlight*2 >= limit).
//
// Sidecar departure: RTTTolerance. Netflix's only latency signal is the absolute Timeout (5 s),
// which a backend of 20 ms never reaches: behind a sidecar the backend rarely drops (it queues,
// like any thread pool with an open queue), so the field's AIMD climbs to its maximum and the
// backend's own queue absorbs the overload. The sidecar also counts a window as slow when its
// RTT exceeds RTTTolerance x MinRTT. With RTTTolerance x Backoff <= 1 (1.1 x 0.9 = 0.99) every
// decrease lands at or below the concurrency the backend serves, so the saw-tooth drains the
// backend's queue once per cycle; that keeps the probe-free MinRTT estimate honest (see MinRTT).
// A tolerance of 1.1 sits above the noise of a p50 against its own windowed minimum.
type AIMD struct {
	// Backoff multiplies the limit on a drop or a slow window; in (0, 1). Field and sidecar: 0.9.
	Backoff float64 `yaml:"backoff" json:"backoff"`
	// Timeout marks a window slow when its RTT exceeds it; 0 disables. Field and sidecar: 5s.
	Timeout time.Duration `yaml:"timeout" json:"timeout"`
	// RTTTolerance marks a window slow when RTT > RTTTolerance x MinRTT; 0 disables (the field's
	// behaviour), otherwise at least 1. Sidecar: 1.1.
	RTTTolerance float64 `yaml:"rttTolerance" json:"rttTolerance"`
}

// DefaultAIMD returns the sidecar defaults.
func DefaultAIMD() AIMD {
	return AIMD{Backoff: 0.9, Timeout: 5 * time.Second, RTTTolerance: 1.1}
}

// FieldAIMD returns Netflix's defaults: backoff 0.9, timeout 5 s, no relative latency test.
func FieldAIMD() AIMD {
	return AIMD{Backoff: 0.9, Timeout: 5 * time.Second}
}

// Validate reports every problem, naming fields like "aimd.backoff".
func (c AIMD) Validate() error {
	var errs fieldErrors
	errs.checkFraction("aimd.backoff", c.Backoff, false)
	if c.Timeout < 0 {
		errs.add("aimd.timeout", "must not be negative, got %s", c.Timeout)
	}
	if c.RTTTolerance != 0 {
		errs.checkRange("aimd.rttTolerance", c.RTTTolerance, 1, 100)
	}
	return errs.err()
}

// NewAIMD returns the AIMD algorithm.
func NewAIMD(c AIMD) (Algorithm, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &aimd{c: c, timeout: c.Timeout.Seconds()}, nil
}

type aimd struct {
	c       AIMD
	timeout float64 // seconds
}

func (a *aimd) Name() string { return NameAIMD }

func (a *aimd) Update(limit float64, w Window) float64 {
	limit = sanitize(limit)
	rtt := seconds(w.RTT)
	slow := w.Dropped > 0 || (a.timeout > 0 && rtt > a.timeout)
	if rtt, minRTT, ok := w.latency(); ok && a.c.RTTTolerance > 0 && rtt > a.c.RTTTolerance*minRTT {
		slow = true
	}
	switch {
	case slow:
		return limit * a.c.Backoff
	case w.Samples <= 0 || w.appLimited(limit):
		return limit
	}
	return math.Min(limit+1, MaxValue)
}
