// Package admissiontest provides a fake clock for tests of code that uses package admission.
package admissiontest

import (
	"sort"
	"sync"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

// Clock is a manual clock. Time moves only when Advance or Set is called; timers due by then run
// in time order, in the goroutine that moved the clock, outside the clock's lock.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*timer
	seq    int
}

var _ admission.Clock = (*Clock)(nil)

// NewClock returns a clock set to start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f to run when the clock reaches now+d.
func (c *Clock) AfterFunc(d time.Duration, f func()) admission.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{c: c, f: f}
	c.schedule(t, d)
	return t
}

func (c *Clock) schedule(t *timer, d time.Duration) {
	c.seq++
	t.at, t.seq, t.armed = c.now.Add(max(d, 0)), c.seq, true
	for _, x := range c.timers {
		if x == t {
			return
		}
	}
	c.timers = append(c.timers, t)
}

// Pending returns how many timers are armed.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if t.armed {
			n++
		}
	}
	return n
}

// Advance moves the clock forward by d, running every timer that falls due on the way at its
// own time.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	c.Set(end)
}

// Set moves the clock to end (never backwards), running due timers in order.
func (c *Clock) Set(end time.Time) {
	for {
		c.mu.Lock()
		sort.SliceStable(c.timers, func(i, j int) bool {
			a, b := c.timers[i], c.timers[j]
			if !a.at.Equal(b.at) {
				return a.at.Before(b.at)
			}
			return a.seq < b.seq
		})
		var due *timer
		for _, t := range c.timers {
			if t.armed && !t.at.After(end) {
				due = t
				break
			}
		}
		if due == nil {
			if end.After(c.now) {
				c.now = end
			}
			c.mu.Unlock()
			return
		}
		if due.at.After(c.now) {
			c.now = due.at
		}
		due.armed = false
		f := due.f
		c.mu.Unlock()
		f()
	}
}

type timer struct {
	c     *Clock
	f     func()
	at    time.Time
	seq   int
	armed bool
}

func (t *timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.armed = false
	return was
}

func (t *timer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.c.schedule(t, d)
	return was
}
