package admission

import (
	"math"
	"slices"
	"time"
)

// LeakyBucketConfig configures a leaky bucket (nginx limit_req without nodelay): requests pour
// into a bucket of Depth cost units that drains at Rate units per second; each request waits
// until the water ahead of it has drained, and a request that would overflow the bucket is
// refused at once. Requests leave at a constant rate however bursty their arrival.
type LeakyBucketConfig struct {
	Rate  float64
	Depth int64
}

// Validate reports every problem with the configuration.
func (c LeakyBucketConfig) Validate() error {
	var errs fieldErrors
	if !(c.Rate > 0) || math.IsInf(c.Rate, 0) {
		errs.add("rate", "must be a positive number of requests per second, got %v", c.Rate)
	}
	if c.Depth < 1 {
		errs.add("depth", "must be at least 1, got %d", c.Depth)
	}
	return errs.err()
}

// NewLeakyBucket returns the leaky bucket strategy as a Core.
func NewLeakyBucket(c LeakyBucketConfig) (Core, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	per := time.Duration(math.Round(float64(time.Second) / c.Rate))
	return &leakyBucket{per: max(per, 1), depth: c.Depth}, nil
}

// leakyBucket keeps the bucket as the virtual time tat at which all water poured so far will
// have drained (the generic cell rate algorithm). The level at now is tat - now; a request of
// cost c fits when level + c*per <= depth*per, starts draining at max(now, tat) and is admitted
// then.
type leakyBucket struct {
	per      time.Duration // drain time of one cost unit
	depth    int64
	tat      time.Time
	waiting  []*Ticket // pending, in start order
	draining bool
}

func (b *leakyBucket) Name() string { return "leaky-bucket" }

func (b *leakyBucket) level(now time.Time) time.Duration {
	if b.tat.After(now) {
		return b.tat.Sub(now)
	}
	return 0
}

func (b *leakyBucket) Offer(now time.Time, t *Ticket, _ *Events) Verdict {
	if r := doorCheck(now, &t.Req, b.draining, b.Name()); r != nil {
		t.refuse(r)
		return Refused
	}
	t.cost = min(t.Req.cost(), b.depth)
	level := b.level(now)
	pour := time.Duration(t.cost) * b.per
	if over := level + pour - time.Duration(b.depth)*b.per; over > 0 {
		t.refuse(&Rejection{Reason: ReasonRateLimited, RetryAfter: over, Stage: b.Name()})
		return Refused
	}
	start := now.Add(level)
	if d := t.Req.Deadline; !d.IsZero() && !start.Before(d) {
		t.refuse(&Rejection{Reason: ReasonDeadline, RetryAfter: level, Stage: b.Name()})
		return Refused
	}
	b.tat = start.Add(pour)
	if level == 0 {
		t.admit(now)
		return Admitted
	}
	t.start = start
	t.state = Pending
	b.waiting = append(b.waiting, t)
	return Pending
}

func (b *leakyBucket) Release(time.Time, *Ticket, Outcome, *Events) {}

// Cancel takes a waiting request's water out of the bucket: everyone behind it starts earlier.
func (b *leakyBucket) Cancel(now time.Time, t *Ticket, ev *Events) {
	if t.state != Pending {
		return
	}
	i := slices.Index(b.waiting, t)
	if i < 0 {
		return
	}
	pour := time.Duration(t.cost) * b.per
	for _, w := range b.waiting[i+1:] {
		w.start = w.start.Add(-pour)
	}
	b.waiting = slices.Delete(b.waiting, i, i+1)
	b.tat = b.tat.Add(-pour)
	t.state = Cancelled
	b.Advance(now, ev)
}

func (b *leakyBucket) Advance(now time.Time, ev *Events) {
	n := 0
	for n < len(b.waiting) && !b.waiting[n].start.After(now) {
		w := b.waiting[n]
		w.admit(w.start)
		ev.Add(w)
		n++
	}
	if n > 0 {
		b.waiting = slices.Delete(b.waiting, 0, n)
	}
}

func (b *leakyBucket) Wake() time.Time {
	if len(b.waiting) == 0 {
		return time.Time{}
	}
	return b.waiting[0].start
}

func (b *leakyBucket) Drain(now time.Time, ev *Events) {
	b.draining = true
	for _, w := range b.waiting {
		w.refuse(&Rejection{Reason: ReasonDraining, RetryAfter: time.Second, Stage: b.Name()})
		ev.Add(w)
	}
	b.waiting = b.waiting[:0]
	b.tat = now
}

func (b *leakyBucket) Stats(now time.Time) Stats {
	var queued int64
	for _, w := range b.waiting {
		queued += w.cost
	}
	level := b.level(now)
	return Stats{
		Queued:         queued,
		QueuedRequests: len(b.waiting),
		Buffered:       int64((level + b.per - 1) / b.per),
		Limit:          float64(b.depth),
		Tokens:         -1,
	}
}

func (b *leakyBucket) stateless() bool { return true }

// estimate: a waiting request starts exactly when the water ahead of it has drained.
func (b *leakyBucket) estimate(now time.Time, t *Ticket) Queued {
	d := max(t.start.Sub(now), 0)
	return Queued{Expected: d, Bound: d}
}

// maxQueueWait: a request starts once the water ahead of it has drained, at most a full bucket.
func (b *leakyBucket) maxQueueWait() time.Duration { return time.Duration(b.depth) * b.per }
