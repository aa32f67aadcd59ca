package lab

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/loadshed/loadshed/internal/slowtail"
	"github.com/loadshed/loadshed/pkg/admission"
)

// A call graph (issue 32): a frontend answers each user request by calling N services at once and
// succeeds only if every leg does. Each service has its own sidecar (a Core, optionally wrapped in
// admission.NewCohorts) and its own backend, modelled as Run models one. Without cohorts every
// sidecar sheds on its own and end-to-end success is about the product of the services' shares;
// with them every leg of a user request carries the same rank, the sidecars refuse the bottom of
// the same ranking, and end-to-end success approaches the least-served service's share.

// MaxFanoutServices bounds FanoutScenario.Services.
const MaxFanoutServices = 64

// FanoutService is one service of a call graph: its sidecar's policy and its backend.
type FanoutService struct {
	// Name labels the service in reports (default "s1", "s2", ...).
	Name string
	// Strategy is the sidecar's admission policy; a fresh core is built per run.
	Strategy Strategy
	// Service, Servers and Hop model the backend and the way to it, as in Scenario.
	Service slowtail.Config
	Servers int
	Hop     Hop
	// ServiceSeed, when not 0, seeds the backend's service times (the live backend's own seed);
	// 0 derives a stream from the scenario's seed and the service's index.
	ServiceSeed uint64
}

// Cohorts configures ranked admission (admission.NewCohorts) in every sidecar of a call graph.
// Zero fields take admission's defaults.
type Cohorts struct {
	// Ranks per priority class (2..4096); every leg of one user request carries the same rank,
	// drawn uniformly from [0, Ranks) per user request.
	Ranks int
	// StrategyShare, WaitFraction, MaxWait and Window are admission.CohortOptions' fields (WaitFraction < 0: no waiting room).
	StrategyShare, WaitFraction float64
	MaxWait, Window             time.Duration
}

// DefaultCohortRanks is the rank count of the configuration's example (cohorts.count).
const DefaultCohortRanks = 128

// String describes the options in the syntax ParseCohorts reads.
func (c Cohorts) String() string {
	s := fmt.Sprintf("count=%d", c.Ranks)
	if c.StrategyShare != 0 {
		s += fmt.Sprintf(",strategyShare=%g", c.StrategyShare)
	}
	if c.WaitFraction != 0 {
		s += fmt.Sprintf(",waitFraction=%g", c.WaitFraction)
	}
	if c.MaxWait != 0 {
		s += ",maxWait=" + c.MaxWait.String()
	}
	if c.Window != 0 {
		s += ",window=" + c.Window.String()
	}
	return s
}

// ParseCohorts parses a --cohorts spec: count=128[,strategyShare=0.03,waitFraction=0.5,
// maxWait=100ms,window=250ms]; "" or "on" is count=128 with admission's defaults. The values
// are checked by admission.NewCohorts when a run builds its cores.
func ParseCohorts(spec string) (Cohorts, error) {
	c := Cohorts{Ranks: DefaultCohortRanks}
	switch spec {
	case "", "on", "true":
		return c, nil
	}
	kv, err := parseKV(spec, []string{"count", "strategyShare", "waitFraction", "maxWait", "window"})
	if err != nil {
		return c, fmt.Errorf("cohorts %q: %w", spec, err)
	}
	if _, ok := kv["count"]; ok {
		if c.Ranks, err = intKey(kv, "count"); err != nil {
			return c, fmt.Errorf("cohorts %q: %w", spec, err)
		}
	}
	for key, dst := range map[string]*float64{"strategyShare": &c.StrategyShare, "waitFraction": &c.WaitFraction} {
		if _, ok := kv[key]; ok {
			if *dst, err = floatKey(kv, key); err != nil {
				return c, fmt.Errorf("cohorts %q: %w", spec, err)
			}
		}
	}
	for key, dst := range map[string]*time.Duration{"maxWait": &c.MaxWait, "window": &c.Window} {
		if _, ok := kv[key]; ok {
			if *dst, err = durKey(kv, key); err != nil {
				return c, fmt.Errorf("cohorts %q: %w", spec, err)
			}
		}
	}
	if c.Ranks < 2 || c.Ranks > 4096 {
		return c, fmt.Errorf("cohorts %q: count: must be in [2, 4096], got %d", spec, c.Ranks)
	}
	return c, nil
}

