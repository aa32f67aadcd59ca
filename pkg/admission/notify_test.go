package admission_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

// TestAdmitNotifyReportsTheQueuedWait: a door learns that its request waits, with the strategy's
// estimate and the bound by which the request is admitted or refused, before Admit blocks.
func TestAdmitNotifyReportsTheQueuedWait(t *testing.T) {
	l, clk := newLimiter(t, must(admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1, Depth: 4, MaxWait: 80 * time.Millisecond})))
	ctx := context.Background()
	// Teach the queue a mean hold time of 20 ms.
	p, _ := l.Admit(ctx, admission.Request{})
	clk.Advance(20 * time.Millisecond)
	p.Done(admission.Success)

	hold, err := l.Admit(ctx, admission.Request{})
	if err != nil {
		t.Fatal(err)
	}
	notices := make(chan admission.Queued, 1)
	done := make(chan error, 1)
	go func() {
		_, err := l.AdmitNotify(ctx, admission.Request{Deadline: clk.Now().Add(50 * time.Millisecond)}, func(q admission.Queued) { notices <- q })
		done <- err
	}()
	q := <-notices
	if q.Bound != 50*time.Millisecond {
		t.Errorf("bound = %s, want the deadline's 50ms (before maxWait's 80ms)", q.Bound)
	}
	if q.Expected != 20*time.Millisecond {
		t.Errorf("expected = %s, want one mean hold time (20ms)", q.Expected)
	}
	clk.Advance(50 * time.Millisecond)
	if err := <-done; reasonOf(err) != admission.ReasonDeadline {
		t.Errorf("waiter = %v, want a deadline refusal at its bound", err)
	}
	hold.Done(admission.Success)
}

// TestAdmitNotifyIsSilentWithoutAQueue: nothing is reported for a request admitted or refused
// at once.
func TestAdmitNotifyIsSilentWithoutAQueue(t *testing.T) {
	l, _ := newLimiter(t, must(admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1, Depth: 1, MaxWait: time.Second})))
	called := 0
	p, err := l.AdmitNotify(context.Background(), admission.Request{}, func(admission.Queued) { called++ })
	if err != nil || called != 0 {
		t.Fatalf("admitted at once: err %v, notified %d times", err, called)
	}
	p.Done(admission.Success)
}

func TestLeakyBucketAndChainBounds(t *testing.T) {
	leaky := must(admission.NewLeakyBucket(admission.LeakyBucketConfig{Rate: 100, Depth: 5}))
	if got := admission.MaxQueueWait(leaky); got != 50*time.Millisecond {
		t.Errorf("leaky bucket max wait = %s, want a full bucket (50ms)", got)
	}
	l, clk := newLimiter(t, leaky)
	ctx := context.Background()
	p, _ := l.Admit(ctx, admission.Request{})
	p.Done(admission.Success)
	notices := make(chan admission.Queued, 1)
	done := make(chan error, 1)
	go func() {
		p, err := l.AdmitNotify(ctx, admission.Request{}, func(q admission.Queued) { notices <- q })
		if err == nil {
			p.Done(admission.Success)
		}
		done <- err
	}()
	if q := <-notices; q.Expected != 10*time.Millisecond || q.Bound != 10*time.Millisecond {
		t.Errorf("leaky wait = %+v, want exactly the 10ms of water ahead", q)
	}
	clk.Advance(10 * time.Millisecond)
	if err := <-done; err != nil {
		t.Errorf("waiter at its start: %v", err)
	}

	queue := must(admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1, Depth: 2, MaxWait: 80 * time.Millisecond}))
	inflight := must(admission.NewInflight(admission.InflightConfig{Limit: 4}))
	chain := must(admission.NewChain(must(admission.NewLeakyBucket(admission.LeakyBucketConfig{Rate: 100, Depth: 5})), queue, inflight))
	if got := admission.MaxQueueWait(chain); got != 130*time.Millisecond {
		t.Errorf("chain max wait = %s, want the sum of its queues (50ms + 80ms)", got)
	}
	for _, c := range []admission.Core{inflight, must(admission.NewTokenBucket(admission.TokenBucketConfig{Rate: 1, Burst: 1})), admission.NewNone()} {
		if got := admission.MaxQueueWait(c); got != 0 {
			t.Errorf("%s max wait = %s, want 0 (it never queues)", c.Name(), got)
		}
	}
}

// TestNoneAdmitsEverythingAndCountsIt: "none" admits whatever arrives, counts the cost in
// flight, and refuses like every strategy once drained.
func TestNoneAdmitsEverythingAndCountsIt(t *testing.T) {
	l, _ := newLimiter(t, admission.NewNone())
	ctx := context.Background()
	var held []admission.Permit
	for range 100 {
		p, err := l.Admit(ctx, admission.Request{Cost: 2})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	if got := l.Stats().InFlight; got != 200 {
		t.Errorf("in flight = %d, want 200", got)
	}
	for _, p := range held {
		p.Done(admission.Success)
	}
	if got := l.Stats().InFlight; got != 0 {
		t.Errorf("in flight after release = %d, want 0", got)
	}
	l.Drain()
	if _, err := l.Admit(ctx, admission.Request{}); reasonOf(err) != admission.ReasonDraining {
		t.Errorf("after Drain: %v, want draining", err)
	}
}

// TestMaxWaitMustBePositive: a bounded queue without a bound on its waits is refused, like the
// proxy's configuration refuses it.
func TestMaxWaitMustBePositive(t *testing.T) {
	if _, err := admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1, Depth: 4}); err == nil {
		t.Error("bounded queue with maxWait 0 accepted")
	}
	var ce *admission.ConfigError
	_, err := admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1, Depth: 4, MaxWait: -time.Second})
	if !errors.As(err, &ce) || ce.Fields()[0] != "maxWait" {
		t.Errorf("negative maxWait: %v, want a problem naming maxWait", err)
	}
}
