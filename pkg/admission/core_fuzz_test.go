package admission

// Fuzzing of the admission state machine. The test is internal to the package so that it can
// hold every core to its exact bookkeeping, not only to what Stats reports.
//
// A fuzz input is a byte string: the first bytes choose a core and its configuration, the rest
// is a program of operations (Offer, Release, Cancel, clock steps with Advance, advancing to the
// core's own Wake, TryAdmit-style offer-and-withdraw, Drain). After every operation the model's
// view of every ticket is compared with the core's, and these invariants are checked:
//
//   - Tickets: a core resolves only tickets that are pending, each exactly once, to Admitted or
//     Refused; it never reports the ticket being offered as an event of its own Offer; Cancel of
//     a ticket that is not pending changes nothing; an admitted ticket's Granted lies between
//     its Arrival and now; a refusal names a known reason and its stage and has a Retry-After
//     of zero or more. Every admitted ticket is released exactly once (by the driver).
//   - In flight: never negative, and equal to the cost of the admitted, unreleased tickets. At
//     every admission the cost in flight is within the permits (the limit rounded down, at
//     least 1; for an adaptive limit, its value at that moment, plus the one permit its
//     fractional part lends while that part's credit lasts), or else the admitted ticket is
//     covered by the priority reservation and the reserved cost in flight is within
//     floor(reserved x permits). Requests that are not covered never hold more than the permits
//     at their admission. With a lead, the permits lent by requests about to finish count too
//     (at most an eighth of the permits, at least one). (A limit that shrinks later may leave more in flight than the new
//     limit; that is allowed and drains as permits are released.)
//   - Queue: its cost equals the cost of the pending tickets and, counting each waiter as at
//     most the depth (a request heavier than the whole queue waits alone), never exceeds the
//     depth; a strategy without a queue never holds a pending ticket. The leaky bucket never
//     holds more water than its depth.
//   - Stats: InFlight, Queued, QueuedRequests and Buffered agree with the tickets; an adaptive
//     limit stays within its floor and ceiling; a token bucket's tokens stay within [0, burst].
//   - Progress: after Advance(now) a core's next Wake is zero or after now (a driver arming a
//     timer for it never spins), and at the end, releasing everything and moving the clock far
//     ahead resolves every pending ticket and leaves nothing in flight or queued.

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/loadshed/loadshed/pkg/admission/limit"
)

// fuzzBytes reads a fuzz input; past its end it yields zeros.
type fuzzBytes struct {
	b []byte
	i int
}

func (f *fuzzBytes) next() byte {
	if f.i >= len(f.b) {
		return 0
	}
	v := f.b[f.i]
	f.i++
	return v
}

func (f *fuzzBytes) done() bool { return f.i >= len(f.b) }

// intn returns a value in [lo, hi].
func (f *fuzzBytes) intn(lo, hi int) int { return lo + int(f.next())%(hi-lo+1) }

func (f *fuzzBytes) ms(lo, hi int) time.Duration {
	return time.Duration(f.intn(lo, hi)) * time.Millisecond
}

var fuzzRates = []float64{0.5, 1, 10, 100, 1000, 1e6}

func (f *fuzzBytes) priorities() PriorityConfig {
	return PriorityConfig{Reserved: []float64{0, 0, 0.25, 0.5, 1}[f.intn(0, 4)], ReservedFor: Priority(f.intn(0, 3))}
}

func (f *fuzzBytes) adaptive() AdaptiveConfig {
	names := limit.Names()
	algo, err := limit.New(names[f.intn(0, len(names)-1)], limit.DefaultParams())
	if err != nil {
		panic(err)
	}
	lo := float64(f.intn(1, 3))
	hi := lo + float64(f.intn(0, 12))
	return AdaptiveConfig{
		Algorithm: algo, MinLimit: lo, MaxLimit: hi, InitialLimit: lo + float64(f.intn(0, int(hi-lo))),
		SlowStart: f.ms(0, 1) * 500, Window: f.ms(1, 100), MaxWindow: time.Second, MinSamples: f.intn(1, 10),
		QueueDepth: int64(f.intn(0, 8)), MaxWait: f.ms(1, 100), Priorities: f.priorities(),
		Lead: f.ms(0, 2) / 4,
	}
}

