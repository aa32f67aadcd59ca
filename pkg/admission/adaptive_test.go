package admission_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
	"github.com/loadshed/loadshed/pkg/admission/limit"
)

// recorder is a fake algorithm: it records every window and returns a scripted limit.
type recorder struct {
	windows []limit.Window
	next    func(cur float64, w limit.Window) float64
}

func (r *recorder) Name() string { return "recorder" }
func (r *recorder) Update(cur float64, w limit.Window) float64 {
	r.windows = append(r.windows, w)
	return r.next(cur, w)
}

// drive admits n requests at once on the core at now, holds them for hold, and releases them
// with outcome o; it returns how many were admitted.
func drive(c admission.Core, now time.Time, n int, hold time.Duration, o admission.Outcome) int {
	var ev admission.Events
	var held []*admission.Ticket
	for range n {
		t := &admission.Ticket{}
		t.Reset(admission.Request{Priority: admission.Critical}, now)
		if c.Offer(now, t, &ev) == admission.Admitted {
			held = append(held, t)
		}
	}
	for _, t := range held {
		c.Release(now.Add(hold), t, o, &ev)
	}
	return len(held)
}

func TestAdaptiveWindowsFeedTheAlgorithm(t *testing.T) {
	rec := &recorder{next: func(cur float64, w limit.Window) float64 { return cur + 1 }}
	core := must(admission.NewAdaptive(admission.AdaptiveConfig{
		Algorithm: rec, InitialLimit: 4, MinLimit: 1, MaxLimit: 6,
		Window: 100 * time.Millisecond, MinSamples: 4,
	}))
	now := t0
	// Four successes of 20 ms each within one window: no update until the window's time is up.
	if got := drive(core, now, 6, 20*time.Millisecond, admission.Success); got != 4 {
		t.Fatalf("admitted %d, want the initial limit 4", got)
	}
	if len(rec.windows) != 0 {
		t.Fatalf("updated before the window ended: %+v", rec.windows)
	}
	now = now.Add(100 * time.Millisecond)
	drive(core, now, 1, 30*time.Millisecond, admission.Success)
	if len(rec.windows) != 1 {
		t.Fatalf("windows = %d, want 1", len(rec.windows))
	}
	w := rec.windows[0]
	if w.Samples != 5 || w.Dropped != 0 || w.RTT != 20*time.Millisecond || w.MaxInFlight != 4 {
		t.Fatalf("window %+v, want 5 samples, p50 20ms, max in flight 4", w)
	}
	if w.Skew != 2*time.Millisecond {
		t.Fatalf("skew %v, want the mean 22ms less the median 20ms", w.Skew)
	}
	if w.MinRTT != 20*time.Millisecond {
		t.Fatalf("min RTT %v, want 20ms", w.MinRTT)
	}
	st := core.Stats(now)
	if st.Limit != 5 || st.LimitFloor != 1 || st.LimitCeiling != 6 || st.SampleRTT != 20*time.Millisecond {
		t.Fatalf("stats %+v, want limit 5 with floor 1, ceiling 6", st)
	}
	// The ceiling clamps whatever the algorithm says.
	for i := range 5 {
		now = now.Add(100 * time.Millisecond)
		drive(core, now, 4+i, 20*time.Millisecond, admission.Success)
	}
	if st := core.Stats(now); st.Limit != 6 {
		t.Fatalf("limit %v, want the ceiling 6", st.Limit)
	}
}

// keeper is a recorder that reports a queue kept on purpose in every window while keep is set.
type keeper struct {
	recorder
	keep bool
}

func (k *keeper) KeptQueue() bool { return k.keep }

func TestAdaptiveWindowsWithAKeptQueueDoNotTeachTheEstimate(t *testing.T) {
	run := func(keep bool, windows int) time.Duration {
		k := &keeper{recorder: recorder{next: func(cur float64, w limit.Window) float64 { return cur }}}
		core := must(admission.NewAdaptive(admission.AdaptiveConfig{
			Algorithm: k, InitialLimit: 4, MinLimit: 1, MaxLimit: 4,
			Window: 100 * time.Millisecond, MinSamples: 4, MinRTTWindows: 2,
		}))
		now := t0
		for range 3 {
			drive(core, now, 4, 20*time.Millisecond, admission.Success)
			now = now.Add(100 * time.Millisecond)
		}
		k.keep = keep
		for range windows {
			drive(core, now, 4, 24*time.Millisecond, admission.Success)
			now = now.Add(150 * time.Millisecond)
		}
		if got := k.windows[len(k.windows)-1].RTT; got != 24*time.Millisecond {
			t.Fatalf("last window's RTT %v, want 24ms", got)
		}
		return core.Stats(now).MinRTT
	}
	// An estimator of two windows learns the slower windows at once, unless the algorithm
	// kept a queue in them.
	if got := run(false, 5); got != 24*time.Millisecond {
		t.Fatalf("MinRTT %v after windows of 24ms, want 24ms", got)
	}
	if got := run(true, 5); got != 20*time.Millisecond {
		t.Fatalf("MinRTT %v after windows of 24ms with a kept queue, want 20ms (not learned)", got)
	}
	// But not for ever: every tenth window in a row is learned whatever the algorithm says, so
	// a backend slower by less than the algorithm can tell from its own queue is followed.
	if got := run(true, 21); got != 24*time.Millisecond {
		t.Fatalf("MinRTT %v after 20 windows of 24ms with a kept queue, want 24ms (every tenth learned)", got)
	}
}

// windowsAt is an adaptive core of a fixed limit (its algorithm records each window and moves
// nothing, 100 ms windows of at least one sample), driven at millisecond offsets from t0.
type windowsAt struct {
	rec  *recorder
	core admission.Core
	ev   admission.Events
}

func newWindowsAt(fixed, floor float64) *windowsAt {
	rec := &recorder{next: func(cur float64, w limit.Window) float64 { return cur }}
	return &windowsAt{rec: rec, core: must(admission.NewAdaptive(admission.AdaptiveConfig{
		Algorithm: rec, InitialLimit: fixed, MinLimit: floor, MaxLimit: fixed,
		Window: 100 * time.Millisecond, MinSamples: 1,
	}))}
}

