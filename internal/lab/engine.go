package lab

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/loadshed/loadshed/internal/config"

	"github.com/loadshed/loadshed/internal/slowtail"
	"github.com/loadshed/loadshed/pkg/admission"
)

// Strategy is a named way to build a fresh admission.Core for one run.
type Strategy struct {
	// Name labels the strategy in tables, CSVs and charts.
	Name string
	// Spec is the strategy's description (the --strategy text or the config file), for reports.
	Spec string
	// Admission is the policy as the proxy's config holds it, when the strategy is one (drivers
	// that run the same policy elsewhere, the live half of compare, use it).
	Admission *config.Admission
	// New builds the core. It is called once per run, so runs never share state.
	New func() (admission.Core, error)
}

// Progress is a snapshot of a running simulation, for progress lines.
type Progress struct {
	Strategy string
	// Now is the virtual time reached; Span the scenario's arrival window.
	Now, Span time.Duration
	// Offered is the number of attempts offered so far.
	Offered int64
}

// RunOptions are optional collaborators of Run.
type RunOptions struct {
	// Progress, when set, is called every ProgressEvery events (default 1<<16).
	Progress      func(Progress)
	ProgressEvery int
}

// Base is the wall-clock instant that virtual time 0 maps to when the lab talks to a core. Any
// fixed instant works; a fixed one keeps runs reproducible.
var Base = time.Unix(0, 0).UTC()

// Attempt states.
const (
	stFree      uint8 = iota
	stScheduled       // a retry waiting for its backoff
	stWaiting         // pending in the strategy
	stBackend         // admitted, waiting for or in service in the backend
	stDone            // no longer of interest to the client; the backend may still owe work
)

// attempt is one offer of a request to the strategy (a fresh request or a retry). Attempts are
// pooled: the ticket inside is reused, so a long run allocates only for its peak concurrency.
type attempt struct {
	t        admission.Ticket
	gen      uint32
	state    uint8
	held     bool // holds a permit that must be released
	answered bool // the client has its answer or has given up
	working  bool // the backend has this attempt queued or in service
	tries    int32
	arrive   int64
	origin   int64 // arrival of the request's first attempt
	prio     admission.Priority
	cost     int64
}

// sim is one run of one strategy against one scenario.
type sim struct {
	sc   Scenario
	core admission.Core
	name string
	opts RunOptions

	now  int64
	h    eventHeap
	seq  uint64
	ev   admission.Events
	atts []*attempt
	free []int32

	stream    ArrivalStream
	fresh     int // fresh arrivals taken from the stream
	svc       *slowtail.Sampler
	hop       *hopSampler
	node      *nodeClock
	speed     float64
	jitter    *rand.Rand
	busy      int
	fifo      ring
	steps     int
	lastWake  int64
	stuckWake int

	rec recorder
}

// Run simulates strategy st against scenario sc and returns what happened. It never blocks on
// anything but the CPU and returns an error for an invalid scenario, a failing constructor or a
// core that breaks the Core contract (for example a Wake that never moves).
func Run(sc Scenario, st Strategy, opts RunOptions) (*Result, error) {
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	if st.New == nil {
		return nil, fmt.Errorf("strategy %q: no constructor", st.Name)
	}
	core, err := st.New()
	if err != nil {
		return nil, fmt.Errorf("strategy %q: %w", st.Name, err)
	}
	stream, err := sc.Arrivals.Open(sc.Seed)
	if err != nil {
		return nil, fmt.Errorf("arrivals: %w", err)
	}
	if opts.ProgressEvery <= 0 {
		opts.ProgressEvery = 1 << 16
	}
	serviceSeed := sc.Seed ^ 0x5be7a11a
	if sc.ServiceSeed != 0 {
		serviceSeed = sc.ServiceSeed
	}
	s := &sim{
		sc: sc, core: core, name: st.Name, opts: opts, stream: stream,
		// Service times, hops and jitter get their own streams, derived from the seed, so that
		// turning jitter or a hop on does not change the service times.
		svc:      slowtail.New(sc.Service, serviceSeed),
		hop:      newHopSampler(sc.Hop.Path, sc.Seed),
		node:     newNodeClock(sc.Node, sc.Seed),
		speed:    1,
		jitter:   rand.New(rand.NewPCG(sc.Seed, 0x7e7121e5)),
		lastWake: -1,
	}
	if sc.Speed != 0 {
		s.speed = sc.Speed
	}
	s.rec.init(sc.SLO, sc.Warmup)
	if err := s.loop(); err != nil {
		return nil, fmt.Errorf("strategy %q: %w", st.Name, err)
	}
	return s.rec.result(st.Name, sc.Arrivals.Span(), s.now), nil
}