// fuzzCore builds a core from the input; depth limits chain nesting.
func fuzzCore(f *fuzzBytes, chainOK bool) (Core, error) {
	kinds := 6
	if chainOK {
		kinds = 7
	}
	switch f.intn(0, kinds-1) {
	case 0:
		return NewInflight(InflightConfig{Limit: int64(f.intn(1, 8)), Priorities: f.priorities()})
	case 1:
		return NewBoundedQueue(BoundedQueueConfig{Concurrency: int64(f.intn(1, 8)), Depth: int64(f.intn(0, 8)), MaxWait: f.ms(1, 100), Priorities: f.priorities()})
	case 2:
		return NewLeakyBucket(LeakyBucketConfig{Rate: fuzzRates[f.intn(0, len(fuzzRates)-1)], Depth: int64(f.intn(1, 8))})
	case 3:
		return NewTokenBucket(TokenBucketConfig{Rate: fuzzRates[f.intn(0, len(fuzzRates)-1)], Burst: f.intn(1, 8)})
	case 4:
		return NewAdaptive(f.adaptive())
	case 5:
		c := CoDelConfig{Concurrency: int64(f.intn(0, 4)), Target: f.ms(1, 10), Depth: int64(f.intn(1, 8)), Priorities: f.priorities()}
		c.Interval = c.Target + f.ms(1, 100)
		if c.Concurrency == 0 {
			a := f.adaptive()
			c.Adaptive = &a
		}
		return NewCoDel(c)
	}
	n := f.intn(1, 3)
	stages := make([]Core, n)
	for i := range stages {
		c, err := fuzzCore(f, false)
		if err != nil {
			return nil, err
		}
		stages[i] = c
	}
	return NewChain(stages...)
}

// checked wraps a core (or a chain's stage) and checks, around every call, what can only be seen
// at that moment: the limit at each admission, and Wake after Advance.
type checked struct {
	Core
	h *harness
}

func (c *checked) Offer(now time.Time, t *Ticket, ev *Events) Verdict {
	n := ev.Len()
	v := c.Core.Offer(now, t, ev)
	for i := n; i < ev.Len(); i++ {
		if ev.At(i) == t {
			c.h.fail("%s: Offer reported the offered ticket as an event", c.Name())
		}
	}
	var admitted []*Ticket
	if v == Admitted {
		admitted = append(admitted, t)
	}
	c.admissions(now, admitted, ev, n)
	return v
}

func (c *checked) Release(now time.Time, t *Ticket, o Outcome, ev *Events) {
	n := ev.Len()
	c.Core.Release(now, t, o, ev)
	c.admissions(now, nil, ev, n)
}

func (c *checked) Cancel(now time.Time, t *Ticket, ev *Events) {
	n := ev.Len()
	c.Core.Cancel(now, t, ev)
	c.admissions(now, nil, ev, n)
}

func (c *checked) Advance(now time.Time, ev *Events) {
	n := ev.Len()
	c.Core.Advance(now, ev)
	c.admissions(now, nil, ev, n)
	if _, isChain := c.Core.(*chain); !isChain {
		// A chain may offer to a stage after advancing it; its own convergence is checked by
		// the driver. A single core has resolved everything due.
		if w := c.Core.Wake(); !w.IsZero() && !w.After(now) {
			c.h.fail("%s: Wake %v is not after now %v right after Advance: a driver would spin", c.Name(), w, now)
		}
	}
}

func (c *checked) Drain(now time.Time, ev *Events) {
	n := ev.Len()
	c.Core.Drain(now, ev)
	for i := n; i < ev.Len(); i++ {
		if t := ev.At(i); t.state != Refused || t.Err == nil || t.Err.Reason != ReasonDraining {
			c.h.fail("%s: Drain resolved a ticket to %v (%v), want refused draining", c.Name(), t.state, t.Err)
		}
	}
}

