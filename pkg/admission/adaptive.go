package admission

import (
	"math"
	"slices"
	"time"

	"github.com/loadshed/loadshed/pkg/admission/limit"
)

// AdaptiveConfig configures the adaptive strategy: an in-flight limit that a limit algorithm
// moves from latency samples, with an optional bounded wait queue. No capacity needs to be
// configured: the algorithm finds it.
type AdaptiveConfig struct {
	// Algorithm computes the next limit from each window of samples (package limit).
	Algorithm limit.Algorithm
	// InitialLimit is the limit before any sample (warm start); MinLimit and MaxLimit clamp it.
	// A limit is enforced as an average over time: floor(limit) requests in flight always, and
	// one more for the fractional part's share of the time.
	InitialLimit, MinLimit, MaxLimit float64
	// SlowStart: for this long after the first request, and until the first sign of overload,
	// the limit grows on demand up to twice its value at the start of each window (like TCP slow
	// start), so a fresh pod finds its capacity in a few windows instead of shedding while it
	// creeps up; a saturated window at least doubles it. Zero disables it.
	SlowStart time.Duration
	// Window is the shortest update interval; a window also needs MinSamples outcomes, and
	// closes after MaxWindow whatever it holds (defaults 100 ms, 10, 1 s).
	Window, MaxWindow time.Duration
	MinSamples        int
	// MinRTTWindows is how many windows the no-load latency estimate remembers (default 100).
	MinRTTWindows int
	// Tolerance is the latency below which nothing counts as overload: a window whose median
	// is at most this reads to the algorithm as one without queueing (its median equal to the
	// MinRTT), so that scheduling noise in front of a backend that answers in microseconds is
	// not taken for a many-fold slowdown. Zero: every window counts.
	Tolerance time.Duration
	// QueueDepth and MaxWait configure the optional wait queue (depth 0: refuse at once); a
	// queue's MaxWait must be positive.
	QueueDepth int64
	MaxWait    time.Duration
	// QueuePerLimit sizes the queue from the limit when QueueDepth is 0 (a fixed depth wins):
	// ceil(QueuePerLimit x limit) cost units may wait, so the queue grows and shrinks with the
	// limit the algorithm finds. WaitPerRTT bounds each wait in such a queue at WaitPerRTT x the
	// no-load latency estimate (never beyond MaxWait, which alone applies while that estimate is
	// unknown). A fixed QueueDepth is the user's own queue: MaxWait alone bounds its waits.
	//
	// Such a queue keeps the backend busy without a queue inside it: a slot that frees is taken
	// at once by a waiter instead of staying idle until the next arrival, while the limit stays
	// where the latency says the backend is saturated. Half the limit waiting, each for at most a
	// quarter of the no-load latency (QueuePerLimit 0.5, WaitPerRTT 0.25), is the default of the
	// proxy's adaptive block.
	QueuePerLimit float64
	WaitPerRTT    float64
	// QueueLIFO serves the newest waiter first (within a priority level). Under a light overload
	// the queue only bridges the moment between a completion and the next arrival, and either
	// order serves every waiter; under a heavy one the queue is always full, and newest-first
	// admits requests that have barely waited while the oldest reach their bound and are
	// refused, instead of making every admitted request pay the whole wait.
	QueueLIFO bool
	// Lead hands a slot over just before it frees: a request in flight that is expected to
	// finish within Lead (it set out, or the request that lent it a slot was released, one
	// expected latency ago: the larger of the no-load estimate and the last window's median;
	// before that lender's release, one latency after the lender was expected to finish), and
	// is not overdue by more than that latency, lends its slot once to a request admitted in
	// its place; at most an eighth of the limit (at least one) is lent at once, never while
	// the limit is fractional, and the lead is at most LeadShare of the expected latency.
	// The request then reaches the upstream as the slot frees instead of setting out only
	// then, so the limit can sit at the upstream's own concurrency without a worker idling for
	// the hop after each completion, and without a queue inside the upstream to hide that hop.
	// The borrower's latency sample is counted from its lender's release (shortened by at most
	// the lead in effect): the wait inside the upstream the lead itself causes is not a queue the limit holds.
	// It should cover the hop and the spread of finishes around the expected one: a sidecar's
	// loopback hop and the two processes' wake-ups take some hundreds of microseconds, and
	// timers fire up to a millisecond late (Go rounds a timer's wait up to whole
	// milliseconds), so the lead in effect is often shorter than the one set. Zero: off.
	Lead time.Duration
	// LeadShare caps the lead in effect at this share of the expected latency, so that an
	// upstream that answers in a millisecond or two is not sent requests it cannot start yet.
	// Zero: DefaultLeadShare. A longer way to the upstream than a sidecar's loopback (Envoy's
	// external processor adds its gRPC messages and Envoy's own hop) wants a longer lead, and
	// at a latency of some tens of milliseconds a larger share to let it act.
	LeadShare  float64
	Priorities PriorityConfig
}

