package limit

import (
	"math"
	"slices"
)

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
//   - SqrtHeadroom 1 -> 0, Headroom 0 -> 0.5. Buffer 25% -> 5% plus three times the noise of
//     a window median when nothing queues (NoiseBuffer x noise): the larger of its own sampling
//     error (Window.RTTNoise) and how far medians wander from window to window on this node
//     (the spread read from consecutive windows under a steady whole limit the upstream served
//     in full; see wander), at most a fifth of the no-load latency (noiseMax). The sampling
//     error alone missed a busy node's noise: on a two-core kind node under load the medians
//     of a 20 ms backend wandered 1-8% at a fixed limit, each such window drained the limit a
//     whole request and the e2e's adaptive rows served 0.3-0.7 of capacity. In a
//     saturated backend of W workers Envoy's limit settles at 1.25W + sqrt(1.25W): 13 on 8
//     workers (+65% latency), 7 on 4 (+75%), always holding a queue inside the backend; a fixed
//     25% buffer without the sqrt term still settles at 1.25 W, a standing queue of W/4. The
//     sidecar needs no queue inside the backend to keep it busy (its wait queue and the lead
//     hand freed slots over, admission.AdaptiveConfig.Lead), so the allowance only has to
//     cover the noise: about 5% on a constant-time backend, as much as the medians wander on
//     one whose service time spreads (a smaller fixed buffer, 10% was tried before the noise
//     term, drained such a backend's limit to its floor).
//   - Hold and HoldMax (50 and 300 windows; Envoy has no rest): where the medians
//     are steady enough to see one request queued at the knee (the noise term within the buffer)
//     and requests found the limit taken (waited for it or were refused: Window.Blocked; the queue
//     at one instant, which a short wait leaves empty at most window ends, let failed probes go
//     unjudged and the limit cycle above the knee), a drain lands on the served concurrency rounded
//     to a whole number and the limit rests there; then it probes one above it (steps are whole
//     there: at a fractional limit the queue's lead lends nothing, and a half step measured that
//     loss as much as its own gain), lets the step act for a window and keeps it only if the
//     upstream served at least half the step more than the mean of the rest (without a rest,
//     than the window before the step, at most its limit; over two windows when the first says
//     so: one window's completions wander by about a step); a failed probe
//     lands back below the step, marks the knee and doubles the rest (a step the limiter
//     overrode, slow start doubling the limit, is no probe; a step waits for a window run under
//     the limit after a drain).
//     Growing from the knee every window put the limit a step above it every other window, and each
//     request admitted then waits inside the upstream for the next completion (a whole service time
//     when a constant-time backend's workers finish together), which was most of the admitted p99
//     at 2x and 5x. A drain that lands below the knee rests one window and returns to it: one slow
//     window (the node or the client stalled) is likelier than a drop in capacity, and if the
//     return drains again the knee is forgotten.
//   - A node that stalls (a window at twice the latency, serving half, then clean again) is
//     no queue either, and a drain lowers no latency it causes. During a rest or a probe, a
//     window that served less than three quarters of its limit with requests refused
//     (stalled) is left out, up to two in a row, and joins no rest's mean; a third is
//     followed. A drain that interrupts a rest at a whole limit takes that limit for the knee,
//     so the limit returns to it after a window, and rests only what was left of the rest (a
//     return that re-armed the whole rest held a stall's landing for as long as the next
//     stall came within it); a return that drains again forgets it (a capacity drop). A step that the
//     upstream used (served half the step more than before it) is not failed by a latency
//     below one request queued per limit: that is noise, where a step above the knee adds at
//     least a completion's spacing to every request.
//   - A drain that did not lower the latency (with a rest, Hold > 0: the next two windows are as
//     slow, at least 90% of the excess, and at most 25% over the estimate: a larger excess right
//     after a drain, or one window of it, is the lag of a queue, the window after a drain timing
//     requests admitted before it) says the excess is not a queue the limit holds: a no-load
//     estimate learned too low (a busy node's sidecar takes its own delay off the samples, and at a
//     5x start it took off too much, so the estimate sat 14% under the upstream's 20 ms for the
//     estimator's ten-second memory) or a latency others cause. Draining on took the limit from 8
//     to 1. The limit holds instead, and that latency, at most 25% over the estimate, stands for
//     the no-load one until the estimate reaches it, the latency falls below it, or HoldMax windows
//     pass; the served concurrency that floors a drain is still reckoned with the estimator's own
//     value.
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
//     With a rest (Hold > 0) and a spread service time (medians too noisy to rest) the
//     floor is the served concurrency reckoned with the window's mean (MinRTT + Window.Skew)
//     plus the permits held through the whole window (Window.Held: a slow request still being
//     served keeps its worker without completing in the window) plus one request waiting
//     inside the upstream: finishes that spread are beyond the lead, so a limit of exactly W
//     idles each freed worker for the hop, and a slow tail keeps workers busy that a median
//     leaves out. The floor never exceeds the limit: it can hold a drain back, never raise it.
//     A window whose drain the floor held up (at a latency within keptMax of the estimate) does
//     not teach the no-load estimate (QueueKeeper): its median carries the queue the floor
//     keeps, which the estimate would otherwise count as served concurrency in the next floor,
//     so each floor kept a longer queue (on 4 slow-tail workers at 5x the estimate climbed from
//     26 to 43 ms over two minutes, the unloaded median being 19; with the windows kept out it
//     stays at 26-30).
//   - HoldWhenAppLimited: a window whose demand did not test the limit (MaxInFlight*2 < L) may
//     lower it but not raise it. Envoy raises the limit by up to 2x per quiet window, so after
//     a quiet minute the limit sits at its maximum and the next burst meets no protection.
//   - DropBackoff 0.9: a window with drops (429, 5xx, timeouts) multiplies the limit by it.
//     Envoy looks at latency only; an overloaded backend that refuses fast lowers the RTT,
//     which would otherwise raise the limit.
type Gradient struct {
	// Buffer is the latency allowance over MinRTT, a fraction. Field 0.25, sidecar 0.05 (with
	// NoiseBuffer: a fixed 25% is the setpoint of a standing queue
	// of a quarter of the backend's workers, which the wait queue and its lead make unnecessary).
	Buffer float64 `yaml:"buffer" json:"buffer"`
	// NoiseBuffer widens the allowance by this many times a window median's noise, the larger of
	// its sampling error (Window.RTTNoise) and its wander from window to window:
	// MinRTT x (1+Buffer) + NoiseBuffer x noise, the second term at most a fifth of MinRTT.
	// Field 0, sidecar 3.
	NoiseBuffer float64 `yaml:"noiseBuffer" json:"noiseBuffer"`
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
	// Hold is how many windows the limit rests where a drain at the knee landed before it
	// probes one above it (only where the medians are steady enough to see one queued request,
	// and requests found the limit taken). A drop in capacity is still followed at once
	// (a drain is never held back). A probe that fails doubles the next rest, up to HoldMax
	// windows; one that is used brings it back to Hold and the limit grows every other window
	// while the latency stays clean. So at a steady knee the limit probes above it once every
	// HoldMax windows (30 s). 0 disables resting. Field 0 and 0, sidecar
	// 50 and 300: each probe above a constant-time backend's knee queues requests for a whole
	// service time, and on 4 workers rests of 20 up to 100 windows put the admitted p99 at 1.5-1.7x
	// the unloaded one in half the runs, 50 up to 300 at 1.35-1.38x.
	Hold    int `yaml:"hold" json:"hold"`
	HoldMax int `yaml:"holdMax" json:"holdMax"`
	// HoldWhenAppLimited forbids increases in windows where MaxInFlight*2 < L. Field false,
	// sidecar true.
	HoldWhenAppLimited bool `yaml:"holdWhenAppLimited" json:"holdWhenAppLimited"`
	// DropBackoff multiplies the limit in a window with drops; 1 ignores drops. Field 1,
	// sidecar 0.9.
	DropBackoff float64 `yaml:"dropBackoff" json:"dropBackoff"`
}

