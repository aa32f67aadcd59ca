package admission_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
	"github.com/loadshed/loadshed/pkg/admission/admissiontest"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// must unwraps a constructor's result; a failing constructor is a broken test setup.
func must(c admission.Core, err error) admission.Core {
	if err != nil {
		panic(err)
	}
	return c
}

func newLimiter(t *testing.T, c admission.Core) (*admission.Limiter, *admissiontest.Clock) {
	t.Helper()
	clk := admissiontest.NewClock(t0)
	return admission.NewLimiter(c, admission.WithClock(clk)), clk
}

func reasonOf(err error) admission.Reason {
	var r *admission.Rejection
	if errors.As(err, &r) {
		return r.Reason
	}
	return ""
}

// waitQueued blocks until the limiter holds n queued requests. It polls a condition, bounded in
// time, instead of sleeping for a guessed duration.
func waitQueued(t *testing.T, l *admission.Limiter, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats().QueuedRequests != n {
		if time.Now().After(deadline) {
			t.Fatalf("queued = %d, want %d", l.Stats().QueuedRequests, n)
		}
		runtime.Gosched()
	}
}

type result struct {
	p   admission.Permit
	err error
}

func admitAsync(l *admission.Limiter, ctx context.Context, req admission.Request) <-chan result {
	ch := make(chan result, 1)
	go func() {
		p, err := l.Admit(ctx, req)
		ch <- result{p, err}
	}()
	return ch
}

func TestTokenBucketBurstThenRetryAfter(t *testing.T) {
	l, clk := newLimiter(t, must(admission.NewTokenBucket(admission.TokenBucketConfig{Rate: 10, Burst: 3})))
	ctx := context.Background()
	for i := range 3 {
		p, err := l.Admit(ctx, admission.Request{})
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		p.Done(admission.Success)
	}
	_, err := l.Admit(ctx, admission.Request{})
	if !errors.Is(err, admission.ErrRateLimited) || !errors.Is(err, admission.ErrRejected) {
		t.Fatalf("err = %v, want rate_limited", err)
	}
	var r *admission.Rejection
	if !errors.As(err, &r) || r.RetryAfter != 100*time.Millisecond {
		t.Fatalf("retry after = %v, want 100ms (one token at 10/s)", r.RetryAfter)
	}
	if errors.Is(err, admission.ErrQueueFull) {
		t.Fatal("a rate limit must not match ErrQueueFull")
	}
	// A cost of 2 needs two tokens: 200 ms from empty.
	_, err = l.Admit(ctx, admission.Request{Cost: 2})
	if !errors.As(err, &r) || r.RetryAfter != 200*time.Millisecond {
		t.Fatalf("cost 2: %v, want retry after 200ms", err)
	}
	clk.Advance(100 * time.Millisecond)
	if _, err := l.Admit(ctx, admission.Request{}); err != nil {
		t.Fatalf("after one token's time: %v", err)
	}
	// Cost above the burst is clamped to the burst: it runs when the bucket is full.
	clk.Advance(time.Second)
	if _, err := l.Admit(ctx, admission.Request{Cost: 50}); err != nil {
		t.Fatalf("cost above burst on a full bucket: %v", err)
	}
	if _, err := l.Admit(ctx, admission.Request{}); reasonOf(err) != admission.ReasonRateLimited {
		t.Fatalf("after a clamped heavy request the bucket must be empty, got %v", err)
	}
}