// DefaultLeadShare is AdaptiveConfig.LeadShare's default: the lead is at most a twentieth of the
// expected latency.
const DefaultLeadShare = 0.05

// MaxLeadShare is the largest AdaptiveConfig.LeadShare: a lead of half the latency would have
// every request in flight lend its slot half-way through.
const MaxLeadShare = 0.5

func (c *AdaptiveConfig) defaults() {
	if c.Window == 0 {
		c.Window = 100 * time.Millisecond
	}
	if c.MaxWindow == 0 {
		c.MaxWindow = time.Second
	}
	if c.MinSamples == 0 {
		c.MinSamples = 10
	}
	if c.MinRTTWindows == 0 {
		c.MinRTTWindows = 100
	}
	if c.LeadShare == 0 {
		c.LeadShare = DefaultLeadShare
	}
}

// Validate reports every problem with the configuration.
func (c AdaptiveConfig) Validate() error {
	c.defaults()
	var errs fieldErrors
	if c.Algorithm == nil {
		errs.add("algorithm", "required")
	}
	if !(c.MinLimit >= 1) {
		errs.add("minLimit", "must be at least 1, got %v", c.MinLimit)
	}
	if !(c.MaxLimit >= c.MinLimit) || math.IsInf(c.MaxLimit, 0) {
		errs.add("maxLimit", "must be finite and at least minLimit (%v), got %v", c.MinLimit, c.MaxLimit)
	}
	if !(c.InitialLimit >= c.MinLimit && c.InitialLimit <= c.MaxLimit) {
		errs.add("initialLimit", "must lie within [minLimit, maxLimit] = [%v, %v], got %v", c.MinLimit, c.MaxLimit, c.InitialLimit)
	}
	if c.SlowStart < 0 {
		errs.add("slowStart", "must not be negative, got %s", c.SlowStart)
	}
	if c.Window <= 0 || c.MaxWindow < c.Window {
		errs.add("window", "must be positive and at most maxWindow, got %s and %s", c.Window, c.MaxWindow)
	}
	if c.MinSamples < 1 {
		errs.add("minSamples", "must be at least 1, got %d", c.MinSamples)
	}
	if c.Tolerance < 0 {
		errs.add("tolerance", "must not be negative, got %s", c.Tolerance)
	}
	if c.QueueDepth < 0 {
		errs.add("queue.depth", "must not be negative, got %d", c.QueueDepth)
	}
	if !(c.QueuePerLimit >= 0 && c.QueuePerLimit <= 100) {
		errs.add("queue.depthPerLimit", "must be between 0 and 100, got %v", c.QueuePerLimit)
	}
	if c.Lead < 0 || c.Lead > time.Second {
		errs.add("queue.lead", "must be between 0 and 1s, got %s", c.Lead)
	}
	if !(c.LeadShare > 0 && c.LeadShare <= MaxLeadShare) {
		errs.add("queue.leadShare", "must be above 0 and at most %v, got %v", MaxLeadShare, c.LeadShare)
	}
	if !(c.WaitPerRTT >= 0 && c.WaitPerRTT <= 100) {
		errs.add("queue.waitPerRTT", "must be between 0 and 100, got %v", c.WaitPerRTT)
	}
	if c.MaxWait < 0 || ((c.QueueDepth > 0 || c.QueuePerLimit > 0) && c.MaxWait == 0) {
		errs.add("queue.maxWait", "must be a positive duration (how long a request may wait) when queue.depth or queue.depthPerLimit is set, got %s", c.MaxWait)
	}
	errs.nest("priorities", c.Priorities.Validate())
	return errs.err()
}

