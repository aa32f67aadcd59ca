package quota

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/loadshed/loadshed/internal/metrics"
	"github.com/loadshed/loadshed/pkg/admission"
	"github.com/loadshed/loadshed/pkg/admission/admissiontest"
)

var t0 = time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)

// fixture is a Store over the fake backend on a fake clock.
type fixture struct {
	clock *admissiontest.Clock
	be    *fakeBackend
	store *Store
	reg   *prometheus.Registry
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	c := admissiontest.NewClock(t0)
	be := newFakeBackend(c)
	reg := prometheus.NewPedanticRegistry()
	f := &fixture{clock: c, be: be, reg: reg}
	m := metrics.NewQuota(reg, func() (metrics.QuotaState, bool) {
		if f.store == nil {
			return metrics.QuotaState{}, false
		}
		return f.store.State()
	})
	o := options{clock: c, metrics: m, replicaID: "pod-a", timing: defaultTiming}
	f.store = newStore(RedisConfig{Addr: "127.0.0.1:1"}.withDefaults(), be, o)
	t.Cleanup(func() { _ = f.store.Close() })
	return f
}

func (f *fixture) limiter(t *testing.T, rate float64, burst int, more ...func(*Quota)) *Shared {
	t.Helper()
	q := Quota{Name: "api", Limits: admission.ClientLimitsConfig{Rate: rate, Burst: burst, MaxKeys: 100}}
	for _, fn := range more {
		fn(&q)
	}
	l, err := f.store.Limiter(q)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// admitted counts how many of n checks of cost 1 at the clock's time pass.
func admitted(l Limiter, now time.Time, key string, n int) int {
	ok := 0
	for range n {
		if l.Check(context.Background(), now, key, 1) == nil {
			ok++
		}
	}
	return ok
}

var errDown = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}