// FanoutScenario is a frontend's user requests fanning out to services.
type FanoutScenario struct {
	// Arrivals says when user requests arrive; their priority goes with every leg.
	Arrivals Arrivals
	// MaxRequests caps the number of user requests; 0 leaves the count to Arrivals.
	MaxRequests int
	// Services are called at once for every user request.
	Services []FanoutService
	// Timeout is each leg's timeout (the frontend's --call-timeout): a leg not answered by then
	// fails; a leg still queued in its sidecar is withdrawn, an admitted one releases its permit
	// (Ignore) and its backend works on. 0: legs wait for ever.
	Timeout time.Duration
	// Cohorts, when set, wraps every sidecar's core in admission.NewCohorts and gives every leg
	// of a user request the same rank.
	Cohorts *Cohorts
	// Seed seeds Poisson arrivals, ranks, hops and (unless a service sets its own) service times.
	Seed uint64
	// Speed runs every backend and hop Speed times as fast (0 means 1), as Scenario.Speed.
	Speed float64
}

// Validate reports every problem with the scenario, each naming its field.
func (f FanoutScenario) Validate() error {
	var errs []error
	if f.Arrivals == nil {
		errs = append(errs, errors.New("arrivals: required"))
	}
	if f.MaxRequests < 0 {
		errs = append(errs, fmt.Errorf("maxRequests: must not be negative, got %d", f.MaxRequests))
	}
	if n := len(f.Services); n < 1 || n > MaxFanoutServices {
		errs = append(errs, fmt.Errorf("services: want 1 to %d, got %d", MaxFanoutServices, n))
	}
	if f.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout: must not be negative, got %s", f.Timeout))
	}
	if c := f.Cohorts; c != nil && (c.Ranks < 2 || c.Ranks > 4096) {
		errs = append(errs, fmt.Errorf("cohorts.count: must be in [2, 4096], got %d", c.Ranks))
	}
	for i, s := range f.Services {
		if s.Strategy.New == nil {
			errs = append(errs, fmt.Errorf("services[%d].strategy: required", i))
		}
		// The backend's fields are a Scenario's; check them as one (speed is checked once below).
		sc := Scenario{Arrivals: ScheduleArrivals{}, Service: s.Service, Servers: s.Servers, Hop: s.Hop}
		if err := sc.Validate(); err != nil {
			for _, line := range strings.Split(err.Error(), "\n") {
				errs = append(errs, fmt.Errorf("services[%d].%s", i, line))
			}
		}
	}
	if f.Speed != 0 && !(f.Speed >= 0.1 && f.Speed <= 10) {
		errs = append(errs, fmt.Errorf("speed: must be in [0.1, 10] (or 0 for 1), got %v", f.Speed))
	}
	return errors.Join(errs...)
}

// ServiceName is the name of service i in reports.
func (f FanoutScenario) ServiceName(i int) string {
	if n := f.Services[i].Name; n != "" {
		return n
	}
	return fmt.Sprintf("s%d", i+1)
}

// FanoutServiceSeed is the seed of service i's service times when the service sets none: the
// live half starts service i's backend with it, so lab and live draw the same sequence.
func FanoutServiceSeed(seed uint64, i int) uint64 {
	return BackendSeed(seed) + uint64(i)
}

// FanoutCapacity is the capacity offered loads of a call graph are multiples of: the least of
// its services' nominal capacities (Servers / mean service time), so a load of 2 puts the most
// loaded service at 2x. It is 0 when a service has unlimited workers.
func FanoutCapacity(f FanoutScenario) float64 {
	least := 0.0
	for i, s := range f.Services {
		c := Capacity(Scenario{Service: s.Service, Servers: s.Servers})
		if !(c > 0) {
			return 0
		}
		if i == 0 || c < least {
			least = c
		}
	}
	return least
}

// LegStats is what one service did with its legs.
type LegStats struct {
	Name string
	// Offered legs (one per user request); Admitted by the sidecar; OK answered 2xx within the
	// leg timeout; Refused by the sidecar (by reason in Refusals); TimedOut admitted but not
	// answered in time; Abandoned withdrawn while queued in the sidecar.
	Offered, Admitted, OK, Refused, TimedOut, Abandoned int64
	Refusals                                            map[admission.Reason]int64
}

// Share is the leg success share: OK legs over offered legs.
func (l LegStats) Share() float64 { return ratio(l.OK, l.Offered) }

