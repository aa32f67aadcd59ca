package admission

import (
	"sync/atomic"
	"time"
)

// NewNone returns the strategy "none": every request is admitted at once. It keeps no limit and
// no queue; it only counts the cost in flight, so its Stats show the load handed to the backend.
// Like every strategy it refuses with ReasonDraining once drained, and a request whose deadline
// has already passed. The proxy, the lab and the live tests all use it for "none".
func NewNone() Core { return &none{} }

type none struct {
	inUse    atomic.Int64
	draining atomic.Bool
}

func (n *none) Name() string { return "none" }

// admitNow is the Limiter's lock-free path (see fastCore).
func (n *none) admitNow(clock Clock, req Request) (int64, *Rejection) {
	if n.draining.Load() {
		return 0, &Rejection{Reason: ReasonDraining, RetryAfter: time.Second, Stage: n.Name()}
	}
	if !req.Deadline.IsZero() && !clock.Now().Before(req.Deadline) {
		return 0, &Rejection{Reason: ReasonDeadline, Stage: n.Name()}
	}
	cost := req.cost()
	n.inUse.Add(cost)
	return cost, nil
}

func (n *none) releaseNow(cost int64) { n.inUse.Add(-cost) }

func (n *none) Offer(now time.Time, t *Ticket, _ *Events) Verdict {
	if r := doorCheck(now, &t.Req, n.draining.Load(), n.Name()); r != nil {
		t.refuse(r)
		return Refused
	}
	t.cost = t.Req.cost()
	n.inUse.Add(t.cost)
	t.admit(now)
	return Admitted
}

func (n *none) Release(_ time.Time, t *Ticket, _ Outcome, _ *Events) { n.releaseNow(t.cost) }
func (n *none) Cancel(time.Time, *Ticket, *Events)                   {}
func (n *none) Advance(time.Time, *Events)                           {}
func (n *none) Wake() time.Time                                      { return time.Time{} }
func (n *none) Drain(time.Time, *Events)                             { n.draining.Store(true) }
func (n *none) maxQueueWait() time.Duration                          { return 0 }

func (n *none) Stats(time.Time) Stats {
	v := n.inUse.Load()
	return Stats{InFlight: v, Buffered: v, Tokens: -1}
}