func (w *windowsAt) offer(ms int, cost int64) (*admission.Ticket, admission.Verdict) {
	at := t0.Add(time.Duration(ms) * time.Millisecond)
	tk := &admission.Ticket{}
	tk.Reset(admission.Request{Priority: admission.Critical, Cost: cost}, at)
	return tk, w.core.Offer(at, tk, &w.ev)
}

func (w *windowsAt) release(ms int, tk *admission.Ticket) {
	w.core.Release(t0.Add(time.Duration(ms)*time.Millisecond), tk, admission.Success, &w.ev)
}

// Window.Held counts the permits admitted before a window began and still in flight at its end:
// a request released within the window is not held, whenever it was admitted.
func TestAdaptiveWindowsCountHeldPermits(t *testing.T) {
	w := newWindowsAt(16, 1)
	admit := func(ms int, cost int64) *admission.Ticket {
		t.Helper()
		tk, v := w.offer(ms, cost)
		if v != admission.Admitted {
			t.Fatalf("offer at %d ms: not admitted", ms)
		}
		return tk
	}
	l1, l2, l3 := admit(0, 1), admit(0, 1), admit(0, 2)
	w.release(10, admit(0, 1)) // the first sample starts the first window
	w.release(120, admit(110, 1))
	// Window 1 (10-120 ms) began with nothing known in flight; it ends with l1-l3 (4 permits).
	w.release(150, l1)
	s3, s4 := admit(150, 1), admit(200, 1)
	w.release(230, s3)
	// Window 2 (120-230 ms): l1 finished in it, s3 and s4 began in it.
	w.release(260, s4)
	w.release(400, l2)
	// Window 3 (230-400 ms): s4 began before it but finished in it, l2 finished at its end.
	var held []int
	for _, win := range w.rec.windows {
		held = append(held, win.Held)
	}
	if want := []int{0, 3, 2}; !slices.Equal(held, want) {
		t.Fatalf("held permits per window %v, want %v (l2 and l3's 1+2, then l3's 2)", held, want)
	}
	w.release(410, l3)
}

func TestAdaptiveWindowsCountBlockedRequests(t *testing.T) {
	// A limit of 2 with no wait queue: requests that find it taken are refused, the queue is
	// empty at every instant, and the window still tells the demand above the limit.
	w := newWindowsAt(2, 2)
	first, _ := w.offer(0, 1)
	w.release(10, first) // the first sample starts the first window
	a, _ := w.offer(20, 1)
	b, _ := w.offer(22, 1)
	for i := range 3 {
		if _, v := w.offer(25+i, 1); v != admission.Refused {
			t.Fatalf("offer %d over a limit of 2: %v, want refused", i, v)
		}
	}
	w.release(30, a)
	w.release(32, b)
	d, _ := w.offer(105, 1)
	w.release(115, d) // closes window 1 (10-115 ms): three refused
	c, _ := w.offer(120, 1)
	w.release(130, c)
	e, _ := w.offer(210, 1)
	w.release(220, e) // closes window 2 (115-220 ms): none refused
	var blocked []int
	for _, win := range w.rec.windows {
		if win.Backlog != 0 {
			t.Fatalf("window %+v: nothing can wait without a queue", win)
		}
		blocked = append(blocked, win.Blocked)
	}
	if want := []int{3, 0}; !slices.Equal(blocked, want) {
		t.Fatalf("blocked per window %v, want %v", blocked, want)
	}
}

func TestAdaptiveDropsAndIgnores(t *testing.T) {
	rec := &recorder{next: func(cur float64, w limit.Window) float64 { return cur }}
	core := must(admission.NewAdaptive(admission.AdaptiveConfig{
		Algorithm: rec, InitialLimit: 8, MinLimit: 1, MaxLimit: 8, Window: 10 * time.Millisecond, MinSamples: 1,
	}))
	drive(core, t0, 3, time.Millisecond, admission.Ignore)
	drive(core, t0.Add(10*time.Millisecond), 2, time.Millisecond, admission.Dropped)
	if len(rec.windows) != 1 {
		t.Fatalf("windows %d", len(rec.windows))
	}
	if w := rec.windows[0]; w.Samples != 0 || w.Dropped != 1 {
		// The window closes at the first outcome after 10 ms: one drop, and client errors
		// (Ignore) are never samples.
		t.Fatalf("window %+v: ignored outcomes must not count, drops must", w)
	}
}

func TestAdaptiveSlowStartDoublesWhileSaturated(t *testing.T) {
	rec := &recorder{next: func(cur float64, w limit.Window) float64 { return cur + 0.5 }}
	core := must(admission.NewAdaptive(admission.AdaptiveConfig{
		Algorithm: rec, InitialLimit: 2, MinLimit: 1, MaxLimit: 64, SlowStart: time.Second,
		Window: 100 * time.Millisecond, MinSamples: 1,
	}))
	now := t0
	limits := []float64{}
	for range 4 {
		// Offer more than the limit: saturated, no sign of overload.
		lim := int(core.Stats(now).Limit)
		drive(core, now, lim+3, 20*time.Millisecond, admission.Success)
		now = now.Add(100 * time.Millisecond)
		drive(core, now, 1, 20*time.Millisecond, admission.Success)
		limits = append(limits, core.Stats(now).Limit)
	}
	// The first window measures the unloaded latency at the initial limit (the algorithm alone
	// moves it); after that each saturated window at least doubles the limit (the algorithm
	// alone would add 0.5), and never more than doubles it beyond what the algorithm asks.
	if limits[0] != 2.5 {
		t.Fatalf("limits %v: the first window must follow the algorithm only", limits)
	}
	prev := limits[0]
	for _, l := range limits[1:] {
		if l < min(2*prev, 64) || l > 2*prev+0.5 {
			t.Fatalf("limits %v from 2: slow start must double a saturated limit each window", limits)
		}
		prev = l
	}
	// A decrease ends slow start for good.
	rec.next = func(cur float64, w limit.Window) float64 { return cur / 2 }
	now = now.Add(100 * time.Millisecond)
	drive(core, now, 1, 20*time.Millisecond, admission.Success)
	half := core.Stats(now).Limit
	rec.next = func(cur float64, w limit.Window) float64 { return cur + 0.5 }
	for range 2 {
		lim := int(core.Stats(now).Limit)
		drive(core, now, lim+3, 20*time.Millisecond, admission.Success)
		now = now.Add(100 * time.Millisecond)
		drive(core, now, 1, 20*time.Millisecond, admission.Success)
	}
	if got := core.Stats(now).Limit; got > half+1.01 {
		t.Fatalf("after slow start ended the limit went %v -> %v: it must follow the algorithm only", half, got)
	}
}

