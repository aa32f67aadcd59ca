package admission

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Limiter serves a Core to concurrent callers in real time. Admit returns at once when the core
// admits or refuses; when it queues, Admit blocks until the core resolves the ticket or the
// caller's context ends. One timer, armed for the core's next Wake, drives expiries and drains.
type Limiter struct {
	mu      sync.Mutex
	core    Core
	clock   Clock
	ev      Events
	timer   Timer
	timerAt time.Time
	tickets sync.Pool
	// stateless cores (token and leaky buckets) keep nothing per permit: Done skips the lock.
	stateless bool
	// fast cores decide without the lock, a ticket or a queue (see fastCore).
	fast fastCore
}

// fastCore is implemented by cores that decide every request at once, with their own
// synchronisation (an atomic counter, x/time/rate's lock): the Limiter then admits through them
// without taking its lock, filling a ticket or, unless the core needs it, reading the clock.
type fastCore interface {
	// admitNow admits req and returns the cost it holds, or refuses it.
	admitNow(clock Clock, req Request) (int64, *Rejection)
	// releaseNow gives back what admitNow took.
	releaseNow(cost int64)
}

// Option configures a Limiter.
type Option func(*Limiter)

// WithClock sets the clock (default SystemClock).
func WithClock(c Clock) Option { return func(l *Limiter) { l.clock = c } }

// NewLimiter wraps core for concurrent use.
func NewLimiter(core Core, opts ...Option) *Limiter {
	l := &Limiter{core: core, clock: SystemClock{}}
	for _, o := range opts {
		o(l)
	}
	if s, ok := core.(interface{ stateless() bool }); ok {
		l.stateless = s.stateless()
	}
	l.fast, _ = core.(fastCore)
	l.tickets.New = func() any { return &Ticket{ready: make(chan struct{}, 1), heapIdx: -1} }
	return l
}

// Core returns the wrapped core. Use it only under Inspect.
func (l *Limiter) Core() Core { return l.core }

// Permit is an admitted request's hold on the strategy. Release it exactly once with Done,
// normally with defer right after Admit succeeds. The zero Permit is invalid.
type Permit struct {
	l    *Limiter
	t    *Ticket
	gen  uint32
	cost int64 // what a fast core holds for this permit
	// Waited is how long the request spent queued before admission.
	Waited time.Duration
	// Granted is when the request was admitted.
	Granted time.Time
}

// Done releases the permit with the request's outcome. It returns false, and does nothing, if
// the permit was already released.
func (p Permit) Done(o Outcome) bool { return p.DoneAfter(o, 0) }

// DoneAfter is Done with the latency the caller measured for the upstream exchange (rtt > 0):
// an adaptive strategy samples it instead of the time since the permit was granted, which also
// holds the caller's own work and waits.
func (p Permit) DoneAfter(o Outcome, rtt time.Duration) bool {
	l := p.l
	if l == nil {
		return false
	}
	t := p.t
	if l.fast != nil {
		// The ticket carries only the generation that makes a second Done a no-op.
		if !t.gen.CompareAndSwap(p.gen, p.gen+1) {
			return false
		}
		l.fast.releaseNow(p.cost)
		l.tickets.Put(t)
		return true
	}
	if l.stateless {
		// Nothing to give back: the generation bump alone makes a second Done a no-op.
		if !t.gen.CompareAndSwap(p.gen, p.gen+1) {
			return false
		}
		l.tickets.Put(t)
		return true
	}
	l.mu.Lock()
	if !t.gen.CompareAndSwap(p.gen, p.gen+1) {
		l.mu.Unlock()
		return false
	}
	now := l.clock.Now()
	t.RTT = rtt
	l.core.Release(now, t, o, &l.ev)
	t.state = Cancelled
	l.flush(now)
	l.mu.Unlock()
	l.tickets.Put(t)
	return true
}

// Admit asks the strategy to admit req. It returns a Permit, a *Rejection (errors.Is
// ErrRejected), or ctx.Err() if the context ended while the request waited; a waiting request
// whose context ends leaves the queue at once.
func (l *Limiter) Admit(ctx context.Context, req Request) (Permit, error) {
	return l.AdmitNotify(ctx, req, nil)
}

// Queued describes a request the strategy put in a queue.
type Queued struct {
	// Expected is the strategy's estimate of the wait (0 when it has none yet).
	Expected time.Duration
	// Bound is the longest the request can wait before it is admitted or refused: its queue's
	// maxWait or its deadline, whichever comes first; for a chain, the stages still ahead add
	// theirs. Zero means no bound is known.
	Bound time.Duration
}

// AdmitNotify is Admit for a caller that must know when its request waits: when the strategy
// queues req, queued (if not nil) is called once, before Admit blocks, with the expected wait
// and its bound. A front door with a deadline of its own (Envoy's ext_proc message timeout)
// extends it from there.
func (l *Limiter) AdmitNotify(ctx context.Context, req Request, queued func(Queued)) (Permit, error) {
	if err := ctx.Err(); err != nil {
		return Permit{}, err
	}
	if l.fast != nil {
		return l.admitFast(req)
	}
	t, gen, v, q := l.offer(req, false, queued != nil)
	switch v {
	case Admitted:
		return Permit{l: l, t: t, gen: gen, Granted: t.Granted}, nil
	case Refused:
		err := t.Err
		l.tickets.Put(t)
		return Permit{}, err
	}
	if queued != nil {
		queued(q)
	}
	select {
	case <-t.ready:
	case <-ctx.Done():
		l.mu.Lock()
		if t.state == Pending {
			now := l.clock.Now()
			l.core.Cancel(now, t, &l.ev)
			l.flush(now)
			l.mu.Unlock()
			l.tickets.Put(t)
			return Permit{}, ctx.Err()
		}
		l.mu.Unlock()
		<-t.ready // resolved just now: the notification is already in the channel
		if t.state == Admitted {
			Permit{l: l, t: t, gen: gen}.Done(Ignore)
		} else {
			l.tickets.Put(t)
		}
		return Permit{}, ctx.Err()
	}
	if t.state == Admitted {
		return Permit{l: l, t: t, gen: gen, Waited: t.Granted.Sub(t.Arrival), Granted: t.Granted}, nil
	}
	err := t.Err
	l.tickets.Put(t)
	return Permit{}, err
}