// admissions checks the limit for the tickets a call admitted: t (when Offer admitted it) and
// the events from index n on that are admitted.
func (c *checked) admissions(now time.Time, admitted []*Ticket, ev *Events, n int) {
	for i := n; i < ev.Len(); i++ {
		if ev.At(i).state == Admitted {
			admitted = append(admitted, ev.At(i))
		}
	}
	for _, t := range admitted {
		if t.Granted.Before(t.Arrival) || t.Granted.After(now) {
			c.h.fail("%s: granted at %v, arrival %v, now %v", c.Name(), t.Granted, t.Arrival, now)
		}
	}
	s, ok := c.Core.(*semaphore)
	if !ok || len(admitted) == 0 {
		return
	}
	p := s.allowed() + s.lentOut
	reserve := int64(math.Floor(s.prio.Reserved * float64(s.permits())))
	if s.lentOut > s.lendRoom() || s.lentOut < 0 {
		c.h.fail("%s: %d lent with %d permits", s.name, s.lentOut, s.permits())
	}
	plain := false
	for _, t := range admitted {
		plain = plain || !s.important(t)
	}
	if s.inUse > p && s.importants > reserve {
		c.h.fail("%s: admitted with %d in flight over %d permits and %d reserved over a reserve of %d", s.name, s.inUse, p, s.importants, reserve)
	}
	if plain && s.inUse-s.importants > p {
		c.h.fail("%s: admitted an uncovered request with %d uncovered in flight over %d permits", s.name, s.inUse-s.importants, p)
	}
}

// harness drives one core through a fuzz program and keeps the model.
type harness struct {
	t    *testing.T
	core Core
	now  time.Time
	ev   Events
	// live holds the tickets the model knows as pending or admitted, in offer order.
	live  []*Ticket
	model map[*Ticket]Verdict
	// drained: the core was drained; every later offer must be refused.
	drained bool
}

func (h *harness) fail(format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf(format, args...)
}

// wrap puts a checked wrapper around the core and, for a chain, around each stage.
func (h *harness) wrap(c Core) Core {
	if ch, ok := c.(*chain); ok {
		for i, s := range ch.stages {
			ch.stages[i] = &checked{Core: s, h: h}
		}
	}
	return &checked{Core: c, h: h}
}

func unwrap(c Core) Core {
	if w, ok := c.(*checked); ok {
		return w.Core
	}
	return c
}

// resolved applies the events of the last call to the model.
func (h *harness) resolved(op string) {
	seen := map[*Ticket]bool{}
	for i := 0; i < h.ev.Len(); i++ {
		t := h.ev.At(i)
		if seen[t] {
			h.fail("%s: ticket resolved twice in one call", op)
		}
		seen[t] = true
		if h.model[t] != Pending {
			h.fail("%s: resolved a ticket the model holds as %v", op, h.model[t])
		}
		switch t.state {
		case Admitted:
			h.model[t] = Admitted
		case Refused:
			h.checkRefusal(op, t)
			h.forget(t)
		default:
			h.fail("%s: event with state %v", op, t.state)
		}
	}
	h.ev.Reset()
}

func (h *harness) checkRefusal(op string, t *Ticket) {
	if t.Err == nil || !slices.Contains(AllReasons, t.Err.Reason) || t.Err.Stage == "" || t.Err.RetryAfter < 0 {
		h.fail("%s: bad refusal %+v", op, t.Err)
	}
}

func (h *harness) forget(t *Ticket) {
	delete(h.model, t)
	h.live = slices.DeleteFunc(h.live, func(x *Ticket) bool { return x == t })
}

func (h *harness) pick(b byte, want Verdict) *Ticket {
	var c []*Ticket
	for _, t := range h.live {
		if h.model[t] == want {
			c = append(c, t)
		}
	}
	if len(c) == 0 {
		return nil
	}
	return c[int(b)%len(c)]
}

func (h *harness) offer(f *fuzzBytes, withdraw bool) {
	req := Request{Priority: Priority(f.intn(0, 4)), Cost: int64(f.intn(-1, 10)), Rank: f.intn(-1, 9)}
	if d := f.next(); d%4 != 0 {
		req.Deadline = h.now.Add(time.Duration(d/4) * time.Millisecond)
	}
	t := &Ticket{heapIdx: -1}
	t.Reset(req, h.now)
	v := h.core.Offer(h.now, t, &h.ev)
	if v != t.state {
		h.fail("Offer returned %v but the ticket is %v", v, t.state)
	}
	switch v {
	case Admitted:
		h.model[t] = Admitted
		h.live = append(h.live, t)
	case Pending:
		h.model[t] = Pending
		h.live = append(h.live, t)
	case Refused:
		h.checkRefusal("Offer", t)
	default:
		h.fail("Offer returned %v", v)
	}
	if h.drained && v != Refused {
		h.fail("Offer after Drain returned %v", v)
	}
	h.resolved("Offer")
	if withdraw && v == Pending {
		h.core.Cancel(h.now, t, &h.ev)
		if t.state != Cancelled {
			h.fail("Cancel left a pending ticket %v", t.state)
		}
		h.forget(t)
		h.resolved("Cancel")
	}
}

