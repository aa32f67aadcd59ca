package admission

import (
	"math"
	"time"
)

// BoundedQueueConfig configures a bounded queue: Concurrency permits in use at once, up to Depth
// more waiting, served most important first and FIFO within a priority, each waiting at most
// MaxWait. Concurrency and Depth count cost units (a request of cost 3 takes 3).
type BoundedQueueConfig struct {
	Concurrency int64
	Depth       int64
	// MaxWait bounds the time in the queue. It must be positive: a queue whose waits have no
	// bound turns a sustained overload into unbounded latency.
	MaxWait time.Duration
	// Priorities shares the limit between priority levels (optional).
	Priorities PriorityConfig
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
	if c.MaxWait <= 0 {
		errs.add("maxWait", "must be a positive duration (how long a request may wait), got %s", c.MaxWait)
	}
	errs.nest("priorities", c.Priorities.Validate())
	return errs.err()
}

// InflightConfig configures an in-flight shedder: at most Limit cost units in progress; the next
// request is refused at once.
type InflightConfig struct {
	Limit      int64
	Priorities PriorityConfig
}

// Validate reports every problem with the configuration.
func (c InflightConfig) Validate() error {
	var errs fieldErrors
	if c.Limit < 1 {
		errs.add("limit", "must be at least 1, got %d", c.Limit)
	}
	errs.nest("priorities", c.Priorities.Validate())
	return errs.err()
}

// PriorityConfig keeps a share of a concurrency limit for the most important requests.
//
// Requests of priority ReservedFor or more important may hold up to Reserved x limit permits
// even when the limit is reached; everyone may use the limit itself, so less important levels
// borrow whatever the important ones leave idle (the partitioned limiter of Netflix's
// concurrency-limits: a partition's share binds only when the global limit is reached). Queues
// always serve the most important waiter first, and a full queue makes room for an important
// request by refusing the newest of the least important waiters.
type PriorityConfig struct {
	// Reserved is the share of the limit guaranteed to important requests, from 0 to 1.
	Reserved float64
	// ReservedFor is the least important level the reservation covers (default CriticalPlus).
	ReservedFor Priority
}

// Validate reports every problem with the configuration.
func (c PriorityConfig) Validate() error {
	var errs fieldErrors
	if !(c.Reserved >= 0 && c.Reserved <= 1) {
		errs.add("reserved", "must be a share from 0 to 1, got %v", c.Reserved)
	}
	if c.ReservedFor >= NumPriorities {
		errs.add("reservedFor", "unknown priority %d", c.ReservedFor)
	}
	return errs.err()
}

// NewBoundedQueue returns the bounded-queue strategy as a Core.
func NewBoundedQueue(c BoundedQueueConfig) (Core, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &semaphore{name: "bounded-queue", limit: float64(c.Concurrency), depth: c.Depth, maxWait: c.MaxWait, prio: c.Priorities}, nil
}

// NewInflight returns the in-flight shedder as a Core.
func NewInflight(c InflightConfig) (Core, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Priorities.Reserved == 0 {
		return &inflight{limit: c.Limit}, nil
	}
	return &semaphore{name: "inflight", limit: float64(c.Limit), prio: c.Priorities}, nil
}