// admitFast is Admit for a fast core: no lock, no queue; the pooled ticket only carries the
// permit's generation.
func (l *Limiter) admitFast(req Request) (Permit, error) {
	cost, rej := l.fast.admitNow(l.clock, req)
	if rej != nil {
		return Permit{}, rej
	}
	t := l.tickets.Get().(*Ticket)
	return Permit{l: l, t: t, gen: t.gen.Load(), cost: cost}, nil
}

// flush notifies the waiters the core resolved and re-arms the wake-up timer. Called with l.mu
// held; the sends never block (each ticket's channel has room for its one notification).
func (l *Limiter) flush(now time.Time) {
	for i := 0; i < l.ev.Len(); i++ {
		l.ev.At(i).ready <- struct{}{}
	}
	l.ev.Reset()
	w := l.core.Wake()
	if w.IsZero() || (!l.timerAt.IsZero() && !w.Before(l.timerAt)) {
		return
	}
	l.timerAt = w
	d := max(w.Sub(now), 0)
	if l.timer == nil {
		l.timer = l.clock.AfterFunc(d, l.wake)
	} else {
		l.timer.Reset(d)
	}
}

// wake runs when the timer fires: it advances the core and re-arms for the next due time.
func (l *Limiter) wake() {
	l.mu.Lock()
	now := l.clock.Now()
	defer l.mu.Unlock()
	if !l.timerAt.IsZero() && now.Before(l.timerAt) {
		// Fired early (the timer was re-armed meanwhile): re-arm for the current due time.
		l.timer.Reset(l.timerAt.Sub(now))
		return
	}
	l.timerAt = time.Time{}
	l.core.Advance(now, &l.ev)
	l.flush(now)
}

// Drain refuses every queued request with ReasonDraining and every later request likewise.
// Permits already held stay valid and must still be released.
func (l *Limiter) Drain() {
	l.mu.Lock()
	now := l.clock.Now()
	l.core.Drain(now, &l.ev)
	l.flush(now)
	l.mu.Unlock()
}

// Stats returns the core's current state.
func (l *Limiter) Stats() Stats {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.core.Stats(now)
}

// StageStats returns the state of each stage (one entry unless the core is a chain).
func (l *Limiter) StageStats() []Stats {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	stages := Stages(l.core)
	out := make([]Stats, len(stages))
	for i, s := range stages {
		out[i] = s.Stats(now)
	}
	return out
}

// Inspect calls f with the core while holding the limiter's lock, for reading state that Stats
// does not report. f must not block or call back into the limiter.
func (l *Limiter) Inspect(f func(now time.Time, c Core)) {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	f(now, l.core)
}

// ErrWouldWait is returned by TryAdmit when the strategy would queue the request.
var ErrWouldWait = errors.New("admission: the request would wait")

// TryAdmit decides without waiting: it admits, refuses (a *Rejection), or returns ErrWouldWait
// and leaves nothing queued. Dry-run policies use it to learn what a strategy would do without
// delaying anyone.
func (l *Limiter) TryAdmit(req Request) (Permit, error) {
	if l.fast != nil {
		return l.admitFast(req)
	}
	t, gen, v, _ := l.offer(req, true, false)
	switch v {
	case Admitted:
		return Permit{l: l, t: t, gen: gen, Granted: t.Granted}, nil
	case Refused:
		err := t.Err
		l.tickets.Put(t)
		return Permit{}, err
	}
	l.tickets.Put(t)
	return Permit{}, ErrWouldWait
}

// offer offers req to the core under the lock, with a pooled ticket. With withdraw, a ticket
// the core queues is withdrawn at once (it never waits); with describe, a queued ticket's wait is
// estimated under the same lock.
func (l *Limiter) offer(req Request, withdraw, describe bool) (*Ticket, uint32, Verdict, Queued) {
	t := l.tickets.Get().(*Ticket)
	gen := t.gen.Load()
	var q Queued
	l.mu.Lock()
	now := l.clock.Now()
	t.Reset(req, now)
	v := l.core.Offer(now, t, &l.ev)
	if v == Pending {
		if withdraw {
			l.core.Cancel(now, t, &l.ev)
		} else if describe {
			q = queuedWait(l.core, now, t)
		}
	}
	l.flush(now)
	l.mu.Unlock()
	return t, gen, v, q
}

// waitEstimator is implemented by the cores that queue: what a pending ticket can expect.
type waitEstimator interface {
	estimate(now time.Time, t *Ticket) Queued
}

func queuedWait(c Core, now time.Time, t *Ticket) Queued {
	if e, ok := c.(waitEstimator); ok {
		return e.estimate(now, t)
	}
	return Queued{}
}