func (s *sim) abs(t int64) time.Time { return Base.Add(time.Duration(t)) }

func (s *sim) schedule(at int64, kind uint8, id int32) {
	var gen uint32
	if id >= 0 {
		gen = s.atts[id].gen
	}
	s.seq++
	s.h.push(event{at: at, seq: s.seq, id: id, gen: gen, kind: kind})
}

// nextFresh takes the next arrival from the stream and schedules it.
func (s *sim) nextFresh() error {
	if s.sc.MaxRequests > 0 && s.fresh >= s.sc.MaxRequests {
		return nil
	}
	a, ok := s.stream.Next()
	if !ok {
		return nil
	}
	if int64(a.At) < s.now {
		return fmt.Errorf("arrivals: request %d arrives at %s, before the previous one", s.fresh+1, a.At)
	}
	s.fresh++
	id := s.alloc()
	at := s.atts[id]
	at.state = stScheduled
	at.origin, at.prio, at.cost = int64(a.At), a.Priority, a.Cost
	s.schedule(int64(a.At), evArrival, id)
	return nil
}

// alloc takes an attempt from the pool, cleared of its previous use (the ticket is reset when
// it is offered).
func (s *sim) alloc() int32 {
	if n := len(s.free); n > 0 {
		id := s.free[n-1]
		s.free = s.free[:n-1]
		a := s.atts[id]
		a.state, a.held, a.answered, a.working = stFree, false, false, false
		a.tries, a.arrive, a.origin, a.prio, a.cost = 0, 0, 0, 0, 0
		return id
	}
	s.atts = append(s.atts, &attempt{})
	return int32(len(s.atts) - 1)
}

// recycle returns an attempt to the pool once neither the client nor the backend needs it.
func (s *sim) recycle(id int32) {
	a := s.atts[id]
	if !a.answered || a.working || a.held {
		return
	}
	a.gen++
	a.state = stFree
	s.free = append(s.free, id)
}

// wake returns the core's next due time as a virtual offset, or -1 when nothing is scheduled.
func (s *sim) wake() int64 {
	w := s.core.Wake()
	if w.IsZero() {
		return -1
	}
	return max(int64(w.Sub(Base)), s.now)
}

func (s *sim) loop() error {
	if err := s.nextFresh(); err != nil {
		return err
	}
	for {
		w := s.wake()
		if s.h.len() == 0 && w < 0 {
			return nil
		}
		if w >= 0 && (s.h.len() == 0 || w < s.h.top().at || (w == s.h.top().at && s.h.top().kind >= evArrival)) {
			if err := s.checkWake(w); err != nil {
				return err
			}
			s.advanceTo(w)
			s.core.Advance(s.abs(w), &s.ev)
			s.settle()
		} else {
			e := s.h.pop()
			s.advanceTo(e.at)
			if err := s.handle(e); err != nil {
				return err
			}
		}
		s.rec.buffered(s.now, s.core.Stats(s.abs(s.now)).Buffered, int64(s.fifo.len()))
		s.steps++
		if s.opts.Progress != nil && s.steps%s.opts.ProgressEvery == 0 {
			s.opts.Progress(Progress{Strategy: s.name, Now: time.Duration(s.now), Span: s.sc.Arrivals.Span(), Offered: s.rec.total.Incoming})
		}
	}
}

// checkWake catches a core whose Wake stays at the same instant although Advance ran there: the
// loop would otherwise spin for ever.
func (s *sim) checkWake(w int64) error {
	if w != s.lastWake {
		s.lastWake, s.stuckWake = w, 0
		return nil
	}
	s.stuckWake++
	if s.stuckWake > 1000 {
		return fmt.Errorf("core %s: Wake stays at %s after Advance (Core contract broken)", s.core.Name(), time.Duration(w))
	}
	return nil
}

