package limit

import "math"

// Vegas tunes the queue-estimating algorithm (Netflix VegasLimit, after TCP Vegas).
//
// The field's rule, per window, with lg = max(1, floor(log10 L)): queue = ceil(L x (1 -
// MinRTT/RTT)) estimates how many of the L requests in flight wait rather than being served (L
// is the enforced, floored limit: Netflix's limits are integers); a drop decreases (L - lg); an
// app-limited window (MaxInFlight*2 < L) holds; queue <= Threshold x lg grows fast (L + Beta x
// lg); queue < Alpha x lg grows (L + lg); queue > Beta x lg shrinks (L - lg); otherwise the
// limit holds. Netflix: alpha 3, beta 6, threshold 1, initial 20, max 1000.
//
// Sidecar departures (FieldVegas keeps Netflix's values):
//   - MinRTT comes from the probe-free estimator instead of Netflix's periodic re-probe, which
//     resets the no-load estimate to whatever the next sample says.
//   - Alpha 3 -> 0.9, Beta 6 -> 0.9, Threshold 1 -> 0. The field keeps 3 to 6 requests queued
//     inside the backend: +75 to +150% latency behind 4 workers, and a queue that always stands
//     becomes the probe-free windowed minimum, after which the limit climbs again. In the
//     sidecar the limit grows by 0.9 per window while the backend shows no queue, and a single
//     queued request (queue 1 > 0.9) is already above Beta, so the limit dithers between W and
//     W+1 for a backend of W workers and the backend's queue empties every other window.
//     Beta is both the fast step and the queue bound in Vegas, so it cannot be 1 or more
//     without tolerating a standing queue.
//   - Drain: a decrease for queueing removes the whole estimated queue (L - queue) instead of
//     lg, so the limit follows a capacity drop in one window instead of one request per window.
//   - A drop multiplies the limit by DropBackoff (0.9) instead of subtracting lg: a backend that
//     refuses (429, 5xx) while the limit sits far above its capacity should not need dozens of
//     windows to come down. DropBackoff 0 keeps the field's L - lg.
type Vegas struct {
	// Alpha, Beta and Threshold are multiples of lg. Field: 3, 6, 1. Sidecar: 0.9, 0.9, 0.
	Alpha     float64 `yaml:"alpha" json:"alpha"`
	Beta      float64 `yaml:"beta" json:"beta"`
	Threshold float64 `yaml:"threshold" json:"threshold"`
	// Drain makes a decrease for queueing subtract the estimated queue rather than lg.
	// Field false, sidecar true.
	Drain bool `yaml:"drain" json:"drain"`
	// DropBackoff multiplies the limit on a drop; 0 subtracts lg instead (the field's rule).
	// Sidecar: 0.9.
	DropBackoff float64 `yaml:"dropBackoff" json:"dropBackoff"`
	// NoiseBand: an RTT within this share of MinRTT counts as no queue. Field 0, sidecar 0.15:
	// a window median wanders that much on a busy node, and with alpha and beta below one
	// request every wander would read as a queue and drain the limit to its floor.
	NoiseBand float64 `yaml:"noiseBand" json:"noiseBand"`
}

// DefaultVegas returns the sidecar defaults.
func DefaultVegas() Vegas {
	return Vegas{Alpha: 0.9, Beta: 0.9, Threshold: 0, Drain: true, DropBackoff: 0.9, NoiseBand: 0.15}
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
	errs.checkRange("vegas.noiseBand", c.NoiseBand, 0, 1)
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
	lg := vegasLg(limit)
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
	queue := queued(math.Floor(limit), rtt, minRTT, v.c.NoiseBand)
	switch {
	case queue <= v.c.Threshold*lg:
		return math.Min(limit+v.c.Beta*lg, MaxValue)
	case queue < v.c.Alpha*lg:
		return math.Min(limit+lg, MaxValue)
	case queue > v.c.Beta*lg:
		if v.c.Drain {
			return math.Max(0, limit-math.Max(queue, lg))
		}
		return math.Max(0, limit-lg)
	}
	return limit
}

// vegasLg is max(1, floor(log10 L)), with a fast path for the limits a sidecar usually has.
func vegasLg(limit float64) float64 {
	if limit < 100 {
		return 1
	}
	return math.Max(1, math.Floor(math.Log10(limit)))
}