// FanoutResult is what a call graph did in one run.
type FanoutResult struct {
	// Cohorts is whether the sidecars ranked legs.
	Cohorts bool
	// Users is the number of user requests; OK those whose every leg answered 2xx.
	Users, OK int64
	Legs      []LegStats
	// Admitted is the number of legs admitted by any sidecar; Wasted the 2xx legs of user
	// requests that failed (work the services did for nothing).
	Admitted, Wasted int64
	// Latency percentiles (nearest rank) of successful user requests, from arrival to the last
	// leg's answer; P99Lo and P99Hi are p98.5 and p99.5.
	P50, P99, P99Lo, P99Hi time.Duration
	// Span is the arrival window; End the virtual time of the run's last event.
	Span, End time.Duration
}

// Success is the end-to-end success share: user requests whose every leg answered 2xx.
func (r FanoutResult) Success() float64 { return ratio(r.OK, r.Users) }

// LeastLeg is the least-served service's leg share and its index.
func (r FanoutResult) LeastLeg() (float64, int) {
	least, at := 0.0, -1
	for i, l := range r.Legs {
		if s := l.Share(); at < 0 || s < least {
			least, at = s, i
		}
	}
	return least, at
}

// ProductOfLegs is the product of the leg shares: end-to-end success if legs failed
// independently.
func (r FanoutResult) ProductOfLegs() float64 {
	p := 1.0
	for _, l := range r.Legs {
		p *= l.Share()
	}
	return p
}

// WastedShare is wasted legs over admitted legs.
func (r FanoutResult) WastedShare() float64 { return ratio(r.Wasted, r.Admitted) }

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// leg is one call of a user request to one service; legs are pooled like attempts.
type leg struct {
	t        admission.Ticket
	gen      uint32
	state    uint8
	held     bool
	answered bool
	working  bool
	svc      int32
	user     int32
	arrive   int64
}

// user is one user request in flight.
type user struct {
	arrive  int64
	end     int64
	cost    int64
	pending int32
	ok      int32
	prio    admission.Priority
}

// fanSvc is one service's sidecar and backend during a run.
type fanSvc struct {
	core    admission.Core
	svc     *slowtail.Sampler
	hop     *hopSampler
	worker  time.Duration
	pathHop bool
	servers int
	busy    int
	fifo    ring
	stats   LegStats
}

// fanSim is one run of a call graph.
type fanSim struct {
	sc    FanoutScenario
	now   int64
	h     eventHeap
	seq   uint64
	ev    admission.Events
	svcs  []*fanSvc
	legs  []*leg
	free  []int32
	users []user
	ufree []int32

	stream ArrivalStream
	fresh  int
	ranks  *rand.Rand
	speed  float64

	res       FanoutResult
	lat       []time.Duration
	lastWake  int64
	stuckWake int
}

// RunFanout simulates the call graph and returns what happened. Like Run it never blocks and
// gives the same output for the same scenario and seed.
func RunFanout(sc FanoutScenario) (*FanoutResult, error) {
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	stream, err := sc.Arrivals.Open(sc.Seed)
	if err != nil {
		return nil, fmt.Errorf("arrivals: %w", err)
	}
	s := &fanSim{sc: sc, stream: stream, speed: 1, lastWake: -1,
		// Ranks get their own stream, so turning cohorts on changes nothing else of a run.
		ranks: rand.New(rand.NewPCG(sc.Seed, 0xc0407a11)),
		res:   FanoutResult{Cohorts: sc.Cohorts != nil, Span: sc.Arrivals.Span()}}
	if sc.Speed != 0 {
		s.speed = sc.Speed
	}
	for i, fs := range sc.Services {
		core, err := fs.Strategy.New()
		if err != nil {
			return nil, fmt.Errorf("services[%d] (%s): strategy %q: %w", i, sc.ServiceName(i), fs.Strategy.Name, err)
		}
		if sc.Cohorts != nil {
			if core, err = withCohorts(core, *sc.Cohorts); err != nil {
				return nil, fmt.Errorf("services[%d] (%s): cohorts: %w", i, sc.ServiceName(i), err)
			}
		}
		seed := fs.ServiceSeed
		if seed == 0 {
			seed = FanoutServiceSeed(sc.Seed, i)
		}
		s.svcs = append(s.svcs, &fanSvc{
			core: core, svc: slowtail.New(fs.Service, seed),
			hop:    newHopSampler(fs.Hop.Path, sc.Seed+uint64(i)),
			worker: fs.Hop.Worker, pathHop: !fs.Hop.Path.IsZero(), servers: fs.Servers,
			stats: LegStats{Name: sc.ServiceName(i)},
		})
	}
	if err := s.loop(); err != nil {
		return nil, err
	}
	slices.Sort(s.lat)
	r := &s.res
	r.P50, r.P99 = Percentile(s.lat, 50, 100), Percentile(s.lat, 99, 100)
	r.P99Lo, r.P99Hi = Percentile(s.lat, 985, 1000), Percentile(s.lat, 995, 1000)
	r.End = time.Duration(s.now)
	for _, v := range s.svcs {
		r.Legs = append(r.Legs, v.stats)
		r.Admitted += v.stats.Admitted
	}
	return r, nil
}

