package quota

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/loadshed/loadshed/internal/metrics"
)

// breakerState is where the circuit breaker stands.
type breakerState int32

const (
	closed   breakerState = iota // requests call the store
	open                         // requests decide locally; the background loop probes later
	halfOpen                     // requests decide locally; one probe is in flight
)

func (s breakerState) String() string {
	switch s {
	case open:
		return metrics.BreakerOpen
	case halfOpen:
		return metrics.BreakerHalfOpen
	}
	return metrics.BreakerClosed
}

// breaker stops calls to a store that keeps failing. Requests only read its state (one atomic
// load); failures count up under a lock; threshold consecutive failures open it. Only a probe
// closes it again: a late success of a request that started before the store went away does
// not. The first probe comes minProbe after the opening; the delay doubles after every failed
// probe, up to maxProbe.
type breaker struct {
	state     atomic.Int32
	threshold int
	minProbe  time.Duration
	maxProbe  time.Duration

	mu       sync.Mutex
	failures atomic.Int32  // consecutive; written under mu, read without it
	delay    time.Duration // before the next probe; under mu
}

func newBreaker(threshold int, minProbe, maxProbe time.Duration) *breaker {
	return &breaker{threshold: threshold, minProbe: minProbe, maxProbe: maxProbe, delay: minProbe}
}

func (b *breaker) current() breakerState { return breakerState(b.state.Load()) }

// calls reports whether requests may call the store.
func (b *breaker) calls() bool { return b.current() == closed }

// success records a store call that worked while the breaker was closed. The common case, no
// failure to forget, takes no lock.
func (b *breaker) success() {
	if b.failures.Load() == 0 {
		return
	}
	b.mu.Lock()
	b.failures.Store(0)
	b.mu.Unlock()
}

// failure records a failed store call; it reports whether this failure opened the breaker.
func (b *breaker) failure() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.current() != closed {
		return false
	}
	if int(b.failures.Add(1)) < b.threshold {
		return false
	}
	b.state.Store(int32(open))
	b.delay = b.minProbe
	return true
}

// probing marks a probe in flight; it reports false unless the breaker was open.
func (b *breaker) probing() bool {
	return b.state.CompareAndSwap(int32(open), int32(halfOpen))
}

// probed ends a probe: success closes the breaker, failure opens it again. It returns the
// delay before the next probe (0 when closed).
func (b *breaker) probed(ok bool) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ok {
		b.failures.Store(0)
		b.delay = b.minProbe
		b.state.Store(int32(closed))
		return 0
	}
	b.state.Store(int32(open))
	b.delay = min(2*b.delay, b.maxProbe)
	return b.delay
}
