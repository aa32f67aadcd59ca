package limit

import "math"

// Greed tunes the backlog-driven multiplicative controller taken from the "greed" adaptive
// backpressure algorithm, where a consumer adapts how many items it asks for at once.
//
// The field's rule: the state is the amount (here the limit) and shift. At each window the
// backlog is compared with shift: backlog < shift doubles the limit and raises shift by one (up
// to 3); backlog > shift halves the limit (not below 3) and lowers shift by one (not below 1);
// equal holds. The constants are empirical.
//
// Backlog, for a limiter in front of a backend, is the estimated number of requests queued
// INSIDE the backend: of MaxInFlight requests in flight, a share MinRTT/RTT is being served
// (Little's law), so backlog = ceil(MaxInFlight x (1 - MinRTT/RTT)). That is the consumer's
// queue of received-but-unprocessed items in the original. The limiter's own queue
// (Window.Backlog) is NOT added: it holds requests not yet asked of the backend — demand, the
// producer's side — and it is non-empty whenever offered load exceeds the limit, so counting
// it would halve the limit under every overload however healthy the backend. A window without
// samples, or without a MinRTT estimate, holds.
//
// Sidecar departures (FieldGreed keeps the paper's constants):
//   - Increase 2 -> 1.25 and Decrease 0.5 -> 0.75. Doubling from a backend's capacity W lands
//     at 2W: the field's limit alternates between W and 2W, and every second window carries
//     +100% latency. With 1.25 the overshoot stays within a quarter of W.
//   - MaxShift 3 -> 1 and DecreaseOnEqual: shift is the backlog tolerated before the limit
//     falls, and "equal holds" lets that backlog stand for ever. A standing queue of 3 requests
//     in a backend of 4 workers is +75% latency, and any queue that always stands becomes the
//     probe-free windowed minimum RTT, after which the limit climbs again. In the sidecar shift
//     stays 1 and one queued request already decreases.
//   - Drain: a decrease for backlog lands no lower than the concurrency the backend served,
//     MaxInFlight - backlog (Little's law): 0.75 x L may cut below W, which loses goodput
//     without shortening any queue. The limit still returns to W, which empties the backend's
//     queue once per cycle. A drop is not a backlog estimate and always decreases by Decrease.
//   - Floor 3 -> 1: the field never goes below 3; a sidecar must work from a limit of 1. A
//     decrease never raises the limit (the field's max(L/2, 3) would turn 2 into 3).
//   - Increases are held while the window is app-limited (MaxInFlight*2 < L): multiplying a
//     limit nobody tested only piles up permits for the next burst.
//   - A window with drops counts as backlog above shift (decrease).
type Greed struct {
	// Increase multiplies the limit when the backlog is below shift; > 1. Field 2, sidecar 1.25.
	Increase float64 `yaml:"increase" json:"increase"`
	// Decrease multiplies the limit when the backlog is above shift; in (0, 1). Field 0.5,
	// sidecar 0.75.
	Decrease float64 `yaml:"decrease" json:"decrease"`
	// Floor is the lowest limit a decrease produces. Field 3, sidecar 1.
	Floor float64 `yaml:"floor" json:"floor"`
	// MinShift and MaxShift bound shift; shift starts at MinShift. Field 1 and 3, sidecar 1 and 1.
	MinShift int `yaml:"minShift" json:"minShift"`
	MaxShift int `yaml:"maxShift" json:"maxShift"`
	// DecreaseOnEqual treats a backlog equal to shift as too much (decrease) instead of holding.
	// Field false, sidecar true.
	DecreaseOnEqual bool `yaml:"decreaseOnEqual" json:"decreaseOnEqual"`
	// Drain keeps a decrease for backlog from going below MaxInFlight - backlog. Field false,
	// sidecar true.
	Drain bool `yaml:"drain" json:"drain"`
	// NoiseBand: an RTT within this share of MinRTT counts as no backlog. Field 0, sidecar 0.15
	// (see Vegas.NoiseBand).
	NoiseBand float64 `yaml:"noiseBand" json:"noiseBand"`
}

// DefaultGreed returns the sidecar defaults.
func DefaultGreed() Greed {
	return Greed{Increase: 1.25, Decrease: 0.75, Floor: 1, MinShift: 1, MaxShift: 1, DecreaseOnEqual: true, Drain: true, NoiseBand: 0.15}
}

// FieldGreed returns the paper's constants.
func FieldGreed() Greed {
	return Greed{Increase: 2, Decrease: 0.5, Floor: 3, MinShift: 1, MaxShift: 3}
}

// Validate reports every problem, naming fields like "greed.increase".
func (c Greed) Validate() error {
	var errs fieldErrors
	errs.checkRange("greed.noiseBand", c.NoiseBand, 0, 1)
	if math.IsNaN(c.Increase) || c.Increase <= 1 || c.Increase > 100 {
		errs.add("greed.increase", "must be greater than 1 and at most 100, got %v", c.Increase)
	}
	errs.checkFraction("greed.decrease", c.Decrease, false)
	errs.checkRange("greed.floor", c.Floor, 0, 1e6)
	if c.MinShift < 0 {
		errs.add("greed.minShift", "must not be negative, got %d", c.MinShift)
	}
	if c.MaxShift < c.MinShift {
		errs.add("greed.maxShift", "must not be below greed.minShift (%d), got %d", c.MinShift, c.MaxShift)
	}
	return errs.err()
}

// NewGreed returns the greed algorithm. It keeps shift as state.
func NewGreed(c Greed) (Algorithm, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &greed{c: c, shift: c.MinShift}, nil
}

type greed struct {
	c     Greed
	shift int
}

func (g *greed) Name() string { return NameGreed }

func (g *greed) Update(limit float64, w Window) float64 {
	limit = sanitize(limit)
	backlog, served := math.Inf(1), 0.0
	if w.Dropped == 0 {
		rtt, minRTT, ok := w.latency()
		if !ok {
			return limit
		}
		inflight := float64(max(w.MaxInFlight, 0))
		backlog = queued(inflight, rtt, minRTT, g.c.NoiseBand)
		served = inflight - backlog
	}
	shift := float64(g.shift)
	switch {
	case backlog < shift:
		g.shift = min(g.shift+1, g.c.MaxShift)
		if w.appLimited(limit) {
			return limit
		}
		return math.Min(limit*g.c.Increase, MaxValue)
	case backlog > shift || (g.c.DecreaseOnEqual && backlog == shift):
		g.shift = max(g.shift-1, g.c.MinShift)
		next := math.Max(limit*g.c.Decrease, g.c.Floor)
		if g.c.Drain {
			next = math.Max(next, served)
		}
		return math.Min(limit, next)
	}
	return limit
}
