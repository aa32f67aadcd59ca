//go:build integration

package quota

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/loadshed/loadshed/internal/metrics"
	"github.com/loadshed/loadshed/internal/quota/quotatest"
	"github.com/loadshed/loadshed/pkg/admission"
)

// replicas is n stores, each with one limiter of the same quota: stand-ins for n proxy
// replicas sharing one Redis.
type replicas struct {
	stores []*Store
	lims   []*Shared
	regs   []*prometheus.Registry
}

func newReplicas(t *testing.T, n int, cfg RedisConfig, q Quota, tune func(*options)) *replicas {
	t.Helper()
	rs := &replicas{}
	for i := range n {
		reg := prometheus.NewRegistry()
		var s *Store
		m := metrics.NewQuota(reg, func() (metrics.QuotaState, bool) {
			if s == nil {
				return metrics.QuotaState{}, false
			}
			return s.State()
		})
		opts := []Option{WithMetrics(m), WithReplicaID(fmt.Sprintf("replica-%d", i))}
		if tune != nil {
			opts = append(opts, func(o *options) { tune(o) })
		}
		s, err := NewStore(cfg, opts...)
		if err != nil {
			t.Fatal(err)
		}
		l, err := s.Limiter(q)
		if err != nil {
			t.Fatal(err)
		}
		rs.stores, rs.lims, rs.regs = append(rs.stores, s), append(rs.lims, l), append(rs.regs, reg)
	}
	t.Cleanup(rs.close)
	return rs
}

func (rs *replicas) close() {
	for _, s := range rs.stores {
		_ = s.Close()
	}
}