// DefaultGradient returns the sidecar defaults: buffer 5% plus three times the medians' noise,
// rest 50 windows at the knee, probe at most every 300 (issue 35; before it, buffer 25% with no
// noise term and no rest). Together with the adaptive queue's lead and short wait they hold a
// constant-time backend's limit on its workers and the admitted p99 at 1.08-1.1x the unloaded
// one, where the 25% buffer reached 1.7-2x, at 0.996-1.008x the goodput of Envoy's
// adaptive_concurrency; a backend whose service time spreads keeps one request waiting inside
// it, and less of a queue than Envoy's (docs/benchmarks.md, "The adaptive tail").
func DefaultGradient() Gradient {
	return Gradient{Buffer: 0.05, NoiseBuffer: 3, MinGradient: 0.5, MaxGradient: 2, Headroom: 0.5, Drain: true,
		Hold: 50, HoldMax: 300, HoldWhenAppLimited: true, DropBackoff: 0.9}
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
	errs.checkRange("gradient.noiseBuffer", c.NoiseBuffer, 0, 100)
	errs.checkFraction("gradient.minGradient", c.MinGradient, true)
	errs.checkRange("gradient.maxGradient", c.MaxGradient, 1, 10)
	errs.checkRange("gradient.sqrtHeadroom", c.SqrtHeadroom, 0, 100)
	errs.checkRange("gradient.headroom", c.Headroom, 0, 1e6)
	errs.checkFraction("gradient.dropBackoff", c.DropBackoff, true)
	if c.Hold < 0 || c.Hold > 1000 {
		errs.add("gradient.hold", "must be between 0 and 1000 windows, got %d", c.Hold)
	}
	if c.HoldMax < c.Hold || c.HoldMax > 1000 {
		errs.add("gradient.holdMax", "must be between hold (%d) and 1000 windows, got %d", c.Hold, c.HoldMax)
	}
	return errs.err()
}

