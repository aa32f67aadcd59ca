//go:build integration

package quota

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/loadshed/loadshed/internal/quota/quotatest"
)

func testBackend(t *testing.T, r *quotatest.Server) *redisBackend {
	t.Helper()
	uo, err := clientOptions(RedisConfig{Addr: r.Addr(), Timeout: time.Second}.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	b := &redisBackend{c: redis.NewUniversalClient(uo)}
	t.Cleanup(func() { _ = b.close() })
	return b
}

// TestScriptIsTheModel: with the time given, the script's every answer equals the Go model's
// exactly, for float rates, costs up to and above the burst, refusals that store nothing and
// keys that expire.
func TestScriptIsTheModel(t *testing.T) {
	r := quotatest.Start(t)
	b := testBackend(t, r)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		rate  float64
		burst int64
	}{{2.5, 3}, {0.3, 1}, {1000, 50}, {7, 7}, {123.456, 10}} {
		key := "model:" + time.Now().String()
		interval := 1e6 / c.rate
		at := time.Now().Truncate(time.Microsecond)
		tat, lastReset := 0.0, time.Duration(0)
		for i := range 300 {
			at = at.Add(time.Duration(rng.ExpFloat64()*interval/3) * time.Microsecond)
			cost := 1 + rng.Int64N(c.burst+1) // sometimes above the burst
			now := float64(at.Sub(scriptEpoch).Microseconds())
			want, next := gcraStep(tat, now, interval, c.burst, cost)
			got, err := b.take(ctx, key, interval, c.burst, cost, at)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("rate %v burst %d step %d cost %d: script %+v, model %+v", c.rate, c.burst, i, cost, got, want)
			}
			if want.allowed {
				tat, lastReset = next, want.resetAfter
			}
		}
		// The key lives until the bucket is full again (as of the last allowed request), and not
		// longer: a refusal stores nothing.
		ttl, err := b.c.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl > lastReset+time.Millisecond || ttl < lastReset-time.Second {
			t.Errorf("rate %v: key TTL %v, the bucket was full %v after the last allowed request", c.rate, ttl, lastReset)
		}
	}
}

// TestScriptMatchesRedisRate: for integer rates the script answers as go-redis/redis_rate's
// AllowN does (its published behaviour): the same allowed count and remaining, retry-after
// and reset-after within the time between the two calls. Periods of minutes and hours keep
// the two calls, a fraction of a millisecond apart, on the same side of every boundary.
func TestScriptMatchesRedisRate(t *testing.T) {
	r := quotatest.Start(t)
	b := testBackend(t, r)
	ctx := context.Background()
	rr := redis_rate.NewLimiter(b.c)

	// The examples of redis_rate's own tests: 10 per second (redis_rate.PerSecond(10)), burst 10.
	for i, step := range []struct {
		cost                 int64
		allowed, remaining   int64
		retryAfter, resetMin time.Duration
	}{
		{1, 1, 9, 0, 100 * time.Millisecond},
		{2, 1, 7, 0, 300 * time.Millisecond},
		{7, 1, 0, 0, time.Second},
		{1000, 0, 0, 99 * time.Second, time.Second},
	} {
		v, err := b.take(ctx, "published", 1e5, 10, step.cost, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		allowed := int64(0)
		if v.allowed {
			allowed = 1
		}
		if allowed != step.allowed || v.remaining != step.remaining {
			t.Fatalf("example %d (cost %d): allowed %v remaining %d, want %d and %d", i, step.cost, v.allowed, v.remaining, step.allowed, step.remaining)
		}
		if !near(v.resetAfter, step.resetMin, 10*time.Millisecond) || step.retryAfter > 0 && !near(v.retryAfter, step.retryAfter, time.Second) {
			t.Fatalf("example %d: retry %v reset %v, want about %v and %v", i, v.retryAfter, v.resetAfter, step.retryAfter, step.resetMin)
		}
	}

	rng := rand.New(rand.NewPCG(3, 4))
	for _, l := range []redis_rate.Limit{
		redis_rate.PerMinute(10),
		redis_rate.PerHour(100),
		{Rate: 3, Burst: 5, Period: time.Minute},
		{Rate: 7, Burst: 1, Period: time.Hour},
	} {
		key := "cmp:" + l.String()
		interval := float64(l.Period.Microseconds()) / float64(l.Rate)
		for i := range 60 {
			cost := 1 + rng.IntN(l.Burst)
			want, err := rr.AllowN(ctx, key, l, cost)
			if err != nil {
				t.Fatal(err)
			}
			got, err := b.take(ctx, "loadshed:"+key, interval, int64(l.Burst), int64(cost), time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			wantRetry := max(want.RetryAfter, 0) // redis_rate says -1 when allowed
			if got.allowed != (want.Allowed > 0) || got.remaining != int64(want.Remaining) ||
				!near(got.retryAfter, wantRetry, 5*time.Millisecond) || !near(got.resetAfter, want.ResetAfter, 5*time.Millisecond) {
				t.Fatalf("%s step %d cost %d: script %+v, redis_rate %+v", l, i, cost, got, *want)
			}
		}
	}
}

func near(a, b, tol time.Duration) bool { return a-b <= tol && b-a <= tol }