// waitCounted waits until every replica counts n live replicas.
func (rs *replicas) waitCounted(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, s := range rs.stores {
		for s.Replicas() != n {
			if time.Now().After(deadline) {
				t.Fatalf("a replica counts %d replicas, want %d", s.Replicas(), n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// call is one Check as the load saw it.
type call struct {
	at      time.Duration // scheduled, from the start of the run
	start   time.Time     // when the Check began
	took    time.Duration // the whole Check
	replica int
	key     string
	r       *admission.Rejection
}

// offer sends requests for each key at its rate (per second, all replicas together) for d,
// open loop (each request at its scheduled time, whatever the previous ones did), each to a
// replica picked at random. Bounded: at most rate x d requests per key.
func offer(lims []*Shared, rates map[string]float64, d time.Duration) []call {
	start := time.Now()
	var mu sync.Mutex
	var calls []call
	var wg sync.WaitGroup
	const workers = 4
	seed := uint64(0)
	for key, rate := range rates {
		total := int(rate * d.Seconds())
		for w := range workers {
			seed++
			wg.Add(1)
			go func(key string, w int, rng *rand.Rand) {
				defer wg.Done()
				for i := w; i < total; i += workers {
					at := time.Duration(float64(i) / rate * float64(time.Second))
					if wait := time.Until(start.Add(at)); wait > 0 {
						time.Sleep(wait)
					}
					rep := rng.IntN(len(lims))
					t0 := time.Now()
					r := lims[rep].Check(context.Background(), t0, key, 1)
					c := call{at: at, start: t0, took: time.Since(t0), replica: rep, key: key, r: r}
					mu.Lock()
					calls = append(calls, c)
					mu.Unlock()
				}
			}(key, w, rand.New(rand.NewPCG(seed, 99)))
		}
	}
	wg.Wait()
	return calls
}

// admittedIn counts key's admitted calls scheduled in [from, to).
func admittedIn(calls []call, key string, from, to time.Duration) int {
	n := 0
	for _, c := range calls {
		if c.key == key && c.r == nil && c.at >= from && c.at < to {
			n++
		}
	}
	return n
}

// checkRefusals fails the test for a refusal that is not client_limited with a Retry-After.
func checkRefusals(t *testing.T, calls []call, maxRetry time.Duration) {
	t.Helper()
	for _, c := range calls {
		if c.r == nil {
			continue
		}
		if !errors.Is(c.r, admission.ErrClientLimited) || c.r.RetryAfter <= 0 || c.r.RetryAfter > maxRetry {
			t.Fatalf("refusal at %v: %v, want client_limited with 0 < Retry-After <= %v", c.at, c.r, maxRetry)
		}
	}
}

func timed(calls []call) []quotatest.Call {
	out := make([]quotatest.Call, len(calls))
	for i, c := range calls {
		out[i] = quotatest.Call{Start: c.start, Took: c.took}
	}
	return out
}

func tookLatencies(calls []call, from, to time.Duration) *quotatest.Latencies {
	l := &quotatest.Latencies{}
	for _, c := range calls {
		if c.at >= from && c.at < to {
			l.Add(c.took)
		}
	}
	return l
}

const (
	quotaRate  = 100.0 // per second, the global quota of the hot client
	quotaBurst = 10
)

func testQuota() Quota {
	return Quota{Name: "api", Limits: admission.ClientLimitsConfig{Rate: quotaRate, Burst: quotaBurst, MaxKeys: 1000}}
}

// TestSharedQuotaHoldsAcrossReplicas: two and three replicas sharing one Redis hold one client
// offered 3x its quota, spread at random over the replicas, to the quota within 10% over 10 s
// (the first second, with the initial burst, excluded); a client under its quota is never
// refused; every refusal carries a Retry-After.
func TestSharedQuotaHoldsAcrossReplicas(t *testing.T) {
	r := quotatest.Start(t)
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d replicas", n), func(t *testing.T) {
			rs := newReplicas(t, n, RedisConfig{Addr: r.Addr(), KeyPrefix: fmt.Sprintf("t%d:", n)}, testQuota(), nil)
			rs.waitCounted(t, int64(n))
			mon := quotatest.StartStallMonitor()
			calls := offer(rs.lims, map[string]float64{"hot": 3 * quotaRate, "calm": 0.4 * quotaRate}, 11*time.Second)
			got := admittedIn(calls, "hot", time.Second, 11*time.Second)
			want := quotaRate * 10
			errPct := 100 * (float64(got) - want) / want
			lat := tookLatencies(calls, 0, time.Hour)
			p99, _ := lat.Quantile(0.99)
			t.Logf("FIGURE %d replicas: hot client offered %.0f/s admitted %d in 10 s (quota %.0f): %+.1f%%; store %s",
				n, 3*quotaRate, got, want, errPct, lat)
			if errPct < -10 || errPct > 10 {
				t.Errorf("hot client admitted %d in 10 s, want %.0f within 10%%", got, want)
			}
			calm := admittedIn(calls, "calm", 0, time.Hour)
			if offered := int(0.4 * quotaRate * 11); calm != offered {
				t.Errorf("calm client admitted %d of %d: a client under its quota was refused", calm, offered)
			}
			// The store refuses with up to 1 / rate to wait; a check whose store call failed (a
			// stall of this process past the timeout, on a busy machine) is decided locally, with
			// up to replicas / rate.
			checkRefusals(t, calls, time.Duration(n)*time.Second/time.Duration(quotaRate)+time.Millisecond)
			local := 0.0
			for _, s := range rs.stores {
				for _, res := range []string{"allowed", "limited"} {
					local += testutil.ToFloat64(s.m.Decisions.WithLabelValues("api", "fallback", res))
				}
			}
			if local > 0 {
				t.Logf("FIGURE %d replicas: %.0f of %d checks decided locally after a failed store call", n, local, len(calls))
			}
			for i, s := range rs.stores {
				if s.Fallback() {
					t.Errorf("replica %d fell back during a healthy run", i)
				}
			}
			if p99 > 5*time.Millisecond {
				t.Errorf("store p99 %v on loopback", p99)
			}
			mon.End()
			checkAddedWait(t, fmt.Sprintf("%d replicas", n), timed(calls), DefaultTimeout, mon)
		})
	}
}
