package admission

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// stepClock is a manual Clock for this package's own tests (admissiontest imports the package,
// so internal tests cannot use it). Timers run when Advance passes their time.
type stepClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*stepTimer
}

type stepTimer struct {
	c     *stepClock
	at    time.Time
	f     func()
	armed bool
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &stepTimer{c: c, at: c.now.Add(d), f: f, armed: true}
	c.timers = append(c.timers, t)
	return t
}

// Advance moves the clock by d and runs the timers that fell due, outside the lock.
func (c *stepClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []func()
	for _, t := range c.timers {
		if t.armed && !t.at.After(c.now) {
			t.armed = false
			due = append(due, t.f)
		}
	}
	c.mu.Unlock()
	for _, f := range due {
		f()
	}
}

func (t *stepTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.armed = false
	return was
}

func (t *stepTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.at, t.armed = t.c.now.Add(d), true
	return was
}

// FuzzLimiterPermits drives a Limiter (the proxy's driver) over every core with a fake clock:
// random TryAdmit, Done, repeated Done of permits already released (whose tickets the limiter has
// since reused), Admit with a context that has ended, clock steps and Drain. It checks that each
// permit is released exactly once (a second Done returns false and changes nothing), that the
// in-flight count equals the permits held, that TryAdmit never leaves anything queued, and that
// every request after Drain is refused with ReasonDraining.
func FuzzLimiterPermits(f *testing.F) {
	for kind := range 7 {
		f.Add([]byte{byte(kind), 3, 2, 1, 4, 20, 2, 1, 3, 2, 1, 5, 0, 0, 0, 3, 0, 5, 0, 0, 6, 9, 0, 3, 1, 5, 1, 7, 8, 0, 0})
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			return
		}
		in := &fuzzBytes{b: data}
		core, err := fuzzCore(in, true)
		if err != nil {
			t.Fatalf("a valid configuration was refused: %v", err)
		}
		// Buckets hold nothing per permit; every other core counts the permits held.
		var stateless bool
		switch core.(type) {
		case *tokenBucket, *leakyBucket:
			stateless = true
		}
		clk := &stepClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		l := NewLimiter(core, WithClock(clk))
		var held, released []Permit
		drained := false
		check := func(op string) {
			t.Helper()
			st := l.Stats()
			want := int64(len(held))
			if stateless {
				want = 0
			}
			if st.InFlight != want || st.QueuedRequests != 0 || st.Queued != 0 {
				t.Fatalf("after %s: stats %+v with %d permits held, want nothing queued", op, st, len(held))
			}
		}
		for steps := 0; !in.done() && steps < 2000; steps++ {
			switch in.next() % 8 {
			case 0, 1, 2:
				p, err := l.TryAdmit(Request{Priority: Priority(in.intn(0, 3))})
				var rej *Rejection
				switch {
				case err == nil:
					held = append(held, p)
				case errors.As(err, &rej):
					if !errors.Is(err, ErrRejected) || rej.RetryAfter < 0 {
						t.Fatalf("bad rejection %v", err)
					}
				case !errors.Is(err, ErrWouldWait):
					t.Fatalf("TryAdmit: %v", err)
				}
				if drained && !errors.Is(err, ErrDraining) {
					t.Fatalf("TryAdmit after Drain: %v, want draining", err)
				}
				check("TryAdmit")
			case 3, 4:
				if len(held) == 0 {
					continue
				}
				i := int(in.next()) % len(held)
				p := held[i]
				if !p.Done(Outcome(in.next() % 3)) {
					t.Fatal("the first Done of a permit returned false")
				}
				held = slices.Delete(held, i, i+1)
				released = append(released, p)
				check("Done")
			case 5:
				if len(released) == 0 {
					continue
				}
				before := l.Stats()
				if released[int(in.next())%len(released)].Done(Success) {
					t.Fatal("a permit was released twice")
				}
				if after := l.Stats(); after != before {
					t.Fatalf("a second Done changed the limiter: %+v -> %+v", before, after)
				}
			case 6:
				clk.Advance(time.Duration(in.next()) * time.Millisecond)
				check("Advance")
			case 7:
				if in.next()%8 == 0 {
					l.Drain()
					drained = true
					check("Drain")
					continue
				}
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				if _, err := l.Admit(ctx, Request{}); !errors.Is(err, context.Canceled) {
					t.Fatalf("Admit with an ended context: %v", err)
				}
				check("Admit")
			}
		}
		for _, p := range held {
			if !p.Done(Ignore) {
				t.Fatal("Done of a held permit returned false")
			}
		}
		held = nil
		check("releasing everything")
	})
}
