package limit

import "math"

// Baselines of the Gradient2 algorithm.
const (
	// BaselineLong compares the window RTT with the long-term average only (the field).
	BaselineLong = "long"
	// BaselineMinRTT compares it with MinRTT, or with the long-term average while MinRTT is
	// unknown.
	BaselineMinRTT = "minRTT"
)

// Gradient2 tunes Netflix's Gradient2Limit.
//
// The field's rule, per window: shortRTT is the window's RTT; longRTT is an exponential moving
// average of it over LongWindow samples (here it advances by the window's sample count:
// weight 1-(1-2/(LongWindow+1))^Samples). Drift correction: when longRTT/shortRTT > 2 the
// long average is multiplied by 0.95, so it recovers after a latency spike. A window whose
// demand did not test the limit (MaxInFlight < L/2) holds. gradient = clamp(RTTTolerance x
// longRTT / shortRTT, 0.5, 1); new = L x gradient + QueueSize; L = L x (1-Smoothing) + new x
// Smoothing. Netflix: smoothing 0.2, queueSize 4, long window 600, tolerance 1.5, min 20.
//
// Sidecar departures (FieldGradient2 keeps Netflix's values):
//   - Baseline "minRTT": the gradient compares the window's RTT with the probe-free MinRTT
//     estimate (longRTT only while MinRTT is unknown). The long average follows a backend that
//     stays saturated: once the queue inside it stands, longRTT equals shortRTT, the gradient
//     is 1 and the limit grows by Smoothing x QueueSize every window, without bound (Netflix
//     relies on its maximum of 200 and on timeouts; the closed-loop model test shows it at the
//     maximum). The other way round, after a backend became permanently slower the long
//     average keeps the old latency for tens of windows after MinRTT has aged out, and would
//     hold the limit at its floor that long.
//   - RTTTolerance 1.5 -> 1.1: anchored to MinRTT, 1.5 lets 50% of W queue inside a backend of W
//     workers. 1.1 sits above the noise of a window's p50 against its own windowed minimum.
//   - Drain: when the RTT exceeds the tolerance (gradient < 1), the limit becomes the
//     concurrency the backend actually serves, L x baseline/RTT (Little's law), at once, without
//     smoothing or QueueSize. A smoothed decrease stops wherever the tolerance is met, so the
//     queue inside the backend never empties and the probe-free MinRTT drifts up with it; the
//     sidecar's decrease empties it once per cycle and follows a capacity drop in one window.
//     Growth keeps the field's smoothing and QueueSize 4 (+0.8 per window).
//   - Drops: a window with drops multiplies the limit by DropBackoff (0.9). Netflix's Gradient2
//     ignores drops; an overloaded backend may answer 503 fast, lowering the RTT.
type Gradient2 struct {
	// Smoothing weighs the new limit against the old one, in (0, 1]. Field and sidecar 0.2.
	Smoothing float64 `yaml:"smoothing" json:"smoothing"`
	// QueueSize is the headroom added to the limit after the gradient. Field and sidecar 4.
	QueueSize float64 `yaml:"queueSize" json:"queueSize"`
	// LongWindow is the span of the long average in samples. Field and sidecar 600.
	LongWindow int `yaml:"longWindow" json:"longWindow"`
	// RTTTolerance is how far the RTT may rise over the baseline before the limit shrinks; at
	// least 1. Field 1.5, sidecar 1.1.
	RTTTolerance float64 `yaml:"rttTolerance" json:"rttTolerance"`
	// Baseline is BaselineLong (field) or BaselineMinRTT (sidecar).
	Baseline string `yaml:"baseline" json:"baseline"`
	// DropBackoff multiplies the limit in a window with drops; 1 ignores drops. Field 1,
	// sidecar 0.9.
	DropBackoff float64 `yaml:"dropBackoff" json:"dropBackoff"`
	// Drain sets the limit to L x baseline/RTT (not below L/2) at once when the gradient is
	// below 1: no smoothing, no QueueSize. Field false, sidecar true.
	Drain bool `yaml:"drain" json:"drain"`
}

// Drift correction constants of Gradient2 (Netflix's, not configurable).
const (
	gradient2DriftRatio = 2
	gradient2DriftDecay = 0.95
)

// DefaultGradient2 returns the sidecar defaults.
func DefaultGradient2() Gradient2 {
	return Gradient2{Smoothing: 0.2, QueueSize: 4, LongWindow: 600, RTTTolerance: 1.1, Baseline: BaselineMinRTT, Drain: true, DropBackoff: 0.9}
}

// FieldGradient2 returns Netflix's defaults.
func FieldGradient2() Gradient2 {
	return Gradient2{Smoothing: 0.2, QueueSize: 4, LongWindow: 600, RTTTolerance: 1.5, Baseline: BaselineLong, DropBackoff: 1}
}

// Validate reports every problem, naming fields like "gradient2.smoothing".
func (c Gradient2) Validate() error {
	var errs fieldErrors
	errs.checkFraction("gradient2.smoothing", c.Smoothing, true)
	errs.checkRange("gradient2.queueSize", c.QueueSize, 0, 1e6)
	if c.LongWindow < 1 {
		errs.add("gradient2.longWindow", "must be at least 1 sample, got %d", c.LongWindow)
	}
	errs.checkRange("gradient2.rttTolerance", c.RTTTolerance, 1, 100)
	if c.Baseline != BaselineLong && c.Baseline != BaselineMinRTT {
		errs.add("gradient2.baseline", "must be %q or %q, got %q", BaselineLong, BaselineMinRTT, c.Baseline)
	}
	errs.checkFraction("gradient2.dropBackoff", c.DropBackoff, true)
	return errs.err()
}

// NewGradient2 returns the Gradient2 algorithm. It keeps the long average as state.
func NewGradient2(c Gradient2) (Algorithm, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &gradient2{c: c, keep: math.Log1p(-2 / float64(c.LongWindow+1))}, nil
}

type gradient2 struct {
	c    Gradient2
	keep float64 // log of the long average's per-sample retention, ln(1 - 2/(N+1))
	long float64 // long-term RTT average, seconds; 0 until the first window with an RTT
}

func (g *gradient2) Name() string { return NameGradient2 }

func (g *gradient2) Update(limit float64, w Window) float64 {
	limit = sanitize(limit)
	if w.Dropped > 0 && g.c.DropBackoff < 1 {
		return limit * g.c.DropBackoff
	}
	short := seconds(w.RTT)
	if w.Samples <= 0 || short == 0 {
		return limit
	}
	if g.long == 0 {
		g.long = short
	} else {
		weight := -math.Expm1(float64(w.Samples) * g.keep) // 1 - retention^Samples
		g.long += (short - g.long) * weight
	}
	if g.long/short > gradient2DriftRatio {
		g.long *= gradient2DriftDecay
	}
	if float64(max(w.MaxInFlight, 0)) < limit/2 {
		return limit
	}
	base := g.long
	if minRTT := seconds(w.MinRTT); g.c.Baseline == BaselineMinRTT && minRTT > 0 {
		base = minRTT
	}
	grad := math.Min(math.Max(g.c.RTTTolerance*base/short, 0.5), 1)
	if g.c.Drain && grad < 1 {
		return limit * math.Max(base/short, 0.5)
	}
	next := limit*grad + g.c.QueueSize
	return math.Min(limit*(1-g.c.Smoothing)+next*g.c.Smoothing, MaxValue)
}