func TestReservedShareForImportantRequests(t *testing.T) {
	core := must(admission.NewInflight(admission.InflightConfig{Limit: 4,
		Priorities: admission.PriorityConfig{Reserved: 0.5, ReservedFor: admission.Critical}}))
	l, _ := newLimiter(t, core)
	ctx := context.Background()
	// Sheddable traffic may use the whole limit when it is idle (borrowing)...
	for i := range 4 {
		if _, err := l.Admit(ctx, admission.Request{Priority: admission.Sheddable}); err != nil {
			t.Fatalf("sheddable %d: %v", i, err)
		}
	}
	if _, err := l.Admit(ctx, admission.Request{Priority: admission.Sheddable}); !errors.Is(err, admission.ErrConcurrencyLimit) {
		t.Fatalf("5th sheddable: %v", err)
	}
	// ...but critical requests still get their reserved half on top.
	for i := range 2 {
		if _, err := l.Admit(ctx, admission.Request{Priority: admission.Critical}); err != nil {
			t.Fatalf("critical %d within its reserved share: %v", i, err)
		}
	}
	if _, err := l.Admit(ctx, admission.Request{Priority: admission.CriticalPlus}); !errors.Is(err, admission.ErrConcurrencyLimit) {
		t.Fatalf("beyond the reserved share: %v", err)
	}
}

func TestDeadlineShorterThanExpectedWaitIsRefused(t *testing.T) {
	l, clk := newLimiter(t, must(admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1, Depth: 10, MaxWait: time.Second})))
	ctx := context.Background()
	// Teach the queue that requests hold their permit for 20 ms.
	for range 3 {
		p, _ := l.Admit(ctx, admission.Request{})
		clk.Advance(20 * time.Millisecond)
		p.Done(admission.Success)
	}
	hold, _ := l.Admit(ctx, admission.Request{})
	// Behind one in service, a new request expects ~20 ms of wait and 20 ms of service.
	now := clk.Now()
	if _, err := l.Admit(ctx, admission.Request{Deadline: now.Add(30 * time.Millisecond)}); !errors.Is(err, admission.ErrDeadline) {
		t.Fatalf("30 ms left, ~40 ms expected: %v, want deadline", err)
	}
	ch := admitAsync(l, ctx, admission.Request{Deadline: now.Add(100 * time.Millisecond)})
	waitQueued(t, l, 1)
	hold.Done(admission.Success)
	if r := <-ch; r.err != nil {
		t.Fatalf("100 ms left: %v", r.err)
	}
}