// NewGradient returns the gradient algorithm.
func NewGradient(c Gradient) (Algorithm, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &gradient{c: c}, nil
}

type gradient struct {
	c       Gradient
	hold    int     // windows left before the limit may grow again
	rest    int     // how long the next rest after a drain lasts (Hold, doubled per failed probe)
	probing bool    // the limit grew in the last window or two: a drain now ends a failed probe
	to      float64 // where that step up took the limit
	rested  bool    // the last window ended a rest: the next step up is the smallest
	// from is the limit before the last step up and before the concurrency served then (0:
	// unknown).
	from, before float64
	// drained is the last window's latency excess over the no-load estimate (RTT/MinRTT - 1)
	// when that window drained the limit, else 0. base (seconds, 0: none) is a no-load latency
	// learned from drains that did not lower the latency, used while it is above MinRTT, for
	// at most HoldMax windows (age).
	drained, base float64
	age           int
	lagged        bool // the last window followed a drain and was as slow: the lag of a queue, or not
	// ran is the limit the last window ran under (0: unknown): a window after a higher one
	// still completes requests admitted under it.
	ran float64
	// restSum and restN add up the concurrency served in the windows of the current rest that
	// ran wholly under its limit: the baseline a probe is judged against. probeSum and probeN
	// do the same for the windows that judge a probe.
	restSum, probeSum float64
	restN, probeN     int
	// resume is the rest left when a drain interrupted it (0: none): what a return to the knee
	// rests.
	resume int
	// stalls counts the stalled windows in a row left out of a rest or a probe.
	stalls int
	// restAt is the limit the rest's windows ran under: a mean served under another limit is
	// no baseline for a step from this one (a rest at 8 before a backend's service time
	// doubled, kept through the drains to 1 that followed, judged the first step from 1 to 2
	// unused against 8 served, and the limit rested at 1 of 8 workers for 30 s; in the
	// closed-loop model of model_test.go).
	restAt float64
	// knee is where the last failed step up landed (0: unknown); back: a drain landed below
	// it and the limit returns to it after a window; returned: it just did.
	knee           float64
	back, returned bool
	// kept: the last Update held a drain up at the spread floor (QueueKeeper).
	kept bool
	// wander: how far window medians move from one window to the next under a steady limit.
	wander wander
}