func TestLocalIsClientLimits(t *testing.T) {
	l, err := NewLocal(admission.ClientLimitsConfig{Rate: 1, Burst: 2, MaxKeys: 10, Allow: []string{"vip"}, Deny: []string{"bad"}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if n := admitted(l, t0, "a", 5); n != 2 {
		t.Fatalf("admitted %d of 5 at once, want the burst 2", n)
	}
	r := l.Check(context.Background(), t0, "a", 1)
	if !errors.Is(r, admission.ErrClientLimited) || r.RetryAfter != time.Second {
		t.Fatalf("refusal %v, want client_limited with Retry-After 1s", r)
	}
	if n := admitted(l, t0.Add(time.Second), "a", 5); n != 1 {
		t.Fatalf("admitted %d after 1 s at 1/s, want 1", n)
	}
	if r := l.Check(context.Background(), t0, "bad", 1); !errors.Is(r, admission.ErrDenied) {
		t.Fatalf("deny-listed key: %v", r)
	}
	if n := admitted(l, t0, "vip", 50); n != 50 {
		t.Fatalf("allow-listed key admitted %d of 50", n)
	}
	if _, err := NewLocal(admission.ClientLimitsConfig{Rate: 0, Burst: 1, MaxKeys: 1}); err == nil {
		t.Fatal("rate 0 accepted")
	}
}

func TestSharedTheStoreDecides(t *testing.T) {
	f := newFixture(t)
	l := f.limiter(t, 10, 5, func(q *Quota) { q.Limits.Allow = []string{"vip"}; q.Limits.Deny = []string{"bad"} })
	if n := admitted(l, t0, "a", 8); n != 5 {
		t.Fatalf("admitted %d of 8 at once, want the burst 5", n)
	}
	r := l.Check(context.Background(), t0, "a", 1)
	if !errors.Is(r, admission.ErrClientLimited) || r.RetryAfter != 100*time.Millisecond || r.Stage != "clients" {
		t.Fatalf("refusal %+v, want client_limited by clients, Retry-After 100ms (the store's answer)", r)
	}
	// A cost above the burst takes the whole burst, like the local limits.
	f.clock.Advance(time.Second)
	if r := l.Check(context.Background(), f.clock.Now(), "a", 1000); r != nil {
		t.Fatalf("cost above burst refused on a full bucket: %v", r)
	}
	if r := l.Check(context.Background(), f.clock.Now(), "a", 1); r == nil || r.RetryAfter != 100*time.Millisecond {
		t.Fatalf("after a clamped cost: %v, want a refusal with Retry-After 100ms", r)
	}
	// Other keys have their own quota; allow and deny never reach the store.
	if n := admitted(l, f.clock.Now(), "b", 5); n != 5 {
		t.Fatalf("key b admitted %d of 5", n)
	}
	takes, _ := f.be.counts()
	if r := l.Check(context.Background(), t0, "bad", 1); !errors.Is(r, admission.ErrDenied) {
		t.Fatalf("deny-listed: %v", r)
	}
	if n := admitted(l, t0, "vip", 20); n != 20 {
		t.Fatalf("allow-listed admitted %d of 20", n)
	}
	if after, _ := f.be.counts(); after != takes {
		t.Fatalf("allow/deny called the store %d times", after-takes)
	}
	if got, want := f.be.keys[0], "loadshed:q:api:k:a"; got != want {
		t.Fatalf("store key %q, want %q", got, want)
	}
}

func TestSharedFallsBackToRateOverReplicas(t *testing.T) {
	f := newFixture(t)
	f.be.set(func(b *fakeBackend) { b.replicas = 4 })
	f.clock.Advance(0) // the first heartbeat reads the count
	if got := f.store.Replicas(); got != 4 {
		t.Fatalf("replicas %d, want 4", got)
	}
	l := f.limiter(t, 40, 20)
	f.be.set(func(b *fakeBackend) { b.err = errDown })
	// Every check decides locally, failing calls included: rate 10/s, burst ceil(20/4) = 5.
	if n := admitted(l, t0, "a", 30); n != 5 {
		t.Fatalf("admitted %d of 30 in the outage, want the local burst 5", n)
	}
	if !f.store.Fallback() {
		t.Fatal("breaker still closed after 30 failures")
	}
	total := 0
	for range 10 { // 1 s at 10/s
		f.clock.Advance(100 * time.Millisecond)
		total += admitted(l, f.clock.Now(), "a", 10)
	}
	if total != 10 {
		t.Fatalf("admitted %d in 1 s of outage, want 10 (rate 40 / 4 replicas)", total)
	}
	r := l.Check(context.Background(), f.clock.Now(), "a", 1)
	if r == nil || r.RetryAfter != 100*time.Millisecond {
		t.Fatalf("fallback refusal %v, want Retry-After 100ms", r)
	}
	// The count is the last known one throughout.
	if got := f.store.Replicas(); got != 4 {
		t.Fatalf("replicas %d during the outage, want the last known 4", got)
	}
}

func TestReplicasDefaultToOne(t *testing.T) {
	f := newFixture(t)
	f.be.set(func(b *fakeBackend) { b.err = errDown; b.replicas = 7 })
	f.clock.Advance(5 * time.Second)
	if got := f.store.Replicas(); got != 1 {
		t.Fatalf("replicas %d with a store never reached, want 1", got)
	}
	l := f.limiter(t, 10, 4)
	if n := admitted(l, t0, "a", 10); n != 4 {
		t.Fatalf("admitted %d, want the whole burst 4 (one replica)", n)
	}
}

func TestBreakerStopsCallsAndProbes(t *testing.T) {
	f := newFixture(t)
	l := f.limiter(t, 1000, 1000)
	f.clock.Advance(0)
	f.be.set(func(b *fakeBackend) { b.err = errDown })
	admitted(l, t0, "a", 100)
	takes, beats := f.be.counts()
	if takes != defaultTiming.threshold {
		t.Fatalf("%d store calls before the breaker opened, want the threshold %d", takes, defaultTiming.threshold)
	}
	if st, _ := f.store.State(); st.Breaker != metrics.BreakerOpen {
		t.Fatalf("breaker %s, want open", st.Breaker)
	}
	// Probes back off: 100 ms after the opening, then 200, 400, 800, 1000, 1000 ms apart.
	var at []time.Duration
	start := f.clock.Now()
	for range 3000 {
		f.clock.Advance(10 * time.Millisecond)
		if _, b := f.be.counts(); b != beats {
			beats = b
			at = append(at, f.clock.Now().Sub(start))
		}
	}
	want := []time.Duration{100, 300, 700, 1500, 2500, 3500}
	for i, w := range want {
		if i >= len(at) || at[i] != w*time.Millisecond {
			t.Fatalf("probes at %v, want them at %v ms after the opening", at, want)
		}
	}
	if after, _ := f.be.counts(); after != takes {
		t.Fatalf("requests called an open breaker's store %d times", after-takes)
	}
	// The store is back: the next probe closes the breaker and requests use the store again.
	f.be.set(func(b *fakeBackend) { b.err = nil; b.replicas = 2 })
	f.clock.Advance(time.Second)
	if f.store.Fallback() {
		t.Fatal("breaker open after a successful probe")
	}
	if got := f.store.Replicas(); got != 2 {
		t.Fatalf("replicas %d after the probe, want 2", got)
	}
	admitted(l, f.clock.Now(), "a", 3)
	if after, _ := f.be.counts(); after != takes+3 {
		t.Fatalf("%d store calls after recovery, want 3", after-takes)
	}
	// Back to heartbeats once a second.
	_, b0 := f.be.counts()
	f.clock.Advance(3 * time.Second)
	if _, b1 := f.be.counts(); b1-b0 != 3 {
		t.Fatalf("%d heartbeats in 3 s, want 3", b1-b0)
	}
}

func TestHeartbeatFailuresOpenTheBreakerWithoutTraffic(t *testing.T) {
	f := newFixture(t)
	f.clock.Advance(0)
	f.be.set(func(b *fakeBackend) { b.err = errDown })
	f.clock.Advance(time.Duration(defaultTiming.threshold) * time.Second)
	if !f.store.Fallback() {
		t.Fatalf("breaker closed after %d failed heartbeats", defaultTiming.threshold)
	}
}

func TestSuccessResetsTheFailureCount(t *testing.T) {
	f := newFixture(t)
	l := f.limiter(t, 1000, 1000)
	for range 10 {
		f.be.set(func(b *fakeBackend) { b.err = errDown })
		admitted(l, t0, "a", defaultTiming.threshold-1)
		f.be.set(func(b *fakeBackend) { b.err = nil })
		admitted(l, t0, "a", 1)
	}
	if f.store.Fallback() {
		t.Fatal("breaker opened on failures that were never consecutive")
	}
}

func TestCallerCancelIsNotAStoreFailure(t *testing.T) {
	f := newFixture(t)
	l := f.limiter(t, 1000, 1000)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 10 {
		if r := l.Check(ctx, t0, "a", 1); r != nil {
			t.Fatalf("decided %v for a caller that left; the local fallback has room", r)
		}
	}
	if f.store.Fallback() {
		t.Fatal("callers that left opened the breaker")
	}
}

func TestStoreCloseLeavesAndStops(t *testing.T) {
	f := newFixture(t)
	l := f.limiter(t, 10, 2)
	f.clock.Advance(0)
	if err := f.store.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.store.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if f.clock.Pending() != 0 {
		t.Fatalf("%d timers armed after Close", f.clock.Pending())
	}
	if _, ok := f.store.State(); ok {
		t.Fatal("a closed store still reports its state to the metrics")
	}
	f.be.mu.Lock()
	left, closed := f.be.left, f.be.closed
	f.be.mu.Unlock()
	if len(left) != 1 || left[0] != "loadshed:replicas pod-a" || !closed {
		t.Fatalf("left %v closed %v, want the replica out of loadshed:replicas and the client closed", left, closed)
	}
	takes, _ := f.be.counts()
	if n := admitted(l, t0, "a", 5); n != 2 {
		t.Fatalf("admitted %d after Close, want the local burst 2", n)
	}
	if after, _ := f.be.counts(); after != takes {
		t.Fatal("a closed store was called")
	}
}

func TestFallbackFollowsTheReplicaCount(t *testing.T) {
	f := newFixture(t)
	l := f.limiter(t, 30, 9)
	for _, n := range []int64{1, 3, 2} {
		f.be.set(func(b *fakeBackend) { b.replicas = n; b.err = nil })
		f.clock.Advance(time.Second)
		lim, err := l.local()
		if err != nil {
			t.Fatal(err)
		}
		want := int((9 + n - 1) / n)
		if got := admitted(&Local{limits: lim}, f.clock.Now(), fmt.Sprint("k", n), 20); got != want {
			t.Fatalf("%d replicas: local burst %d, want %d", n, got, want)
		}
	}
}

func TestMetrics(t *testing.T) {
	f := newFixture(t)
	l := f.limiter(t, 10, 1)
	f.clock.Advance(0)
	admitted(l, t0, "a", 2) // one allowed, one limited by the store
	f.be.set(func(b *fakeBackend) { b.err = errDown })
	admitted(l, t0, "b", 4) // 3 failures open the breaker; all 4 decided locally: 1 allowed
	want := `
# HELP loadshed_quota_decisions_total Shared quota checks, by quota, source (store, or fallback: decided locally at rate / replicas) and result (allowed, limited).
# TYPE loadshed_quota_decisions_total counter
loadshed_quota_decisions_total{quota="api",result="allowed",source="fallback"} 1
loadshed_quota_decisions_total{quota="api",result="allowed",source="store"} 1
loadshed_quota_decisions_total{quota="api",result="limited",source="fallback"} 3
loadshed_quota_decisions_total{quota="api",result="limited",source="store"} 1
# HELP loadshed_quota_fallback_active 1 while the quota store is not called (its breaker is open or probing) and shared quotas are enforced locally at rate / replicas.
# TYPE loadshed_quota_fallback_active gauge
loadshed_quota_fallback_active 1
# HELP loadshed_quota_store_breaker_state State of the quota store's circuit breaker: 1 for the current state (closed, open, half_open), 0 for the others.
# TYPE loadshed_quota_store_breaker_state gauge
loadshed_quota_store_breaker_state{state="closed"} 0
loadshed_quota_store_breaker_state{state="half_open"} 0
loadshed_quota_store_breaker_state{state="open"} 1
# HELP loadshed_quota_store_errors_total Failed quota store calls, by op and kind (timeout, pool_timeout, connection, reply, other).
# TYPE loadshed_quota_store_errors_total counter
loadshed_quota_store_errors_total{kind="connection",op="take"} 3
# HELP loadshed_quota_replicas Live replicas sharing the quota store, as last counted from their heartbeats (the divisor of the local fallback).
# TYPE loadshed_quota_replicas gauge
loadshed_quota_replicas 1
`
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(want), "loadshed_quota_decisions_total", "loadshed_quota_fallback_active",
		"loadshed_quota_store_breaker_state", "loadshed_quota_store_errors_total", "loadshed_quota_replicas"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(f.reg, "loadshed_quota_store_latency_seconds"); n != 3 {
		t.Fatalf("%d latency series, want 3 (take, heartbeat, probe)", n)
	}
	problems, err := testutil.GatherAndLint(f.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestErrorKind(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{redis.ErrPoolTimeout, "pool_timeout"},
		{context.DeadlineExceeded, "timeout"},
		{fmt.Errorf("read: %w", &net.OpError{Op: "read", Err: timeoutErr{}}), "timeout"},
		{errDown, "connection"},
		{io.EOF, "connection"},
		{redis.ErrClosed, "connection"},
		{replyError("bad"), "reply"},
		{errors.New("mystery"), "other"},
	} {
		if got := errorKind(c.err); got != c.want {
			t.Errorf("errorKind(%v) = %s, want %s", c.err, got, c.want)
		}
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestClientLoggerWrites(t *testing.T) {
	var b strings.Builder
	clientLogger{slog.New(slog.NewTextHandler(&b, nil))}.Printf(context.Background(), "dial %s failed", "x:1")
	if !strings.Contains(b.String(), "redis client: dial x:1 failed") || !strings.Contains(b.String(), "level=WARN") {
		t.Fatalf("logged %q", b.String())
	}
}
