package admission_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

func newCohorts(t *testing.T, inner admission.Core, o admission.CohortOptions) *admission.Cohorts {
	t.Helper()
	if o.Ranks == 0 {
		o.Ranks = 8
	}
	c, err := admission.NewCohorts(inner, o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// warm admits and releases one request after d, so the room knows the admitted latency.
func warm(t *testing.T, l *admission.Limiter, clk interface{ Advance(time.Duration) }, d time.Duration) {
	t.Helper()
	p, err := l.Admit(context.Background(), admission.Request{Priority: admission.Critical})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(d)
	p.Done(admission.Success)
}

func TestCohortRoomHandsAReleaseToTheBestRank(t *testing.T) {
	co := newCohorts(t, must(admission.NewInflight(admission.InflightConfig{Limit: 2})), admission.CohortOptions{WaitFraction: 1})
	l, clk := newLimiter(t, co)
	warm(t, l, clk, 20*time.Millisecond)
	ctx := context.Background()
	var held []admission.Permit
	for range 2 {
		p, err := l.Admit(ctx, admission.Request{Priority: admission.Critical, Rank: 0})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, p)
	}
	// The limit is full: a worse rank waits first, a better one after it.
	worse := admitAsync(l, ctx, admission.Request{Priority: admission.Critical, Rank: 6})
	waitQueued(t, l, 1)
	better := admitAsync(l, ctx, admission.Request{Priority: admission.Critical, Rank: 2})
	waitQueued(t, l, 2)
	// A third waiter does not fit a room of WaitFraction x limit = 2: the worst of the three
	// (the newcomer here) is refused at once, for the strategy's reason.
	if _, err := l.Admit(ctx, admission.Request{Priority: admission.Critical, Rank: 7}); !errors.Is(err, admission.ErrConcurrencyLimit) {
		t.Fatalf("third waiter: %v, want the strategy's concurrency_limit", err)
	}
	held[0].Done(admission.Success)
	r := <-better
	if r.err != nil {
		t.Fatalf("the better rank, waiting second, got %v; want the released permit", r.err)
	}
	if l.Stats().QueuedRequests != 1 {
		t.Fatalf("the worse rank should still wait")
	}
	// Nothing is released within its wait (WaitFraction x 20 ms): refused for the strategy's reason.
	clk.Advance(25 * time.Millisecond)
	if r := <-worse; !errors.Is(r.err, admission.ErrConcurrencyLimit) {
		t.Fatalf("worse rank after its wait: %v, want concurrency_limit", r.err)
	}
	r.p.Done(admission.Success)
	held[1].Done(admission.Success)
}

func TestCohortRoomEvictsTheWorstRankForABetterOne(t *testing.T) {
	co := newCohorts(t, must(admission.NewInflight(admission.InflightConfig{Limit: 1})), admission.CohortOptions{WaitFraction: 1})
	l, clk := newLimiter(t, co)
	warm(t, l, clk, 20*time.Millisecond)
	ctx := context.Background()
	p, err := l.Admit(ctx, admission.Request{Priority: admission.Critical})
	if err != nil {
		t.Fatal(err)
	}
	low := admitAsync(l, ctx, admission.Request{Priority: admission.Sheddable, Rank: 0})
	waitQueued(t, l, 1)
	high := admitAsync(l, ctx, admission.Request{Priority: admission.Critical, Rank: 5})
	// The room holds one: the sheddable waiter makes way for the critical one.
	if r := <-low; !errors.Is(r.err, admission.ErrConcurrencyLimit) {
		t.Fatalf("evicted waiter: %v", r.err)
	}
	p.Done(admission.Success)
	if r := <-high; r.err != nil {
		t.Fatalf("critical waiter: %v", r.err)
	} else {
		r.p.Done(admission.Success)
	}
}

func TestCohortRoomLeavesWithItsClientAndOnDrain(t *testing.T) {
	co := newCohorts(t, must(admission.NewInflight(admission.InflightConfig{Limit: 1})), admission.CohortOptions{WaitFraction: 2})
	l, clk := newLimiter(t, co)
	warm(t, l, clk, 20*time.Millisecond)
	p, err := l.Admit(context.Background(), admission.Request{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gone := admitAsync(l, ctx, admission.Request{Rank: 1})
	waitQueued(t, l, 1)
	cancel()
	if r := <-gone; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", r.err)
	}
	if n := l.Stats().QueuedRequests; n != 0 {
		t.Fatalf("%d still waiting after the client left", n)
	}
	stays := admitAsync(l, context.Background(), admission.Request{Rank: 1})
	waitQueued(t, l, 1)
	l.Drain()
	if r := <-stays; !errors.Is(r.err, admission.ErrDraining) {
		t.Fatalf("waiter at drain: %v", r.err)
	}
	p.Done(admission.Success)
}

func TestCohortRoomRetriesABucketWhenItRefills(t *testing.T) {
	co := newCohorts(t, must(admission.NewTokenBucket(admission.TokenBucketConfig{Rate: 100, Burst: 1})), admission.CohortOptions{WaitFraction: 4})
	l, clk := newLimiter(t, co)
	warm(t, l, clk, 20*time.Millisecond) // takes the token; the latency makes the wait 80 ms
	clk.Advance(10 * time.Millisecond)
	if _, err := l.Admit(context.Background(), admission.Request{}); err != nil {
		t.Fatal(err)
	}
	next := admitAsync(l, context.Background(), admission.Request{})
	waitQueued(t, l, 1)
	clk.Advance(10 * time.Millisecond) // one token at 100/s
	if r := <-next; r.err != nil {
		t.Fatalf("waiter after the bucket refilled: %v", r.err)
	}
}

func TestCohortsLeaveAQueueingStrategyItsOwnQueue(t *testing.T) {
	q := must(admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1, Depth: 1, MaxWait: time.Second}))
	l, clk := newLimiter(t, newCohorts(t, q, admission.CohortOptions{}))
	warm(t, l, clk, 20*time.Millisecond)
	p, _ := l.Admit(context.Background(), admission.Request{})
	w := admitAsync(l, context.Background(), admission.Request{})
	waitQueued(t, l, 1)
	// The queue is full: no room behind it, the strategy's refusal stands.
	if _, err := l.Admit(context.Background(), admission.Request{}); !errors.Is(err, admission.ErrQueueFull) {
		t.Fatalf("over a full queue: %v", err)
	}
	if got := admission.MaxQueueWait(newCohorts(t, q, admission.CohortOptions{})); got != time.Second+admission.DefaultCohortMaxWait {
		t.Fatalf("MaxQueueWait = %v", got)
	}
	p.Done(admission.Success)
	(<-w).p.Done(admission.Success)
}