// wanderPairs is how many consecutive pairs of window medians the wander estimate remembers,
// and wanderMin how many it needs before it counts.
const (
	wanderPairs = 64
	wanderMin   = 16
)

// wander estimates how much window medians wander from window to window with nothing changed:
// the node's own noise (other processes on its cores, timer slack), which a window's sampling
// error (Window.RTTNoise) does not see. It takes the change between consecutive window
// medians run under the same limit, each at least the second window under it (the first
// still times requests admitted under the limit before), and reads the spread of one median
// from the median of those changes: a difference of two medians spread by sigma is spread by
// sigma x sqrt 2, whose median magnitude is 0.954 sigma. A queue that stands under a steady
// limit raises every median alike and reads as no wander; a stall now and then, or one hiccup
// among the first pairs, moves a median of changes little (a high percentile of the first
// few pairs read one hiccup as the node's noise, the limit stopped resting at the knee, and
// with the limit no longer whole no pair came to correct it). Pairs are forgotten after
// wanderStale windows without a new one.
type wander struct {
	last   float64 // the last window's median (seconds), 0 if the next pair does not count
	at     float64 // the limit it ran under
	steady int     // windows in a row under that limit
	stale  int     // windows since the last pair
	ring   [wanderPairs]float64
	n, i   int
	sorted []float64
}

// wanderStale is how many windows without a new pair make the wander estimate forget its
// pairs: two rings' worth, 13 s at 100 ms windows.
const wanderStale = 2 * wanderPairs

// observe takes one window's median run under limit; clean is false for a window that may
// have held a queue inside the upstream (it served less than its limit let in).
func (v *wander) observe(limit, rtt float64, clean bool) {
	if v.stale++; v.stale >= wanderStale {
		v.n, v.i = 0, 0
	}
	if limit != v.at || !clean {
		v.at, v.steady, v.last = limit, 1, 0
		return
	}
	v.steady++
	if v.steady >= 3 && v.last > 0 {
		v.ring[v.i] = math.Abs(rtt - v.last)
		v.i = (v.i + 1) % wanderPairs
		v.n = min(v.n+1, wanderPairs)
		v.stale = 0
	}
	v.last = rtt
}

// sigma is the spread of one window median (seconds), 0 until wanderMin pairs are known.
func (v *wander) sigma() float64 {
	if v.n < wanderMin {
		return 0
	}
	v.sorted = append(v.sorted[:0], v.ring[:v.n]...)
	slices.Sort(v.sorted)
	return v.sorted[v.n/2] / 0.954
}

func (g *gradient) Name() string { return NameGradient }

func (g *gradient) KeptQueue() bool { return g.kept }

// stepUsed reports whether the step up being judged served at least half the step more than
// before it, with a latency excess below one request queued per limit (what a step above the
// upstream's workers adds to every request when the workers finish together: at least a
// completion's spacing, S/W).
func (g *gradient) stepUsed(w Window, est, limit, excess float64) bool {
	served, ok := w.served(est)
	step := limit - g.from
	return ok && g.before > 0 && step > 0 && served >= g.before+step/2 && excess < step/limit
}

// resumed returns the rest a return to the knee takes: what was left of the rest a drain
// interrupted, else a whole rest.
func (g *gradient) resumed() int {
	if r := g.resume; r > 0 {
		g.resume = 0
		return r
	}
	return g.rest
}

// maxStallSkips is how many stalled windows in a row (see stalled) a rest or a probe leaves out.
const maxStallSkips = 2

// stalled reports a window that served much less than its limit let in while requests found
// the limit taken: completions stopped for part of it (a stalled node), or the upstream lost
// capacity. Either way it is no reading of the knee.
func stalled(w Window, served, limit float64) bool {
	return w.demanded() && served < 0.75*math.Min(limit, float64(w.MaxInFlight))
}

// minRestWindows is how many windows of a rest make its mean the baseline a probe is judged
// against, instead of the last window alone.
const minRestWindows = 4

