package admission

import (
	"sync/atomic"
	"time"
)

// inflight is the in-flight shedder without priority reservation: one atomic counter, so the
// Limiter admits and releases through it without taking its lock, reading a clock or queueing.
// (With a priority reservation NewInflight uses the general semaphore instead.)
type inflight struct {
	limit    int64
	inUse    atomic.Int64
	draining atomic.Bool
}

func (f *inflight) Name() string { return "inflight" }

// acquire takes cost permits if they fit, in one compare-and-swap loop.
func (f *inflight) acquire(cost int64) bool {
	for {
		cur := f.inUse.Load()
		if cur+cost > f.limit {
			return false
		}
		if f.inUse.CompareAndSwap(cur, cur+cost) {
			return true
		}
	}
}

// admitNow is the Limiter's lock-free path (see fastCore).
func (f *inflight) admitNow(clock Clock, req Request) (int64, *Rejection) {
	if f.draining.Load() {
		return 0, &Rejection{Reason: ReasonDraining, RetryAfter: time.Second, Stage: f.Name()}
	}
	if !req.Deadline.IsZero() && !clock.Now().Before(req.Deadline) {
		return 0, &Rejection{Reason: ReasonDeadline, Stage: f.Name()}
	}
	cost := min(req.cost(), f.limit)
	if !f.acquire(cost) {
		// Retry-After is rounded up to whole seconds on the wire; a permit typically frees far
		// sooner, so the shortest hint is the honest one.
		return 0, &Rejection{Reason: ReasonConcurrencyLimit, RetryAfter: time.Second, Stage: f.Name()}
	}
	return cost, nil
}

func (f *inflight) releaseNow(cost int64) { f.inUse.Add(-cost) }

func (f *inflight) Offer(now time.Time, t *Ticket, _ *Events) Verdict {
	if r := doorCheck(now, &t.Req, f.draining.Load(), f.Name()); r != nil {
		t.refuse(r)
		return Refused
	}
	t.cost = min(t.Req.cost(), f.limit)
	if !f.acquire(t.cost) {
		t.refuse(&Rejection{Reason: ReasonConcurrencyLimit, RetryAfter: time.Second, Stage: f.Name()})
		return Refused
	}
	t.admit(now)
	return Admitted
}

func (f *inflight) Release(_ time.Time, t *Ticket, _ Outcome, _ *Events) { f.releaseNow(t.cost) }
func (f *inflight) Cancel(time.Time, *Ticket, *Events)                   {}
func (f *inflight) Advance(time.Time, *Events)                           {}
func (f *inflight) Wake() time.Time                                      { return time.Time{} }
func (f *inflight) Drain(time.Time, *Events)                             { f.draining.Store(true) }
func (f *inflight) maxQueueWait() time.Duration                          { return 0 }

func (f *inflight) Stats(time.Time) Stats {
	n := f.inUse.Load()
	return Stats{InFlight: n, Buffered: n, Limit: float64(f.limit), Tokens: -1}
}