func (s *fanSim) abs(t int64) time.Time { return Base.Add(time.Duration(t)) }

func (s *fanSim) scaled(d time.Duration) int64 {
	if s.speed == 1 {
		return int64(d)
	}
	return int64(float64(d) / s.speed)
}

func (s *fanSim) schedule(at int64, kind uint8, id int32) {
	var gen uint32
	if kind != evArrival {
		gen = s.legs[id].gen
	}
	s.seq++
	s.h.push(event{at: at, seq: s.seq, id: id, gen: gen, kind: kind})
}

// nextFresh takes the next user request from the stream and schedules its arrival.
func (s *fanSim) nextFresh() error {
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
	var id int32
	if n := len(s.ufree); n > 0 {
		id = s.ufree[n-1]
		s.ufree = s.ufree[:n-1]
	} else {
		s.users = append(s.users, user{})
		id = int32(len(s.users) - 1)
	}
	s.users[id] = user{arrive: int64(a.At), prio: a.Priority, cost: a.Cost}
	s.schedule(int64(a.At), evArrival, id)
	return nil
}

// wake returns the earliest due time of any sidecar's core and its index, or -1.
func (s *fanSim) wake() (int64, int) {
	best, at := int64(-1), -1
	for i, v := range s.svcs {
		w := v.core.Wake()
		if w.IsZero() {
			continue
		}
		t := max(int64(w.Sub(Base)), s.now)
		if at < 0 || t < best {
			best, at = t, i
		}
	}
	return best, at
}

func (s *fanSim) loop() error {
	if err := s.nextFresh(); err != nil {
		return err
	}
	for {
		w, wi := s.wake()
		if s.h.len() == 0 && w < 0 {
			return nil
		}
		if w >= 0 && (s.h.len() == 0 || w < s.h.top().at || (w == s.h.top().at && s.h.top().kind >= evArrival)) {
			if w != s.lastWake {
				s.lastWake, s.stuckWake = w, 0
			} else if s.stuckWake++; s.stuckWake > 1000*len(s.svcs) {
				return fmt.Errorf("core %s: Wake stays at %s after Advance (Core contract broken)", s.svcs[wi].core.Name(), time.Duration(w))
			}
			s.now = max(s.now, w)
			s.svcs[wi].core.Advance(s.abs(s.now), &s.ev)
			s.settle()
			continue
		}
		e := s.h.pop()
		s.now = max(s.now, e.at)
		if e.kind != evArrival && s.legs[e.id].gen != e.gen {
			continue // the leg has been recycled; the event is stale
		}
		switch e.kind {
		case evArrival:
			// Keep exactly one user request scheduled ahead.
			if err := s.nextFresh(); err != nil {
				return err
			}
			s.arrive(e.id)
		case evComplete:
			s.complete(e.id)
		case evReachBackend:
			s.reachBackend(e.id)
		case evClientTimeout:
			s.timeout(e.id)
		}
	}
}

// arrive offers one leg of user request u to every service, in the services' order.
func (s *fanSim) arrive(u int32) {
	s.res.Users++
	// One rank per user request, drawn whether or not cohorts are on, so both variants of a
	// run see the same draws.
	draw, rank := s.ranks.Uint64(), 0
	if s.sc.Cohorts != nil {
		rank = int(draw % uint64(s.sc.Cohorts.Ranks))
	}
	us := &s.users[u]
	us.pending = int32(len(s.svcs))
	for i := range s.svcs {
		id := s.alloc()
		l := s.legs[id]
		l.svc, l.user, l.arrive, l.state = int32(i), u, s.now, stWaiting
		req := admission.Request{Priority: us.prio, Cost: us.cost}
		setRank(&req, rank)
		if s.sc.Timeout > 0 {
			s.schedule(s.now+int64(s.sc.Timeout), evClientTimeout, id)
		}
		l.t.Reset(req, s.abs(s.now))
		l.t.Tag = int64(id)
		v := s.svcs[i]
		v.stats.Offered++
		switch v.core.Offer(s.abs(s.now), &l.t, &s.ev) {
		case admission.Admitted:
			s.admitted(id)
		case admission.Refused:
			s.refused(id)
		}
		s.settle()
	}
}