// semaphore is a weighted semaphore with an optional bounded wait queue. With a fixed limit and
// no queue it is the in-flight shedder; with a queue, the bounded queue; with an adaptive
// controller, the adaptive strategy; with a controlled-delay discipline, CoDel.
type semaphore struct {
	name    string
	limit   float64 // permits = floor(limit), at least 1 (adaptive: and one more for a share of the time)
	depth   int64
	maxWait time.Duration
	// depthPerLimit and waitPerRTT (adaptive only, 0 when unused) make the queue follow the
	// limit and the no-load latency: see AdaptiveConfig.
	depthPerLimit, waitPerRTT float64
	lifo                      bool
	inUse                     int64
	q                         waitQueue
	draining                  bool
	meanHold                  time.Duration // moving average of successful hold times: Retry-After and deadlines

	prio       PriorityConfig
	importants int64 // cost held by requests the reservation covers

	adapt *controller // nil: a fixed limit
	codel *codel      // nil: a plain FIFO queue with maxWait

	// An adaptive limit's fractional part is enforced as a share of time: one permit beyond
	// floor(limit) may be taken while partCredit is positive. The credit grows at the rate of
	// the fractional part while no one holds that permit and shrinks at the rate of the rest
	// while someone does, within plus or minus meanHold; so a limit of 4.5 keeps a fifth request
	// in flight about half the time instead of never. Between a limit and the next whole number
	// the upstream then serves the limit the algorithm chose, not the one below it: a backend
	// of W workers at a limit of W + 0.5 keeps a queue half the time, and a hand-off that
	// crosses a second proxy (Envoy's ext_proc stream) idles a worker only the other half.
	partCredit float64   // nanoseconds
	partAt     time.Time // when partCredit was last brought up to date

	// lead (adaptive only, 0 when unused) hands a freed slot over before it frees: see
	// AdaptiveConfig.Lead. The requests in flight are linked oldest first through their
	// wait-queue links (unused once admitted), so the ones about to finish are found from the
	// head.
	lead                   time.Duration
	leadShare              float64 // the lead in effect is at most this share of the latency
	flightHead, flightTail *Ticket
	lentOut                int64 // cost lent by requests in flight that are about to finish
}

func (s *semaphore) Name() string { return s.name }

func (s *semaphore) permits() int64 {
	return max(int64(s.limit), 1)
}

// part is the fractional part of an adaptive limit: 0 for a fixed one, and below a thousandth
// (which would lend the permit once in hours).
func (s *semaphore) part() float64 {
	if s.adapt == nil || s.limit < 1 {
		return 0
	}
	if f := s.limit - math.Floor(s.limit); f >= 1e-3 {
		return f
	}
	return 0
}

// allowed is how many cost units may be in flight now: the permits, and the permit beyond them
// while the fractional part's credit lasts.
func (s *semaphore) allowed() int64 {
	if s.partCredit > 0 && s.part() > 0 {
		return s.permits() + 1
	}
	return s.permits()
}

// accrue brings the fractional part's credit up to now. It must run before anything that
// changes what is in flight or the limit, so that each interval is charged at what held in it.
func (s *semaphore) accrue(now time.Time) {
	if s.adapt == nil {
		return
	}
	if s.partAt.IsZero() || now.Before(s.partAt) {
		s.partAt = now
		return
	}
	dt := float64(now.Sub(s.partAt))
	s.partAt = now
	rate := s.part()
	if s.inUse > s.permits() {
		rate -= 1
	}
	bound := float64(s.meanHold)
	s.partCredit = min(max(s.partCredit+rate*dt, -bound), bound)
}

// partReady is when the credit has turned positive if nothing changes before (a microsecond
// after it crosses zero, so that it is positive then), or zero when it is positive already, or
// will not turn.
func (s *semaphore) partReady() time.Time {
	rate := s.part()
	if s.partCredit > 0 || rate <= 0 || s.inUse > s.permits() || s.partAt.IsZero() {
		return time.Time{}
	}
	wait := min(math.Ceil(-s.partCredit/rate), float64(time.Hour))
	return s.partAt.Add(time.Duration(wait) + time.Microsecond)
}

func (s *semaphore) important(t *Ticket) bool {
	return s.prio.Reserved > 0 && clampPriority(t.Req.Priority) <= s.prio.ReservedFor
}

// fits reports whether t may take permits now: under the limit, or within the reserved share.
func (s *semaphore) fits(t *Ticket) bool {
	if s.inUse+t.cost <= s.allowed() {
		return true
	}
	return s.important(t) && s.importants+t.cost <= int64(math.Floor(s.prio.Reserved*float64(s.permits())))
}

