package admission

import (
	"sync/atomic"
	"time"
)

// Verdict is what a Core decided about a ticket.
type Verdict uint8

const (
	// Pending: the ticket waits in a queue; a later Release, Cancel, Advance or Drain resolves
	// it and reports it in Events.
	Pending Verdict = iota
	// Admitted: the ticket holds a permit until Release.
	Admitted
	// Refused: the ticket's Err says why.
	Refused
	// Cancelled: the ticket was withdrawn while it waited.
	Cancelled
)

// Core is a strategy as a state machine. A Core is not safe for concurrent use: the driver
// serialises calls (Limiter holds a mutex; the lab runs one event loop). A Core never blocks,
// never reads a clock and never calls out while deciding; everything it resolves later is
// appended to the Events passed in.
//
// Core is sealed: every strategy is written in this package (its constructor returns a Core),
// because the drivers rely on contracts a Core cannot state in its exported methods: how long a
// ticket may stay pending (maxQueueWait), and two optional fast paths the Limiter detects:
//
//   - fastCore (inflight without a priority reservation, the token bucket, none): the core
//     decides every request at once with its own synchronisation (an atomic counter,
//     x/time/rate's lock), so the Limiter admits and releases through admitNow/releaseNow without
//     its lock, a ticket or a queue. The lab still drives such cores through Offer/Release.
//   - stateless (the leaky bucket): a permit holds nothing the core must give back, so
//     Permit.Done skips the lock; the core still queues through Offer.
//
// Code outside the package wraps a Core by embedding it (a struct with an embedded Core is a
// Core); it cannot build one from scratch.
type Core interface {
	// Name is the strategy's name, used as the "strategy" metric label.
	Name() string
	// Offer decides on t at now: Admitted, Refused (t.Err set) or Pending.
	Offer(now time.Time, t *Ticket, ev *Events) Verdict
	// Release returns the permit of an admitted ticket. It may admit queued tickets.
	Release(now time.Time, t *Ticket, o Outcome, ev *Events)
	// Cancel withdraws a pending ticket whose caller went away. It is a no-op for a ticket that
	// is not pending.
	Cancel(now time.Time, t *Ticket, ev *Events)
	// Advance resolves whatever has fallen due by now (drains, expiries, interval boundaries).
	Advance(now time.Time, ev *Events)
	// Wake returns when Advance next has work to do; the zero time means nothing is scheduled.
	Wake() time.Time
	// Drain refuses every pending ticket with ReasonDraining and every later offer likewise.
	Drain(now time.Time, ev *Events)
	// Stats reports the state at now, for metrics and the lab.
	Stats(now time.Time) Stats

	// maxQueueWait is the longest a ticket may stay pending in this core: 0 when it never
	// queues. Deadlines may shorten a wait, never lengthen it.
	maxQueueWait() time.Duration
}

// MaxQueueWait returns the longest a request may wait in c's queues before it is admitted or
// refused: 0 for a strategy that never queues; for a chain, the sum over its stages. A front door
// that must answer within a timeout of its own (Envoy's ext_proc message timeout) checks its
// policy against it.
func MaxQueueWait(c Core) time.Duration { return c.maxQueueWait() }

// Stats is a Core's state at a moment.
type Stats struct {
	// InFlight is the cost held by admitted permits the strategy tracks.
	InFlight int64
	// Queued is the cost of pending tickets, QueuedRequests their number.
	Queued         int64
	QueuedRequests int
	// Buffered is how many requests the strategy holds at once: in flight under its limit plus
	// waiting (for a leaky bucket, the water level rounded up; a token bucket holds none).
	Buffered int64
	// Limit is the current concurrency or depth limit, 0 when the strategy has none.
	Limit float64
	// Tokens is the number of tokens available (token buckets), -1 otherwise.
	Tokens float64
	// Adaptive limits also report their floor and ceiling, their no-load latency estimate and
	// their latest latency sample.
	LimitFloor, LimitCeiling float64
	MinRTT, SampleRTT        time.Duration
}

// Ticket is one request passing through a Core. Drivers allocate and reuse tickets; cores keep
// their bookkeeping in the unexported fields.
type Ticket struct {
	Req Request
	// Arrival is when the ticket was offered; Granted when it was admitted.
	Arrival time.Time
	Granted time.Time
	// Err is set when the ticket is refused.
	Err *Rejection
	// Tag is the driver's own reference (the lab stores its request index here).
	Tag int64
	// RTT is the latency its driver measured for the request's exchange with the upstream, set
	// before Release (Permit.DoneAfter); zero means the time from Granted to Release. A driver
	// that can time the exchange itself gives a sample free of its own overheads.
	RTT time.Duration

	state Verdict
	cost  int64 // effective cost, clamped to the strategy's capacity
	// adaptive lead: when this request in flight is expected to finish, and whether it let
	// another in just before that
	finish time.Time
	lent   bool
	// A lender and the request it lent its slot to are linked while both are in flight; freed
	// is when a borrower's lender was released (its slot freed in the upstream then).
	lender, borrower *Ticket
	freed            time.Time

	// wait-queue links and expiry-heap index; start is the leaky bucket's scheduled start.
	prev, next *Ticket
	heapIdx    int
	expiry     time.Time
	start      time.Time
	expiryWhy  Reason

	// chain bookkeeping: the parent ticket, the stage index and the children per stage.
	parent   *Ticket
	stage    int
	children []*Ticket

	// driver bookkeeping (Limiter).
	ready chan struct{}
	gen   atomic.Uint32
}

// State returns the ticket's current verdict.
func (t *Ticket) State() Verdict { return t.state }

// Reset clears a ticket for reuse by a driver; the driver's own fields stay.
func (t *Ticket) Reset(req Request, now time.Time) {
	ch, gen, kids := t.ready, t.gen.Load(), t.children[:0]
	*t = Ticket{Req: req, Arrival: now, ready: ch, children: kids, heapIdx: -1}
	t.gen.Store(gen)
}

func (t *Ticket) admit(now time.Time) {
	t.state = Admitted
	t.Granted = now
}

func (t *Ticket) refuse(r *Rejection) {
	t.state = Refused
	t.Err = r
}

// Events collects tickets that a Core resolved after their Offer returned Pending.
type Events struct {
	list []*Ticket
}

// Add appends a resolved ticket.
func (e *Events) Add(t *Ticket) { e.list = append(e.list, t) }

// Len is the number of resolved tickets.
func (e *Events) Len() int { return len(e.list) }

// At returns the i-th resolved ticket.
func (e *Events) At(i int) *Ticket { return e.list[i] }

// Reset empties the list, keeping its storage.
func (e *Events) Reset() {
	clear(e.list)
	e.list = e.list[:0]
}

// earliest returns the earlier of two wake times, treating zero as "never".
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