// advanceTo moves the clock, letting the recorder close the seconds passed on the way.
func (s *sim) advanceTo(t int64) {
	if t < s.now {
		t = s.now
	}
	if sec(t) > sec(s.now) {
		s.rec.crossSeconds(s.now, t, func(at int64) admission.Stats { return s.core.Stats(s.abs(at)) }, int64(s.fifo.len()))
	}
	s.now = t
}

func (s *sim) handle(e event) error {
	if e.id >= 0 && s.atts[e.id].gen != e.gen {
		return nil // the attempt has been recycled; the event is stale
	}
	switch e.kind {
	case evArrival:
		a := s.atts[e.id]
		if a.tries == 0 {
			// A fresh request: keep exactly one fresh arrival scheduled ahead.
			if err := s.nextFresh(); err != nil {
				return err
			}
		}
		s.offer(e.id)
	case evComplete:
		s.complete(e.id)
	case evReachBackend:
		s.reachBackend(e.id)
	case evClientTimeout:
		s.clientTimeout(e.id)
	case evUpstreamTimeout:
		s.upstreamTimeout(e.id)
	}
	return nil
}

func (s *sim) offer(id int32) {
	a := s.atts[id]
	a.state = stWaiting
	a.arrive = s.now
	req := admission.Request{Priority: a.prio, Cost: a.cost}
	if s.sc.Client.Timeout > 0 {
		if s.sc.Client.PropagateDeadline {
			req.Deadline = s.abs(s.now + int64(s.sc.Client.Timeout))
		}
		s.schedule(s.now+int64(s.sc.Client.Timeout), evClientTimeout, id)
	}
	a.t.Reset(req, s.abs(s.now))
	a.t.Tag = int64(id)
	s.rec.offered(s.now, a.tries > 0)
	switch s.core.Offer(s.abs(s.now), &a.t, &s.ev) {
	case admission.Admitted:
		s.admitted(id)
	case admission.Refused:
		s.refused(id)
	}
	s.settle()
}

// settle processes the tickets the core resolved during the last call. Handling them never
// calls the core, so the list does not grow while it is read.
func (s *sim) settle() {
	for i := 0; i < s.ev.Len(); i++ {
		t := s.ev.At(i)
		id := int32(t.Tag)
		if id < 0 || int(id) >= len(s.atts) || &s.atts[id].t != t || s.atts[id].state != stWaiting {
			continue
		}
		switch t.State() {
		case admission.Admitted:
			s.admitted(id)
		case admission.Refused:
			s.refused(id)
		}
	}
	s.ev.Reset()
}

func (s *sim) admitted(id int32) {
	a := s.atts[id]
	a.state = stBackend
	a.held = true
	a.working = true
	s.rec.accepted(a.arrive)
	if s.sc.UpstreamTimeout > 0 {
		s.schedule(s.now+int64(s.sc.UpstreamTimeout), evUpstreamTimeout, id)
	}
	if !s.sc.Hop.Path.IsZero() {
		s.schedule(s.now+s.slowed(s.scaled(s.hop.sample())), evReachBackend, id)
		return
	}
	s.reachBackend(id)
}

// reachBackend gives an admitted attempt to a free worker, or queues it in the backend.
func (s *sim) reachBackend(id int32) {
	if s.sc.Servers == 0 || s.busy < s.sc.Servers {
		s.startService(id)
		return
	}
	s.fifo.push(id)
}

func (s *sim) startService(id int32) {
	s.busy++
	s.schedule(s.now+s.slowed(s.scaled(s.svc.Sample()+s.sc.Hop.Worker)), evComplete, id)
}

// slowed is d stretched by the node's slowdown at this moment.
func (s *sim) slowed(d int64) int64 {
	if f := s.node.factor(s.now); f != 1 {
		return int64(float64(d) * f)
	}
	return d
}

// scaled is d at the scenario's speed.
func (s *sim) scaled(d time.Duration) int64 {
	if s.speed == 1 {
		return int64(d)
	}
	return int64(float64(d) / s.speed)
}