func (s *semaphore) take(now time.Time, t *Ticket) {
	var after time.Time // the lenders' expected finish, when t takes slots they lend
	if s.lead > 0 && !s.fits(t) {
		if need := s.over(t); need > 0 {
			var lender *Ticket
			after, _, lender = s.lend(now, need, true)
			if lender != nil {
				t.lender, lender.borrower = lender, t
			}
		}
	}
	s.inUse += t.cost
	if s.important(t) {
		s.importants += t.cost
	}
	t.admit(now)
	if s.adapt != nil {
		s.adapt.inflight(s.inUse)
	}
	if s.lead > 0 {
		// Expected to finish one latency after it starts: now, or when the slot it takes frees.
		t.finish = later(now, after).Add(s.expected())
		t.prev, t.next = s.flightTail, nil
		if s.flightTail != nil {
			s.flightTail.next = t
		} else {
			s.flightHead = t
		}
		s.flightTail = t
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// unlinkFlight takes a released ticket out of the in-flight list.
func (s *semaphore) unlinkFlight(t *Ticket) {
	if t.prev != nil {
		t.prev.next = t.next
	} else if s.flightHead == t {
		s.flightHead = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	} else if s.flightTail == t {
		s.flightTail = t.prev
	}
	t.prev, t.next = nil, nil
}

// maxLeadScan bounds how many requests in flight the lead looks at: the oldest ones, where a
// few slow requests may sit for a long time before the ones about to finish.
const maxLeadScan = 64

// expected is the latency a request admitted now is expected to take once it starts: the last
// window's median, not the no-load estimate, since with a queue inside the upstream requests
// take longer than that (0: unknown).
func (s *semaphore) expected() time.Duration {
	if s.lead <= 0 || s.adapt == nil {
		return 0
	}
	return max(s.adapt.minRTT.Value(), s.adapt.lastRTT)
}

// leadSpan is the latency expected and the lead within it, or zeros while no slot may be lent:
// without a lead or a latency, or while the limit is fractional (it is on the move: the
// algorithm is probing above the upstream's concurrency or following a spread service time,
// and completions are not due when the latency says).
func (s *semaphore) leadSpan() (m, lead time.Duration) {
	m = s.expected()
	if m <= 0 || s.part() > 0 {
		return 0, 0
	}
	return m, s.leadFor(m)
}

// leadFor is the lead in effect for an expected latency m: the configured one, at most the
// lead share of m (AdaptiveConfig.LeadShare, a twentieth by default). The default share's
// product truncates to m/20 exactly: 0.05 rounds up in binary, by far less than a nanosecond.
func (s *semaphore) leadFor(m time.Duration) time.Duration {
	return min(s.lead, time.Duration(float64(m)*s.leadShare))
}

// lend finds requests in flight about to finish that may lend their slots now: expected to
// finish within the lead (at most the lead share of the latency expected) and not overdue by more
// than that latency (an older one is a slow request, which says nothing about when it ends),
// that have not lent yet, while what is lent stays within an eighth of the permits (at least
// one). It returns the latest expected finish among them and their cost; with mark, they are
// marked as lenders until need units are lent.
//
// Each request lends its slot once, to one request admitted in its place just before it
// finishes; the lent units return when the lender is released. The borrower is expected to
// finish one latency after its lender is expected to, and once the lender is released, one
// latency after that (Release), so a chain of borrowers does not drift ahead of the upstream.
// So the slot a finishing request leaves is taken by a request that reaches the upstream as
// it frees, instead of one that sets out only then. It returns the lender with the latest
// expected finish too (nil when none), the one the borrower is linked to.
func (s *semaphore) lend(now time.Time, need int64, mark bool) (time.Time, int64, *Ticket) {
	m, lead := s.leadSpan()
	if m <= 0 {
		return time.Time{}, 0, nil
	}
	var lender *Ticket
	room := s.lendRoom() - s.lentOut
	var n int64
	var last time.Time
	i := 0
	for t := s.flightHead; t != nil && i < maxLeadScan && n < room && (!mark || n < need); t, i = t.next, i+1 {
		if t.lent || t.finish.Sub(now) > lead || now.Sub(t.finish) > m || n+t.cost > room {
			continue
		}
		n += t.cost
		if !t.finish.Before(last) {
			lender = t
		}
		last = later(last, t.finish)
		if mark {
			t.lent = true
			s.lentOut += t.cost
		}
	}
	return last, n, lender
}

// leadReady is when the next request in flight not yet about to finish at now will be, or
// zero.
func (s *semaphore) leadReady(now time.Time) time.Time {
	m, lead := s.leadSpan()
	if m <= 0 || s.lentOut >= s.lendRoom() {
		return time.Time{}
	}
	var next time.Time
	i := 0
	for t := s.flightHead; t != nil && i < maxLeadScan; t, i = t.next, i+1 {
		if at := t.finish.Add(-lead); !t.lent && at.After(now) {
			next = earliest(next, at)
		}
	}
	return next
}

// lendRoom is the most cost that may be lent at once: an eighth of the permits, at least one.
func (s *semaphore) lendRoom() int64 { return max(s.permits()/8, 1) }

// over is how many cost units beyond what is allowed and lent admitting t would take.
func (s *semaphore) over(t *Ticket) int64 {
	return s.inUse + t.cost - s.allowed() - s.lentOut
}

// fitsNow reports whether t may take permits now: fits, or within slots about to free.
func (s *semaphore) fitsNow(now time.Time, t *Ticket) bool {
	if s.fits(t) {
		return true
	}
	if s.lead <= 0 {
		return false
	}
	need := s.over(t)
	if need <= 0 {
		return true
	}
	_, n, _ := s.lend(now, need, false)
	return n >= need
}

func (s *semaphore) Offer(now time.Time, t *Ticket, ev *Events) Verdict {
	if r := doorCheck(now, &t.Req, s.draining, s.name); r != nil {
		t.refuse(r)
		return Refused
	}
	s.accrue(now)
	t.cost = min(t.Req.cost(), s.permits())
	if s.adapt != nil && s.inUse+t.cost > s.allowed() && s.q.len() == 0 {
		// Slow start: grow on demand rather than shed while the limit is still being found.
		s.limit = s.adapt.grow(now, s.limit, float64(s.inUse+t.cost))
	}
	free := s.aheadOf(t) && s.fitsNow(now, t)
	if !free && s.adapt != nil {
		s.adapt.block()
	}
	if d := t.Req.Deadline; !d.IsZero() && s.meanHold > 0 {
		// Refuse at once a request that cannot finish in time: its expected wait plus service.
		expect := s.meanHold
		if !free {
			ahead := float64(s.q.cost+t.cost) / float64(s.permits())
			expect += time.Duration(ahead * float64(s.meanHold))
		}
		if d.Sub(now) < expect {
			t.refuse(&Rejection{Reason: ReasonDeadline, Stage: s.name})
			return Refused
		}
	}
	if free {
		if s.codel != nil {
			s.codel.roll(now, &s.q)
			s.codel.sample(0) // admitted without waiting: no queue stands
		}
		s.take(now, t)
		return Admitted
	}
	depth := s.queueDepth()
	if depth == 0 {
		t.refuse(&Rejection{Reason: ReasonConcurrencyLimit, RetryAfter: s.meanHold, Stage: s.name})
		return Refused
	}
	cost := min(t.cost, max(depth, 1))
	// Make room by displacing less important waiters, newest first.
	for s.q.cost+cost > depth {
		low := s.q.lowest()
		if low == nil || low.Req.Priority <= t.Req.Priority {
			t.refuse(&Rejection{Reason: ReasonQueueFull, RetryAfter: s.retryAfter(), Stage: s.name})
			return Refused
		}
		s.q.remove(low)
		low.refuse(&Rejection{Reason: ReasonQueueFull, RetryAfter: s.retryAfter(), Stage: s.name})
		ev.Add(low)
	}
	at, why := queueExpiry(now, s.queueWait(), t.Req.Deadline)
	s.q.push(t, at, why)
	return Pending
}

// aheadOf reports whether t may take free permits before the waiters: the queue is empty or t
// is more important than every waiter.
func (s *semaphore) aheadOf(t *Ticket) bool {
	h := s.q.peek(s.lifo)
	return h == nil || clampPriority(t.Req.Priority) < clampPriority(h.Req.Priority)
}

// queueDepth is how many cost units may wait now: the fixed depth, else the share of the limit.
func (s *semaphore) queueDepth() int64 {
	if s.depth == 0 && s.depthPerLimit > 0 {
		return int64(math.Ceil(s.depthPerLimit*float64(s.permits()) - 1e-9))
	}
	return s.depth
}

// queueWait is how long a request that queues now may wait: maxWait, or in a queue that follows
// the limit the share of the no-load latency when that is known and shorter. A fixed depth is
// the user's own queue, bounded by maxWait alone.
func (s *semaphore) queueWait() time.Duration {
	w := s.maxWait
	if s.depth == 0 && s.waitPerRTT > 0 && s.adapt != nil {
		if m := s.adapt.minRTT.Value(); m > 0 {
			w = min(w, time.Duration(s.waitPerRTT*float64(m)))
		}
	}
	return w
}

func (s *semaphore) retryAfter() time.Duration {
	if w := s.queueWait(); w > 0 {
		return w
	}
	return s.meanHold
}

func (s *semaphore) Release(now time.Time, t *Ticket, o Outcome, ev *Events) {
	s.accrue(now)
	if s.lead > 0 {
		s.unlinkFlight(t)
		if t.lent {
			s.lentOut -= t.cost
		}
		if b := t.borrower; b != nil {
			// The borrower holds the freed slot from now: it is expected to finish one
			// latency from here, not from when its lender was expected to (a late lender
			// made each borrower in a chain later than expected, and the chain's lends ever
			// earlier).
			b.freed, b.lender, t.borrower = now, nil, nil
			if m := s.expected(); m > 0 {
				b.finish = now.Add(m)
			}
		}
		if l := t.lender; l != nil {
			l.borrower, t.lender = nil, nil
		}
	}
	s.inUse -= t.cost
	if s.important(t) {
		s.importants -= t.cost
	}
	hold := now.Sub(t.Granted)
	if o == Success && hold >= 0 {
		// An exponentially weighted average with weight 1/16: cheap and stable enough for a
		// Retry-After hint and deadline checks.
		if s.meanHold == 0 {
			s.meanHold = hold
		} else {
			s.meanHold += (hold - s.meanHold) / 16
		}
	}
	if s.adapt != nil {
		rtt := hold
		if t.RTT > 0 {
			rtt = t.RTT
		}
		if !t.freed.IsZero() && t.freed.After(t.Granted) {
			// A borrower reached the upstream before its lender's slot freed and waited there
			// for it, by design: its latency is counted from when the slot freed (the lender's
			// release), so that the lead's own wait is not read as a queue the limit holds. By
			// at most the lead in effect (at most the lead share of the expected latency): a
			// lender released later than that (a slow upstream, or a client that reads its
			// answer slowly) shortens no sample by more.
			rtt = max(min(rtt, now.Sub(t.freed)), rtt-s.leadFor(s.expected()))
		}
		s.limit = s.adapt.sample(now, rtt, o, s.limit, s.q.len(), t.Granted, t.cost, s.inUse)
	}
	s.grant(now, ev)
}

// grant admits waiters, most important first, while their cost fits.
func (s *semaphore) grant(now time.Time, ev *Events) {
	for {
		if s.codel != nil {
			s.codel.roll(now, &s.q)
			s.lifo = s.codel.overloaded
			s.codel.slough(now, &s.q, s.name, ev)
		}
		h := s.q.peek(s.lifo)
		if h == nil {
			return
		}
		if p := s.permits(); h.cost > p {
			// An adaptive limit shrank below the cost clamped at the offer: clamp again, so the
			// request runs alone rather than never (and blocks nobody behind it forever).
			s.q.cost -= h.cost - p
			h.cost = p
		}
		if !s.fitsNow(now, h) {
			return
		}
		if s.codel != nil {
			// The standing-queue signal is how long the oldest waiter has waited, whichever
			// waiter is served: under LIFO the served one is fresh while the queue still stands.
			s.codel.sample(now.Sub(s.q.oldest().Arrival))
		}
		s.q.remove(h)
		s.take(now, h)
		ev.Add(h)
	}
}

func (s *semaphore) Cancel(now time.Time, t *Ticket, ev *Events) {
	if t.state != Pending {
		return
	}
	s.accrue(now)
	s.q.remove(t)
	t.state = Cancelled
	s.grant(now, ev) // a heavy head that left may unblock lighter waiters
}

func (s *semaphore) Advance(now time.Time, ev *Events) {
	s.accrue(now)
	s.q.expire(now, s.name, ev)
	s.grant(now, ev)
}

func (s *semaphore) Wake() time.Time {
	w := s.q.nextExpiry()
	if s.codel != nil {
		w = earliest(w, s.codel.wake(&s.q))
	}
	if s.q.len() > 0 {
		// A waiter may take the permit beyond the whole ones when its credit returns, or a
		// slot that is about to free.
		w = earliest(w, s.partReady())
		w = earliest(w, s.leadReady(s.partAt))
	}
	return w
}

// estimate: the waiters' cost ahead spread over the permits, each held for the mean hold time;
// the bound is the ticket's expiry (maxWait or deadline).
func (s *semaphore) estimate(now time.Time, t *Ticket) Queued {
	var q Queued
	if !t.expiry.IsZero() {
		q.Bound = max(t.expiry.Sub(now), 0)
	}
	if s.meanHold > 0 {
		q.Expected = time.Duration(float64(s.q.cost) / float64(s.permits()) * float64(s.meanHold))
		if q.Bound > 0 {
			q.Expected = min(q.Expected, q.Bound)
		}
	}
	return q
}

// maxQueueWait: a waiter leaves at its maxWait (CoDel's sheds only end waits earlier; a wait
// that follows the no-load latency is never longer).
func (s *semaphore) maxQueueWait() time.Duration {
	if s.depth == 0 && s.depthPerLimit == 0 {
		return 0
	}
	return s.maxWait
}

func (s *semaphore) Drain(_ time.Time, ev *Events) {
	s.draining = true
	s.q.refuseAll(ReasonDraining, s.retryAfter(), s.name, ev)
}

func (s *semaphore) Stats(time.Time) Stats {
	st := Stats{
		InFlight:       s.inUse,
		Queued:         s.q.cost,
		QueuedRequests: s.q.len(),
		Buffered:       s.inUse + s.q.cost,
		Limit:          float64(s.permits()),
		Tokens:         -1,
	}
	if s.adapt != nil {
		st.Limit = s.limit
		st.LimitFloor, st.LimitCeiling = s.adapt.min, s.adapt.max
		st.MinRTT, st.SampleRTT = s.adapt.minRTT.Value(), s.adapt.lastRTT
	}
	return st
}

// doorCheck refuses what no strategy may admit: anything while draining, and a request whose
// deadline has already passed.
func doorCheck(now time.Time, req *Request, draining bool, stage string) *Rejection {
	if draining {
		return &Rejection{Reason: ReasonDraining, RetryAfter: time.Second, Stage: stage}
	}
	if d := req.Deadline; !d.IsZero() && !now.Before(d) {
		return &Rejection{Reason: ReasonDeadline, Stage: stage}
	}
	return nil
}