func (h *harness) release(t *Ticket, o Outcome) {
	h.core.Release(h.now, t, o, &h.ev)
	h.forget(t)
	h.resolved("Release")
}

func (h *harness) advance(d time.Duration) {
	h.now = h.now.Add(d)
	h.core.Advance(h.now, &h.ev)
	h.resolved("Advance")
	// A chain may take a few passes (a stage offered to after its own Advance); it must settle.
	for i := 0; ; i++ {
		w := h.core.Wake()
		if w.IsZero() || w.After(h.now) {
			return
		}
		if i == 3 {
			h.fail("Wake stays at %v, not after now %v, after %d Advance calls", w, h.now, i+1)
		}
		h.core.Advance(h.now, &h.ev)
		h.resolved("Advance")
	}
}

func (h *harness) step(f *fuzzBytes) {
	switch op := f.next() % 10; op {
	case 0, 1, 2:
		h.offer(f, false)
	case 3:
		h.offer(f, true)
	case 4, 5:
		b, o := f.next(), Outcome(f.next()%3)
		if t := h.pick(b, Admitted); t != nil {
			h.release(t, o)
		}
	case 6:
		b, any := f.next(), f.next()%4 == 0
		var t *Ticket
		if any && len(h.live) > 0 {
			t = h.live[int(b)%len(h.live)]
		} else {
			t = h.pick(b, Pending)
		}
		if t == nil {
			return
		}
		was, before := t.state, h.stats()
		h.core.Cancel(h.now, t, &h.ev)
		if was != Pending {
			if t.state != was || h.ev.Len() != 0 || h.stats() != before {
				h.fail("Cancel of a %v ticket changed the core", was)
			}
			return
		}
		if t.state != Cancelled {
			h.fail("Cancel left the ticket %v", t.state)
		}
		h.forget(t)
		h.resolved("Cancel")
	case 7:
		h.advance(f.ms(0, 255))
	case 8:
		if w := h.core.Wake(); !w.IsZero() {
			h.advance(max(w.Sub(h.now), 0))
		}
	case 9:
		if f.next()%8 == 0 {
			h.core.Drain(h.now, &h.ev)
			h.drained = true
			h.resolved("Drain")
			if h.count(Pending) != 0 {
				h.fail("Drain left %d tickets pending", h.count(Pending))
			}
		}
	}
}

func (h *harness) stats() Stats { return h.core.Stats(h.now) }

func (h *harness) count(v Verdict) int {
	n := 0
	for _, t := range h.live {
		if h.model[t] == v {
			n++
		}
	}
	return n
}

// check compares the core with the model.
func (h *harness) check() {
	var inflight, queued int64
	for _, t := range h.live {
		if t.state != h.model[t] {
			h.fail("ticket is %v, model says %v", t.state, h.model[t])
		}
		if t.state == Admitted {
			inflight += t.cost
		} else {
			queued += t.cost
		}
	}
	st := h.stats()
	core := unwrap(h.core)
	live := h.live
	if co, ok := core.(*Cohorts); ok {
		// The waiting room's tickets are pending in the model and held by no strategy; the
		// strategy holds the rest.
		room := map[*Ticket]bool{}
		var cost int64
		for i, w := range co.room {
			if h.model[w.t] != Pending || w.t.state != Pending || room[w.t] {
				h.fail("cohorts: waiter %d is %v (model %v) or listed twice", i, w.t.state, h.model[w.t])
			}
			if i > 0 && w.level < co.room[i-1].level || w.until.After(h.now.Add(co.o.MaxWait)) {
				h.fail("cohorts: room out of order or waiting beyond MaxWait")
			}
			room[w.t] = true
			cost += max(w.t.Req.cost(), 1)
		}
		live = slices.DeleteFunc(slices.Clone(live), func(t *Ticket) bool { return room[t] })
		if st.QueuedRequests != h.count(Pending) {
			h.fail("cohorts: stats %+v; model %d pending", st, h.count(Pending))
		}
		core = unwrap(co.inner)
		st = co.inner.Stats(h.now)
	}
	if ch, ok := core.(*chain); ok {
		pending := 0
		for _, t := range live {
			if h.model[t] == Pending {
				pending++
			}
		}
		if st.InFlight != inflight || st.QueuedRequests != pending || st.Buffered != st.InFlight+st.Queued {
			h.fail("chain stats %+v; model: %d in flight, %d pending", st, inflight, pending)
		}
		h.checkStages(ch, live)
		return
	}
	h.checkCore(core, live, st)
}

