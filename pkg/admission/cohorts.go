package admission

import (
	"math"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

// ReasonCohort refuses a request below the cohort admission level (NewCohorts).
const ReasonCohort Reason = "cohort"

// ErrCohort matches every refusal below the cohort admission level (errors.Is).
var ErrCohort = &Rejection{Reason: ReasonCohort}

// Defaults of CohortOptions.
const (
	// DefaultCohortStrategyShare is the strategy's share of refusals for a strategy with a queue
	// of its own (adaptive with its queue, the bounded queue, CoDel, the leaky bucket): its queue
	// keeps the backend busy, and the few it refuses keep an adaptive limit learning.
	DefaultCohortStrategyShare = 0.03
	// DefaultCohortRoomShare is the share for a strategy without a queue (inflight, the token
	// bucket), which the waiting room stands in for: with random arrivals a limit without a
	// queue is kept busy only while some of what passes finds it full. Measured in the
	// deterministic simulation of TestCohortsTradeOff (four services of 4 workers): at 5x, 0.10
	// keeps 0.83 C busy, 0.20 keeps 0.91 C; at 2x across four services the end-to-end success
	// stays 0.84x of the least-served leg's share.
	DefaultCohortRoomShare    = 0.2
	DefaultCohortWaitFraction = 1.5
	DefaultCohortMaxWait      = 100 * time.Millisecond
	DefaultCohortWindow       = 250 * time.Millisecond
	// MaxCohortRanks bounds CohortOptions.Ranks (the level histogram has NumPriorities x Ranks bins).
	MaxCohortRanks = 4096
)

// The controller's constants (see Cohorts).
const (
	cohortGain        = 0.5  // share of the way to its target the admitted fraction moves per window
	cohortSmooth      = 0.5  // weight of the newest window in the smoothed counts
	cohortBoost       = 0.25 // the most the passed traffic grows per window when the strategy refuses nothing
	cohortMinArrivals = 20   // a window with fewer arrivals is extended (up to cohortStale windows)
	cohortStale       = 4
	cohortMaxWaiters  = 1024
)

// CohortOptions configure ranked admission (NewCohorts). Zero values take the defaults.
type CohortOptions struct {
	// Ranks is the number of cohort ranks per priority class, 2 to MaxCohortRanks.
	Ranks int
	// StrategyShare is the share of the requests let through the level that the strategy itself
	// (with the waiting room) should still refuse, in (0, 0.5]: so that it keeps measuring (an
	// adaptive limit keeps learning) and keeps the backend busy. Default: 0.03 for a strategy
	// with a queue of its own, 0.2 for one without (DefaultCohortRoomShare).
	StrategyShare float64
	// WaitFraction sizes the waiting room that stands in for a queue when the strategy has none:
	// a request let through that the strategy refuses for want of capacity waits for a release,
	// best level first, up to WaitFraction x the mean admitted latency, and at most WaitFraction
	// x the strategy's limit requests wait (so a full room drains in about that many service
	// times), in [0, 4]. Default 1.5. WaitFraction < 0 means no room (0 takes the default).
	WaitFraction float64
	// MaxWait caps that wait. Default 100 ms.
	MaxWait time.Duration
	// Window is how often the level moves. Default 250 ms.
	Window time.Duration
}

func (o *CohortOptions) fill() error {
	var errs fieldErrors
	switch {
	case o.Ranks < 2 || o.Ranks > MaxCohortRanks:
		errs.add("cohorts.count", "must be from 2 to %d, got %d", MaxCohortRanks, o.Ranks)
	}
	if o.StrategyShare != 0 && !(o.StrategyShare > 0 && o.StrategyShare <= 0.5) {
		errs.add("cohorts.strategyShare", "must be in (0, 0.5], got %v", o.StrategyShare)
	}
	switch {
	case o.WaitFraction == 0:
		o.WaitFraction = DefaultCohortWaitFraction
	case o.WaitFraction < 0:
		o.WaitFraction = 0
	case o.WaitFraction > 4 || math.IsNaN(o.WaitFraction):
		errs.add("cohorts.waitFraction", "must be in [0, 4], got %v", o.WaitFraction)
	}
	if o.MaxWait == 0 {
		o.MaxWait = DefaultCohortMaxWait
	}
	if o.MaxWait < 0 {
		errs.add("cohorts.maxWait", "must not be negative, got %s", o.MaxWait)
	}
	if o.Window == 0 {
		o.Window = DefaultCohortWindow
	}
	if o.Window < time.Millisecond {
		errs.add("cohorts.window", "must be at least 1ms, got %s", o.Window)
	}
	return errs.err()
}

// CohortLevel is an admission level: requests of a more important priority class than Priority
// are admitted, and those of Priority whose rank is at most Rank.
type CohortLevel struct {
	Priority Priority
	Rank     int
}

// Admits reports whether a request of priority p and rank rank is at or above the level.
func (l CohortLevel) Admits(p Priority, rank int) bool {
	return p < l.Priority || p == l.Priority && rank <= l.Rank
}

// String renders the level as "<priority>/<rank>", for example "sheddable/127" (everything
// admitted with 128 ranks) or "critical/40".
func (l CohortLevel) String() string { return l.Priority.String() + "/" + strconv.Itoa(l.Rank) }

// Cohorts is ranked admission in front of a strategy (DAGOR's admission level): every request
// has a level, its priority class first and its cohort rank second (Request.Rank), and Cohorts
// refuses those below an admission level with ReasonCohort, so that when the strategy cannot
// admit everyone, the bottom of the ranking is refused, not a random share. Sidecars that rank
// the legs of one user request alike (the gate's keyed hash) then refuse the same user requests
// in every service of a call graph.
//
// The level moves every Window, from what the strategy did with what passed it:
//
//   - The counts of the window (arrivals, passed, refused by the strategy for want of capacity)
//     are smoothed over windows (half the weight on the newest), and so is the histogram of
//     arrivals per level.
//   - Traffic to pass: what the strategy admitted, divided by (1 - StrategyShare), so that at
//     the fixed point the strategy refuses StrategyShare of what passes. While the strategy
//     refuses less than half of that share, the traffic to pass grows by up to 25% a window
//     (proportionally less as the share approaches half the target), so a level opens within a
//     few seconds once the overload ends.
//   - The admitted fraction of arrivals moves half of the way to that target each window, and
//     the level is read off the histogram: the lowest level whose cumulative arrivals reach the
//     fraction.
//
// Why it settles and does not oscillate: under overload the target (the strategy's admitted
// rate over a constant) does not depend on the fraction passed, so the fraction converges
// geometrically to it, halving the distance each window (1x to 3x settles in about 8 windows,
// 2 s); the strategy's own limit moves each round trip or sample window (tens of ms), so the
// level moves more slowly than the limit and sees it settled. The strategy's refusals near the
// level fall on the requests that waited longest in the rank-ordered waiting room below, which
// are the lowest levels let through, so even these are consistent across services.
//
// In front of a strategy without a queue of its own (inflight, the token bucket), a request let
// through that the strategy refuses for capacity waits in a small waiting room ordered by level,
// for up to WaitFraction x the mean admitted latency (at most MaxWait): each release offers the
// freed capacity to the best-ranked waiter first, so a ranked request is not refused by the
// timing of a release, and the backend is not left idle until the next arrival. A full room
// refuses the worst-ranked of its waiters and the newcomer, so what the room refuses is the
// bottom of what passed the level, the same requests in every service.
type Cohorts struct {
	inner Core
	o     CohortOptions

	sub      Events
	room     []*waiter // ordered by level, then arrival
	draining bool

	// The controller.
	winEnd             time.Time
	cur                []uint32  // arrivals per level this window
	hist               []float64 // smoothed arrivals per level
	n, passed, refused int       // this window's counts
	sN, sP, sF         float64   // smoothed counts
	frac               float64   // admitted fraction of arrivals
	threshold          int       // the highest level admitted
	meanLatency        float64   // EWMA of admitted latency, seconds
	level              atomic.Int64
}

type waiter struct {
	t            *Ticket
	level        int
	until, retry time.Time
	rej          *Rejection
}

// NewCohorts puts ranked admission in front of inner.
func NewCohorts(inner Core, o CohortOptions) (*Cohorts, error) {
	if err := o.fill(); err != nil {
		return nil, err
	}
	n := NumPriorities * o.Ranks
	queues := inner.maxQueueWait() > 0
	if queues {
		o.WaitFraction = 0 // the strategy's own queue keeps the backend busy
	}
	if o.StrategyShare == 0 {
		o.StrategyShare = DefaultCohortRoomShare
		if queues {
			o.StrategyShare = DefaultCohortStrategyShare
		}
	}
	c := &Cohorts{inner: inner, o: o, cur: make([]uint32, n), hist: make([]float64, n), frac: 1, threshold: n - 1}
	c.level.Store(int64(n - 1))
	return c, nil
}

// CohortsOf returns the cohort stage in front of c, or nil when there is none.
func CohortsOf(c Core) *Cohorts {
	x, _ := c.(*Cohorts)
	return x
}

// Level returns the admission level now. It is safe for concurrent use.
func (c *Cohorts) Level() CohortLevel {
	return c.levelOf(int(c.level.Load()))
}

func (c *Cohorts) levelOf(i int) CohortLevel {
	return CohortLevel{Priority: Priority(i / c.o.Ranks), Rank: i % c.o.Ranks}
}

func (c *Cohorts) index(r *Request) int {
	rank := min(max(r.Rank, 0), c.o.Ranks-1)
	return int(clampPriority(r.Priority))*c.o.Ranks + rank
}

// Name is the strategy's name.
func (c *Cohorts) Name() string { return c.inner.Name() }

func (c *Cohorts) Offer(now time.Time, t *Ticket, ev *Events) Verdict {
	c.roll(now)
	if r := doorCheck(now, &t.Req, c.draining, c.Name()); r != nil {
		t.refuse(r)
		return Refused
	}
	lvl := c.index(&t.Req)
	c.cur[lvl]++
	c.n++
	if lvl > c.threshold {
		t.refuse(&Rejection{Reason: ReasonCohort, RetryAfter: time.Second, Stage: "cohorts"})
		return Refused
	}
	c.passed++
	v := c.inner.Offer(now, t, &c.sub)
	c.settle(ev)
	if v == Refused && capacity(t.Err.Reason) {
		if w := c.wait(); w > 0 {
			if len(c.room) >= c.depth(now) {
				// The room is full: the worst-ranked of the waiters and t is refused.
				worst := c.room[len(c.room)-1]
				if worst.level <= lvl {
					c.refused++
					return Refused
				}
				c.room = c.room[:len(c.room)-1]
				worst.t.refuse(worst.rej)
				c.refused++
				ev.Add(worst.t)
			}
			c.enter(now, t, lvl, w)
			return Pending
		}
		c.refused++
	}
	return v
}

// depth is how many requests may wait in the room: WaitFraction of the strategy's concurrency
// limit (at least one), so that a full room drains in about WaitFraction of a service time;
// cohortMaxWaiters for a strategy without one (a rate).
func (c *Cohorts) depth(now time.Time) int {
	l := c.inner.Stats(now).Limit
	if l <= 0 {
		return cohortMaxWaiters
	}
	return min(max(int(math.Ceil(c.o.WaitFraction*l)), 1), cohortMaxWaiters)
}

// capacity reports whether a refusal is for want of capacity (what the level answers for).
func capacity(r Reason) bool {
	switch r {
	case ReasonConcurrencyLimit, ReasonQueueFull, ReasonQueueTimeout, ReasonRateLimited:
		return true
	}
	return false
}

// wait is how long a refused request may wait for a release now.
func (c *Cohorts) wait() time.Duration {
	if c.o.WaitFraction > 0 && c.meanLatency == 0 {
		return c.o.MaxWait // no release yet to learn the latency from: the cap
	}
	w := time.Duration(c.o.WaitFraction * c.meanLatency * float64(time.Second))
	return min(w, c.o.MaxWait)
}

// enter puts t, which the strategy refused, in the waiting room.
func (c *Cohorts) enter(now time.Time, t *Ticket, lvl int, wait time.Duration) {
	w := &waiter{t: t, level: lvl, until: now.Add(wait), rej: t.Err}
	if d := t.Req.Deadline; !d.IsZero() && d.Before(w.until) {
		w.until = d
	}
	c.schedule(now, w)
	t.state, t.Err = Pending, nil
	i, _ := slices.BinarySearchFunc(c.room, lvl, func(x *waiter, l int) int {
		if x.level <= l {
			return -1
		}
		return 1
	})
	c.room = slices.Insert(c.room, i, w)
}

// schedule sets when a waiter refused with a retry hint shorter than its wait tries again (an
// empty bucket refills with time, not with releases).
func (c *Cohorts) schedule(now time.Time, w *waiter) {
	w.retry = time.Time{}
	if ra := w.rej.RetryAfter; ra > 0 && now.Add(ra).Before(w.until) {
		w.retry = now.Add(ra)
	}
}

// retry offers t to the strategy again.
func (c *Cohorts) retry(now time.Time, w *waiter) Verdict {
	t := w.t
	t.state, t.Err, t.cost = Pending, nil, 0
	t.prev, t.next, t.heapIdx = nil, nil, -1
	v := c.inner.Offer(now, t, &c.sub)
	if v == Refused {
		w.rej = t.Err
		t.state, t.Err = Pending, nil
		c.schedule(now, w)
	}
	return v
}

// serve offers the capacity a release freed to the waiters, best level first, until the
// strategy refuses one.
func (c *Cohorts) serve(now time.Time, ev *Events) {
	for len(c.room) > 0 {
		w := c.room[0]
		v := c.retry(now, w)
		if v == Refused {
			return
		}
		c.room = c.room[1:]
		if v == Admitted {
			ev.Add(w.t)
		}
	}
}

// settle passes on what the strategy resolved, counting its refusals for capacity.
func (c *Cohorts) settle(ev *Events) {
	for i := 0; i < c.sub.Len(); i++ {
		t := c.sub.At(i)
		if t.state == Refused && capacity(t.Err.Reason) {
			c.refused++
		}
		ev.Add(t)
	}
	c.sub.Reset()
}

func (c *Cohorts) Release(now time.Time, t *Ticket, o Outcome, ev *Events) {
	c.roll(now)
	if o == Success {
		d := t.RTT
		if d <= 0 {
			d = now.Sub(t.Granted)
		}
		if c.meanLatency == 0 {
			c.meanLatency = d.Seconds()
		} else {
			c.meanLatency += 0.1 * (d.Seconds() - c.meanLatency)
		}
	}
	c.inner.Release(now, t, o, &c.sub)
	c.settle(ev)
	c.serve(now, ev)
	c.settle(ev)
}

func (c *Cohorts) Cancel(now time.Time, t *Ticket, ev *Events) {
	for i, w := range c.room {
		if w.t == t {
			c.room = slices.Delete(c.room, i, i+1)
			t.state = Cancelled
			return
		}
	}
	c.inner.Cancel(now, t, &c.sub)
	c.settle(ev)
}

func (c *Cohorts) Advance(now time.Time, ev *Events) {
	c.roll(now)
	c.inner.Advance(now, &c.sub)
	c.settle(ev)
	kept := c.room[:0]
	for _, w := range c.room {
		due := !now.Before(w.until)
		if due || !w.retry.IsZero() && !now.Before(w.retry) {
			switch c.retry(now, w) {
			case Admitted:
				ev.Add(w.t)
				continue
			case Pending:
				continue
			}
			if due {
				w.t.refuse(w.rej)
				c.refused++
				ev.Add(w.t)
				continue
			}
		}
		kept = append(kept, w)
	}
	clear(c.room[len(kept):])
	c.room = kept
	c.settle(ev)
}

func (c *Cohorts) Wake() time.Time {
	w := c.inner.Wake()
	for _, x := range c.room {
		w = earliest(w, x.until)
		if !x.retry.IsZero() {
			w = earliest(w, x.retry)
		}
	}
	return w
}

func (c *Cohorts) Drain(now time.Time, ev *Events) {
	c.draining = true
	for _, w := range c.room {
		w.t.refuse(&Rejection{Reason: ReasonDraining, RetryAfter: time.Second, Stage: c.Name()})
		ev.Add(w.t)
	}
	clear(c.room)
	c.room = c.room[:0]
	c.inner.Drain(now, &c.sub)
	c.settle(ev)
}

func (c *Cohorts) Stats(now time.Time) Stats {
	s := c.inner.Stats(now)
	for _, w := range c.room {
		s.Queued += max(w.t.Req.cost(), 1)
	}
	s.QueuedRequests += len(c.room)
	s.Buffered += int64(len(c.room))
	return s
}

// estimate is what a waiting request can expect: the rest of its wait in the waiting room, or
// the strategy's estimate when it waits in the strategy's queue.
func (c *Cohorts) estimate(now time.Time, t *Ticket) Queued {
	for _, w := range c.room {
		if w.t == t {
			return Queued{Bound: max(w.until.Sub(now), 0) + c.inner.maxQueueWait()}
		}
	}
	return queuedWait(c.inner, now, t)
}

func (c *Cohorts) maxQueueWait() time.Duration { return c.inner.maxQueueWait() + c.o.MaxWait }

// roll closes the window when it is over and moves the level.
func (c *Cohorts) roll(now time.Time) {
	if c.winEnd.IsZero() {
		c.winEnd = now.Add(c.o.Window)
		return
	}
	if now.Before(c.winEnd) {
		return
	}
	if c.n < cohortMinArrivals && now.Sub(c.winEnd) < cohortStale*c.o.Window {
		return // too few arrivals to judge: let the window run on
	}
	c.update()
	c.winEnd = now.Add(c.o.Window)
}

// update moves the level from the window's counts (see Cohorts).
func (c *Cohorts) update() {
	if c.sN == 0 && c.sP == 0 {
		// The first window is judged against a calm past (everything passed, nothing refused),
		// so a sidecar's first moments (cold connections, a slow first answer) do not close it.
		c.sN, c.sP = float64(c.n), float64(c.passed)
		for i, v := range c.cur {
			c.hist[i] = float64(v)
		}
	}
	a := cohortSmooth
	c.sN += a * (float64(c.n) - c.sN)
	c.sP += a * (float64(c.passed) - c.sP)
	c.sF += a * (float64(c.refused) - c.sF)
	for i, v := range c.cur {
		c.hist[i] += a * (float64(v) - c.hist[i])
	}
	switch {
	case c.n < cohortMinArrivals:
		// A quiet spell: nothing to protect; open up.
		c.frac = min(1, c.frac*(1+cohortBoost))
	case c.sP > 0 && c.sN > 0:
		s := c.o.StrategyShare
		f := c.sF / c.sP
		target := (c.sP - c.sF) / (1 - s)
		if f < s/2 {
			target = max(target, c.sP*(1+cohortBoost*(1-2*f/s)))
		}
		c.frac += cohortGain * (min(target/c.sN, 1) - c.frac)
	}
	c.frac = min(max(c.frac, 0), 1)
	c.threshold = c.levelFor(c.frac)
	c.level.Store(int64(c.threshold))
	clear(c.cur)
	c.n, c.passed, c.refused = 0, 0, 0
}

// levelFor is the lowest level whose cumulative smoothed arrivals reach frac of them all (the
// last level when frac is 1, so levels not seen lately are admitted too).
func (c *Cohorts) levelFor(frac float64) int {
	last := len(c.hist) - 1
	if frac >= 0.999 {
		return last
	}
	var total float64
	for _, v := range c.hist {
		total += v
	}
	need, cum := frac*total, 0.0
	for i, v := range c.hist {
		cum += v
		if cum >= need && cum > 0 {
			return i
		}
	}
	return last
}
