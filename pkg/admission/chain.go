package admission

import "time"

// NewChain layers strategies: a request must be admitted by every stage, in order (for example
// a token bucket at the edge, then a bounded queue). A stage that refuses undoes the stages
// before it (their permits are released with Ignore); permits are released in reverse order.
func NewChain(stages ...Core) (Core, error) {
	if len(stages) == 0 {
		var errs fieldErrors
		errs.add("chain", "needs at least one stage")
		return nil, errs.err()
	}
	return &chain{stages: stages}, nil
}

// Stages returns a chain's stages, or the core itself for any other strategy (behind its cohort
// stage, if any).
func Stages(c Core) []Core {
	if x, ok := c.(*Cohorts); ok {
		c = x.inner
	}
	if ch, ok := c.(*chain); ok {
		return ch.stages
	}
	return []Core{c}
}

type chain struct {
	stages   []Core
	sub      Events    // what the stages resolve, processed before returning
	free     []*Ticket // spare child tickets
	inFlight int64
	pending  int
	draining bool
}

func (c *chain) Name() string { return "chain" }

func (c *chain) Offer(now time.Time, t *Ticket, ev *Events) Verdict {
	if r := doorCheck(now, &t.Req, c.draining, c.Name()); r != nil {
		t.refuse(r)
		return Refused
	}
	t.cost = t.Req.cost()
	t.children = t.children[:0]
	v := c.enter(now, t, 0)
	c.settle(now, ev)
	if v == Pending {
		c.pending++
	}
	return v
}

// enter offers parent t to stages from i on, until one queues or refuses it.
func (c *chain) enter(now time.Time, t *Ticket, i int) Verdict {
	for ; i < len(c.stages); i++ {
		k := c.child(t, i, now)
		switch c.stages[i].Offer(now, k, &c.sub) {
		case Pending:
			t.state, t.stage = Pending, i
			return Pending
		case Refused:
			t.refuse(k.Err)
			c.undo(now, t, i)
			return Refused
		}
	}
	t.admit(now)
	c.inFlight += t.cost
	return Admitted
}

func (c *chain) child(t *Ticket, i int, now time.Time) *Ticket {
	var k *Ticket
	if n := len(c.free); n > 0 {
		k, c.free = c.free[n-1], c.free[:n-1]
	} else {
		k = new(Ticket)
	}
	k.Reset(t.Req, now)
	k.parent, k.stage = t, i
	t.children = append(t.children, k)
	return k
}

// undo releases (with Ignore) the permits t holds in stages before i and recycles its children.
func (c *chain) undo(now time.Time, t *Ticket, i int) {
	for j := i - 1; j >= 0; j-- {
		c.stages[j].Release(now, t.children[j], Ignore, &c.sub)
	}
	c.recycle(t)
}

func (c *chain) recycle(t *Ticket) {
	for _, k := range t.children {
		k.parent = nil
		c.free = append(c.free, k)
	}
	t.children = t.children[:0]
}

// settle moves parents whose queued child a stage has resolved on to their next stage, until
// nothing more changes, and reports the parents it resolves.
func (c *chain) settle(now time.Time, ev *Events) {
	for i := 0; i < c.sub.Len(); i++ {
		k := c.sub.At(i)
		t := k.parent
		if t == nil || t.state != Pending || t.stage != k.stage {
			continue
		}
		c.pending--
		switch k.state {
		case Admitted:
			if c.enter(now, t, k.stage+1) == Pending {
				c.pending++
				continue
			}
		case Refused:
			t.refuse(k.Err)
			c.undo(now, t, k.stage)
		}
		ev.Add(t)
	}
	c.sub.Reset()
}

func (c *chain) Release(now time.Time, t *Ticket, o Outcome, ev *Events) {
	for j := len(t.children) - 1; j >= 0; j-- {
		t.children[j].RTT = t.RTT
		c.stages[j].Release(now, t.children[j], o, &c.sub)
	}
	c.inFlight -= t.cost
	c.recycle(t)
	c.settle(now, ev)
}

func (c *chain) Cancel(now time.Time, t *Ticket, ev *Events) {
	if t.state != Pending {
		return
	}
	i := t.stage
	c.stages[i].Cancel(now, t.children[i], &c.sub)
	t.state = Cancelled
	c.pending--
	c.undo(now, t, i)
	c.settle(now, ev)
}

func (c *chain) Advance(now time.Time, ev *Events) {
	for _, s := range c.stages {
		s.Advance(now, &c.sub)
	}
	c.settle(now, ev)
}

func (c *chain) Wake() time.Time {
	var w time.Time
	for _, s := range c.stages {
		w = earliest(w, s.Wake())
	}
	return w
}

func (c *chain) Drain(now time.Time, ev *Events) {
	c.draining = true
	for _, s := range c.stages {
		s.Drain(now, &c.sub)
	}
	c.settle(now, ev)
}

// estimate: the wait at the stage holding the ticket, plus the longest wait of every stage after
// it, within the request's deadline.
func (c *chain) estimate(now time.Time, t *Ticket) Queued {
	q := queuedWait(c.stages[t.stage], now, t.children[t.stage])
	for _, s := range c.stages[t.stage+1:] {
		q.Bound += s.maxQueueWait()
	}
	if d := t.Req.Deadline; !d.IsZero() && (q.Bound == 0 || d.Sub(now) < q.Bound) {
		q.Bound = max(d.Sub(now), 0)
	}
	return q
}

// maxQueueWait: a request may wait in every stage in turn.
func (c *chain) maxQueueWait() time.Duration {
	var d time.Duration
	for _, s := range c.stages {
		d += s.maxQueueWait()
	}
	return d
}

func (c *chain) Stats(now time.Time) Stats {
	st := Stats{InFlight: c.inFlight, QueuedRequests: c.pending, Tokens: -1}
	for _, s := range c.stages {
		st.Queued += s.Stats(now).Queued
	}
	st.Buffered = c.inFlight + st.Queued
	return st
}