// checkStages checks each stage of a chain against the children of the live parents.
func (h *harness) checkStages(ch *chain, live []*Ticket) {
	for j, s := range ch.stages {
		var kids []*Ticket
		for _, p := range live {
			last := len(p.children) - 1
			if p.state == Admitted && len(p.children) != len(ch.stages) || p.state == Pending && p.stage != last {
				h.fail("chain parent %v at stage %d holds %d children", p.state, p.stage, len(p.children))
			}
			if j > last {
				continue
			}
			k := p.children[j]
			want := Admitted
			if p.state == Pending && j == last {
				want = Pending
			}
			if k.state != want || k.parent != p {
				h.fail("chain stage %d: child is %v, want %v", j, k.state, want)
			}
			kids = append(kids, k)
		}
		h.checkCore(unwrap(s), kids, s.Stats(h.now))
	}
}

// checkCore checks one non-chain core holding the given tickets (admitted or pending).
func (h *harness) checkCore(c Core, tickets []*Ticket, st Stats) {
	var held, queued, important int64
	pending := 0
	for _, t := range tickets {
		if t.state == Admitted {
			held += t.cost
		} else {
			queued += t.cost
			pending++
		}
	}
	if st.InFlight < 0 || st.Queued < 0 || st.QueuedRequests < 0 {
		h.fail("%s: negative stats %+v", c.Name(), st)
	}
	switch s := c.(type) {
	case *semaphore:
		for _, t := range tickets {
			if t.state == Admitted && s.important(t) {
				important += t.cost
			}
		}
		if s.inUse != held || s.importants != important || st.InFlight != held {
			h.fail("%s: in use %d (reserved %d, stats %d), model %d (reserved %d)", s.name, s.inUse, s.importants, st.InFlight, held, important)
		}
		if s.q.cost != queued || s.q.n != pending || st.Queued != queued || st.QueuedRequests != pending || st.Buffered != held+queued {
			h.fail("%s: queue %d/%d (stats %+v), model %d/%d", s.name, s.q.cost, s.q.n, st, queued, pending)
		}
		var capped int64
		for _, t := range tickets {
			if t.state == Pending {
				capped += min(t.cost, max(s.depth, 1))
			}
		}
		if capped > s.depth {
			h.fail("%s: %d waiting (cost %d) over depth %d", s.name, pending, queued, s.depth)
		}
		h.checkQueueLinks(s, tickets)
		h.checkFlight(s, tickets)
		if s.adapt != nil && (st.Limit < st.LimitFloor || st.Limit > st.LimitCeiling || math.IsNaN(st.Limit)) {
			h.fail("%s: limit %v outside [%v, %v]", s.name, st.Limit, st.LimitFloor, st.LimitCeiling)
		}
	case *inflight:
		if pending != 0 || st.InFlight != held || s.inUse.Load() > s.limit || st.Queued != 0 {
			h.fail("inflight: stats %+v over limit %d; model %d in flight, %d pending", st, s.limit, held, pending)
		}
	case *leakyBucket:
		if len(s.waiting) != pending || st.Queued != queued || st.QueuedRequests != pending {
			h.fail("leaky-bucket: %d waiting (stats %+v), model %d pending", len(s.waiting), st, pending)
		}
		for i, w := range s.waiting {
			if w.state != Pending || i > 0 && w.start.Before(s.waiting[i-1].start) || !w.start.After(h.now) {
				h.fail("leaky-bucket: waiter %d (%v) starts at %v, now %v", i, w.state, w.start, h.now)
			}
		}
		if st.Buffered > s.depth || queued > s.depth {
			h.fail("leaky-bucket: %d buffered, %d queued, depth %d", st.Buffered, queued, s.depth)
		}
	case *tokenBucket:
		if pending != 0 || st.Tokens < -1e-9 || st.Tokens > float64(s.burst)+1e-9 {
			h.fail("token-bucket: %d pending, tokens %v of burst %d", pending, st.Tokens, s.burst)
		}
	default:
		h.fail("unexpected core %T", c)
	}
}