func (s *sim) refused(id int32) {
	a := s.atts[id]
	a.state = stDone
	a.answered = true
	var retryAfter time.Duration
	var reason admission.Reason
	if a.t.Err != nil {
		retryAfter, reason = a.t.Err.RetryAfter, a.t.Err.Reason
	}
	s.rec.rejected(a.arrive, reason)
	if s.sc.Client.Retry.OnRefusal {
		s.retry(a, retryAfter)
	}
	s.recycle(id)
}

func (s *sim) complete(id int32) {
	a := s.atts[id]
	a.working = false
	s.busy--
	if s.fifo.len() > 0 {
		s.startService(s.fifo.pop())
	}
	if a.held {
		a.held = false
		a.answered = true
		a.state = stDone
		s.core.Release(s.abs(s.now), &a.t, admission.Success, &s.ev)
		s.rec.success(a.arrive, a.origin, s.now)
		s.settle()
	}
	s.recycle(id)
}

func (s *sim) clientTimeout(id int32) {
	a := s.atts[id]
	if a.answered {
		return
	}
	a.answered = true
	switch a.state {
	case stWaiting:
		a.state = stDone
		s.core.Cancel(s.abs(s.now), &a.t, &s.ev)
		s.rec.abandoned(a.arrive)
		s.settle()
	case stBackend:
		a.state = stDone
		s.rec.timedOut(a.arrive, s.now)
		if a.held {
			a.held = false
			s.core.Release(s.abs(s.now), &a.t, admission.Ignore, &s.ev)
			s.settle()
		}
	}
	if s.sc.Client.Retry.OnTimeout {
		s.retry(a, 0)
	}
	s.recycle(id)
}

func (s *sim) upstreamTimeout(id int32) {
	a := s.atts[id]
	if !a.held || a.answered {
		return
	}
	a.held = false
	a.answered = true
	a.state = stDone
	s.rec.upstreamTimedOut(a.arrive, s.now)
	s.core.Release(s.abs(s.now), &a.t, admission.Dropped, &s.ev)
	s.settle()
	if s.sc.Client.Retry.OnTimeout {
		s.retry(a, 0)
	}
	s.recycle(id)
}

// retry schedules the next attempt of a's request, if the policy allows one more.
func (s *sim) retry(a *attempt, retryAfter time.Duration) {
	r := s.sc.Client.Retry
	if int(a.tries) >= r.Max {
		return
	}
	wait := backoff(r, int(a.tries))
	if r.Jitter && wait > 0 {
		wait = time.Duration(s.jitter.Int64N(int64(wait) + 1))
	}
	if r.HonorRetryAfter && retryAfter > wait {
		wait = retryAfter
	}
	origin, tries, prio, cost := a.origin, a.tries+1, a.prio, a.cost
	id := s.alloc()
	n := s.atts[id]
	n.state = stScheduled
	n.origin, n.tries, n.prio, n.cost = origin, tries, prio, cost
	s.schedule(s.now+int64(wait), evArrival, id)
}

// backoff is the wait before retry number n+1 (n = 0 for the first retry).
func backoff(r Retry, n int) time.Duration {
	mult := r.Multiplier
	if mult == 0 {
		mult = 2
	}
	w := float64(r.Backoff) * math.Pow(mult, float64(n))
	if r.MaxBackoff > 0 && w > float64(r.MaxBackoff) {
		return r.MaxBackoff
	}
	if w > float64(time.Hour) {
		return time.Hour
	}
	return time.Duration(w)
}

// ring is a FIFO of attempt indexes (the backend's wait queue) that reuses its storage.
type ring struct {
	buf        []int32
	head, size int
}

func (r *ring) len() int { return r.size }

func (r *ring) push(v int32) {
	if r.size == len(r.buf) {
		nb := make([]int32, max(16, 2*len(r.buf)))
		for i := 0; i < r.size; i++ {
			nb[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = nb, 0
	}
	r.buf[(r.head+r.size)%len(r.buf)] = v
	r.size++
}

func (r *ring) pop() int32 {
	v := r.buf[r.head]
	r.head = (r.head + 1) % len(r.buf)
	r.size--
	return v
}
