package limit

import "math"

// Gradient tunes Envoy's adaptive-concurrency gradient controller.
//
// The field's rule, per window: gradient = clamp(MinRTT x (1+Buffer) / RTT, MinGradient,
// MaxGradient); L' = L x gradient; new = L' + SqrtHeadroom x sqrt(L') + Headroom. Envoy:
// buffer 25%, gradient in [0.5, 2], headroom sqrt(L') (SqrtHeadroom 1, Headroom 0), max 1000.
// A window without latency information holds.
//
// Sidecar departures (FieldGradient keeps Envoy's values):
//   - MinRTT comes from the probe-free estimator instead of Envoy's probe windows, which pin the
//     limit at 3 until 50 samples arrive and shed traffic every interval.
//   - SqrtHeadroom 1 -> 0, Headroom 0 -> 0.5; Buffer stays 25%. In a saturated backend of W
//     workers Envoy's limit settles at 1.25W + sqrt(1.25W): 13 on 8 workers (+65% latency), 7
//     on 4 (+75%), always holding a queue inside the backend. Without the sqrt term growth
//     stops where the RTT reaches 1.25 x MinRTT; the small constant headroom keeps pushing just
//     past that point, so the limit crosses it and drains (below) every few windows instead of
//     resting on it, which keeps the min-RTT estimate honest. The buffer stays at Envoy's 25%:
//     a smaller one (10% was tried) sits inside the noise of a window's median on a backend
//     whose service time varies or a node that is busy, and the limit then drains to its floor.
//   - Drain: when the RTT exceeds the allowance (gradient < 1), the limit becomes the
//     concurrency the backend actually serves, L x MinRTT/RTT (Little's law), without buffer
//     or headroom; growth keeps Envoy's formula. Envoy's decrease lands at (1+Buffer) x W plus
//     headroom, so the queue inside the backend never empties; a probe-free windowed minimum
//     then takes the queued latency for the no-load latency and the limit climbs again, without
//     bound (shown by the closed-loop model test). Landing at W empties the queue once per
//     cycle, keeps MinRTT honest, and follows a capacity drop in one window.
//     The drain does not go below the concurrency the window actually served (completions per
//     second x MinRTT, Little's law again): the window's median lags the limit, and without
//     that floor a drain from a high limit landed at 0.9 W and left a queued request waiting.
//   - HoldWhenAppLimited: a window whose demand did not test the limit (MaxInFlight*2 < L) may
//     lower it but not raise it. Envoy raises the limit by up to 2x per quiet window, so after
//     a quiet minute the limit sits at its maximum and the next burst meets no protection.
//   - DropBackoff 0.9: a window with drops (429, 5xx, timeouts) multiplies the limit by it.
//     Envoy looks at latency only; an overloaded backend that refuses fast lowers the RTT,
//     which would otherwise raise the limit.
type Gradient struct {
	// Buffer is the latency allowance over MinRTT, a fraction. Field and sidecar 0.25.
	Buffer float64 `yaml:"buffer" json:"buffer"`
	// MinGradient and MaxGradient clamp the gradient. Field and sidecar 0.5 and 2.
	MinGradient float64 `yaml:"minGradient" json:"minGradient"`
	MaxGradient float64 `yaml:"maxGradient" json:"maxGradient"`
	// SqrtHeadroom is the coefficient of sqrt(L') and Headroom a constant, both added after the
	// gradient. Field 1 and 0, sidecar 0 and 0.5.
	SqrtHeadroom float64 `yaml:"sqrtHeadroom" json:"sqrtHeadroom"`
	Headroom     float64 `yaml:"headroom" json:"headroom"`
	// Drain sets the limit to L x MinRTT/RTT (not below MinGradient x L) when the gradient is
	// below 1. Field false, sidecar true.
	Drain bool `yaml:"drain" json:"drain"`
	// HoldWhenAppLimited forbids increases in windows where MaxInFlight*2 < L. Field false,
	// sidecar true.
	HoldWhenAppLimited bool `yaml:"holdWhenAppLimited" json:"holdWhenAppLimited"`
	// DropBackoff multiplies the limit in a window with drops; 1 ignores drops. Field 1,
	// sidecar 0.9.
	DropBackoff float64 `yaml:"dropBackoff" json:"dropBackoff"`
}

// DefaultGradient returns the sidecar defaults.
func DefaultGradient() Gradient {
	return Gradient{Buffer: 0.25, MinGradient: 0.5, MaxGradient: 2, Headroom: 0.5, Drain: true, HoldWhenAppLimited: true, DropBackoff: 0.9}
}

// FieldGradient returns Envoy's defaults: buffer 25%, gradient in [0.5, 2], sqrt headroom,
// drops ignored, no drain, no app-limited hold.
func FieldGradient() Gradient {
	return Gradient{Buffer: 0.25, MinGradient: 0.5, MaxGradient: 2, SqrtHeadroom: 1, DropBackoff: 1}
}

// Validate reports every problem, naming fields like "gradient.buffer".
func (c Gradient) Validate() error {
	var errs fieldErrors
	errs.checkRange("gradient.buffer", c.Buffer, 0, 10)
	errs.checkFraction("gradient.minGradient", c.MinGradient, true)
	errs.checkRange("gradient.maxGradient", c.MaxGradient, 1, 10)
	errs.checkRange("gradient.sqrtHeadroom", c.SqrtHeadroom, 0, 100)
	errs.checkRange("gradient.headroom", c.Headroom, 0, 1e6)
	errs.checkFraction("gradient.dropBackoff", c.DropBackoff, true)
	return errs.err()
}

// NewGradient returns the gradient algorithm.
func NewGradient(c Gradient) (Algorithm, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &gradient{c: c}, nil
}

type gradient struct{ c Gradient }

func (g *gradient) Name() string { return NameGradient }

func (g *gradient) Update(limit float64, w Window) float64 {
	limit = sanitize(limit)
	if w.Dropped > 0 && g.c.DropBackoff < 1 {
		return limit * g.c.DropBackoff
	}
	rtt, minRTT, ok := w.latency()
	if !ok {
		return limit
	}
	grad := math.Min(math.Max(minRTT*(1+g.c.Buffer)/rtt, g.c.MinGradient), g.c.MaxGradient)
	if g.c.Drain && grad < 1 {
		next := limit * math.Max(minRTT/rtt, g.c.MinGradient)
		// The window's RTT lags the limit (it holds requests admitted under a higher one), so
		// L x MinRTT/RTT can land below what the upstream serves; never drain below that.
		if served, ok := w.served(minRTT); ok {
			next = math.Max(next, math.Min(served, limit))
		}
		return next
	}
	l := limit * grad
	next := math.Min(l+g.c.SqrtHeadroom*math.Sqrt(l)+g.c.Headroom, MaxValue)
	if g.c.HoldWhenAppLimited && w.appLimited(limit) {
		return math.Min(next, limit)
	}
	return next
}