// checkQueueLinks walks a semaphore's wait lists and expiry heap.
// checkFlight: with a lead, the in-flight list holds exactly the admitted tickets, oldest
// first, and the lent cost is that of the admitted lenders.
func (h *harness) checkFlight(s *semaphore, tickets []*Ticket) {
	if s.lead <= 0 {
		return
	}
	in := map[*Ticket]bool{}
	var prev *Ticket
	var lent int64
	for t := s.flightHead; t != nil; t = t.next {
		if t.prev != prev || in[t] || t.state != Admitted || (prev != nil && t.Granted.Before(prev.Granted)) {
			h.fail("%s: in-flight list is broken", s.name)
			return
		}
		in[t] = true
		if t.lent {
			lent += t.cost
		}
		prev = t
	}
	if s.flightTail != prev || lent != s.lentOut {
		h.fail("%s: in-flight list tail or lent cost %d (list %d) is wrong", s.name, s.lentOut, lent)
	}
	for _, t := range tickets {
		if t.state == Admitted && !in[t] {
			h.fail("%s: an admitted ticket is not in the in-flight list", s.name)
		}
	}
}

func (h *harness) checkQueueLinks(s *semaphore, tickets []*Ticket) {
	in := map[*Ticket]bool{}
	for p := range s.q.heads {
		var prev *Ticket
		for t := s.q.heads[p]; t != nil; t = t.next {
			if t.prev != prev || clampPriority(t.Req.Priority) != Priority(p) || in[t] {
				h.fail("%s: wait list %d is broken", s.name, p)
			}
			in[t] = true
			prev = t
		}
		if s.q.tails[p] != prev {
			h.fail("%s: wait list %d tail is wrong", s.name, p)
		}
	}
	withExpiry := 0
	for _, t := range tickets {
		if t.state == Pending {
			if !in[t] {
				h.fail("%s: a pending ticket is not in the wait lists", s.name)
			}
			if !t.expiry.IsZero() {
				withExpiry++
				if t.heapIdx < 0 || t.heapIdx >= len(s.q.expiries) || s.q.expiries[t.heapIdx] != t {
					h.fail("%s: expiry heap index broken", s.name)
				}
				if !t.expiry.After(h.now) {
					h.fail("%s: a ticket expired at %v is still waiting at %v", s.name, t.expiry, h.now)
				}
			}
		}
	}
	if len(in) != s.q.n || len(s.q.expiries) != withExpiry {
		h.fail("%s: %d in lists, %d in heap; %d waiting, %d with expiry", s.name, len(in), len(s.q.expiries), s.q.n, withExpiry)
	}
}

// finish releases everything and moves time on until nothing is left: every pending ticket must
// be resolved, and the core must end empty.
func (h *harness) finish() {
	for round := 0; len(h.live) > 0; round++ {
		if round == 64 {
			h.fail("%d tickets never resolved (%d pending) after releasing everything and advancing %d hours", len(h.live), h.count(Pending), round)
		}
		for t := h.pick(0, Admitted); t != nil; t = h.pick(0, Admitted) {
			h.release(t, Success)
			h.check()
		}
		h.advance(time.Hour)
		h.check()
	}
	st := h.stats()
	if st.InFlight != 0 || st.Queued != 0 || st.QueuedRequests != 0 {
		h.fail("empty core reports %+v", st)
	}
}

// runCoreProgram builds a core from data and runs the program in the rest of data.
func runCoreProgram(t *testing.T, data []byte) {
	f := &fuzzBytes{b: data}
	core, err := fuzzCore(f, true)
	if err != nil {
		t.Fatalf("a valid configuration was refused: %v", err)
	}
	h := &harness{t: t, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), model: map[*Ticket]Verdict{}}
	core = h.wrap(core)
	if f.intn(0, 2) == 0 {
		// Ranked admission in front of it, moving its level every few milliseconds.
		co, err := NewCohorts(core, CohortOptions{Ranks: f.intn(2, 8), Window: f.ms(1, 20),
			WaitFraction: []float64{-1, 0.5, 1.5, 4}[f.intn(0, 3)], MaxWait: f.ms(1, 50)})
		if err != nil {
			t.Fatalf("valid cohort options were refused: %v", err)
		}
		core = &checked{Core: co, h: h}
	}
	h.core = core
	for steps := 0; !f.done() && steps < 2000; steps++ {
		h.step(f)
		h.check()
	}
	h.finish()
}

