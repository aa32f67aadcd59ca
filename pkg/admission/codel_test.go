package admission_test

import (
	"testing"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

// sim drives a core like the lab does, on one goroutine with virtual time: requests arrive on a
// schedule, each admitted one holds its permit for service, and everything is counted.
type sim struct {
	core    admission.Core
	ev      admission.Events
	service time.Duration
	done    []struct {
		at time.Time
		t  *admission.Ticket
	} // admitted, by completion time
	refused  map[admission.Reason]int
	admitted int
	maxWait  time.Duration
}

func newSim(c admission.Core, service time.Duration) *sim {
	return &sim{core: c, service: service, refused: map[admission.Reason]int{}}
}

func (s *sim) collect(now time.Time) {
	for i := 0; i < s.ev.Len(); i++ {
		t := s.ev.At(i)
		s.record(now, t)
	}
	s.ev.Reset()
}

func (s *sim) record(now time.Time, t *admission.Ticket) {
	switch t.State() {
	case admission.Admitted:
		s.admitted++
		s.maxWait = max(s.maxWait, t.Granted.Sub(t.Arrival))
		s.done = append(s.done, struct {
			at time.Time
			t  *admission.Ticket
		}{t.Granted.Add(s.service), t})
	case admission.Refused:
		s.refused[t.Err.Reason]++
	}
}

// until processes completions and wake-ups up to and including now.
func (s *sim) until(now time.Time) {
	for {
		var next time.Time
		idx := -1
		for i, d := range s.done {
			if !d.at.After(now) && (idx < 0 || d.at.Before(next)) {
				next, idx = d.at, i
			}
		}
		w := s.core.Wake()
		if !w.IsZero() && !w.After(now) && (idx < 0 || w.Before(next)) {
			s.core.Advance(w, &s.ev)
			s.collect(w)
			continue
		}
		if idx < 0 {
			return
		}
		d := s.done[idx]
		s.done = append(s.done[:idx], s.done[idx+1:]...)
		s.core.Release(d.at, d.t, admission.Success, &s.ev)
		s.collect(d.at)
	}
}

func (s *sim) arrive(now time.Time, p admission.Priority) {
	s.until(now)
	t := &admission.Ticket{}
	t.Reset(admission.Request{Priority: p}, now)
	switch s.core.Offer(now, t, &s.ev) {
	case admission.Admitted, admission.Refused:
		s.record(now, t)
	}
	s.collect(now)
}

// run offers rate requests per second from start for d.
func (s *sim) run(start time.Time, rate float64, d time.Duration) time.Time {
	gap := time.Duration(float64(time.Second) / rate)
	end := start.Add(d)
	at := start
	for ; at.Before(end); at = at.Add(gap) {
		s.arrive(at, admission.Critical)
	}
	return at
}

func newCodel(t *testing.T) admission.Core {
	return must(admission.NewCoDel(admission.CoDelConfig{Concurrency: 8, Target: 5 * time.Millisecond, Interval: 100 * time.Millisecond, Depth: 1000}))
}

// A 50 ms burst at 3x the capacity (8 workers x 20 ms = 400/s) from idle leaves a backlog that
// drains within one interval: CoDel sheds nothing.
func TestCoDelLetsAShortBurstThrough(t *testing.T) {
	s := newSim(newCodel(t), 20*time.Millisecond)
	end := s.run(t0, 1200, 50*time.Millisecond)
	s.until(end.Add(time.Second))
	if n := len(s.refused); n != 0 {
		t.Fatalf("refused %v during a short burst", s.refused)
	}
	if s.admitted < 60 {
		t.Fatalf("admitted %d, want every request of the burst (60+)", s.admitted)
	}
	if s.maxWait < 50*time.Millisecond {
		t.Fatalf("max wait %v: the burst should have queued", s.maxWait)
	}
}

// Sustained 3x overload: a standing queue persists, CoDel switches to overloaded, and admitted
// waits stay near 2 x target instead of growing.
func TestCoDelShedsAStandingQueue(t *testing.T) {
	s := newSim(newCodel(t), 20*time.Millisecond)
	// Warm up past the first intervals, then measure.
	at := s.run(t0, 1200, time.Second)
	s.maxWait = 0
	s.run(at, 1200, 2*time.Second)
	shed := s.refused[admission.ReasonQueueTimeout] + s.refused[admission.ReasonQueueFull]
	if shed == 0 {
		t.Fatal("sustained 3x overload must be shed")
	}
	// Waits above 2 x target are shed, so admitted waits stay about there (plus at most one
	// interval's worth before the state switches, which happened in the warm-up).
	if s.maxWait > 3*5*time.Millisecond {
		t.Fatalf("max admitted wait %v under sustained overload, want about 2 x target", s.maxWait)
	}
	// Throughput is kept: about 400/s admitted over 2 s.
	if s.admitted < 700 {
		t.Fatalf("admitted %d in 2 s, want close to capacity (800)", s.admitted)
	}
}

// While overloaded the queue is served LIFO: the newest waiter goes first.
func TestCoDelAdaptiveLIFO(t *testing.T) {
	core := must(admission.NewCoDel(admission.CoDelConfig{Concurrency: 1, Target: 5 * time.Millisecond, Interval: 100 * time.Millisecond, Depth: 10, MaxWait: time.Second}))
	var ev admission.Events
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ticket := func(ms int) *admission.Ticket {
		k := &admission.Ticket{}
		k.Reset(admission.Request{}, at(ms))
		return k
	}
	a, b := ticket(0), ticket(1)
	core.Offer(at(0), a, &ev) // admitted at once: the first interval sees no standing queue
	core.Offer(at(1), b, &ev)
	core.Release(at(120), a, admission.Success, &ev) // b starts after a 119 ms stand
	if b.State() != admission.Admitted {
		t.Fatalf("b %v", b.State())
	}
	c, d := ticket(225), ticket(226)
	core.Offer(at(225), c, &ev)
	core.Offer(at(226), d, &ev)
	// The interval that saw the 119 ms stand ends: overloaded, so LIFO.
	core.Release(at(230), b, admission.Success, &ev)
	if d.State() != admission.Admitted || c.State() != admission.Pending {
		t.Fatalf("c %v d %v: overloaded CoDel must serve the newest first", c.State(), d.State())
	}
	// c passes 2 x target while d is served: it is shed, not kept for the full max wait.
	core.Advance(at(236), &ev)
	if c.State() != admission.Refused || c.Err.Reason != admission.ReasonQueueTimeout {
		t.Fatalf("c %v (%v): a waiter past 2 x target must be shed while overloaded", c.State(), c.Err)
	}
}