func (s *fanSim) alloc() int32 {
	if n := len(s.free); n > 0 {
		id := s.free[n-1]
		s.free = s.free[:n-1]
		l := s.legs[id]
		l.held, l.answered, l.working = false, false, false
		return id
	}
	s.legs = append(s.legs, &leg{})
	return int32(len(s.legs) - 1)
}

func (s *fanSim) recycle(id int32) {
	l := s.legs[id]
	if !l.answered || l.working || l.held {
		return
	}
	l.gen++
	l.state = stFree
	s.free = append(s.free, id)
}

func (s *fanSim) settle() {
	for i := 0; i < s.ev.Len(); i++ {
		t := s.ev.At(i)
		id := int32(t.Tag)
		if id < 0 || int(id) >= len(s.legs) || &s.legs[id].t != t || s.legs[id].state != stWaiting {
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

func (s *fanSim) admitted(id int32) {
	l := s.legs[id]
	v := s.svcs[l.svc]
	l.state, l.held, l.working = stBackend, true, true
	v.stats.Admitted++
	if v.pathHop {
		s.schedule(s.now+s.scaled(v.hop.sample()), evReachBackend, id)
		return
	}
	s.reachBackend(id)
}

func (s *fanSim) reachBackend(id int32) {
	v := s.svcs[s.legs[id].svc]
	if v.servers == 0 || v.busy < v.servers {
		s.startService(v, id)
		return
	}
	v.fifo.push(id)
}

func (s *fanSim) startService(v *fanSvc, id int32) {
	v.busy++
	s.schedule(s.now+s.scaled(v.svc.Sample()+v.worker), evComplete, id)
}

func (s *fanSim) refused(id int32) {
	l := s.legs[id]
	v := s.svcs[l.svc]
	l.state, l.answered = stDone, true
	v.stats.Refused++
	reason := admission.Reason("")
	if l.t.Err != nil {
		reason = l.t.Err.Reason
	}
	if v.stats.Refusals == nil {
		v.stats.Refusals = map[admission.Reason]int64{}
	}
	v.stats.Refusals[reason]++
	s.legDone(l, false)
	s.recycle(id)
}

func (s *fanSim) complete(id int32) {
	l := s.legs[id]
	v := s.svcs[l.svc]
	l.working = false
	v.busy--
	if v.fifo.len() > 0 {
		s.startService(v, v.fifo.pop())
	}
	if l.held {
		l.held, l.answered, l.state = false, true, stDone
		v.core.Release(s.abs(s.now), &l.t, admission.Success, &s.ev)
		v.stats.OK++
		s.legDone(l, true)
		s.settle()
	}
	s.recycle(id)
}

func (s *fanSim) timeout(id int32) {
	l := s.legs[id]
	if l.answered {
		return
	}
	v := s.svcs[l.svc]
	l.answered = true
	switch l.state {
	case stWaiting:
		l.state = stDone
		v.core.Cancel(s.abs(s.now), &l.t, &s.ev)
		v.stats.Abandoned++
	case stBackend:
		l.state = stDone
		v.stats.TimedOut++
		if l.held {
			l.held = false
			v.core.Release(s.abs(s.now), &l.t, admission.Ignore, &s.ev)
		}
	}
	s.legDone(l, false)
	s.settle()
	s.recycle(id)
}

// legDone records the end of a leg for its user request, and the user request's end with its
// last leg.
func (s *fanSim) legDone(l *leg, ok bool) {
	u := &s.users[l.user]
	u.pending--
	if ok {
		u.ok++
	}
	u.end = max(u.end, s.now)
	if u.pending > 0 {
		return
	}
	if int(u.ok) == len(s.svcs) {
		s.res.OK++
		s.lat = append(s.lat, time.Duration(u.end-u.arrive))
	} else {
		s.res.Wasted += int64(u.ok)
	}
	s.ufree = append(s.ufree, l.user)
}
