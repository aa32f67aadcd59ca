package admission

import "time"

// Clock is where a Limiter reads time and sets its wake-up timer. Tests pass a fake
// (admissiontest.Clock); the lab needs none because it calls cores directly.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has elapsed, like time.AfterFunc.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is the part of *time.Timer a Limiter uses.
type Timer interface {
	Stop() bool
	Reset(d time.Duration) bool
}

// SystemClock is the real clock.
type SystemClock struct{}

func (SystemClock) Now() time.Time { return time.Now() }

func (SystemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