func TestInflightRefusesAtOnceAndHonoursCost(t *testing.T) {
	l, _ := newLimiter(t, must(admission.NewInflight(admission.InflightConfig{Limit: 4})))
	ctx := context.Background()
	heavy, err := l.Admit(ctx, admission.Request{Cost: 3})
	if err != nil {
		t.Fatal(err)
	}
	light, err := l.Admit(ctx, admission.Request{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Admit(ctx, admission.Request{}); !errors.Is(err, admission.ErrConcurrencyLimit) {
		t.Fatalf("5th unit: %v, want concurrency_limit", err)
	}
	if got := l.Stats().InFlight; got != 4 {
		t.Fatalf("in flight = %d, want 4", got)
	}
	if !heavy.Done(admission.Success) {
		t.Fatal("first Done must release")
	}
	if heavy.Done(admission.Success) {
		t.Fatal("second Done must be a no-op")
	}
	if got := l.Stats().InFlight; got != 1 {
		t.Fatalf("in flight after release = %d, want 1 (a double Done must not release twice)", got)
	}
	light.Done(admission.Ignore)
	if got := l.Stats().InFlight; got != 0 {
		t.Fatalf("in flight = %d, want 0", got)
	}
}

func TestBoundedQueueFIFOTimeoutAndFull(t *testing.T) {
	l, clk := newLimiter(t, must(admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1, Depth: 2, MaxWait: 80 * time.Millisecond})))
	ctx := context.Background()
	first, err := l.Admit(ctx, admission.Request{})
	if err != nil {
		t.Fatal(err)
	}
	a := admitAsync(l, ctx, admission.Request{})
	waitQueued(t, l, 1)
	b := admitAsync(l, ctx, admission.Request{})
	waitQueued(t, l, 2)
	if _, err := l.Admit(ctx, admission.Request{}); !errors.Is(err, admission.ErrQueueFull) {
		t.Fatalf("third waiter: %v, want queue_full", err)
	}
	clk.Advance(30 * time.Millisecond)
	first.Done(admission.Success)
	ra := <-a
	if ra.err != nil {
		t.Fatalf("first waiter: %v", ra.err)
	}
	if ra.p.Waited != 30*time.Millisecond {
		t.Fatalf("waited %v, want 30ms", ra.p.Waited)
	}
	// b has waited 30 ms; at 80 ms it times out while a still holds the permit.
	clk.Advance(50 * time.Millisecond)
	rb := <-b
	if !errors.Is(rb.err, admission.ErrQueueTimeout) {
		t.Fatalf("second waiter: %v, want queue_timeout", rb.err)
	}
	ra.p.Done(admission.Success)
	if st := l.Stats(); st.InFlight != 0 || st.QueuedRequests != 0 {
		t.Fatalf("stats %+v, want empty", st)
	}
}

func TestBoundedQueueServesInArrivalOrder(t *testing.T) {
	l, _ := newLimiter(t, must(admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1, Depth: 10, MaxWait: time.Minute})))
	ctx := context.Background()
	hold, _ := l.Admit(ctx, admission.Request{})
	var chans []<-chan result
	for i := range 5 {
		chans = append(chans, admitAsync(l, ctx, admission.Request{Key: string(rune('a' + i))}))
		waitQueued(t, l, i+1)
	}
	hold.Done(admission.Success)
	for i, ch := range chans {
		r := <-ch
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i, r.err)
		}
		// Only one permit exists: if the wrong waiter had been admitted, the next receive would
		// block until the test times out; check the queue shrank by one each time instead.
		if got := l.Stats().QueuedRequests; got != len(chans)-i-1 {
			t.Fatalf("after admitting waiter %d, %d still queued", i, got)
		}
		r.p.Done(admission.Success)
	}
}

func TestQueuedCallerLeavesOnCancel(t *testing.T) {
	l, _ := newLimiter(t, must(admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1, Depth: 4, MaxWait: time.Minute})))
	hold, _ := l.Admit(context.Background(), admission.Request{})
	ctx, cancel := context.WithCancel(context.Background())
	ch := admitAsync(l, ctx, admission.Request{})
	waitQueued(t, l, 1)
	cancel()
	r := <-ch
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", r.err)
	}
	if got := l.Stats().QueuedRequests; got != 0 {
		t.Fatalf("queue holds %d after cancel, want 0", got)
	}
	hold.Done(admission.Success)
	if got := l.Stats().InFlight; got != 0 {
		t.Fatalf("in flight = %d: the cancelled waiter must not take the freed permit", got)
	}
}

func TestDeadlineRefusedAtDoorAndInQueue(t *testing.T) {
	l, clk := newLimiter(t, must(admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1, Depth: 4, MaxWait: time.Second})))
	ctx := context.Background()
	if _, err := l.Admit(ctx, admission.Request{Deadline: t0}); !errors.Is(err, admission.ErrDeadline) {
		t.Fatalf("expired deadline: %v, want deadline", err)
	}
	hold, _ := l.Admit(ctx, admission.Request{})
	ch := admitAsync(l, ctx, admission.Request{Deadline: t0.Add(20 * time.Millisecond)})
	waitQueued(t, l, 1)
	clk.Advance(20 * time.Millisecond)
	if r := <-ch; !errors.Is(r.err, admission.ErrDeadline) {
		t.Fatalf("queued past its deadline: %v, want deadline", r.err)
	}
	hold.Done(admission.Success)
}

