package admission

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// graphSim drives cohort cores on a virtual clock: user requests arrive (Poisson) and send one
// leg to each of the services at once; a service is a core in front of a backend with as many
// workers as the core's limit, so an admitted leg is served at once. Deterministic for a seed.
type graphSim struct {
	rng      *rand.Rand
	now      time.Time
	events   simHeap
	services []*simService
	users    []*simUser
	// Counts of users and legs in the measured part (after warm-up).
	from            time.Time
	usersN, usersOK int
	wasted          int
	seq             int
	legsOK          []int
	legsN           []int
	levels          [][]int         // each service's level index, sampled per window after warm-up
	lat             []time.Duration // latency of the first service's served legs (measured)
	cohortRefused   int             // legs refused below the level (measured)
}

type simService struct {
	core  Core
	coh   *Cohorts
	ev    Events
	waker time.Time
	// the service time of an admitted leg
	svc func(*rand.Rand) time.Duration
}

type simUser struct {
	at      time.Time
	pending int
	failed  bool
	ok      int // legs admitted and served
}

type simEvent struct {
	at   time.Time
	kind int // 0 arrival, 1 completion, 2 wake, 3 sample
	svc  int
	t    *Ticket
	seq  int
}

type simHeap []simEvent

func (h simHeap) Len() int { return len(h) }
func (h simHeap) Less(i, j int) bool {
	if h[i].at.Equal(h[j].at) {
		return h[i].seq < h[j].seq
	}
	return h[i].at.Before(h[j].at)
}
func (h simHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *simHeap) Push(x any)   { *h = append(*h, x.(simEvent)) }
func (h *simHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func (g *graphSim) push(e simEvent) {
	g.seq++
	e.seq = g.seq
	heap.Push(&g.events, e)
}

// serviceTime is the service: normal, 20 ms mean, 5 ms stddev, and a 1% slow tail.
func serviceTime(r *rand.Rand) time.Duration {
	if r.Float64() < 0.01 {
		return 60*time.Millisecond + time.Duration(r.ExpFloat64()*float64(60*time.Millisecond))
	}
	d := 20*time.Millisecond + time.Duration(r.NormFloat64()*float64(5*time.Millisecond))
	return max(d, time.Millisecond)
}

func newGraphSim(t *testing.T, seed uint64, services int, cohorts bool, o CohortOptions) *graphSim {
	t.Helper()
	g := &graphSim{rng: rand.New(rand.NewPCG(seed, 1)), now: time.Unix(1000, 0),
		legsOK: make([]int, services), legsN: make([]int, services), levels: make([][]int, services)}
	for range services {
		inner, err := NewInflight(InflightConfig{Limit: 4})
		if err != nil {
			t.Fatal(err)
		}
		s := &simService{core: inner, svc: serviceTime}
		if cohorts {
			if o.Ranks == 0 {
				o.Ranks = 128
			}
			c, err := NewCohorts(inner, o)
			if err != nil {
				t.Fatal(err)
			}
			s.core, s.coh = c, c
		}
		g.services = append(g.services, s)
	}
	return g
}

// run offers user requests at rate(t) per second from start to end, measuring after from.
func (g *graphSim) run(rate func(time.Duration) float64, prio func(*rand.Rand) Priority, length, warm time.Duration) {
	start := g.now
	g.from = start.Add(warm)
	end := start.Add(length)
	next := start
	for w := start.Add(DefaultCohortWindow); w.Before(end); w = w.Add(DefaultCohortWindow) {
		g.push(simEvent{at: w, kind: 3})
	}
	g.push(simEvent{at: next, kind: 0})
	for g.events.Len() > 0 {
		e := heap.Pop(&g.events).(simEvent)
		g.now = e.at
		switch e.kind {
		case 0:
			if !g.now.Before(end) {
				continue
			}
			g.arrive(prio(g.rng))
			r := rate(g.now.Sub(start))
			g.push(simEvent{at: g.now.Add(time.Duration(g.rng.ExpFloat64() / r * float64(time.Second))), kind: 0})
		case 1:
			s := g.services[e.svc]
			u := g.users[e.t.Tag]
			u.ok++
			if e.svc == 0 && !u.at.Before(g.from) {
				g.lat = append(g.lat, g.now.Sub(u.at))
			}
			s.core.Release(g.now, e.t, Success, &s.ev)
			g.legDone(u, e.svc, true)
			g.flush(e.svc)
		case 2:
			s := g.services[e.svc]
			if !s.waker.Equal(g.now) {
				continue
			}
			s.waker = time.Time{}
			s.core.Advance(g.now, &s.ev)
			g.flush(e.svc)
		case 3:
			if !g.now.Before(g.from) {
				for i, s := range g.services {
					if s.coh != nil {
						g.levels[i] = append(g.levels[i], int(s.coh.level.Load()))
					}
				}
			}
		}
	}
}

func (g *graphSim) arrive(p Priority) {
	u := &simUser{at: g.now, pending: len(g.services)}
	g.users = append(g.users, u)
	rank := g.rng.IntN(128)
	for i, s := range g.services {
		t := &Ticket{heapIdx: -1}
		t.Reset(Request{Priority: p, Rank: rank, Cost: 1}, g.now)
		t.Tag = int64(len(g.users) - 1)
		switch s.core.Offer(g.now, t, &s.ev) {
		case Admitted:
			g.start(i, t)
		case Refused:
			if t.Err.Reason == ReasonCohort && !u.at.Before(g.from) {
				g.cohortRefused++
			}
			g.legDone(u, i, false)
		}
		g.flush(i)
	}
}

func (g *graphSim) start(i int, t *Ticket) {
	g.push(simEvent{at: g.now.Add(g.services[i].svc(g.rng)), kind: 1, svc: i, t: t})
}

func (g *graphSim) flush(i int) {
	s := g.services[i]
	for k := 0; k < s.ev.Len(); k++ {
		t := s.ev.At(k)
		switch t.state {
		case Admitted:
			g.start(i, t)
		case Refused:
			g.legDone(g.users[t.Tag], i, false)
		}
	}
	s.ev.Reset()
	if w := s.core.Wake(); !w.IsZero() && (s.waker.IsZero() || w.Before(s.waker)) {
		s.waker = w
		g.push(simEvent{at: w, kind: 2, svc: i})
	}
}

func (g *graphSim) legDone(u *simUser, svc int, ok bool) {
	measured := !u.at.Before(g.from)
	if measured {
		g.legsN[svc]++
		if ok {
			g.legsOK[svc]++
		}
	}
	if !ok {
		u.failed = true
	}
	u.pending--
	if u.pending > 0 || !measured {
		return
	}
	g.usersN++
	if !u.failed {
		g.usersOK++
		return
	}
	g.wasted += u.ok
}

func (g *graphSim) shares() (e2e, least, wasted float64) {
	least = 1
	admitted := 0
	for i := range g.services {
		least = min(least, float64(g.legsOK[i])/float64(g.legsN[i]))
		admitted += g.legsOK[i]
	}
	return float64(g.usersOK) / float64(g.usersN), least, float64(g.wasted) / float64(admitted)
}

// p99 is the 99th percentile (nearest rank) of the first service's served legs' latency.
func (g *graphSim) p99() time.Duration {
	v := slices.Clone(g.lat)
	slices.Sort(v)
	if len(v) == 0 {
		return 0
	}
	return v[(len(v)*99+99)/100-1]
}

// noTail is 20 ms with 5 ms stddev and no slow tail.
func noTail(r *rand.Rand) time.Duration {
	return max(20*time.Millisecond+time.Duration(r.NormFloat64()*float64(5*time.Millisecond)), time.Millisecond)
}

// TestCohortsBelowCapacityRefuseNothing: one service at 0.8x and 0.9x of its capacity, where
// its limit refuses some requests by the timing of arrivals (bursts): the level stays open, no
// request is refused below it.
func TestCohortsBelowCapacityRefuseNothing(t *testing.T) {
	for _, load := range []float64{0.8, 0.9} {
		for seed := range uint64(3) {
			g := newGraphSim(t, seed+11, 1, true, CohortOptions{})
			g.services[0].svc = noTail
			g.run(constant(load*200), allCritical, 60*time.Second, 2*time.Second)
			_, served, _ := g.shares()
			if g.cohortRefused > 0 {
				t.Errorf("%.1fx seed %d: %d refused below the level (served %.3f)", load, seed, g.cohortRefused, served)
			}
		}
	}
}

func constant(r float64) func(time.Duration) float64 { return func(time.Duration) float64 { return r } }
func allCritical(*rand.Rand) Priority                { return Critical }

// TestCohortsShedTheSameUserRequestsEverywhere is the case in the core: four services,
// each 4 workers of 20 ms behind an in-flight limit of 4, called together at 2x their capacity.
func TestCohortsShedTheSameUserRequestsEverywhere(t *testing.T) {
	const capacity = 200.0 // 4 workers / 20 ms
	for _, load := range []float64{1.5, 2, 3} {
		off := newGraphSim(t, 7, 4, false, CohortOptions{})
		off.run(constant(load*capacity), allCritical, 30*time.Second, 5*time.Second)
		on := newGraphSim(t, 7, 4, true, CohortOptions{})
		on.run(constant(load*capacity), allCritical, 30*time.Second, 5*time.Second)
		e0, l0, w0 := off.shares()
		e1, l1, w1 := on.shares()
		t.Logf("%.1fx: off e2e %.3f least leg %.3f wasted %.3f; on e2e %.3f least leg %.3f wasted %.3f (goodput/C %.3f)",
			load, e0, l0, w0, e1, l1, w1, l1*load)
		if e1 < 0.75*l1 {
			t.Errorf("%.1fx: end-to-end success %.3f < 0.75 x least-served leg %.3f", load, e1, l1)
		}
		if load == 2 && e1 < 3*e0 {
			t.Errorf("2x: end-to-end success %.3f < 3 x the independent sidecars' %.3f", e1, e0)
		}
		if w1 > 0.3 {
			t.Errorf("%.1fx: wasted legs %.3f of admitted > 0.3", load, w1)
		}
	}
}

// TestCohortsLevelSettlesAfterAStep: a step from 1x to 3x settles the level within 5 s, and it
// then stays within a narrow band (no oscillation).
func TestCohortsLevelSettlesAfterAStep(t *testing.T) {
	g := newGraphSim(t, 3, 1, true, CohortOptions{})
	step := 10 * time.Second
	g.run(func(d time.Duration) float64 {
		if d < step {
			return 200
		}
		return 600
	}, allCritical, 30*time.Second, 0)
	lv := g.levels[0]
	win := int(step / DefaultCohortWindow)
	final := lv[len(lv)-20:]
	lo, hi := slicesMinMax(final)
	settled := -1
	for i := win; i < len(lv); i++ {
		ok := true
		for _, v := range lv[i:] {
			if v < lo-8 || v > hi+8 {
				ok = false
				break
			}
		}
		if ok {
			settled = i
			break
		}
	}
	took := time.Duration(settled-win) * DefaultCohortWindow
	t.Logf("before the step %v, after %v; settled %v after the step; final band %d-%d", lv[win-8:win], lv[win:win+24], took, lo, hi)
	if settled < 0 || took > 5*time.Second {
		t.Errorf("level settled %v after the step, want within 5s", took)
	}
	if hi-lo > 24 {
		t.Errorf("level swings %d-%d in the last 5 s (over 24 ranks): it oscillates", lo, hi)
	}
}

func slicesMinMax(v []int) (int, int) {
	lo, hi := math.MaxInt, math.MinInt
	for _, x := range v {
		lo, hi = min(lo, x), max(hi, x)
	}
	return lo, hi
}

// TestCohortsTradeOff measures what DefaultCohortRoomShare documents: in front of a limit
// without a queue, the share of what passes that the strategy and its room refuse buys the
// backend's utilisation. One service at 5x, then four at 2x (end-to-end success against the
// least-served leg).
func TestCohortsTradeOff(t *testing.T) {
	goodput := map[float64]float64{}
	for _, share := range []float64{0.1, 0.2} {
		one := newGraphSim(t, 7, 1, true, CohortOptions{StrategyShare: share})
		one.run(constant(5*200), allCritical, 30*time.Second, 5*time.Second)
		_, served, _ := one.shares()
		goodput[share] = served * 5
		four := newGraphSim(t, 7, 4, true, CohortOptions{StrategyShare: share})
		four.run(constant(2*200), allCritical, 30*time.Second, 5*time.Second)
		e2e, least, wasted := four.shares()
		t.Logf("share %.2f: 5x goodput/C %.3f (admitted p99 %v); 2x x4 end-to-end %.3f = %.2f x least leg %.3f, wasted %.3f",
			share, goodput[share], one.p99(), e2e, e2e/least, least, wasted)
	}
	// The room's size against the tail: one service without the slow tail at 5x.
	type point struct {
		goodput float64
		p99     time.Duration
	}
	room := map[float64]point{}
	for _, wf := range []float64{0.5, DefaultCohortWaitFraction} {
		g := newGraphSim(t, 7, 1, true, CohortOptions{WaitFraction: wf})
		g.services[0].svc = noTail
		g.run(constant(5*200), allCritical, 30*time.Second, 5*time.Second)
		_, served, _ := g.shares()
		room[wf] = point{served * 5, g.p99()}
		t.Logf("waitFraction %.1f, no tail, 5x: goodput/C %.3f, admitted p99 %v", wf, served*5, g.p99())
	}
	if small, dflt := room[0.5], room[DefaultCohortWaitFraction]; small.p99 >= dflt.p99 || small.goodput >= dflt.goodput {
		t.Errorf("a smaller room (%+v) should cost goodput and shorten the tail against the default (%+v)", small, dflt)
	}
	if goodput[0.2] < 0.9 {
		t.Errorf("5x with the default share keeps %.3f C busy, want >= 0.9", goodput[0.2])
	}
	if goodput[0.1] >= goodput[0.2] {
		t.Errorf("refusing less (0.1) kept the backend as busy (%.3f) as refusing 0.2 (%.3f): the trade-off documented is wrong", goodput[0.1], goodput[0.2])
	}
}