// TestCohortLevelRefusesTheBottomFirst: under overload the level closes on the sheddable class
// before the critical one, and within a class on the high ranks; below capacity it stays open.
func TestCohortLevelRefusesTheBottomFirst(t *testing.T) {
	co := newCohorts(t, must(admission.NewInflight(admission.InflightConfig{Limit: 4})), admission.CohortOptions{Ranks: 16, WaitFraction: -1, StrategyShare: 0.03})
	l, clk := newLimiter(t, co)
	if got := co.Level().String(); got != "sheddable/15" {
		t.Fatalf("level at start %q, want everything admitted (sheddable/15)", got)
	}
	ctx := context.Background()
	// Each 10 ms, 8 requests (2 critical, 6 sheddable, ranks spread) arrive and the 4 admitted
	// are released: twice what fits.
	refused := map[admission.Priority]int{}
	for step := range 200 {
		var held []admission.Permit
		for i := range 8 {
			prio := admission.Critical
			if i >= 2 {
				prio = admission.Sheddable
			}
			p, err := l.Admit(ctx, admission.Request{Priority: prio, Rank: (step*7 + i*3) % 16})
			if err != nil {
				if step >= 100 {
					refused[prio]++
				}
				continue
			}
			held = append(held, p)
		}
		clk.Advance(10 * time.Millisecond)
		for _, p := range held {
			p.Done(admission.Success)
		}
	}
	lv := co.Level()
	// 2 critical and about 2 sheddable of 6 fit: the level sits a third into the sheddable class.
	if lv.Priority != admission.Sheddable || lv.Rank < 2 || lv.Rank > 9 {
		t.Fatalf("level %s under 2x overload, a quarter of the traffic critical: want about sheddable/5", lv)
	}
	if refused[admission.Critical] > 4 || refused[admission.Sheddable] < 300 {
		t.Fatalf("refused in the last 100 steps: %d critical of 200, %d sheddable of 600", refused[admission.Critical], refused[admission.Sheddable])
	}
	if !lv.Admits(admission.Critical, 15) || !lv.Admits(admission.Sheddable, lv.Rank) || lv.Admits(admission.Sheddable, lv.Rank+1) {
		t.Fatalf("level %s: Admits disagrees with its own order", lv)
	}
	// The overload ends: the level opens within a few seconds.
	for range 300 {
		p, err := l.Admit(ctx, admission.Request{Priority: admission.Sheddable, Rank: 15})
		if err == nil {
			clk.Advance(10 * time.Millisecond)
			p.Done(admission.Success)
		} else {
			clk.Advance(10 * time.Millisecond)
		}
	}
	if got := co.Level().String(); got != "sheddable/15" {
		t.Fatalf("level after 3 s below capacity %q, want open", got)
	}
}

func TestCohortOptionsAreValidated(t *testing.T) {
	inner := must(admission.NewInflight(admission.InflightConfig{Limit: 1}))
	for _, tc := range []struct {
		o     admission.CohortOptions
		field string
	}{
		{admission.CohortOptions{Ranks: 1}, "cohorts.count"},
		{admission.CohortOptions{Ranks: admission.MaxCohortRanks + 1}, "cohorts.count"},
		{admission.CohortOptions{Ranks: 8, StrategyShare: 0.6}, "cohorts.strategyShare"},
		{admission.CohortOptions{Ranks: 8, WaitFraction: 5}, "cohorts.waitFraction"},
		{admission.CohortOptions{Ranks: 8, Window: time.Microsecond}, "cohorts.window"},
	} {
		_, err := admission.NewCohorts(inner, tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: error %v, want one naming %s", tc.o, err, tc.field)
		}
	}
	co := newCohorts(t, inner, admission.CohortOptions{})
	if admission.CohortsOf(co) != co || admission.CohortsOf(inner) != nil || co.Name() != "inflight" {
		t.Fatal("CohortsOf or Name do not see through the cohort stage")
	}
	if st := admission.Stages(co); len(st) != 1 || st[0] != inner {
		t.Fatal("Stages does not see the strategy behind the cohort stage")
	}
}