// baseMax bounds a no-load latency learned from drains that did not lower the latency, as a
// multiple of the estimator's: at worst the limit then settles where the default buffer (25%)
// puts it, until the learned latency expires.
const baseMax = 1.25

// noiseMax bounds the noise term of the allowance, as a share of the no-load latency: with
// Buffer 5% the allowance is then at most the field's 25%, whose limit settles a quarter over
// the upstream's workers. The window-to-window wander grows with a queue that comes and goes
// (a limit far above the workers), so unbounded it would widen its own allowance.
const noiseMax = 0.2

// keptMax bounds the latency, as a multiple of the no-load estimate, of a window that the
// spread floor held up and that is kept from the estimator: a queue the floor keeps reads less
// (on 4 slow-tail workers at 5x, 96% of windows read under 1.5x, at most 1.83x), and an upstream
// that became slower by more is learned at once.
const keptMax = 1.5

// landed ends a drain or a failed probe at next, on a whole number: a
// fractional part above the upstream's workers lends one request more a share of the time, and
// that request waits inside the upstream for the next completion (with a constant service
// time, for a whole service time when the workers finish together). The limit then rests there,
// twice as long as last time when a step up just failed.
func (g *gradient) landed(next, limit float64, returned, below bool) float64 {
	g.rest = max(g.rest, g.c.Hold)
	failed := g.probing
	if failed {
		// A step up failed: the knee is no higher than where it started.
		next = math.Min(next, g.from)
		g.rest = min(2*g.rest, g.c.HoldMax)
	}
	// Rounded to the nearest: one request too many queues inside the upstream and the next
	// window drains it, one too few idles a worker until the next probe.
	next = math.Round(next)
	if failed || below {
		// But below the limit that drained when a step up failed or the upstream served
		// less than it: a drain diluted by the requests that did not wait (4.6 at 5 on 4
		// workers, or a failed step from a fractional 4.65) rounded back to the limit,
		// marked it as the knee and rested there with a request waiting inside the upstream.
		next = math.Min(next, math.Ceil(limit)-1)
	}
	if failed && g.before > 0 {
		// A failed step lands no lower than what the upstream served before it: a step from
		// a fractional limit to the next whole one is a fraction of a request, which a
		// window's completions cannot tell from noise (a step from 1.88 to 2 on 2 workers x
		// 40 ms, ten completions a window, served 1.89 against 1.88 before it, judged unused
		// and landed on 1: half the upstream idle for the 30 s rest that followed). Resting a
		// request below the knee costs a worker for the whole rest; a request above it is
		// drained, or found by the next probe.
		next = math.Max(next, math.Round(math.Min(g.before, g.from)))
	}
	next = math.Max(next, 1)
	g.probing = false
	g.restSum, g.restN = 0, 0
	switch {
	case failed:
		g.knee = next
	case returned:
		// Back at the knee, the latency rose again: the knee has moved down, or the node
		// stalled again. Rest what was left of the rest, then probe.
		g.knee = 0
		g.hold = g.resumed()
		return next
	case next < g.knee:
		// A drain below the knee a failed step found: one slow window (the node or the
		// client stalled) is likelier than a drop in capacity, which the return to the knee
		// tests. Rest a window, then go back to it (a 5x run on a busy node rested 4 s at 7
		// of 8 workers after one window 7% slow).
		g.hold, g.back = 1, true
		return next
	}
	g.hold = g.rest
	return next
}