func TestTryAdmitNeverQueues(t *testing.T) {
	l, _ := newLimiter(t, must(admission.NewBoundedQueue(admission.BoundedQueueConfig{Concurrency: 1, Depth: 5, MaxWait: time.Second})))
	p, err := l.TryAdmit(admission.Request{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAdmit(admission.Request{}); !errors.Is(err, admission.ErrWouldWait) {
		t.Fatalf("second: %v, want ErrWouldWait", err)
	}
	if st := l.Stats(); st.QueuedRequests != 0 || st.InFlight != 1 {
		t.Fatalf("stats %+v: TryAdmit must leave nothing queued", st)
	}
	p.Done(admission.Success)
}

func TestClientLimits(t *testing.T) {
	cl, err := admission.NewClientLimits(admission.ClientLimitsConfig{Rate: 1, Burst: 2, MaxKeys: 3, Allow: []string{"vip"}, Deny: []string{"bad"}})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if r := cl.Check(t0, "a", 1); r != nil {
			t.Fatal(r)
		}
	}
	r := cl.Check(t0, "a", 1)
	if r == nil || r.Reason != admission.ReasonClientLimited || r.RetryAfter != time.Second {
		t.Fatalf("third from a: %v, want client_limited retry after 1s", r)
	}
	if r := cl.Check(t0, "b", 1); r != nil {
		t.Fatalf("another client has its own bucket: %v", r)
	}
	for range 10 {
		if r := cl.Check(t0, "vip", 1); r != nil {
			t.Fatalf("allow-listed: %v", r)
		}
	}
	if r := cl.Check(t0, "bad", 1); r == nil || r.Reason != admission.ReasonDenied {
		t.Fatalf("deny-listed: %v", r)
	}
	for i := range 100 {
		cl.Check(t0, string(rune('A'+i%60))+"x", 1)
	}
	if cl.Len() > 3 {
		t.Fatalf("%d keys tracked, cap 3", cl.Len())
	}
	if _, err := admission.NewClientLimits(admission.ClientLimitsConfig{Rate: 1, Burst: 1, MaxKeys: 1, Allow: []string{"x"}, Deny: []string{"x"}}); err == nil {
		t.Fatal("a key both allowed and denied must be rejected")
	}
}

func TestAdaptiveSlowStartGrowsOnDemandWithinAWindow(t *testing.T) {
	rec := &recorder{next: func(cur float64, w limit.Window) float64 { return cur }}
	core := must(admission.NewAdaptive(admission.AdaptiveConfig{
		Algorithm: rec, InitialLimit: 4, MinLimit: 1, MaxLimit: 64, SlowStart: time.Second,
		Window: 100 * time.Millisecond, MinSamples: 1,
	}))
	// The first window runs at the initial limit: it measures the unloaded latency, which growing
	// on demand would spoil.
	if got := drive(core, t0, 10, 20*time.Millisecond, admission.Success); got != 4 {
		t.Fatalf("first window: admitted %d of a burst of 10, want the initial 4", got)
	}
	if got := drive(core, t0.Add(100*time.Millisecond), 10, 20*time.Millisecond, admission.Success); got != 4 {
		t.Fatalf("until the first window closes: admitted %d, want 4", got)
	}
	// After a healthy window, a burst of 10 gets twice the window's limit without shedding.
	if got := drive(core, t0.Add(200*time.Millisecond), 10, 20*time.Millisecond, admission.Success); got != 8 {
		t.Fatalf("admitted %d of a burst of 10, want 8 (twice the limit)", got)
	}
	// Once a window shows a sign of overload, slow start is over: no more growth on demand (at
	// most the limit rounded up, its fractional part being a share of time).
	rec.next = func(cur float64, w limit.Window) float64 { return cur * 0.9 }
	drive(core, t0.Add(300*time.Millisecond), 1, 20*time.Millisecond, admission.Dropped)
	lim := core.Stats(t0).Limit
	if got := drive(core, t0.Add(400*time.Millisecond), 20, time.Millisecond, admission.Success); float64(got) > math.Ceil(lim) {
		t.Fatalf("admitted %d with limit %v after slow start ended", got, lim)
	}
}

// TestAdaptiveToleranceHidesNoiseBelowIt: a window whose median is within the tolerance reads
// to the algorithm as one without queueing; above it the median is passed as it is.
func TestAdaptiveToleranceHidesNoiseBelowIt(t *testing.T) {
	rec := &recorder{next: func(cur float64, w limit.Window) float64 { return cur }}
	core := must(admission.NewAdaptive(admission.AdaptiveConfig{
		Algorithm: rec, InitialLimit: 8, MinLimit: 1, MaxLimit: 8,
		Window: 10 * time.Millisecond, MinSamples: 1, Tolerance: 2 * time.Millisecond,
	}))
	now := t0
	for _, hold := range []time.Duration{200 * time.Microsecond, 1500 * time.Microsecond, 3 * time.Millisecond} {
		drive(core, now, 4, hold, admission.Success)
		now = now.Add(10 * time.Millisecond)
	}
	drive(core, now, 1, 3*time.Millisecond, admission.Success) // closes the last window
	if len(rec.windows) < 3 {
		t.Fatalf("windows %d, want 3", len(rec.windows))
	}
	want := []time.Duration{200 * time.Microsecond, 200 * time.Microsecond, 3 * time.Millisecond}
	for i, w := range rec.windows[:3] {
		if w.RTT != want[i] || w.MinRTT != 200*time.Microsecond {
			t.Errorf("window %d: RTT %v MinRTT %v, want RTT %v and MinRTT 200µs", i, w.RTT, w.MinRTT, want[i])
		}
	}
	if st := core.Stats(now); st.SampleRTT != 3*time.Millisecond {
		t.Errorf("stats report %v, want the measured median 3ms", st.SampleRTT)
	}
}

// TestDoneAfterSamplesTheCallersLatency: a latency the caller measured replaces the time the
// permit was held as the adaptive sample; Done keeps the held time.
func TestDoneAfterSamplesTheCallersLatency(t *testing.T) {
	rec := &recorder{next: func(cur float64, w limit.Window) float64 { return cur }}
	l, clk := newLimiter(t, must(admission.NewAdaptive(admission.AdaptiveConfig{
		Algorithm: rec, InitialLimit: 4, MinLimit: 1, MaxLimit: 4, Window: 10 * time.Millisecond, MinSamples: 1,
	})))
	ctx := context.Background()
	// The first release opens a window, the second closes it, the third closes the next.
	for i, measured := range []time.Duration{5 * time.Millisecond, 5 * time.Millisecond, 0} {
		p, err := l.Admit(ctx, admission.Request{})
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(50 * time.Millisecond)
		if !p.DoneAfter(admission.Success, measured) || p.DoneAfter(admission.Success, measured) {
			t.Fatalf("release %d: want true once, then false", i)
		}
	}
	if len(rec.windows) != 2 || rec.windows[0].RTT != 5*time.Millisecond || rec.windows[1].RTT != 50*time.Millisecond {
		t.Fatalf("windows %+v, want RTT 5ms (measured) then 50ms (held)", rec.windows)
	}
}

// TestChainPassesTheMeasuredLatencyToItsStages: in a chain, the adaptive stage samples the
// latency given to the chain's permit.
func TestChainPassesTheMeasuredLatencyToItsStages(t *testing.T) {
	rec := &recorder{next: func(cur float64, w limit.Window) float64 { return cur }}
	adaptive := must(admission.NewAdaptive(admission.AdaptiveConfig{
		Algorithm: rec, InitialLimit: 4, MinLimit: 1, MaxLimit: 4, Window: 10 * time.Millisecond, MinSamples: 1,
	}))
	bucket := must(admission.NewTokenBucket(admission.TokenBucketConfig{Rate: 1000, Burst: 10}))
	l, clk := newLimiter(t, must(admission.NewChain(bucket, adaptive)))
	for range 2 {
		p, err := l.Admit(context.Background(), admission.Request{})
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(40 * time.Millisecond)
		p.DoneAfter(admission.Success, 7*time.Millisecond)
	}
	if len(rec.windows) == 0 || rec.windows[0].RTT != 7*time.Millisecond {
		t.Fatalf("windows %+v, want the chain's measured 7ms", rec.windows)
	}
}

// TestAdaptiveQueueFollowsTheLimitAndTheLatency: with QueuePerLimit and WaitPerRTT the queue's
// depth is a share of the current limit and a waiter's bound a share of the no-load latency
// (MaxWait while that is unknown, and never beyond it); a freed slot goes to a waiter at once.
func TestAdaptiveQueueFollowsTheLimitAndTheLatency(t *testing.T) {
	limitNow := 4.0
	rec := &recorder{next: func(float64, limit.Window) float64 { return limitNow }}
	core := must(admission.NewAdaptive(admission.AdaptiveConfig{
		Algorithm: rec, InitialLimit: 4, MinLimit: 1, MaxLimit: 64, MinSamples: 4,
		QueuePerLimit: 0.5, WaitPerRTT: 0.5, MaxWait: 50 * time.Millisecond,
	}))
	var ev admission.Events
	offer := func(now time.Time) *admission.Ticket {
		tk := &admission.Ticket{}
		tk.Reset(admission.Request{Priority: admission.Critical}, now)
		core.Offer(now, tk, &ev)
		return tk
	}
	now := t0
	// Limit 4: four run, ceil(0.5 x 4) = 2 wait, the next is refused as queue-full.
	var running []*admission.Ticket
	for range 4 {
		running = append(running, offer(now))
	}
	w1, w2, full := offer(now), offer(now), offer(now)
	if w1.State() != admission.Pending || w2.State() != admission.Pending {
		t.Fatalf("waiters %v %v, want both pending", w1.State(), w2.State())
	}
	if full.State() != admission.Refused || full.Err.Reason != admission.ReasonQueueFull {
		t.Fatalf("third waiter: %v %+v, want queue-full", full.State(), full.Err)
	}
	// No latency known yet: the bound is MaxWait. A slot that frees goes to the first waiter.
	core.Advance(now.Add(49*time.Millisecond), &ev)
	if w1.State() != admission.Pending {
		t.Fatalf("w1 %v before MaxWait, want pending", w1.State())
	}
	core.Release(now.Add(20*time.Millisecond), running[0], admission.Success, &ev)
	if w1.State() != admission.Admitted || !w1.Granted.Equal(now.Add(20*time.Millisecond)) {
		t.Fatalf("w1 %v granted %v, want admitted when the slot freed", w1.State(), w1.Granted)
	}
	core.Advance(now.Add(50*time.Millisecond), &ev)
	if w2.State() != admission.Refused || w2.Err.Reason != admission.ReasonQueueTimeout {
		t.Fatalf("w2 %v %+v, want a queue timeout at MaxWait", w2.State(), w2.Err)
	}
	for _, tk := range append(running[1:], w1) {
		core.Release(now.Add(20*time.Millisecond), tk, admission.Success, &ev)
	}

	// A window of 20 ms samples teaches the no-load latency; the algorithm raises the limit to 8.
	limitNow = 8
	now = now.Add(200 * time.Millisecond)
	drive(core, now, 4, 20*time.Millisecond, admission.Success)
	if len(rec.windows) == 0 || rec.windows[len(rec.windows)-1].MinRTT != 20*time.Millisecond {
		t.Fatalf("windows %+v, want one with MinRTT 20ms", rec.windows)
	}
	now = now.Add(20 * time.Millisecond)
	for range 8 {
		offer(now)
	}
	var waiters []*admission.Ticket
	for range 5 {
		waiters = append(waiters, offer(now))
	}
	for i, w := range waiters[:4] {
		if w.State() != admission.Pending {
			t.Fatalf("waiter %d: %v, want pending (depth ceil(0.5 x 8) = 4)", i, w.State())
		}
	}
	// A full queue's Retry-After is the wait a waiter is now given: half the 20 ms no-load latency.
	if last := waiters[4]; last.State() != admission.Refused || last.Err.Reason != admission.ReasonQueueFull || last.Err.RetryAfter != 10*time.Millisecond {
		t.Fatalf("fifth waiter %v %+v, want queue-full with Retry-After 10ms", last.State(), last.Err)
	}
	// Each wait is bounded by that too.
	core.Advance(now.Add(9*time.Millisecond), &ev)
	if waiters[0].State() != admission.Pending {
		t.Fatalf("waiter %v at 9 ms, want pending", waiters[0].State())
	}
	core.Advance(now.Add(10*time.Millisecond), &ev)
	for i, w := range waiters[:4] {
		if w.State() != admission.Refused || w.Err.Reason != admission.ReasonQueueTimeout {
			t.Fatalf("waiter %d: %v %+v, want a queue timeout at 10 ms", i, w.State(), w.Err)
		}
	}
}

func TestAdaptiveQueueValidation(t *testing.T) {
	base := admission.AdaptiveConfig{Algorithm: &recorder{}, InitialLimit: 4, MinLimit: 1, MaxLimit: 8}
	for _, tc := range []struct {
		name  string
		edit  func(*admission.AdaptiveConfig)
		field string
	}{
		{"negative share", func(c *admission.AdaptiveConfig) { c.QueuePerLimit = -1; c.MaxWait = time.Millisecond }, "queue.depthPerLimit"},
		{"share without a wait", func(c *admission.AdaptiveConfig) { c.QueuePerLimit = 0.5 }, "queue.maxWait"},
		{"negative wait share", func(c *admission.AdaptiveConfig) { c.WaitPerRTT = -0.1 }, "queue.waitPerRTT"},
		{"negative lead share", func(c *admission.AdaptiveConfig) { c.LeadShare = -0.1 }, "queue.leadShare"},
		{"lead share over half", func(c *admission.AdaptiveConfig) { c.LeadShare = 0.6 }, "queue.leadShare"},
		{"lead share NaN", func(c *admission.AdaptiveConfig) { c.LeadShare = math.NaN() }, "queue.leadShare"},
	} {
		c := base
		tc.edit(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v, want an error naming %s", tc.name, err, tc.field)
		}
	}
}

// TestAdaptiveQueueLIFO: with QueueLIFO a freed slot goes to the newest waiter of the most
// important level; the oldest keeps waiting until its bound.
func TestAdaptiveQueueLIFO(t *testing.T) {
	core := must(admission.NewAdaptive(admission.AdaptiveConfig{
		Algorithm:    &recorder{next: func(cur float64, _ limit.Window) float64 { return cur }},
		InitialLimit: 2, MinLimit: 1, MaxLimit: 8, MinSamples: 100,
		QueuePerLimit: 1, MaxWait: 50 * time.Millisecond, QueueLIFO: true,
	}))
	var ev admission.Events
	offer := func(now time.Time, p admission.Priority) *admission.Ticket {
		tk := &admission.Ticket{}
		tk.Reset(admission.Request{Priority: p}, now)
		core.Offer(now, tk, &ev)
		return tk
	}
	a, b := offer(t0, admission.Critical), offer(t0, admission.Critical)
	old := offer(t0.Add(time.Millisecond), admission.Critical)
	fresh := offer(t0.Add(2*time.Millisecond), admission.Critical)
	core.Release(t0.Add(5*time.Millisecond), a, admission.Success, &ev)
	if fresh.State() != admission.Admitted || old.State() != admission.Pending {
		t.Fatalf("fresh %v, old %v: want the newest waiter admitted first", fresh.State(), old.State())
	}
	// A more important waiter still goes before a newer, less important one.
	low := offer(t0.Add(6*time.Millisecond), admission.Sheddable)
	core.Release(t0.Add(7*time.Millisecond), b, admission.Success, &ev)
	if old.State() != admission.Admitted || low.State() != admission.Pending {
		t.Fatalf("old %v, low %v: want the critical waiter before the newer sheddable one", old.State(), low.State())
	}
}

// TestAdaptiveFixedQueueKeepsItsMaxWait: a fixed depth is the user's own queue: WaitPerRTT
// shortens only the waits of the queue that follows the limit, so a learned 20 ms no-load
// latency leaves a fixed queue's 50 ms maxWait as it is.
func TestAdaptiveFixedQueueKeepsItsMaxWait(t *testing.T) {
	rec := &recorder{next: func(float64, limit.Window) float64 { return 4 }}
	core := must(admission.NewAdaptive(admission.AdaptiveConfig{
		Algorithm: rec, InitialLimit: 4, MinLimit: 1, MaxLimit: 64, MinSamples: 4,
		QueueDepth: 3, QueuePerLimit: 0.5, WaitPerRTT: 0.25, MaxWait: 50 * time.Millisecond,
	}))
	var ev admission.Events
	now := t0
	// Two windows of 20 ms samples: the first closes when the second begins.
	drive(core, now, 4, 20*time.Millisecond, admission.Success)
	drive(core, now.Add(200*time.Millisecond), 4, 20*time.Millisecond, admission.Success)
	if len(rec.windows) == 0 || rec.windows[len(rec.windows)-1].MinRTT != 20*time.Millisecond {
		t.Fatalf("windows %+v, want one with MinRTT 20ms", rec.windows)
	}
	now = now.Add(time.Second)
	var tickets []*admission.Ticket
	for range 8 {
		tk := &admission.Ticket{}
		tk.Reset(admission.Request{}, now)
		core.Offer(now, tk, &ev)
		tickets = append(tickets, tk)
	}
	w := tickets[4]
	if w.State() != admission.Pending || tickets[6].State() != admission.Pending || tickets[7].State() != admission.Refused {
		t.Fatalf("fifth %v, seventh %v, eighth %v: want pending, pending, refused (the fixed depth 3 wins over the share's 2)",
			w.State(), tickets[6].State(), tickets[7].State())
	}
	core.Advance(now.Add(49*time.Millisecond), &ev)
	if w.State() != admission.Pending {
		t.Fatalf("waiter %v at 49 ms, want pending until the fixed queue's maxWait", w.State())
	}
	core.Advance(now.Add(50*time.Millisecond), &ev)
	if w.State() != admission.Refused || w.Err.Reason != admission.ReasonQueueTimeout {
		t.Fatalf("waiter %v %+v at 50 ms, want a queue timeout", w.State(), w.Err)
	}
}

// meanInFlight keeps the core saturated for d on a fake clock, 1 ms per step: every request
// is held for hold, and each step offers requests until one is refused (no queue). It returns
// the time-average of the requests in flight and the most ever in flight.
func meanInFlight(c admission.Core, d, hold time.Duration) (mean float64, most int64) {
	var ev admission.Events
	type held struct {
		t   *admission.Ticket
		end time.Time
	}
	var running []held
	var sum float64
	steps := int(d / time.Millisecond)
	for i := range steps {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		kept := running[:0]
		for _, h := range running {
			if !now.Before(h.end) {
				c.Release(now, h.t, admission.Success, &ev)
				continue
			}
			kept = append(kept, h)
		}
		running = kept
		for {
			t := &admission.Ticket{}
			t.Reset(admission.Request{}, now)
			if c.Offer(now, t, &ev) != admission.Admitted {
				break
			}
			running = append(running, held{t, now.Add(hold)})
		}
		n := c.Stats(now).InFlight
		most = max(most, n)
		sum += float64(n)
	}
	return sum / float64(steps), most
}

// An adaptive limit's fractional part is enforced as a share of time: at 4.5 a fifth request
// is in flight about half the time, never a sixth; a whole limit is enforced exactly.
func TestAdaptiveFractionalLimitIsATimeShare(t *testing.T) {
	for _, lim := range []float64{4, 4.25, 4.5, 4.9} {
		core := must(admission.NewAdaptive(admission.AdaptiveConfig{
			Algorithm:    &recorder{next: func(cur float64, w limit.Window) float64 { return cur }},
			InitialLimit: lim, MinLimit: 1, MaxLimit: 8,
		}))
		mean, most := meanInFlight(core, 20*time.Second, 40*time.Millisecond)
		if mean < lim-0.06 || mean > lim+0.06 {
			t.Errorf("limit %v: %.3f in flight on average, want %v within 0.06", lim, mean, lim)
		}
		if want := int64(math.Ceil(lim)); most != want {
			t.Errorf("limit %v: at most %d in flight, want %d", lim, most, want)
		}
	}
}

// A waiter takes the permit the fractional part lends when its credit returns, with no release
// to wake it: Wake names that moment and Advance admits it then, not a moment before.
func TestAdaptiveFractionalPermitWakesAWaiter(t *testing.T) {
	core := must(admission.NewAdaptive(admission.AdaptiveConfig{
		Algorithm:    &recorder{next: func(cur float64, w limit.Window) float64 { return cur }},
		InitialLimit: 1.5, MinLimit: 1, MaxLimit: 4, QueueDepth: 4, MaxWait: 10 * time.Second,
	}))
	var ev admission.Events
	offer := offerer(core, &ev)
	// One request of 40 ms teaches the mean hold, which bounds the credit.
	warm := offer(t0)
	core.Release(t0.Add(40*time.Millisecond), warm, admission.Success, &ev)
	// 60 ms later the credit stands at 30 ms: a second request takes the lent permit, a third waits.
	t1 := t0.Add(100 * time.Millisecond)
	a, b, c := offer(t1), offer(t1), offer(t1)
	if a.State() != admission.Admitted || b.State() != admission.Admitted || c.State() != admission.Pending {
		t.Fatalf("states %v %v %v, want admitted, admitted (the lent permit), pending", a.State(), b.State(), c.State())
	}
	// Held 100 ms at half the rate it earns, the lent permit leaves the credit at -20 ms: its
	// release does not admit the waiter, which gets it 40 ms later when the credit returns.
	t2 := t1.Add(100 * time.Millisecond)
	core.Release(t2, b, admission.Success, &ev)
	if c.State() != admission.Pending {
		t.Fatalf("waiter %v at the release, want still pending (credit spent)", c.State())
	}
	want := t2.Add(40*time.Millisecond + time.Microsecond)
	if w := core.Wake(); !w.Equal(want) {
		t.Fatalf("Wake %v, want %v (when the credit turns positive)", w.Sub(t0), want.Sub(t0))
	}
	core.Advance(want.Add(-2*time.Microsecond), &ev)
	if c.State() != admission.Pending {
		t.Fatal("admitted before the credit returned")
	}
	core.Advance(want, &ev)
	if c.State() != admission.Admitted {
		t.Fatalf("waiter %v when the credit returned, want admitted", c.State())
	}
}

// The lead: a request in flight for the expected latency less the lead lends its slot once to a
// waiter, which then reaches the upstream as the slot frees; at most an eighth of the permits
// (at least one) are lent at once, the lent slot returns when its lender is released, and a
// request overdue by more than the expected latency (a slow one) lends nothing.
func TestAdaptiveLeadLendsASlotAboutToFree(t *testing.T) {
	const lead = 500 * time.Microsecond
	core := must(admission.NewAdaptive(admission.AdaptiveConfig{
		Algorithm:    &recorder{next: func(cur float64, w limit.Window) float64 { return cur }},
		InitialLimit: 8, MinLimit: 1, MaxLimit: 16, Window: 100 * time.Millisecond, MinSamples: 1,
		QueueDepth: 8, MaxWait: 10 * time.Second, Lead: lead,
	}))
	var ev admission.Events
	offer := offerer(core, &ev)
	// A window of 20 ms exchanges teaches the expected latency.
	drive(core, t0, 8, 20*time.Millisecond, admission.Success)
	drive(core, t0.Add(100*time.Millisecond), 1, 20*time.Millisecond, admission.Success)
	if st := core.Stats(t0); st.MinRTT != 20*time.Millisecond {
		t.Fatalf("MinRTT %v, want 20ms", st.MinRTT)
	}
	at := t0.Add(time.Second)
	var held []*admission.Ticket
	for range 8 {
		held = append(held, offer(at))
	}
	w1 := offer(at)
	if w1.State() != admission.Pending {
		t.Fatalf("ninth request %v, want pending at the limit", w1.State())
	}
	due := at.Add(20*time.Millisecond - lead)
	if w := core.Wake(); !w.Equal(due) {
		t.Fatalf("Wake at %v, want %v (the oldest request about to finish)", w.Sub(at), due.Sub(at))
	}
	core.Advance(due.Add(-time.Microsecond), &ev)
	if w1.State() != admission.Pending {
		t.Fatal("admitted before a slot was about to free")
	}
	core.Advance(due, &ev)
	if w1.State() != admission.Admitted || core.Stats(due).InFlight != 9 {
		t.Fatalf("waiter %v with %d in flight, want admitted on a lent slot, 9 in flight", w1.State(), core.Stats(due).InFlight)
	}
	// One slot lent is the most on 8 permits: the next waiter waits though seven more are due.
	w2 := offer(due)
	if w2.State() != admission.Pending {
		t.Fatalf("second waiter %v, want pending (one lent slot at most on 8 permits)", w2.State())
	}
	// The lender finishes: its slot is the borrower's already, and lending is free again for the
	// next request about to finish.
	end := at.Add(20 * time.Millisecond)
	core.Release(end, held[0], admission.Success, &ev)
	if w2.State() != admission.Admitted || core.Stats(end).InFlight != 9 {
		t.Fatalf("second waiter %v with %d in flight, want admitted on the next lent slot, 9 in flight", w2.State(), core.Stats(end).InFlight)
	}
	for _, tk := range append(held[1:], w1, w2) {
		core.Release(end.Add(20*time.Millisecond), tk, admission.Success, &ev)
	}
	// Eight requests far past their expected finish (slow ones) lend nothing.
	late := end.Add(time.Second)
	held = held[:0]
	for range 8 {
		held = append(held, offer(late))
	}
	slow := late.Add(45 * time.Millisecond) // 25 ms past the expected finish, more than 20 ms
	w3 := offer(slow)
	core.Advance(slow, &ev)
	if w3.State() != admission.Pending {
		t.Fatalf("waiter %v behind slow requests, want pending", w3.State())
	}
	for _, tk := range held {
		core.Release(slow.Add(time.Millisecond), tk, admission.Success, &ev)
	}
	if w3.State() != admission.Admitted {
		t.Fatalf("waiter %v after the releases, want admitted", w3.State())
	}
	core.Release(slow.Add(20*time.Millisecond), w3, admission.Success, &ev)
}

// offerer returns a function that offers a fresh ticket on core at a time and returns it.
func offerer(core admission.Core, ev *admission.Events) func(time.Time) *admission.Ticket {
	return func(now time.Time) *admission.Ticket {
		tk := &admission.Ticket{}
		tk.Reset(admission.Request{}, now)
		core.Offer(now, tk, ev)
		return tk
	}
}

// leadCore is an adaptive core with one permit, the given lead and a recorded algorithm that
// keeps the limit, taught a no-load latency of 20 ms. window closes the window in progress at
// end with no sample of its own and returns it.
func leadCore(t *testing.T, lead time.Duration) (core admission.Core, ev *admission.Events, offer func(time.Time) *admission.Ticket, window func(end time.Time) limit.Window) {
	t.Helper()
	return leadShareCore(t, lead, 0)
}

// leadShareCore is leadCore with a lead share (0: the default).
func leadShareCore(t *testing.T, lead time.Duration, share float64) (core admission.Core, ev *admission.Events, offer func(time.Time) *admission.Ticket, window func(end time.Time) limit.Window) {
	t.Helper()
	rec := &recorder{next: func(cur float64, w limit.Window) float64 { return cur }}
	core = must(admission.NewAdaptive(admission.AdaptiveConfig{
		Algorithm: rec, InitialLimit: 1, MinLimit: 1, MaxLimit: 1, Window: 100 * time.Millisecond, MinSamples: 1,
		QueueDepth: 8, MaxWait: 10 * time.Second, Lead: lead, LeadShare: share,
	}))
	ev = &admission.Events{}
	offer = offerer(core, ev)
	drive(core, t0, 1, 20*time.Millisecond, admission.Success)
	drive(core, t0.Add(100*time.Millisecond), 1, 20*time.Millisecond, admission.Success)
	if st := core.Stats(t0); st.MinRTT != 20*time.Millisecond {
		t.Fatalf("MinRTT %v, want 20ms", st.MinRTT)
	}
	window = func(end time.Time) limit.Window {
		t.Helper()
		n := len(rec.windows)
		drive(core, end, 1, 20*time.Millisecond, admission.Ignore)
		if len(rec.windows) != n+1 {
			t.Fatalf("%d windows closed, want 1", len(rec.windows)-n)
		}
		return rec.windows[n]
	}
	return core, ev, offer, window
}

// A borrower holds its lender's slot from the lender's release: its latency sample starts there,
// so the time it waited inside the upstream for that slot (the lead's own wait, at most the
// lead) is not read as a queue the limit holds; and a lender released late makes its borrower's
// expected finish, and so its own lend, later by as much, instead of a chain of borrowers lending
// ever earlier than their slots free.
func TestAdaptiveLeadBorrowerCountsFromTheFreedSlot(t *testing.T) {
	const lead = 500 * time.Microsecond
	const ms = time.Millisecond
	core, ev, offer, window := leadCore(t, lead)
	// lent starts a request, lets a second borrow its slot the lead before it is expected to
	// finish, and releases the first at freed with an exchange of rtt; it returns the borrower.
	lent := func(at, freed time.Time, rtt time.Duration) *admission.Ticket {
		t.Helper()
		a, b := offer(at), offer(at)
		core.Advance(at.Add(20*ms-lead), ev)
		if a.State() != admission.Admitted || b.State() != admission.Admitted {
			t.Fatalf("states %v %v, want both admitted (the second on the slot the first lends)", a.State(), b.State())
		}
		a.RTT = rtt
		core.Release(freed, a, admission.Success, ev)
		return b
	}

	// On time: the borrower set out 19.5 ms after its lender and waited 0.5 ms inside the
	// upstream; counted from the freed slot, it took the upstream's 20 ms.
	at := t0.Add(time.Second)
	b := lent(at, at.Add(20*ms), 20*ms)
	b.RTT = 20500 * time.Microsecond
	core.Release(at.Add(40*ms), b, admission.Success, ev)
	if w := window(at.Add(200 * ms)); w.Samples != 1 || w.RTT != 20*ms {
		t.Fatalf("borrower's window: %d samples, median %v, want its one sample of 20ms (from the freed slot)", w.Samples, w.RTT)
	}

	// Late: the lender's exchange took 23 ms. The borrower's next lend waits for one latency
	// from the freed slot, and its sample, 23.5 ms from when it set out, is shortened by no
	// more than the lead.
	at = at.Add(time.Second)
	freed := at.Add(23 * ms)
	b = lent(at, freed, 23*ms)
	c := offer(freed)
	due := freed.Add(20*ms - lead)
	if w := core.Wake(); !w.Equal(due) {
		t.Fatalf("Wake at %v, want %v (one latency from the freed slot, less the lead)", w.Sub(at), due.Sub(at))
	}
	core.Advance(due, ev)
	if c.State() != admission.Admitted {
		t.Fatalf("third request %v at %v, want admitted on the slot the borrower lends", c.State(), due.Sub(at))
	}
	b.RTT = 23500 * time.Microsecond
	core.Release(freed.Add(20*ms), b, admission.Success, ev)
	core.Release(freed.Add(40*ms), c, admission.Ignore, ev)
	if w := window(at.Add(200 * ms)); w.Samples != 1 || w.RTT != 23*ms {
		t.Fatalf("late lender's borrower: %d samples, median %v, want one of 23ms (23.5 less the lead)", w.Samples, w.RTT)
	}
}

// The lead in effect is at most LeadShare of the expected latency (a twentieth by default),
// whatever is configured, and so is what a borrower's sample may be shortened by: a lender whose
// client read its answer 3 ms late on a 20 ms upstream shortens its borrower's 23.5 ms by 1 ms
// (2 ms at a share of a tenth), not by the 5 ms configured.
func TestAdaptiveLeadShortensASampleByAtMostTheLeadInEffect(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		share    float64
		inEffect time.Duration
	}{{0, ms}, {0.1, 2 * ms}} {
		core, ev, offer, window := leadShareCore(t, 5*ms, tc.share)
		at := t0.Add(time.Second)
		a, b := offer(at), offer(at)
		early := at.Add(20*ms - tc.inEffect)
		core.Advance(early.Add(-time.Microsecond), ev)
		if b.State() != admission.Pending {
			t.Fatalf("share %v: borrower %v more than %v early, want pending", tc.share, b.State(), tc.inEffect)
		}
		core.Advance(early, ev)
		if a.State() != admission.Admitted || b.State() != admission.Admitted {
			t.Fatalf("share %v: states %v %v, want both admitted %v before the expected finish", tc.share, a.State(), b.State(), tc.inEffect)
		}
		a.RTT = 20 * ms // its exchange took 20 ms; its client took 3 ms more to read the answer
		core.Release(at.Add(23*ms), a, admission.Success, ev)
		b.RTT = 23500 * time.Microsecond
		core.Release(at.Add(43*ms), b, admission.Success, ev)
		want := 23500*time.Microsecond - tc.inEffect
		if w := window(at.Add(200 * ms)); w.Samples != 1 || w.RTT != want {
			t.Fatalf("share %v: borrower's window: %d samples, median %v, want one of %v (23.5 less the lead in effect)", tc.share, w.Samples, w.RTT, want)
		}
	}
}