func TestPriorityJumpsQueueAndDisplacesLowest(t *testing.T) {
	l, _ := newLimiter(t, must(admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1, Depth: 2, MaxWait: time.Minute})))
	ctx := context.Background()
	hold, _ := l.Admit(ctx, admission.Request{Priority: admission.Critical})
	low1 := admitAsync(l, ctx, admission.Request{Priority: admission.Sheddable})
	waitQueued(t, l, 1)
	low2 := admitAsync(l, ctx, admission.Request{Priority: admission.Sheddable})
	waitQueued(t, l, 2)
	crit := admitAsync(l, ctx, admission.Request{Priority: admission.Critical})
	// The full queue makes room for the critical request by refusing the newest sheddable one.
	if r := <-low2; !errors.Is(r.err, admission.ErrQueueFull) {
		t.Fatalf("displaced waiter: %v, want queue_full", r.err)
	}
	hold.Done(admission.Success)
	r := <-crit
	if r.err != nil {
		t.Fatalf("critical waiter: %v", r.err)
	}
	r.p.Done(admission.Success)
	if r := <-low1; r.err != nil {
		t.Fatalf("remaining sheddable waiter: %v", r.err)
	} else {
		r.p.Done(admission.Success)
	}
	// An equally unimportant request cannot displace anyone.
	hold, _ = l.Admit(ctx, admission.Request{Priority: admission.Sheddable})
	w1 := admitAsync(l, ctx, admission.Request{Priority: admission.Sheddable})
	waitQueued(t, l, 1)
	w2 := admitAsync(l, ctx, admission.Request{Priority: admission.Sheddable})
	waitQueued(t, l, 2)
	if _, err := l.Admit(ctx, admission.Request{Priority: admission.Sheddable}); !errors.Is(err, admission.ErrQueueFull) {
		t.Fatalf("equal priority at a full queue: %v, want queue_full", err)
	}
	hold.Done(admission.Success)
	for _, ch := range []<-chan result{w1, w2} {
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.p.Done(admission.Success)
	}
}

func TestLeakyBucketPacesAndOverflows(t *testing.T) {
	l, clk := newLimiter(t, must(admission.NewLeakyBucket(admission.LeakyBucketConfig{Rate: 100, Depth: 3})))
	ctx := context.Background()
	p, err := l.Admit(ctx, admission.Request{})
	if err != nil {
		t.Fatal(err)
	}
	p.Done(admission.Success)
	// The bucket holds the first request's 10 ms of water; the next two wait 10 and 20 ms.
	a := admitAsync(l, ctx, admission.Request{})
	waitQueued(t, l, 1)
	b := admitAsync(l, ctx, admission.Request{})
	waitQueued(t, l, 2)
	_, err = l.Admit(ctx, admission.Request{})
	var r *admission.Rejection
	if !errors.As(err, &r) || r.Reason != admission.ReasonRateLimited || r.RetryAfter != 10*time.Millisecond {
		t.Fatalf("overflow: %v, want rate_limited retry after 10ms", err)
	}
	clk.Advance(10 * time.Millisecond)
	ra := <-a
	if ra.err != nil || ra.p.Waited != 10*time.Millisecond {
		t.Fatalf("first waiter: %v waited %v, want 10ms", ra.err, ra.p.Waited)
	}
	clk.Advance(10 * time.Millisecond)
	rb := <-b
	if rb.err != nil || rb.p.Waited != 20*time.Millisecond {
		t.Fatalf("second waiter: %v waited %v, want 20ms", rb.err, rb.p.Waited)
	}
}

func TestLeakyBucketCancelRefundsWater(t *testing.T) {
	l, clk := newLimiter(t, must(admission.NewLeakyBucket(admission.LeakyBucketConfig{Rate: 100, Depth: 3})))
	ctx := context.Background()
	p, _ := l.Admit(ctx, admission.Request{})
	p.Done(admission.Success)
	cctx, cancel := context.WithCancel(ctx)
	a := admitAsync(l, cctx, admission.Request{}) // would start at 10 ms
	waitQueued(t, l, 1)
	b := admitAsync(l, ctx, admission.Request{}) // would start at 20 ms
	waitQueued(t, l, 2)
	cancel()
	if r := <-a; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", r.err)
	}
	clk.Advance(10 * time.Millisecond)
	if rb := <-b; rb.err != nil || rb.p.Waited != 10*time.Millisecond {
		t.Fatalf("waiter behind the cancelled one: %v waited %v, want 10ms", rb.err, rb.p.Waited)
	}
}

