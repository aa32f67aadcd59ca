package admission

import (
	"fmt"
	"time"
)

// BoundedQueueConfig configures a bounded queue: Concurrency permits in use at once, up to Depth
// more waiting, served most important first and FIFO within a priority, each waiting at most
// MaxWait. Concurrency and Depth count cost units (a request of cost 3 takes 3).
type BoundedQueueConfig struct {
	Concurrency int64
	Depth       int64
	// MaxWait bounds the time in the queue; zero means only the depth bounds it.
	MaxWait time.Duration
}

// Validate reports every problem with the configuration.
func (c BoundedQueueConfig) Validate() error {
	var errs fieldErrors
	if c.Concurrency < 1 {
		errs.add("concurrency", "must be at least 1, got %d", c.Concurrency)
	}
	if c.Depth < 0 {
		errs.add("depth", "must not be negative, got %d", c.Depth)
	}
	if c.MaxWait < 0 {
		errs.add("maxWait", "must not be negative, got %s", c.MaxWait)
	}
	return errs.err()
}

// InflightConfig configures an in-flight shedder: at most Limit cost units in progress; the next
// request is refused at once.
type InflightConfig struct {
	Limit int64
}

// Validate reports every problem with the configuration.
func (c InflightConfig) Validate() error {
	var errs fieldErrors
	if c.Limit < 1 {
		errs.add("limit", "must be at least 1, got %d", c.Limit)
	}
	return errs.err()
}

// NewBoundedQueue returns the bounded-queue strategy as a Core.
func NewBoundedQueue(c BoundedQueueConfig) (Core, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &semaphore{name: "bounded-queue", limit: c.Concurrency, depth: c.Depth, maxWait: c.MaxWait}, nil
}

// NewInflight returns the in-flight shedder as a Core.
func NewInflight(c InflightConfig) (Core, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &semaphore{name: "inflight", limit: c.Limit}, nil
}

// semaphore is a weighted semaphore with an optional bounded wait queue. It is the in-flight
// shedder (depth 0) and the bounded queue.
type semaphore struct {
	name     string
	limit    int64
	depth    int64
	maxWait  time.Duration
	lifo     bool
	inUse    int64
	q        waitQueue
	draining bool
	meanHold time.Duration // moving average of permit hold times, for Retry-After
}

func (s *semaphore) Name() string { return s.name }

func (s *semaphore) Offer(now time.Time, t *Ticket, ev *Events) Verdict {
	if r := doorCheck(now, t, s.draining, s.name); r != nil {
		t.refuse(r)
		return Refused
	}
	t.cost = min(t.Req.cost(), s.limit)
	if s.inUse+t.cost <= s.limit && s.aheadOf(t) {
		s.inUse += t.cost
		t.admit(now)
		return Admitted
	}
	if s.depth == 0 {
		t.refuse(&Rejection{Reason: ReasonConcurrencyLimit, RetryAfter: s.meanHold, Stage: s.name})
		return Refused
	}
	cost := min(t.cost, s.depth)
	// Make room by displacing less important waiters, newest first.
	for s.q.cost+cost > s.depth {
		low := s.q.lowest()
		if low == nil || low.Req.Priority <= t.Req.Priority {
			t.refuse(&Rejection{Reason: ReasonQueueFull, RetryAfter: s.retryAfter(), Stage: s.name})
			return Refused
		}
		s.q.remove(low)
		low.refuse(&Rejection{Reason: ReasonQueueFull, RetryAfter: s.retryAfter(), Stage: s.name})
		ev.Add(low)
	}
	at, why := queueExpiry(now, s.maxWait, t.Req.Deadline)
	s.q.push(t, at, why)
	return Pending
}

// aheadOf reports whether t may take free permits before the waiters: the queue is empty or t
// is more important than every waiter.
func (s *semaphore) aheadOf(t *Ticket) bool {
	h := s.q.peek(s.lifo)
	return h == nil || clampPriority(t.Req.Priority) < clampPriority(h.Req.Priority)
}

func (s *semaphore) retryAfter() time.Duration {
	if s.maxWait > 0 {
		return s.maxWait
	}
	return s.meanHold
}

func (s *semaphore) Release(now time.Time, t *Ticket, _ Outcome, ev *Events) {
	s.inUse -= t.cost
	if hold := now.Sub(t.Granted); hold >= 0 {
		// An exponentially weighted average with weight 1/16: cheap and stable enough for a
		// Retry-After hint.
		s.meanHold += (hold - s.meanHold) / 16
	}
	s.grant(now, ev)
}

// grant admits waiters, most important first, while their cost fits.
func (s *semaphore) grant(now time.Time, ev *Events) {
	for {
		h := s.q.peek(s.lifo)
		if h == nil || s.inUse+h.cost > s.limit {
			return
		}
		s.q.remove(h)
		s.inUse += h.cost
		h.admit(now)
		ev.Add(h)
	}
}

func (s *semaphore) Cancel(now time.Time, t *Ticket, ev *Events) {
	if t.state != Pending {
		return
	}
	s.q.remove(t)
	t.state = Cancelled
	s.grant(now, ev) // a heavy head that left may unblock lighter waiters
}

func (s *semaphore) Advance(now time.Time, ev *Events) {
	s.q.expire(now, s.name, ev)
	s.grant(now, ev)
}

func (s *semaphore) Wake() time.Time { return s.q.nextExpiry() }

func (s *semaphore) Drain(_ time.Time, ev *Events) {
	s.draining = true
	s.q.refuseAll(ReasonDraining, s.retryAfter(), s.name, ev)
}

func (s *semaphore) Stats(time.Time) Stats {
	return Stats{
		InFlight:       s.inUse,
		Queued:         s.q.cost,
		QueuedRequests: s.q.len(),
		Buffered:       s.inUse + s.q.cost,
		Limit:          float64(s.limit),
		Tokens:         -1,
	}
}

// doorCheck refuses what no strategy may admit: anything while draining, and a request whose
// deadline has already passed.
func doorCheck(now time.Time, t *Ticket, draining bool, stage string) *Rejection {
	if draining {
		return &Rejection{Reason: ReasonDraining, RetryAfter: time.Second, Stage: stage}
	}
	if d := t.Req.Deadline; !d.IsZero() && !now.Before(d) {
		return &Rejection{Reason: ReasonDeadline, Stage: stage}
	}
	return nil
}

// fieldErrors collects validation problems, each naming its field.
type fieldErrors []string

func (e *fieldErrors) add(field, format string, args ...any) {
	*e = append(*e, field+": "+fmt.Sprintf(format, args...))
}

func (e fieldErrors) err() error {
	if len(e) == 0 {
		return nil
	}
	return &ConfigError{Problems: e}
}

// ConfigError lists every problem found in a strategy configuration, each prefixed with the
// field it concerns.
type ConfigError struct {
	Problems []string
}

func (e *ConfigError) Error() string {
	s := "invalid admission config: " + e.Problems[0]
	for _, p := range e.Problems[1:] {
		s += "; " + p
	}
	return s
}