// NewAdaptive returns the adaptive strategy as a Core.
func NewAdaptive(c AdaptiveConfig) (Core, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c.defaults()
	return &semaphore{
		name: "adaptive", limit: c.InitialLimit, depth: c.QueueDepth, maxWait: c.MaxWait,
		depthPerLimit: c.QueuePerLimit, waitPerRTT: c.WaitPerRTT, lifo: c.QueueLIFO, lead: c.Lead,
		leadShare: c.LeadShare, prio: c.Priorities, adapt: newController(c),
	}, nil
}

// maxWindowSamples bounds the memory of one window; a busier window closes early.
const maxWindowSamples = 1024

// controller gathers outcomes into windows and moves the limit with the algorithm. It holds no
// lock and reads no clock: the semaphore calls it with the time of each release.
type controller struct {
	algo                 limit.Algorithm
	min, max             float64
	window, maxWindow    time.Duration
	minSamples           int
	minRTT               *limit.MinRTT
	noise                *limit.MinRTT // the window median's sampling error without a queue
	slowStart            time.Duration
	slowUntil            time.Time
	slowDone             bool
	tolerance            time.Duration
	slowCap              float64   // during slow start: how far the limit may grow in this window
	healthy              bool      // the last window showed no queueing (RTT within 10% of MinRTT) and no drops
	start                time.Time // of the current window, zero before the first sample
	rtts                 []time.Duration
	dropped, maxInFlight int
	blocked              int // requests that found the limit taken in the current window
	lastRTT              time.Duration
	// held is the permits in flight when the current window began that have not been released
	// since (Window.Held at its end).
	held int64
	// kept counts the windows in a row left out of the no-load estimate (learns).
	kept int
}

func newController(c AdaptiveConfig) *controller {
	return &controller{
		algo: c.Algorithm, min: c.MinLimit, max: c.MaxLimit,
		window: c.Window, maxWindow: c.MaxWindow, minSamples: c.MinSamples,
		minRTT: limit.NewMinRTT(c.MinRTTWindows), noise: limit.NewMinNoise(c.MinRTTWindows), slowStart: c.SlowStart, tolerance: c.Tolerance,
		rtts: make([]time.Duration, 0, 64),
	}
}

// maxKeptWindows bounds how many windows in a row the no-load estimator leaves out because the
// algorithm kept a queue in them (limit.QueueKeeper): the next one is learned whatever it
// says, so a backend that became slower by less than the algorithm can tell from the queue it
// keeps (the gradient: half again the estimate) is still followed, within ten of the
// estimator's spans instead of one.
const maxKeptWindows = 9

// learns reports whether the window just given to the algorithm teaches the no-load estimator.
func (c *controller) learns() bool {
	if k, ok := c.algo.(limit.QueueKeeper); ok && k.KeptQueue() && c.kept < maxKeptWindows {
		c.kept++
		return false
	}
	c.kept = 0
	return true
}

// inflight records the in-flight count after an admission.
func (c *controller) inflight(n int64) {
	c.maxInFlight = max(c.maxInFlight, int(n))
}

// block records a request that found the limit taken: it waits for a permit or is refused.
func (c *controller) block() {
	c.blocked++
}

// grow is asked, during slow start, for a limit of at least want; it returns the limit to use.
func (c *controller) grow(now time.Time, cur, want float64) float64 {
	// No growth on demand before a window has measured the unloaded latency at the initial
	// limit (growing first would teach the estimator a queued latency), nor after a window that
	// showed queueing.
	if c.slowDone || c.slowStart == 0 || !c.healthy {
		return cur
	}
	if c.slowCap == 0 {
		c.slowCap = 2 * cur
	}
	if now.After(c.slowUntil) {
		return cur
	}
	return min(max(cur, want), c.slowCap, c.max)
}