func (g *gradient) Update(limit float64, w Window) float64 {
	limit = sanitize(limit)
	g.kept = false
	prev := g.ran
	g.ran = limit
	if g.probing && limit != g.to {
		// The limiter moved the limit past the step (slow start doubled it, a bound clipped
		// it): what the next windows measure is not that step, and a drain from a doubled
		// limit judged as its failure landed on the limit before it (4 of 8 workers for 10 s).
		g.probing, g.hold = false, 0
	}
	if w.Dropped > 0 && g.c.DropBackoff < 1 {
		return limit * g.c.DropBackoff
	}
	rtt, minRTT, ok := w.latency()
	if !ok {
		return limit
	}
	// est is the estimator's no-load latency: what the upstream served at once is always
	// reckoned with it, so a latency learned below (base) raises the allowance and the drain's
	// target but never the served concurrency that floors a drain.
	est := minRTT
	if g.base > 0 {
		// A latency this limit could not lower stands for the no-load one (at most a quarter
		// over the estimate) until the estimate reaches it, the latency falls below it (it
		// follows the latency down) or HoldMax windows pass.
		g.age++
		if g.base = math.Min(g.base, rtt); g.base <= minRTT || g.age > g.c.HoldMax {
			g.base = 0
		} else {
			minRTT = g.base
		}
	}
	// Only a whole limit the upstream served in full says how medians wander without a queue:
	// above the upstream's workers the extra requests wait for the next completion, whose
	// moment moves with the workers' phases, and a fractional limit comes and goes.
	if served, ok := w.served(minRTT); ok {
		g.wander.observe(limit, rtt, limit == math.Trunc(limit) && served >= limit-0.5)
	}
	noise := math.Min(g.c.NoiseBuffer*math.Max(w.RTTNoise.Seconds(), g.wander.sigma()), noiseMax*minRTT)
	allowance := minRTT*(1+g.c.Buffer) + noise
	grad := math.Min(math.Max(allowance/rtt, g.c.MinGradient), g.c.MaxGradient)
	// Precise: the window medians are steady enough (their noise's allowance within the
	// buffer) to see a single request queued at the knee, so the limit can rest there (Hold).
	// A spread service time hides that request in the noise, and so does a busy node's wander;
	// the limit then moves every window. (Judged by the medians' sampling error alone, a
	// constant-time backend on a stalled kind node rested at a knee its noise had lowered: the
	// e2e's adaptive row held 2 of 4 workers through the whole overload.)
	precise := g.c.Hold > 0 && noise <= g.c.Buffer*minRTT
	before := limit
	if g.probing {
		// A step judged is weighed against the limit before it: a failed step from 2 to 3 on
		// 2 workers serves 2, two thirds of its limit, and that is the step's failure.
		before = math.Min(limit, g.from)
	}
	if served, ok := w.served(est); ok && precise && (g.probing || g.hold > 0) && stalled(w, served, before) {
		if g.stalls < maxStallSkips {
			// The upstream served much less than the limit let in, with requests refused:
			// completions stopped for part of the window (a stalled node reads twice the
			// latency and serves half, or serves less with a clean median when the stall
			// falls at the window's end). A step or a rest judged by it failed and marked a
			// knee a worker or more low for the doubled rest; a drain lowers no latency a
			// stall causes. Leave out up to maxStallSkips in a row; a third is followed (the
			// upstream lost capacity).
			g.stalls++
			return limit
		}
	} else {
		g.stalls = 0
	}
	returned := g.returned
	g.returned = false
	if !precise {
		g.hold, g.probing, g.rested, g.back, g.knee = 0, false, false, false, 0
	}
	excess := rtt/minRTT - 1
	drained := g.drained
	g.drained = 0
	lagged := g.lagged
	g.lagged = false
	if g.c.Drain && grad < 1 && precise && drained > 0 && excess >= 0.9*drained && rtt <= baseMax*est {
		if !lagged {
			// The window right after a drain still times requests admitted before it (at
			// 5x on 4 workers a failed probe's landing read 6.5% slow in the next window,
			// and taking that for a no-load latency ended the rest at once): hold, and let the
			// next window tell.
			g.drained, g.lagged = drained, true
			return limit
		}
		// The last window drained the limit and the latency did not fall: the excess is not a
		// queue this limit holds (a no-load estimate learned too low, from samples a busy node
		// over-corrected, or a latency others cause). Draining on would take the limit to its
		// floor, a whole estimator's memory long; this latency is the no-load one instead.
		g.base, g.age = math.Min(rtt, baseMax*est), 0
		g.hold, g.probing, g.rested, g.back = 0, false, false, false
		return limit
	}
	if g.c.Drain && grad < 1 && precise && g.probing && g.stepUsed(w, est, limit, excess) {
		// A step up that the upstream used (it served at least half the step more than before
		// it) with less latency than one request waiting for every completion would add: no
		// queue the step made, but the node's noise. Judge the step by what it served.
		grad = 1
	}
	if g.c.Drain && grad < 1 {
		if g.hold > 0 && !g.probing && !g.back {
			// A drain interrupts a rest: a return to the knee rests only what was left of it,
			// so that stalls every few seconds do not re-arm the rest for ever (a limit
			// returned to a knee a stall had lowered it to, and rested there, four of eight
			// workers, as long as the next stall came within the rest).
			g.resume = g.hold
		}
		if precise && g.hold > 0 && !g.probing && !returned && limit == math.Trunc(limit) && limit > g.knee {
			// The limit was resting, its latency clean, and the upstream at once got slower
			// (a window of a stalled node reads twice the latency and serves half) or lost
			// capacity. Both drain; the rest's limit is where the return goes, after a
			// window, and a return that drains again forgets it (a capacity drop).
			g.knee = limit
		}
		g.drained = excess
		next := limit * math.Max(minRTT/rtt, g.c.MinGradient)
		// The window's RTT lags the limit (it holds requests admitted under a higher one), so
		// L x MinRTT/RTT can land below what the upstream serves; never drain below that.
		served, ok := w.served(est)
		if ok {
			next = math.Max(next, math.Min(served, limit))
		}
		if g.c.Hold > 0 && !precise {
			// Low-tail settings, a spread service time: the drain leaves one request waiting
			// inside the upstream. The lead cannot hand a slot over where finishes are this
			// hard to foresee, and a limit of exactly the workers idles each freed one for the
			// hop (with the slow tail, 15-20% of the time at 8 of 8, 25-40% at 4 of 4, for
			// 1-1.5% of the goodput). The concurrency served is reckoned with the mean: the
			// no-load estimate is a median, and the tail's share (Skew) keeps workers busy too.
			// Requests held through the whole window (a slow one still being served) keep
			// their workers busy without completing in it.
			if spread, ok := w.served(est + w.Skew.Seconds()); ok {
				if floor := math.Min(spread+float64(w.Held)+1, limit); floor > next {
					// The window waited in the queue this floor keeps: it must not teach the
					// no-load estimate, or that queue is reckoned as served concurrency next
					// time and the floor keeps a longer one (QueueKeeper). A latency more than
					// keptMax times the estimate is no such queue (a slower upstream): learned.
					next, g.kept = floor, rtt <= keptMax*est
				}
			}
		}
		inFlight := math.Min(float64(w.MaxInFlight), limit)
		if g.probing {
			// A step that failed serves what was served before it, one request less than it
			// lets in: on 2 workers a step to 3 serves 2 of 3, under three quarters, and its
			// drain never landed (the limit went from 2 to 3 and back every half second of a
			// halving, the admitted p99 twice the service time).
			inFlight = math.Min(inFlight, g.from)
		}
		if precise && w.demanded() && ok && served >= 0.75*inFlight {
			// Requests found the limit taken and the upstream served about what was in
			// flight (within the limit: a slot the lead lent is one more in flight, and at 5 on
			// 4 workers it kept every drain from landing): the drain found the knee. (Without
			// that demand, a slower window is the upstream's or the node's own doing; and a window
			// that served much less than it held in flight spans idle time, after which the
			// first requests are slow for reasons of their own. The limit then follows without
			// resting.)
			return g.landed(next, limit, returned, math.Round(served) < limit)
		}
		g.hold, g.probing, g.rested = 0, false, false
		if returned {
			g.knee, g.back = 0, false
		} else if precise && next < g.knee {
			// Below the knee without landing (the window served much less than it held: the
			// node stalled): rest a window and return, as a landed drain does.
			g.hold, g.back = 1, true
		}
		return next
	}
	if g.hold > 0 {
		// Resting where the drain landed: no queue inside the upstream, and no probe above it
		// for a while.
		g.hold--
		g.rested = !g.probing
		if served, ok := w.served(est); ok && g.rested && prev == limit && !stalled(w, served, limit) {
			if g.restAt != limit {
				g.restSum, g.restN, g.restAt = 0, 0, limit
			}
			g.restSum += served
			g.restN++
		}
		return limit
	}
	if g.probing {
		if served, ok := w.served(est); ok && g.before > 0 && w.demanded() {
			g.probeSum += served
			g.probeN++
			if g.probeSum/float64(g.probeN) < g.before+(limit-g.from)/2 {
				// The step up left the latency clean but was not used: the upstream served
				// less than half the step more than before it (a constant-time upstream whose
				// workers finish together queues the extra request for a whole service time
				// without moving the median much). The knee is where it was.
				return g.landed(g.from, limit, false, false)
			}
			if g.probeN < 2 {
				// It looks used, but one window's completions wander by a tenth (40 in a
				// window of 8 constant-time workers, 36 to 45 in the recorded runs), about as
				// much as a step of one: a step to 9 judged by one window that read 8.6
				// against 7.7 went on to 10, then landed on 9 and rested there with a queue
				// inside the upstream. Confirm it over the next window.
				return limit
			}
		}
		// The last step up left the latency clean and was used: the knee has moved up; probe
		// at the shortest rest again.
		g.rest = g.c.Hold
	}
	l := limit * grad
	next := math.Min(l+g.c.SqrtHeadroom*math.Sqrt(l)+g.c.Headroom, MaxValue)
	if g.c.HoldWhenAppLimited && w.appLimited(limit) {
		return math.Min(next, limit)
	}
	if g.back {
		// A window after a drain below the knee: back to it, and rest there.
		g.back = false
		if g.knee > limit {
			g.returned, g.hold = true, g.resumed()
			g.restSum, g.restN = 0, 0
			return g.knee
		}
	}
	if precise && next > limit && prev > limit {
		// A step is judged against what was served before it, so the window it starts from
		// must have run under this limit: the window right after a drain still completes
		// requests admitted under the higher limit, and a step judged against that judged a
		// used step unused (a limit rested at 7 of 8 workers for 4 s). Capping that figure at
		// the limit instead biased every baseline low (a window of 8 workers reads 7.2-8.9
		// served by the phases of their completions: the cap cut the high readings and kept
		// the low ones), so steps to 9 looked used. Wait a window.
		return limit
	}
	if g.rested {
		// The first step after a rest is the smallest, Headroom (a whole one, below): the knee
		// is most likely where the limit rests, and every request admitted above it waits
		// inside the upstream.
		next = math.Min(next, limit+g.c.Headroom)
		g.rested = false
	}
	if precise && next > limit {
		// Whole steps: a fractional limit lets one request more in for a share of the time,
		// and the queue's lead lends no slot then (admission.AdaptiveConfig.Lead), so a step
		// of half a request measured the lead's loss as much as the step's gain and was
		// judged unused below the knee (a limit rested at 7 on 8 workers for a whole run).
		next = math.Max(math.Round(next), math.Floor(limit)+1)
		// A window mostly times requests admitted before it began: judge a step up by the
		// window after it before taking the next, against what was served before it.
		g.hold, g.probing, g.from, g.to, g.before = 1, true, limit, next, 0
		g.probeSum, g.probeN = 0, 0
		if g.restN >= minRestWindows && g.restAt == limit {
			// The rest's mean: one window's completions wander by about as much as the step.
			g.before = g.restSum / float64(g.restN)
		} else if served, ok := w.served(est); ok {
			// Without a rest (a drain that did not land, as after slow start), one window
			// is all there is, and at most the limit it ran under: a first step from 7.48 to
			// 8 on 8 workers, judged against a window that read 8.3 by its phases, looked
			// unused, marked 7 as the knee and rested there 20 s. A baseline read high marks
			// a knee a worker low for up to HoldMax windows; one capped low costs at most a
			// step above the knee, which the latency then drains.
			g.before = math.Min(served, limit)
		}
		g.restSum, g.restN = 0, 0
	}
	return next
}
