package admission

import "time"

// CoDelConfig configures the controlled-delay queue ("Fail at Scale", Facebook's wangle):
// requests wait in a queue in front of a concurrency limit, and the queue sheds only when a
// standing queue persists. At each interval boundary the queue counts as overloaded if the
// shortest wait seen during the interval exceeded Target (the wait of the oldest waiter, sampled
// whenever a request starts; zero when one starts without waiting); while overloaded, waits
// above 2 x Target are shed and the queue is served LIFO, so the freshest requests, whose
// clients still wait, go first and those that would only time out leave after 2 x Target
// instead of the full MaxWait. A short burst that drains within an interval passes untouched.
type CoDelConfig struct {
	// Concurrency is a fixed limit; zero puts an adaptive limit (Adaptive) in front instead.
	Concurrency int64
	Adaptive    *AdaptiveConfig
	// Target (default 5 ms) and Interval (default 100 ms) are CoDel's two knobs.
	Target, Interval time.Duration
	// Depth bounds the queue (cost units); MaxWait bounds a wait when not overloaded (default:
	// two intervals, so the backlog of a burst can take the interval after the one it formed in
	// to drain).
	Depth      int64
	MaxWait    time.Duration
	Priorities PriorityConfig
}

func (c *CoDelConfig) defaults() {
	if c.Target == 0 {
		c.Target = 5 * time.Millisecond
	}
	if c.Interval == 0 {
		c.Interval = 100 * time.Millisecond
	}
	if c.MaxWait == 0 {
		c.MaxWait = 2 * c.Interval
	}
}

// Validate reports every problem with the configuration.
func (c CoDelConfig) Validate() error {
	c.defaults()
	var errs fieldErrors
	switch {
	case c.Concurrency < 0:
		errs.add("concurrency", "must not be negative, got %d", c.Concurrency)
	case c.Concurrency == 0 && c.Adaptive == nil:
		errs.add("concurrency", "must be at least 1, or 0 with an adaptive limit")
	case c.Concurrency == 0:
		errs.nest("adaptive", c.Adaptive.Validate())
	}
	if c.Target <= 0 {
		errs.add("target", "must be positive, got %s", c.Target)
	}
	if c.Interval <= c.Target {
		errs.add("interval", "must exceed target (%s), got %s", c.Target, c.Interval)
	}
	if c.Depth < 1 {
		errs.add("depth", "must be at least 1, got %d", c.Depth)
	}
	if c.MaxWait < 0 {
		errs.add("maxWait", "must not be negative, got %s", c.MaxWait)
	}
	errs.nest("priorities", c.Priorities.Validate())
	return errs.err()
}

// NewCoDel returns the controlled-delay queue as a Core.
func NewCoDel(c CoDelConfig) (Core, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c.defaults()
	s := &semaphore{
		name: "codel", limit: float64(c.Concurrency), depth: c.Depth, maxWait: c.MaxWait,
		prio: c.Priorities, codel: &codel{target: c.Target, interval: c.Interval},
	}
	if c.Concurrency == 0 {
		a := *c.Adaptive
		a.defaults()
		s.limit = a.InitialLimit
		s.adapt = newController(a)
	}
	return s, nil
}

// codel is the controlled-delay state: the current interval, the shortest standing-queue delay
// seen in it, and whether the last completed interval was overloaded.
type codel struct {
	target, interval time.Duration
	intervalEnd      time.Time
	minDelay         time.Duration
	sampled          bool // minDelay holds a sample of the current interval
	overloaded       bool
	shed             bool // the current interval shed a waiter
}

// roll closes the interval if it has ended: the queue was overloaded if the shortest
// standing-queue delay seen during it exceeded the target. An interval in which nothing started
// was overloaded exactly when a queue stood through it. An overloaded queue that still had to
// shed during the interval stays overloaded even if it emptied for a moment: shedding keeps the
// queue short, so a short queue then is the remedy at work, not the end of the overload (without
// this, random gaps between arrivals flip the state every interval and the queue swings between
// 2 x target and the full maxWait).
func (c *codel) roll(now time.Time, q *waitQueue) {
	if !c.intervalEnd.IsZero() && now.Before(c.intervalEnd) {
		return
	}
	if !c.intervalEnd.IsZero() {
		delay := c.minDelay
		if !c.sampled {
			delay = 0
			if o := q.oldest(); o != nil {
				delay = now.Sub(o.Arrival)
			}
		}
		c.overloaded = delay > c.target || (c.overloaded && c.shed)
	}
	c.intervalEnd = now.Add(c.interval)
	c.sampled = false
	c.shed = false
}

// sample records the standing-queue delay as a request starts: how long the oldest waiter has
// waited (zero when the request starts without waiting).
func (c *codel) sample(delay time.Duration) {
	if !c.sampled || delay < c.minDelay {
		c.minDelay = delay
		c.sampled = true
	}
}

// slough refuses waiters that have waited more than 2 x target while overloaded.
func (c *codel) slough(now time.Time, q *waitQueue, stage string, ev *Events) {
	if !c.overloaded {
		return
	}
	limit := 2 * c.target
	for p := range q.heads {
		for t := q.heads[p]; t != nil && now.Sub(t.Arrival) > limit; t = q.heads[p] {
			q.remove(t)
			t.refuse(&Rejection{Reason: ReasonQueueTimeout, RetryAfter: limit, Stage: stage})
			ev.Add(t)
			c.shed = true
		}
	}
}

// wake is when the oldest waiter passes 2 x target while overloaded, or when the interval ends
// while a queue stands (the state may change then).
func (c *codel) wake(q *waitQueue) time.Time {
	o := q.oldest()
	if o == nil {
		return time.Time{}
	}
	if c.overloaded {
		return earliest(o.Arrival.Add(2*c.target+1), c.intervalEnd)
	}
	return c.intervalEnd
}