// FuzzCore runs random programs of Offer, Release, Cancel, clock steps, Advance, TryAdmit-style
// withdrawals and Drain against every core (inflight, bounded-queue, leaky-bucket, token-bucket,
// adaptive with each algorithm, codel with a fixed or adaptive limit, chains of them) and checks
// the invariants listed at the top of this file.
func FuzzCore(f *testing.F) {
	for kind := range 7 {
		for _, prog := range [][]byte{
			bytes.Repeat([]byte{0, 5, 3}, 20),
			bytes.Repeat([]byte{1, 2, 9, 40, 7, 30, 4, 0, 0}, 12),
			bytes.Repeat([]byte{2, 0, 7, 8, 6, 1, 8, 3, 3, 12}, 10),
		} {
			f.Add(append([]byte{byte(kind), 3, 2, 1, 4, 20, 2, 1, 3, 2, 1, 5}, prog...))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			return
		}
		runCoreProgram(t, data)
	})
}

// TestCoreProgramsFromSeeds runs a few fixed programs on every core, so the invariants are
// checked by the plain unit tests too (the fuzz seeds run as well, with go test alone).
func TestCoreProgramsFromSeeds(t *testing.T) {
	for kind := range 7 {
		for seed := range 20 {
			data := []byte{byte(kind)}
			x := uint32(seed*2654435761 + kind + 1)
			for range 600 {
				x ^= x << 13
				x ^= x >> 17
				x ^= x << 5
				data = append(data, byte(x))
			}
			t.Run(fmt.Sprintf("kind%d/seed%d", kind, seed), func(t *testing.T) { runCoreProgram(t, data) })
		}
	}
}

// TestShrunkLimitStillAdmitsAHeavyWaiter: a request's cost is clamped to the permits when it is
// offered, so that a request heavier than the whole limit runs alone rather than never. When an
// adaptive limit then shrinks below the cost of a request already waiting, that request must
// still run alone once the permits are free: before the fix it could never fit, blocked every
// waiter behind it and, without a maximum wait, waited forever (found by FuzzCore).
func TestShrunkLimitStillAdmitsAHeavyWaiter(t *testing.T) {
	algo, err := limit.New(limit.NameAIMD, limit.DefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	core, err := NewAdaptive(AdaptiveConfig{Algorithm: algo, InitialLimit: 4, MinLimit: 1, MaxLimit: 8,
		Window: time.Millisecond, MinSamples: 1, QueueDepth: 8, MaxWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var ev Events
	offer := func(cost int64, want Verdict) *Ticket {
		t.Helper()
		k := &Ticket{heapIdx: -1}
		k.Reset(Request{Cost: cost}, now)
		if v := core.Offer(now, k, &ev); v != want {
			t.Fatalf("offer of cost %d: %v, want %v", cost, v, want)
		}
		return k
	}
	a, b := offer(2, Admitted), offer(2, Admitted)
	heavy, light := offer(4, Pending), offer(1, Pending)
	// One success opens the first window; a failure closes it: AIMD backs off from 4 to 3.6,
	// three permits, and every permit is free.
	now = now.Add(10 * time.Millisecond)
	core.Release(now, a, Success, &ev)
	now = now.Add(10 * time.Millisecond)
	core.Release(now, b, Dropped, &ev)
	if st := core.Stats(now); st.Limit >= 4 {
		t.Fatalf("limit %v: the drop must shrink it", st.Limit)
	}
	if heavy.State() != Admitted {
		t.Fatalf("the heavy waiter is %v with every permit free: it must run alone", heavy.State())
	}
	if st := core.Stats(now); st.InFlight > int64(st.Limit) || st.InFlight < 1 {
		t.Fatalf("in flight %d with limit %v", st.InFlight, st.Limit)
	}
	core.Release(now, heavy, Success, &ev)
	if light.State() != Admitted {
		t.Fatalf("the light waiter behind it is %v", light.State())
	}
}