func TestChainAllMustAdmitAndReleaseUndoes(t *testing.T) {
	tb := must(admission.NewTokenBucket(admission.TokenBucketConfig{Rate: 1, Burst: 3}))
	q := must(admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1, Depth: 1, MaxWait: time.Second}))
	l, _ := newLimiter(t, must(admission.NewChain(tb, q)))
	ctx := context.Background()
	p1, err := l.Admit(ctx, admission.Request{})
	if err != nil {
		t.Fatal(err)
	}
	waiter := admitAsync(l, ctx, admission.Request{})
	waitQueued(t, l, 1)
	// Third: the bucket admits (its last token), the queue is full: refused by the queue stage.
	_, err = l.Admit(ctx, admission.Request{})
	var r *admission.Rejection
	if !errors.As(err, &r) || r.Reason != admission.ReasonQueueFull || r.Stage != "bounded-queue" {
		t.Fatalf("third: %v, want queue_full from bounded-queue", err)
	}
	// Fourth: the bucket is empty now.
	if _, err := l.Admit(ctx, admission.Request{}); !errors.As(err, &r) || r.Stage != "token-bucket" {
		t.Fatalf("fourth: %v, want refusal by token-bucket", err)
	}
	p1.Done(admission.Success)
	w := <-waiter
	if w.err != nil {
		t.Fatal(w.err)
	}
	stages := l.StageStats()
	if len(stages) != 2 || stages[1].InFlight != 1 {
		t.Fatalf("stage stats %+v, want the queue stage holding 1", stages)
	}
	w.p.Done(admission.Success)
	if st := l.StageStats(); st[1].InFlight != 0 || l.Stats().InFlight != 0 {
		t.Fatalf("after release: %+v", st)
	}
}

func TestDrainRefusesQueuedAndNew(t *testing.T) {
	l, _ := newLimiter(t, must(admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1, Depth: 4, MaxWait: time.Minute})))
	ctx := context.Background()
	hold, _ := l.Admit(ctx, admission.Request{})
	ch := admitAsync(l, ctx, admission.Request{})
	waitQueued(t, l, 1)
	l.Drain()
	if r := <-ch; !errors.Is(r.err, admission.ErrDraining) {
		t.Fatalf("queued at drain: %v, want draining", r.err)
	}
	if _, err := l.Admit(ctx, admission.Request{}); !errors.Is(err, admission.ErrDraining) {
		t.Fatalf("new after drain: %v, want draining", err)
	}
	if !hold.Done(admission.Success) {
		t.Fatal("a permit held at drain must still release")
	}
}

// TestConcurrentInvariants hammers a small queue from many goroutines; run with -race. The
// in-flight count must never exceed the limit and must return to zero.
func TestConcurrentInvariants(t *testing.T) {
	core := must(admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 3, Depth: 5, MaxWait: time.Hour}))
	l := admission.NewLimiter(core) // real clock: waits end by release, never by time
	var wg sync.WaitGroup
	var mu sync.Mutex
	held, maxHeld := 0, 0
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				ctx, cancel := context.WithCancel(context.Background())
				if (g+i)%7 == 0 {
					cancel() // some callers give up at once
				}
				p, err := l.Admit(ctx, admission.Request{Cost: int64(1 + (g+i)%2)})
				cancel()
				if err != nil {
					continue
				}
				mu.Lock()
				held += int(1 + (g+i)%2)
				maxHeld = max(maxHeld, held)
				mu.Unlock()
				runtime.Gosched() // hold the permit across a scheduling point
				mu.Lock()
				held -= int(1 + (g+i)%2)
				mu.Unlock()
				p.Done(admission.Success)
			}
		}()
	}
	wg.Wait()
	if st := l.Stats(); st.InFlight != 0 || st.QueuedRequests != 0 {
		t.Fatalf("after all released: %+v", st)
	}
	if maxHeld > 3 {
		t.Fatalf("%d permit units held at once, limit 3", maxHeld)
	}
}
