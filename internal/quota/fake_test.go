package quota

import (
	"context"
	"sync"
	"time"

	"github.com/loadshed/loadshed/pkg/admission/admissiontest"
)

// fakeBackend is a model of the Redis backend for unit tests: GCRA on the fake clock, a
// replica count, and failures on demand.
type fakeBackend struct {
	clock *admissiontest.Clock

	mu       sync.Mutex
	tat      map[string]float64
	err      error // every call fails with it
	replicas int64
	takes    int
	beats    int
	left     []string
	closed   bool
	keys     []string
}

func newFakeBackend(c *admissiontest.Clock) *fakeBackend {
	return &fakeBackend{clock: c, tat: map[string]float64{}, replicas: 1}
}

func (f *fakeBackend) take(ctx context.Context, key string, interval float64, burst, cost int64, at time.Time) (verdict, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.takes++
	f.keys = append(f.keys, key)
	if f.err != nil {
		return verdict{}, f.err
	}
	if err := ctx.Err(); err != nil {
		return verdict{}, err
	}
	if at.IsZero() {
		at = f.clock.Now()
	}
	now := float64(at.Sub(scriptEpoch).Microseconds())
	v, next := gcraStep(f.tat[key], now, interval, burst, cost)
	if v.allowed {
		f.tat[key] = next
	}
	return v, nil
}

func (f *fakeBackend) heartbeat(ctx context.Context, set, id string, ttl time.Duration) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.beats++
	if f.err != nil {
		return 0, f.err
	}
	return f.replicas, nil
}

func (f *fakeBackend) leave(ctx context.Context, set, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.left = append(f.left, set+" "+id)
	return f.err
}

func (f *fakeBackend) close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

func (f *fakeBackend) set(fn func(f *fakeBackend)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeBackend) counts() (takes, beats int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.takes, f.beats
}
