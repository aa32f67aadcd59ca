package limit

import "math"

// Vegas tunes the queue-estimating algorithm (Netflix VegasLimit, after TCP Vegas).
//
// The field's rule, per window, with lg = max(1, floor(log10 L)):
// queue = ceil(L x (1 - MinRTT/RTT)) estimates how many of the L requests wait rather than being
// served; a drop decreases (L - lg); an app-limited window (MaxInFlight*2 < L) holds;
// queue <= Threshold*lg grows fast (L + Beta*lg); queue < Alpha*lg grows (L + lg);
// queue > Beta*lg shrinks (L - lg); otherwise the limit holds.
//
// Sidecar departures:
//   - MinRTT comes from the probe-free estimator instead of Netflix's periodic re-probe, which
//     resets the no-load estimate to whatever the next sample says.
//   - Alpha 3 -> 1, Beta 6 -> 2, Threshold 1 -> 0. The field aims at keeping 3 to 6 requests
//     queued inside the backend: behind a backend of 4 workers that is 75 to 150% extra latency,
//     and a queue that always stands makes a windowed minimum RTT drift up with it. The sidecar
//     grows while the backend shows no queue, holds at one queued request and shrinks from two, so
//     the limit dithers between W and W+1 for a backend of W workers. The fast step (Beta) is 2
//     instead of 6 so that it cannot overshoot a small backend by more than its whole capacity.
//   - A drop multiplies the limit by DropBackoff (0.9) instead of subtracting lg: a backend that
//     refuses (429, 5xx) while the limit sits far above its capacity should not need dozens of
//     windows to come down. DropBackoff 0 keeps the field's L - lg.
type Vegas struct {
	// Alpha, Beta and Threshold are multiples of lg. Field: 3, 6, 1. Sidecar: 1, 2, 0.
	Alpha     float64 `yaml:"alpha" json:"alpha"`
	Beta      float64 `yaml:"beta" json:"beta"`
	Threshold float64 `yaml:"threshold" json:"threshold"`
	// DropBackoff multiplies the limit on a drop; 0 subtracts lg instead (the field's rule).
	// Sidecar: 0.9.
	DropBackoff float64 `yaml:"dropBackoff" json:"dropBackoff"`
}

// DefaultVegas returns the sidecar defaults.
func DefaultVegas() Vegas {
	return Vegas{Alpha: 1, Beta: 2, Threshold: 0, DropBackoff: 0.9}
}

// FieldVegas returns Netflix's defaults: alpha 3, beta 6, threshold 1 (times lg), drop => L - lg.
func FieldVegas() Vegas {
	return Vegas{Alpha: 3, Beta: 6, Threshold: 1}
}

// Validate reports every problem, naming fields like "vegas.alpha".
func (c Vegas) Validate() error {
	var errs fieldErrors
	errs.checkRange("vegas.alpha", c.Alpha, 0, 1000)
	errs.checkRange("vegas.beta", c.Beta, 0, 1000)
	errs.checkRange("vegas.threshold", c.Threshold, 0, 1000)
	if c.Beta < c.Alpha {
		errs.add("vegas.beta", "must not be below vegas.alpha (%v), got %v", c.Alpha, c.Beta)
	}
	if c.Threshold > c.Alpha {
		errs.add("vegas.threshold", "must not exceed vegas.alpha (%v), got %v", c.Alpha, c.Threshold)
	}
	if c.DropBackoff != 0 {
		errs.checkFraction("vegas.dropBackoff", c.DropBackoff, false)
	}
	return errs.err()
}

// NewVegas returns the Vegas algorithm.
func NewVegas(c Vegas) (Algorithm, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &vegas{c: c}, nil
}

type vegas struct{ c Vegas }

func (v *vegas) Name() string { return NameVegas }

func (v *vegas) Update(limit float64, w Window) float64 {
	limit = sanitize(limit)
	lg := math.Max(1, math.Floor(math.Log10(limit)))
	if w.Dropped > 0 {
		if v.c.DropBackoff > 0 {
			return limit * v.c.DropBackoff
		}
		return math.Max(0, limit-lg)
	}
	rtt, minRTT, ok := w.latency()
	if !ok || w.appLimited(limit) {
		return limit
	}
	queue := queued(limit, rtt, minRTT)
	switch {
	case queue <= v.c.Threshold*lg:
		return math.Min(limit+v.c.Beta*lg, MaxValue)
	case queue < v.c.Alpha*lg:
		return math.Min(limit+lg, MaxValue)
	case queue > v.c.Beta*lg:
		return math.Max(0, limit-lg)
	}
	return limit
}
