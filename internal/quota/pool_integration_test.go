//go:build integration

package quota

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/loadshed/loadshed/internal/quota/quotatest"
)

// TestFullPoolWaitsNoLongerThanTheTimeout: a pool of 2 connections to a Redis whose network
// path is black-holed, 64 requests at once, ten times over (the breaker is kept closed so that
// every request goes to the pool). Requests that get a connection wait for an answer that never
// comes; the others wait for a connection that is never freed. Neither waits longer than the
// store timeout, the goroutines stay bounded, and all of them end when the store closes.
func TestFullPoolWaitsNoLongerThanTheTimeout(t *testing.T) {
	r := quotatest.Start(t)
	p := quotatest.NewStallProxy(t, r.Addr())
	base := quotatest.Goroutines()
	cfg := RedisConfig{Addr: p.Addr(), PoolSize: 2}.withDefaults()
	rs := newReplicas(t, 1, cfg, testQuota(), func(o *options) { o.timing.threshold = 1 << 30 })
	rs.waitCounted(t, 1)
	p.Stall()

	// One key per caller: each key is taken 10 times in all, within its burst of 10, so the
	// local fallback has room for every call however fast the rounds go.
	const callers, rounds = 64, 10
	if quotaBurst < rounds {
		t.Fatalf("quotaBurst %d < %d rounds: the fallback could refuse", quotaBurst, rounds)
	}
	lat := &quotatest.Latencies{}
	var mu sync.Mutex
	var timedCalls []quotatest.Call
	mon := quotatest.StartStallMonitor()
	peak := 0
	for range rounds {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				t0 := time.Now()
				if r := rs.lims[0].Check(context.Background(), t0, "k"+strconv.Itoa(i), 1); r != nil {
					t.Errorf("refused %v: the local fallback has room for every key", r)
				}
				took := time.Since(t0)
				lat.Add(took)
				mu.Lock()
				timedCalls = append(timedCalls, quotatest.Call{Start: t0, Took: took})
				mu.Unlock()
			}()
		}
		close(start)
		time.Sleep(cfg.Timeout / 2)
		peak = max(peak, quotatest.Goroutines())
		wg.Wait()
	}
	mon.End()
	pool := testutil.ToFloat64(rs.stores[0].m.StoreErrors.WithLabelValues("take", "pool_timeout"))
	timeouts := testutil.ToFloat64(rs.stores[0].m.StoreErrors.WithLabelValues("take", "timeout"))
	t.Logf("FIGURE full pool: %d callers x 10 on 2 stalled connections: %s; errors pool_timeout %.0f timeout %.0f; goroutines %d before, peak %d",
		callers, lat, pool, timeouts, base, peak)
	checkAddedWait(t, "full pool", timedCalls, cfg.Timeout, mon)
	if pool == 0 {
		t.Error("no pool_timeout error: the pool was never full")
	}
	// The callers, and a bounded few of go-redis (dials in flight are capped by the pool size)
	// and of the test.
	if limit := base + callers + cfg.PoolSize + 8; peak > limit {
		t.Errorf("%d goroutines at the peak, want at most %d", peak, limit)
	}
	p.Flow()
	rs.close()
	p.Close()
	if got := quotatest.SettledGoroutines(base, 5*time.Second); got > base {
		t.Errorf("%d goroutines after closing, %d before\n%s", got, base, quotatest.GoroutineDump())
	}
}