// sample takes one outcome and returns the limit, updated when a window closes: the request
// was admitted at granted with cost permits, and inUse permits are still in flight after it.
func (c *controller) sample(now time.Time, rtt time.Duration, o Outcome, cur float64, backlog int, granted time.Time, cost, inUse int64) float64 {
	if c.start.IsZero() {
		c.start = now
		c.slowUntil = now.Add(c.slowStart)
	} else if granted.Before(c.start) {
		c.held = max(0, c.held-cost)
	}
	switch o {
	case Success:
		if rtt >= limit.MinMeaningfulRTT {
			c.rtts = append(c.rtts, rtt)
		}
	case Dropped:
		c.dropped++
	}
	n := len(c.rtts) + c.dropped
	elapsed := now.Sub(c.start)
	// A window spans at least a few round trips, so that what it measures is the limit it ran
	// under rather than the previous window's.
	window := max(c.window, 5*c.minRTT.Value())
	if !(elapsed >= window && n >= c.minSamples) && elapsed < c.maxWindow && len(c.rtts) < maxWindowSamples {
		return cur
	}
	next := cur
	if n > 0 {
		w := limit.Window{Samples: len(c.rtts), Dropped: c.dropped, MaxInFlight: c.maxInFlight, Backlog: backlog, Blocked: c.blocked, Duration: elapsed, Held: int(c.held)}
		var median time.Duration // the window's, before the tolerance below
		if len(c.rtts) > 0 {
			slices.Sort(c.rtts)
			w.RTT = c.rtts[len(c.rtts)/2]
			noise := limit.MedianNoise(c.rtts)
			if len(c.rtts) >= 4 {
				// A window without spread below its median (a constant-time upstream) reads
				// as no noise, and that counts: as an empty slot it left the estimate to the
				// few windows that had some (a step's queue), and one of those made a
				// constant-time upstream's medians look too noisy to rest at the knee.
				noise = max(noise, 1)
			}
			w.RTTNoise = c.noise.Observe(noise)
			var sum time.Duration
			for _, r := range c.rtts {
				sum += r
			}
			w.Skew = max(0, sum/time.Duration(len(c.rtts))-w.RTT)
			// The no-load estimate is the lowest window median seen lately, not the lowest
			// sample: algorithms compare it with a window median, and a backend whose service
			// time varies (a slow tail, a normal spread) has a low percentile well below its
			// median even when nothing queues, which would read as permanent congestion.
			w.MinRTT = c.minRTT.Peek(w.RTT)
			median, c.lastRTT = w.RTT, w.RTT
			if w.RTT <= c.tolerance && w.MinRTT > 0 {
				// Within the tolerance: no queue the algorithm should react to.
				w.RTT = w.MinRTT
			}
		} else {
			w.MinRTT = c.minRTT.Value()
		}
		next = c.algo.Update(cur, w)
		if median > 0 && c.learns() {
			c.minRTT.Observe(median)
		}
		c.healthy = w.Dropped == 0 && w.RTT > 0 && w.MinRTT > 0 && float64(w.RTT) <= 1.1*float64(w.MinRTT)
		if !c.slowDone {
			switch {
			case now.After(c.slowUntil) || next < cur || w.Dropped > 0:
				c.slowDone = true
			case w.MaxInFlight >= int(cur):
				// Saturated and unharmed: twice the window's starting limit (growth on demand
				// may have taken it part of the way already).
				// (After the first window slowCap is still 0: that window measured the baseline at
				// the initial limit and is not doubled.)
				next = max(next, c.slowCap, cur)
			}
		}
		if math.IsNaN(next) || math.IsInf(next, 0) {
			next = cur
		}
		next = min(max(next, c.min), c.max)
	}
	c.start = now
	c.held = inUse
	c.rtts = c.rtts[:0]
	c.dropped = 0
	c.maxInFlight = 0
	c.blocked = 0
	c.slowCap = 2 * next
	return next
}
