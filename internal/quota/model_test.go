package quota

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

// TestBucketIsWhatTheStoreDecides: a Bucket on the caller's clock answers every check as a
// Shared limiter does through the store (the fake backend runs the script's model, which the
// integration tests hold the real script to), refusals and Retry-After included.
func TestBucketIsWhatTheStoreDecides(t *testing.T) {
	f := newFixture(t)
	l := f.limiter(t, 7.5, 4)
	b := NewBucket(7.5, 4)
	rng := rand.New(rand.NewPCG(3, 4))
	allowed := 0
	for i := range 2000 {
		f.clock.Advance(time.Duration(rng.ExpFloat64() * float64(40*time.Millisecond)))
		cost := 1 + rng.Int64N(6) // above the burst sometimes: both take the burst then
		want := l.Check(context.Background(), f.clock.Now(), "k", cost)
		got := b.Take(f.clock.Now(), cost)
		if (want == nil) != (got == nil) || want != nil && (*want != *got) {
			t.Fatalf("check %d (cost %d): bucket %v, store %v", i, cost, got, want)
		}
		if got == nil {
			allowed++
		}
	}
	if allowed == 0 || allowed == 2000 {
		t.Fatalf("%d of 2000 allowed: the sequence does not exercise both answers", allowed)
	}
}

func TestFallbackLimits(t *testing.T) {
	base := admission.ClientLimitsConfig{Rate: 100, Burst: 10, MaxKeys: 50, Allow: []string{"a"}}
	for _, c := range []struct {
		n         int64
		rate      float64
		wantBurst int
	}{{0, 100, 10}, {1, 100, 10}, {3, 100.0 / 3, 4}, {4, 25, 3}, {20, 5, 1}} {
		got := FallbackLimits(base, c.n)
		if got.Rate != c.rate || got.Burst != c.wantBurst || got.MaxKeys != 50 || len(got.Allow) != 1 {
			t.Errorf("%d replicas: %+v, want rate %v burst %d, the rest unchanged", c.n, got, c.rate, c.wantBurst)
		}
	}
}
