package quotatest

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Disruption takes a store away between Begin and End: killed, asleep, or cut off.
type Disruption struct {
	Name string
	// Through says that clients must reach the server through the StallProxy (the network
	// path is what is disrupted).
	Through    bool
	Begin, End func(t testing.TB, r *Server, p *StallProxy)
}

// Disruptions are the ways a store goes away in the tests, each for d: Redis killed with
// SIGKILL and started again; Redis blocked by DEBUG SLEEP (a slow store: every command waits);
// and the network path to Redis black-holed.
func Disruptions(d time.Duration) []Disruption {
	var sleeping sync.WaitGroup
	return []Disruption{
		{
			Name:  "killed",
			Begin: func(_ testing.TB, r *Server, _ *StallProxy) { r.Kill() },
			End:   func(_ testing.TB, r *Server, _ *StallProxy) { r.Start() },
		},
		{
			Name: "DEBUG SLEEP",
			Begin: func(t testing.TB, r *Server, _ *StallProxy) {
				sleeping.Add(1)
				go func() {
					defer sleeping.Done()
					c := r.Admin()
					defer c.Close()
					if err := c.Do(context.Background(), "DEBUG", "SLEEP", d.Seconds()).Err(); err != nil {
						t.Errorf("DEBUG SLEEP: %v", err)
					}
				}()
			},
			End: func(testing.TB, *Server, *StallProxy) { sleeping.Wait() },
		},
		{
			Name:    "stalled network",
			Through: true,
			Begin:   func(_ testing.TB, _ *Server, p *StallProxy) { p.Stall() },
			End:     func(_ testing.TB, _ *Server, p *StallProxy) { p.Flow() },
		},
	}
}

// FallbackWatch records, for each of n replicas, when it first decided locally after a
// disruption began (On), when it first used the store again after the disruption ended (Off),
// and how long it decided locally again after that (Again: a process stalled past the store
// timeout on a busy machine looks like a store away). Durations count from the start of the
// run; -1: not seen.
type FallbackWatch struct {
	mu           sync.Mutex
	On, Off      []time.Duration
	Again        []time.Duration
	last         time.Duration
	stop, done   chan struct{}
	fallback     func(i int) bool
	start        time.Time
	from, to     time.Duration
	stopOnce     sync.Once
	replicaCount int
}

// WatchFallback polls fallback(i) for each of n replicas every 2 ms from start, for a
// disruption from `from` to `to` after start, until End.
func WatchFallback(n int, fallback func(i int) bool, start time.Time, from, to time.Duration) *FallbackWatch {
	w := &FallbackWatch{On: make([]time.Duration, n), Off: make([]time.Duration, n), Again: make([]time.Duration, n),
		stop: make(chan struct{}), done: make(chan struct{}), fallback: fallback, start: start, from: from, to: to, replicaCount: n}
	for i := range n {
		w.On[i], w.Off[i] = -1, -1
	}
	go w.run()
	return w
}

func (w *FallbackWatch) run() {
	defer close(w.done)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
		now := time.Since(w.start)
		w.mu.Lock()
		for i := range w.replicaCount {
			fb := w.fallback(i)
			switch {
			case fb && now >= w.from && w.On[i] < 0:
				w.On[i] = now
			case !fb && now >= w.to && w.On[i] >= 0 && w.Off[i] < 0:
				w.Off[i] = now
			case fb && w.Off[i] >= 0:
				w.Again[i] += now - w.last
			}
		}
		w.last = now
		w.mu.Unlock()
	}
}

// End stops the watch; its fields are final afterwards.
func (w *FallbackWatch) End() {
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
}

// Start starts a server and a flowing StallProxy in front of it, and returns the address the
// clients under test must use for this disruption.
func (d Disruption) Start(t testing.TB) (r *Server, p *StallProxy, addr string) {
	t.Helper()
	r = Start(t)
	p = NewStallProxy(t, r.Addr())
	addr = r.Addr()
	if d.Through {
		addr = p.Addr()
	}
	return r, p, addr
}
