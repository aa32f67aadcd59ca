package limit

import (
	"fmt"
	"math"
	"testing"
	"time"
)

const ms = time.Millisecond

// step is one recorded window and the limit Update must return for it; steps run in order and
// each starts from the previous step's result.
type step struct {
	what string
	w    Window
	want float64
}

func runSteps(t *testing.T, a Algorithm, limit float64, steps []step) {
	t.Helper()
	for i, s := range steps {
		got := a.Update(limit, s.w)
		if math.Abs(got-s.want) > 1e-9*math.Max(1, math.Abs(s.want)) {
			t.Fatalf("step %d (%s): Update(%v, %+v) = %v, want %v", i, s.what, limit, s.w, got, s.want)
		}
		limit = got
	}
}

// win is a window of 50 successful samples.
func win(rtt, minRTT time.Duration, inflight int) Window {
	return Window{Samples: 50, RTT: rtt, MinRTT: minRTT, MaxInFlight: inflight}
}

// rttForQueue returns a window RTT for which ceil(n x (1 - minRTT/RTT)) = q, placing
// n x (1 - minRTT/RTT) at q - 0.5 so rounding cannot move it.
func rttForQueue(n, q int, minRTT time.Duration) time.Duration {
	if q == 0 {
		return minRTT
	}
	return time.Duration(float64(minRTT) / (1 - (float64(q)-0.5)/float64(n)))
}

func newAlg[C any](t *testing.T, ctor func(C) (Algorithm, error), c C) Algorithm {
	t.Helper()
	a, err := ctor(c)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestAIMD(t *testing.T) {
	t.Run("sidecar, 25% buffer and no rest", func(t *testing.T) {
		a := newAlg(t, NewAIMD, DefaultAIMD())
		runSteps(t, a, 4, []step{
			{"unloaded: +1", win(20*ms, 20*ms, 4), 5},
			{"unloaded: +1", win(20*ms, 20*ms, 5), 6},
			{"app-limited (2*2 < 6): hold", win(20*ms, 20*ms, 2), 6},
			{"half the limit in flight is enough to grow", win(20*ms, 20*ms, 3), 7},
			{"RTT at exactly the tolerance is not slow", win(22*ms, 20*ms, 7), 8},
			{"RTT above the tolerance: backoff", win(23*ms, 20*ms, 8), 7.2},
			{"a drop: backoff", Window{Samples: 40, Dropped: 1, RTT: 20 * ms, MinRTT: 20 * ms, MaxInFlight: 7}, 6.48},
			{"drops without any sample: backoff", Window{Dropped: 3}, 5.832},
			{"no samples: hold", Window{}, 5.832},
			{"MinRTT unknown, RTT fine: +1", win(40*ms, 0, 6), 6.832},
			{"above the absolute timeout: backoff", win(6*time.Second, 0, 6), 6.832 * 0.9},
		})
	})
	t.Run("field", func(t *testing.T) {
		a := newAlg(t, NewAIMD, FieldAIMD())
		runSteps(t, a, 20, []step{
			{"RTT 10x MinRTT is not slow without rttTolerance", win(200*ms, 20*ms, 20), 21},
			{"above the 5 s timeout: backoff", win(5001*ms, 20*ms, 21), 18.9},
			{"a drop: backoff", Window{Samples: 1, Dropped: 1, RTT: 20 * ms, MinRTT: 20 * ms, MaxInFlight: 20}, 17.01},
		})
	})
}

func TestVegasThresholdsLg1(t *testing.T) {
	// L = 10: lg = 1, so alpha 3, beta 6, threshold 1 (field).
	const l, m = 10, 20 * ms
	cases := []struct {
		queue int
		want  float64
	}{
		{0, 16}, {1, 16}, // queue <= threshold: L + beta
		{2, 11},                            // queue < alpha: L + lg
		{3, 10}, {4, 10}, {5, 10}, {6, 10}, // alpha <= queue <= beta: hold
		{7, 9}, {9, 9}, // queue > beta: L - lg
	}
	for _, c := range cases {
		a := newAlg(t, NewVegas, FieldVegas())
		if got := a.Update(l, win(rttForQueue(l, c.queue, m), m, l)); got != c.want {
			t.Errorf("queue %d: Update = %v, want %v", c.queue, got, c.want)
		}
	}
}

func TestVegasThresholdsLg2(t *testing.T) {
	// L = 150: lg = 2, so alpha 6, beta 12, threshold 2 (field).
	const l, m = 150, 20 * ms
	cases := []struct {
		queue int
		want  float64
	}{
		{2, 162},           // queue <= threshold: L + beta
		{3, 152}, {5, 152}, // queue < alpha: L + lg
		{6, 150}, {12, 150}, // hold
		{13, 148}, // queue > beta: L - lg
	}
	for _, c := range cases {
		a := newAlg(t, NewVegas, FieldVegas())
		if got := a.Update(l, win(rttForQueue(l, c.queue, m), m, l)); got != c.want {
			t.Errorf("queue %d: Update = %v, want %v", c.queue, got, c.want)
		}
	}
}

func TestVegas(t *testing.T) {
	const m = 20 * ms
	t.Run("sidecar, 25% buffer and no rest", func(t *testing.T) {
		// The steps measure one request of queue exactly; the noise band is tested on its own.
		c := DefaultVegas()
		c.NoiseBand = 0
		a := newAlg(t, NewVegas, c)
		runSteps(t, a, 8, []step{
			{"no queue: + beta (0.9)", win(m, m, 8), 8.9},
			{"no queue: + 0.9", win(m, m, 8), 9.8},
			{"one queued request is above beta: drain it", win(rttForQueue(9, 1, m), m, 9), 8.8},
			{"app-limited: hold", win(m, m, 4), 8.8},
			{"five queued: drain all five at once", win(rttForQueue(8, 5, m), m, 8), 3.8},
			{"a drop: x0.9", Window{Dropped: 2, MaxInFlight: 3}, 3.42},
			{"MinRTT unknown: hold", win(m, 0, 3), 3.42},
			{"no samples: hold", Window{MaxInFlight: 3}, 3.42},
		})
	})
	t.Run("field drop and decrease", func(t *testing.T) {
		a := newAlg(t, NewVegas, FieldVegas())
		runSteps(t, a, 30, []step{
			{"a drop: L - lg", Window{Dropped: 1}, 29},
			{"queue 20 > beta: L - lg only", win(rttForQueue(29, 20, m), m, 29), 28},
			{"app-limited (13*2 < 28): hold", win(m, m, 13), 28},
		})
	})
}

func TestGradient(t *testing.T) {
	const m = 20 * ms
	t.Run("field", func(t *testing.T) {
		a := newAlg(t, NewGradient, FieldGradient())
		l := 16.0
		// Unloaded: gradient 1.25, then + sqrt.
		if got, want := a.Update(l, win(m, m, 16)), 20+math.Sqrt(20); math.Abs(got-want) > 1e-9 {
			t.Errorf("unloaded: %v, want %v", got, want)
		}
		// Clamp at 2: RTT far below MinRTT*1.25 (cannot happen with a windowed minimum, but the
		// formula must hold).
		if got, want := a.Update(l, win(m/10, m, 16)), 32+math.Sqrt(32); math.Abs(got-want) > 1e-9 {
			t.Errorf("clamped at 2: %v, want %v", got, want)
		}
		// Clamp at 0.5: RTT 10x.
		if got, want := a.Update(l, win(10*m, m, 16)), 8+math.Sqrt(8); math.Abs(got-want) > 1e-9 {
			t.Errorf("clamped at 0.5: %v, want %v", got, want)
		}
		// RTT up 50%: gradient 1.25/1.5.
		if got, want := a.Update(l, win(30*ms, m, 16)), 16*1.25/1.5+math.Sqrt(16*1.25/1.5); math.Abs(got-want) > 1e-9 {
			t.Errorf("RTT +50%%: %v, want %v", got, want)
		}
		// Envoy ignores drops and app-limited windows.
		if got, want := a.Update(l, Window{Samples: 10, Dropped: 5, RTT: m, MinRTT: m, MaxInFlight: 1}), 20+math.Sqrt(20); math.Abs(got-want) > 1e-9 {
			t.Errorf("drops, app-limited: %v, want %v", got, want)
		}
	})
	t.Run("sidecar, 25% buffer and no rest", func(t *testing.T) {
		a := newAlg(t, NewGradient, bufferGradient())
		// Sidecar: buffer 25%, +0.5 headroom while growing, drain to the served concurrency.
		l1 := 8*1.25 + 0.5
		l2 := l1*1.25/1.05 + 0.5
		l3 := l2 / 1.3
		runSteps(t, a, 8, []step{
			{"unloaded: x1.25 + 0.5", win(m, m, 8), l1},
			{"RTT within the buffer: x 1.25/1.05 + 0.5", win(21*ms, m, 10), l2},
			{"RTT +30%: drain to the served concurrency L/1.3", win(26*ms, m, 12), l3},
			{"RTT 10x: drain clamped at 0.5", win(10*m, m, 7), l3 / 2},
			{"app-limited: no increase", win(m, m, 1), l3 / 2},
			{"a drop: x0.9", Window{Samples: 10, Dropped: 1, RTT: m, MinRTT: m, MaxInFlight: 4}, l3 / 2 * 0.9},
			{"MinRTT unknown: hold", win(m, 0, 4), l3 / 2 * 0.9},
		})
	})
	t.Run("defaults rest at the knee and probe above it", func(t *testing.T) {
		a := newAlg(t, NewGradient, DefaultGradient())
		h := DefaultGradient().Hold
		// 8 workers x 20 ms behind a limit of 10 with requests waiting: 40 completions in 100 ms
		// at MinRTT 20 ms served 8 at once; RTT 25 ms.
		knee := Window{Samples: 40, RTT: 25 * ms, MinRTT: m, MaxInFlight: 10, Backlog: 3, Duration: 100 * ms}
		clean := Window{Samples: 40, RTT: m, MinRTT: m, MaxInFlight: 8, Backlog: 3, Duration: 100 * ms}
		steps := []step{{"the knee: land on the served 8", knee, 8}}
		for i := range h {
			steps = append(steps, step{fmt.Sprintf("rest %d of %d", i+1, h), clean, 8})
		}
		// The probe: one more (headroom 0.5, in whole steps), then a window to let it act, then
		// judged by what was served.
		steps = append(steps, step{"probe +1", clean, 9}, step{"let the step act", clean, 9},
			step{"served 8 again, not half the step more: back to 8", clean, 8})
		for i := range 2 * h {
			steps = append(steps, step{fmt.Sprintf("rest %d of %d (doubled)", i+1, 2*h), clean, 8})
		}
		more := clean
		more.Samples, more.MaxInFlight = 44, 9 // served 8.8: a step of 1 used
		more2 := more
		more2.Samples = 48
		steps = append(steps, step{"probe +1", clean, 9}, step{"let the step act", more, 9},
			step{"served 8.8: looks used, confirm over a window", more, 9},
			step{"served 8.8 again: the knee moved, grow x1.05 + 0.5, whole", more, math.Round(9*1.05 + 0.5)},
			step{"let the step act", more2, 10})
		runSteps(t, a, 10, steps)
		if g := a.(*gradient); g.rest != DefaultGradient().Hold {
			t.Errorf("after a used step the next rest is %d windows, want %d", g.rest, DefaultGradient().Hold)
		}
	})
	t.Run("a slow window below the knee returns to it", func(t *testing.T) {
		a := newAlg(t, NewGradient, DefaultGradient())
		h := DefaultGradient().Hold
		at := func(l float64, rtt time.Duration) Window {
			// 8 workers x 20 ms behind a limit of l with requests waiting.
			return Window{Samples: int(math.Min(l, 8) * 5), RTT: rtt, MinRTT: m, MaxInFlight: int(l), Backlog: 3, Duration: 100 * ms}
		}
		steps := []step{{"the knee: land on the served 8", at(10, 25*ms), 8}}
		for range h {
			steps = append(steps, step{"rest", at(8, m), 8})
		}
		steps = append(steps, step{"probe +1", at(8, m), 9}, step{"let it act", at(9, m), 9},
			step{"unused: back to 8, the knee", at(9, m), 8},
			// Recorded at 5x on a busy node: one window 7% slow (the node stalled), served 7.2.
			step{"one slow window: drain to 7", Window{Samples: 36, RTT: 21400 * time.Microsecond, MinRTT: m, MaxInFlight: 8, Backlog: 2, Duration: 100 * ms}, 7},
			step{"rest a window", at(7, m), 7},
			step{"back to the knee", at(7, m), 8})
		for i := range 2 * h {
			steps = append(steps, step{fmt.Sprintf("rest %d of %d at the knee", i+1, 2*h), at(8, m), 8})
		}
		runSteps(t, a, 10, steps)

		// A worker fewer: the return to the knee drains again, and the knee is forgotten.
		b := newAlg(t, NewGradient, DefaultGradient())
		seven := func(l float64) Window {
			// 7 workers: above 7 the requests queue, the median by l/7.
			return Window{Samples: int(math.Min(l, 7) * 5), RTT: time.Duration(float64(m) * math.Max(l/7, 1)), MinRTT: m, MaxInFlight: int(l), Backlog: 3, Duration: 100 * ms}
		}
		steps = []step{{"the knee: land on the served 8", at(10, 25*ms), 8}}
		for range h {
			steps = append(steps, step{"rest", at(8, m), 8})
		}
		steps = append(steps, step{"probe +1", at(8, m), 9}, step{"let it act", at(9, m), 9},
			step{"unused: back to 8", at(9, m), 8},
			step{"a worker fewer: drain to the served 7", seven(8), 7},
			step{"rest a window", seven(7), 7},
			step{"back to the knee", seven(7), 8},
			step{"slow again: drain to 7, the knee is gone", seven(8), 7})
		for i := range 2 * h {
			steps = append(steps, step{fmt.Sprintf("rest %d of %d at 7", i+1, 2*h), seven(7), 7})
		}
		runSteps(t, b, 10, steps)
	})
	t.Run("a step waits for a window run under the limit after a drain", func(t *testing.T) {
		a := newAlg(t, NewGradient, DefaultGradient())
		a.(*gradient).ran = 11 // the last window ran under 11, and drained to 7.04
		// Recorded at 5x on 8 workers x 20 ms: after a drain from 11 to 7.04 the next window
		// still completed requests admitted under 11 (served 7.91); a step to 8 judged against
		// it, serving 7.76, looked unused.
		runSteps(t, a, 7.04, []step{
			{"served 7.91, admitted under 11: no step", Window{Samples: 40, RTT: 20570 * time.Microsecond, MinRTT: 20570 * time.Microsecond, MaxInFlight: 8, Backlog: 1, Duration: 104 * ms}, 7.04},
			{"served 7.12 under 7.04: grow to a whole 8", Window{Samples: 36, RTT: 20570 * time.Microsecond, MinRTT: 20570 * time.Microsecond, MaxInFlight: 8, Backlog: 1, Duration: 104 * ms}, 8},
			{"let it act", Window{Samples: 39, RTT: 20490 * time.Microsecond, MinRTT: 20490 * time.Microsecond, MaxInFlight: 9, Duration: 103 * ms}, 8},
			{"served 7.76, over 7.12 + half the step: confirm", Window{Samples: 39, RTT: 20490 * time.Microsecond, MinRTT: 20490 * time.Microsecond, MaxInFlight: 9, Backlog: 2, Duration: 103 * ms}, 8},
			{"and again: used, grow", Window{Samples: 39, RTT: 20490 * time.Microsecond, MinRTT: 20490 * time.Microsecond, MaxInFlight: 9, Backlog: 2, Duration: 103 * ms}, 9},
		})
	})
	t.Run("a first step without a rest is judged against at most its limit", func(t *testing.T) {
		// Recorded at 5x on 8 workers x 20 ms (the bench's trace): slow start overshot to 22,
		// a drain from 11 landed nowhere at 7.48, and the first step to 8 was judged against
		// the one window before it, which read 8.3 by the workers' phases. Serving 8.0 looked
		// unused: the limit landed on 7, marked it as the knee and rested there for the run.
		a := newAlg(t, NewGradient, DefaultGradient())
		a.(*gradient).ran = 7.48
		const m = 20500 * time.Microsecond
		at := func(n int, d time.Duration) Window {
			return Window{Samples: n, RTT: m, MinRTT: m, MaxInFlight: 9, Blocked: 200, Duration: d}
		}
		runSteps(t, a, 7.48, []step{
			{"served 8.3 under 7.48: step to a whole 8, against 7.48", at(42, 103730*time.Microsecond), 8},
			{"let it act", at(40, 102500*time.Microsecond), 8},
			{"served 8.0, over 7.48 + half the step: confirm", at(40, 102500*time.Microsecond), 8},
			{"and again: used, grow", at(40, 102500*time.Microsecond), 9},
		})
	})
	t.Run("a probe's baseline is what was served, above the limit or not", func(t *testing.T) {
		// 8 workers x 20 ms behind a limit of 8: a window's completions wander with the
		// workers' phases (served 7.2-8.9 in recorded runs), and here the rest read 8.6. A step
		// to 9 that served as much judged against the limit (8) instead looked used; capping
		// the baseline at the limit cuts its high readings and keeps its low ones.
		a := newAlg(t, NewGradient, DefaultGradient())
		h := DefaultGradient().Hold
		const m = 22 * time.Millisecond
		at := func(l float64, rtt time.Duration) Window {
			return Window{Samples: 43, RTT: rtt, MinRTT: m, MaxInFlight: int(l) + 1, Blocked: 60, Duration: 110 * ms}
		}
		knee := at(10, 27500*time.Microsecond)
		knee.Samples = 42 // served 8.4, the drain 8: rounds to 8
		steps := []step{{"the knee: land on 8", knee, 8}}
		for i := range h {
			steps = append(steps, step{fmt.Sprintf("rest %d of %d", i+1, h), at(8, m), 8})
		}
		steps = append(steps, step{"probe +1", at(8, m), 9}, step{"let it act", at(9, m), 9},
			step{"served 8.6 again, not half the step more: back to 8", at(9, m), 8})
		runSteps(t, a, 10, steps)
	})
	t.Run("a probe is judged against its rest's mean, and a used one confirmed", func(t *testing.T) {
		// Recorded at 5x on 8 workers x 20 ms: a window holds 40 completions of 8 constant-time
		// workers, 36 to 45 by their phases, so one window's served concurrency wanders by
		// about as much as a step of one. A step to 9 judged against the window before it
		// (7.68) by the next one (8.60) looked used; the limit went on to 10, landed on 9 and
		// rested there with a request waiting inside the upstream.
		a := newAlg(t, NewGradient, DefaultGradient())
		h := DefaultGradient().Hold
		const m = 20510 * time.Microsecond
		at := func(n int, d time.Duration) Window {
			return Window{Samples: n, RTT: m, MinRTT: m, MaxInFlight: 10, Blocked: 200, Duration: d}
		}
		knee := at(40, 103500*time.Microsecond)
		knee.RTT = 25600 * time.Microsecond
		steps := []step{{"the knee: land on 8", knee, 8}}
		for i := range h {
			steps = append(steps, step{fmt.Sprintf("rest %d of %d, served 7.93", i+1, h), at(40, 103500*time.Microsecond), 8})
		}
		steps = append(steps, step{"served 7.68: probe +1 against the rest's 7.93", at(39, 104200*time.Microsecond), 9},
			step{"let it act", at(40, 103500*time.Microsecond), 9},
			step{"served 8.60: looks used, confirm", at(43, 102600*time.Microsecond), 9},
			step{"served 7.87: 8.24 on the two, not half the step more: back to 8", at(40, 104200*time.Microsecond), 8})
		runSteps(t, a, 10, steps)
	})
	t.Run("a drain lands below the limit it drained when the upstream served less", func(t *testing.T) {
		// Recorded at 5x on 4 workers x 20 ms: a step from a fractional 4.65 to 5 failed, and
		// the landing, 5 x 20.50/22.12 = 4.63 rounded, was 5 itself: marked as the knee, the
		// limit rested there with a request waiting inside the upstream (p99 40 ms).
		const m = 20500 * time.Microsecond
		at := func(l float64, rtt time.Duration) Window {
			return Window{Samples: 20, RTT: rtt, RTTNoise: 48 * time.Microsecond, MinRTT: m, MaxInFlight: int(l) + 1, Blocked: 95, Duration: 103 * ms}
		}
		a := newAlg(t, NewGradient, DefaultGradient())
		a.(*gradient).ran = 4.65
		runSteps(t, a, 4.65, []step{
			{"clean at 4.65, served 3.98: step to a whole 5", at(4.65, 20880*time.Microsecond), 5},
			{"slower, served 3.98: the step failed, land on 4, not 5", at(5, 22120*time.Microsecond), 4},
		})
		if k := a.(*gradient).knee; k != 4 {
			t.Errorf("knee after the failed step: %v, want 4", k)
		}
		// A drain at a whole limit the upstream served less than lands below it too; one at a
		// limit it served in full (a slow window of the node) stays on it.
		b := newAlg(t, NewGradient, DefaultGradient())
		b.(*gradient).ran = 5
		runSteps(t, b, 5, []step{{"5 x 20.50/22.28 = 4.6, served 3.98 of 5: land on 4", at(5, 22280*time.Microsecond), 4}})
		c := newAlg(t, NewGradient, DefaultGradient())
		c.(*gradient).ran = 4
		full := at(4, 22280*time.Microsecond)
		full.Samples = 21 // served 4.18
		runSteps(t, c, 4, []step{{"4 x 20.50/22.28 = 3.7, served 4.18 of 4: land on 4", full, 4}})
	})
	t.Run("on 2 workers a failed step to 3 lands on 2 and rests", func(t *testing.T) {
		// Recorded through the long scenario's halving (4 to 2 workers x 40 ms, 2x): a step
		// from 2 to 3 served 1.99 of the 3 it let in, under three quarters of it, and its
		// drain did not land; the limit went back to 3 three windows later, every time.
		const m = 40700 * time.Microsecond
		at := func(rtt time.Duration, inFlight int) Window {
			return Window{Samples: 10, RTT: rtt, RTTNoise: 50 * time.Microsecond, MinRTT: m, MaxInFlight: inFlight, Blocked: 37, Duration: 205 * ms}
		}
		a := newAlg(t, NewGradient, DefaultGradient())
		a.(*gradient).ran = 2
		steps := []step{
			{"clean at 2, served 1.99: step to 3", at(m, 3), 3},
			{"twice as slow, served 1.99: the step failed, land on 2", at(76350*time.Microsecond, 4), 2},
		}
		rest := 2 * DefaultGradient().Hold
		for i := range rest {
			steps = append(steps, step{fmt.Sprintf("rest %d of %d at 2", i+1, rest), at(m, 3), 2})
		}
		runSteps(t, a, 2, append(steps, step{"probe +1", at(m, 3), 3}))
		if k := a.(*gradient).knee; k != 2 {
			t.Errorf("knee after the failed step: %v, want 2", k)
		}
	})
	t.Run("a failed step from a fraction lands no lower than was served before it", func(t *testing.T) {
		// Recorded through the long scenario's halving (2 workers x 40 ms, 2x): a drain that
		// did not land left 1.883; the step to a whole 2 served 1.89 against 1.88, less than
		// half of its 0.12 more, and landed on 1, where the limit rested for the rest of the
		// run with one of the two workers idle.
		const m = 40790 * time.Microsecond
		at := func(n int, rtt time.Duration, inFlight int, d time.Duration) Window {
			return Window{Samples: n, RTT: rtt, RTTNoise: 50 * time.Microsecond, MinRTT: m, MaxInFlight: inFlight, Blocked: 39, Duration: d}
		}
		a := newAlg(t, NewGradient, DefaultGradient())
		a.(*gradient).ran = 3
		steps := []step{
			{"the window after the drain ran under 3: wait", at(10, 41260*time.Microsecond, 2, 237700*time.Microsecond), 1.883},
			{"served 1.92 under 1.883: step to a whole 2, against 1.883", at(10, 41090*time.Microsecond, 2, 212800*time.Microsecond), 2},
			{"let it act", at(10, 40840*time.Microsecond, 3, 209700*time.Microsecond), 2},
			{"served 1.89: unused, but land on 2, not 1", at(10, 41030*time.Microsecond, 3, 215300*time.Microsecond), 2},
			{"rest at 2", at(10, m, 3, 204*ms), 2},
		}
		runSteps(t, a, 1.883, steps)
		if k := a.(*gradient).knee; k != 2 {
			t.Errorf("knee after the failed step: %v, want 2", k)
		}
	})
	t.Run("a failed probe is told by the requests refused, not the last instant's queue", func(t *testing.T) {
		// Recorded at 2x on 4 workers x 20 ms with the short wait (2 ms): the queue was empty
		// when most windows closed, though half the requests were refused in each. A failed
		// probe to 5 then drained to 3.92 without landing, the next clean window probed 5
		// again, and the limit spent a tenth of the run above the workers (admitted p99 1.6x
		// the unloaded one).
		a := newAlg(t, NewGradient, DefaultGradient())
		h := DefaultGradient().Hold
		const m = 20440 * time.Microsecond
		at := func(l float64, rtt time.Duration) Window {
			// 4 workers behind a limit of l, nobody waiting at the window's end, 25 refused.
			return Window{Samples: int(math.Min(l, 4) * 5), RTT: rtt, MinRTT: m, MaxInFlight: int(l) + 1, Blocked: 25, Duration: 104 * ms}
		}
		steps := []step{{"the knee: land on the served 4", at(5, 27370*time.Microsecond), 4}}
		for i := range h {
			steps = append(steps, step{fmt.Sprintf("rest %d of %d", i+1, h), at(4, m), 4})
		}
		steps = append(steps, step{"probe +1", at(4, m), 5}, step{"let it act", at(5, m), 5},
			step{"slower: the probe failed, land back on 4", at(5, 27370*time.Microsecond), 4})
		for i := range 2 * h {
			steps = append(steps, step{fmt.Sprintf("rest %d of %d (doubled)", i+1, 2*h), at(4, m), 4})
		}
		runSteps(t, a, 5, steps)

		// Nobody refused and nobody waiting: the slower window is the upstream's own doing, the
		// limit follows it without resting.
		b := newAlg(t, NewGradient, DefaultGradient())
		idle := at(5, 27370*time.Microsecond)
		idle.Blocked = 0
		next := b.Update(5, idle)
		if next >= 4 || next < 3.7 {
			t.Fatalf("drain without demand: %v, want the unrounded served concurrency (3.7-4)", next)
		}
		if got := b.Update(next, at(next, m)); got != next {
			t.Fatalf("the clean window right after a drain without demand: %v, want %v (a step waits for a window run under the limit)", got, next)
		}
		if got := b.Update(next, at(next, m)); got <= next {
			t.Fatalf("after a drain without demand the second clean window: %v, want growth from %v", got, next)
		}
	})
	t.Run("a step the limiter overrode is no probe", func(t *testing.T) {
		// Recorded at 2x on 8 workers x 20 ms: the first window stepped 4 to 5, slow start
		// doubled the limit to 10, and the drain from 10 was judged the failure of the step
		// to 5: the limit landed on 4 and rested there 10 s.
		a := newAlg(t, NewGradient, DefaultGradient())
		const m = 20920 * time.Microsecond
		runSteps(t, a, 4, []step{
			{"a clean window at 4: step to 5", Window{Samples: 18, RTT: m, MinRTT: m, MaxInFlight: 4, Backlog: 2, Blocked: 79, Duration: 110 * ms}, 5},
		})
		runSteps(t, a, 10, []step{
			{"slow start made it 10; slower: drain, landing on 10 x 20.92/22.17 rounded", Window{Samples: 39, RTT: 22170 * time.Microsecond, MinRTT: m, MaxInFlight: 11, Blocked: 58, Duration: 104600 * time.Microsecond}, 9},
		})
	})
	t.Run("the window after a landing lags, the rest goes on", func(t *testing.T) {
		// Recorded at 5x on 4 workers x 20 ms: a failed probe landed back on 4, the next window
		// still read 6.5% slow (requests admitted under 5), and taking that for a no-load
		// latency the drains do not lower ended the rest: the next window probed 5 again.
		a := newAlg(t, NewGradient, DefaultGradient())
		h := DefaultGradient().Hold
		const m = 20610 * time.Microsecond
		at := func(l float64, rtt time.Duration) Window {
			return Window{Samples: 20, RTT: rtt, RTTNoise: 44 * time.Microsecond, MinRTT: m, MaxInFlight: int(l) + 1, Backlog: 2, Blocked: 97, Duration: 104 * ms}
		}
		clean := 20810 * time.Microsecond
		steps := []step{{"probe 5", at(4, clean), 5}, {"let it act", at(5, clean), 5},
			{"slower: failed, land back on 4", at(5, 21800*time.Microsecond), 4},
			{"the lag: as slow, hold", at(4, 21950*time.Microsecond), 4}}
		for i := range 2 * h {
			steps = append(steps, step{fmt.Sprintf("rest %d of %d", i+1, 2*h), at(4, clean), 4})
		}
		steps = append(steps, step{"then probe", at(4, clean), 5})
		runSteps(t, a, 4, steps)
	})
	t.Run("a lent slot does not keep a drain from landing", func(t *testing.T) {
		a := newAlg(t, NewGradient, DefaultGradient())
		// Recorded at 2x on 4 workers x 20 ms: at a limit of 5 the lead's slot made 6 in
		// flight, and the served 4.1 was under three quarters of 6, so every drain followed
		// to 4.1-4.4 without landing and the next whole step went back to 5.
		w := Window{Samples: 21, RTT: 25290 * time.Microsecond, MinRTT: 21 * ms, MaxInFlight: 6, Backlog: 1, Duration: 105 * ms}
		runSteps(t, a, 5, []step{
			{"land on the served 4.2, rounded", w, 4},
			{"and rest there", Window{Samples: 20, RTT: 21 * ms, MinRTT: 21 * ms, MaxInFlight: 5, Backlog: 2, Duration: 105 * ms}, 4},
		})
	})
	t.Run("without steady medians the defaults never rest", func(t *testing.T) {
		a := newAlg(t, NewGradient, DefaultGradient())
		// A spread service time: the medians' noise (3 x 1 ms) is over the 5% buffer (1 ms).
		knee := Window{Samples: 40, RTT: 30 * ms, RTTNoise: ms, MinRTT: m, MaxInFlight: 10, Backlog: 3, Duration: 100 * ms}
		clean := knee
		clean.RTT = m
		grown := 9*(1.05+0.15) + 0.5
		runSteps(t, a, 10, []step{
			{"drain to the served 8 and one waiting inside the upstream, no rest", knee, 9},
			{"grow at once: x (1.05 + 3 x 5%) + 0.5", clean, grown},
			{"and again", clean, grown*1.2 + 0.5},
		})
		// A slow tail: the mean lies 4 ms above the median, and the upstream's workers spend
		// 24 ms per request, not the 20 ms the median says: 40 completions in 100 ms kept 9.6
		// of them busy.
		tail := knee
		tail.Skew = 4 * ms
		b := newAlg(t, NewGradient, DefaultGradient())
		runSteps(t, b, 12, []step{{"drain to the mean's served 9.6, plus one", tail, 10.6}})
		// Two slow requests held workers through the whole window without completing in it:
		// 30 completions kept 7.2 busy at 24 ms each, and the two held 2 more.
		held := tail
		held.Samples, held.Held = 30, 2
		runSteps(t, newAlg(t, NewGradient, DefaultGradient()), 12, []step{{"drain to the 7.2 served and the 2 held, plus one", held, 10.2}})
		// Never above the limit, and without a rest the drain is to the served concurrency alone.
		runSteps(t, newAlg(t, NewGradient, DefaultGradient()), 10, []step{{"capped at the limit", tail, 10}})
		runSteps(t, newAlg(t, NewGradient, DefaultGradient()), 10, []step{{"with the held ones too", held, 10}})
		runSteps(t, newAlg(t, NewGradient, bufferGradient()), 12, []step{{"25% buffer, no rest: the served 8", tail, 8}})
		runSteps(t, newAlg(t, NewGradient, bufferGradient()), 9, []step{{"25% buffer, no rest: by latency (x 20/30) to the served 6, the held not counted", held, 6}})
	})
	t.Run("a window held up at the spread floor does not teach the no-load estimate", func(t *testing.T) {
		// A slow tail: 40 completions in 100 ms at a mean of 24 ms kept 9.6 workers busy, and
		// the window read 25 ms, a quarter over the estimate, by the requests the limit kept
		// waiting inside the upstream.
		w := Window{Samples: 40, RTT: 25 * ms, RTTNoise: ms, MinRTT: m, Skew: 4 * ms, MaxInFlight: 12, Backlog: 3, Duration: 100 * ms}
		kept := func(a Algorithm) bool { return a.(QueueKeeper).KeptQueue() }
		// More than half again the estimate is not the floor's queue: a slower upstream.
		slow := w
		slow.RTT = 31 * ms
		clean := w
		clean.RTT = m
		a := newAlg(t, NewGradient, DefaultGradient())
		if kept(a) {
			t.Fatal("kept a queue before any window")
		}
		for _, c := range []struct {
			what  string
			limit float64
			w     Window
			want  float64
			kept  bool
		}{
			{"by latency 12 x 20/25 = 9.6, held at the floor 10.6: kept out", 12, w, 10.6, true},
			{"by latency to 7.7, held at the floor, 1.55x the estimate: a slower upstream, learned", 12, slow, 10.6, false},
			{"by latency 20 x 20/25, above the floor: the limit let the queue go, learned", 20, w, 16, false},
			{"no drain below the floor capped at the limit 10: kept out", 10, w, 10, true},
			{"a clean window grows: learned", 10, clean, 10*(1.05+0.15) + 0.5, false},
		} {
			runSteps(t, a, c.limit, []step{{c.what, c.w, c.want}})
			if got := kept(a); got != c.kept {
				t.Fatalf("%s: KeptQueue %v, want %v", c.what, got, c.kept)
			}
		}
		// Without a rest there is no such floor, and nothing is kept.
		d := newAlg(t, NewGradient, bufferGradient())
		queued := w
		queued.RTT = 30 * ms
		runSteps(t, d, 12, []step{{"25% buffer, no rest: by latency to the served 8", queued, 8}})
		if kept(d) {
			t.Fatal("without a rest the gradient kept a window from the estimator")
		}
	})
	t.Run("a window spanning idle time does not rest", func(t *testing.T) {
		a := newAlg(t, NewGradient, DefaultGradient())
		// Traffic resumes after a pause: the window held 10 in flight but served 2 at once over
		// its whole span, and its first requests were slow.
		w := Window{Samples: 20, RTT: 30 * ms, MinRTT: m, MaxInFlight: 10, Backlog: 3, Duration: 200 * ms}
		runSteps(t, a, 10, []step{
			{"drain by latency", w, 10 * 20.0 / 30},
			{"the window after the drain still ran requests admitted under 10: no step", Window{Samples: 40, RTT: m, MinRTT: m, MaxInFlight: 7, Backlog: 3, Duration: 100 * ms}, 10 * 20.0 / 30},
			{"then grow, to a whole limit", Window{Samples: 40, RTT: m, MinRTT: m, MaxInFlight: 7, Backlog: 3, Duration: 100 * ms}, math.Round(10*20.0/30*1.05 + 0.5)},
		})
	})
	t.Run("a latency the drains do not lower is the no-load one", func(t *testing.T) {
		a := newAlg(t, NewGradient, DefaultGradient())
		// Recorded at 5x on 8 workers x 20 ms: the no-load estimate (17.2 ms) came from the
		// startup's over-corrected samples, so every later window read 16% slow at any limit,
		// and drain after drain took the limit from 8 to 1 for the estimator's memory.
		minRTT := 17200 * time.Microsecond
		at := func(l float64) Window {
			// The upstream serves what the limit lets in: l at once for 20 ms each.
			return Window{Samples: int(l * 5), RTT: m, MinRTT: minRTT, MaxInFlight: int(math.Ceil(l)), Backlog: 5, Duration: 100 * ms}
		}
		first := 8 * 17.2 / 20
		runSteps(t, a, 8, []step{
			{"drain by latency: x 17.2/20, on a whole number", at(8), math.Round(first)},
			{"the drain did not lower the latency: hold (the lag of a queue?)", at(7), 7},
			{"nor the next window: not a lag, hold", at(7), 7},
			{"20 ms is the no-load latency now: grow", at(7), 8},
		})
		// A latency twice the estimate is a queue (its lag after a drain) or a slower upstream,
		// not an estimate learned wrong: the drains go on.
		c := newAlg(t, NewGradient, DefaultGradient())
		slow := func(l float64) Window {
			return Window{Samples: int(l * 2.5), RTT: 40 * ms, MinRTT: m, MaxInFlight: int(math.Ceil(l)), Backlog: 5, Duration: 100 * ms}
		}
		runSteps(t, c, 8, []step{
			{"drain to the served 4", slow(8), 4},
			{"and on, x 20/40", slow(4), 2},
		})
		// A real queue: each drain lowers the latency, and the drains go on.
		b := newAlg(t, NewGradient, DefaultGradient())
		q := func(rtt time.Duration, samples, inflight int) Window {
			return Window{Samples: samples, RTT: rtt, MinRTT: m, MaxInFlight: inflight, Backlog: 5, Duration: 100 * ms}
		}
		runSteps(t, b, 16, []step{
			{"a queue inside the upstream: drain to the served 8", q(40*ms, 40, 16), 8},
			{"the latency fell but is still over: drain on, to the served 6", q(30*ms, 30, 8), 6},
		})
	})
	t.Run("the medians' wander from window to window widens the allowance", func(t *testing.T) {
		// 8 workers x 20 ms resting at its knee on a busy node: the window medians wander by
		// a few tenths of a millisecond with nothing queued (their own sampling error reads almost none:
		// constant service). A window 7.5% slow, and a little short of completions, is that
		// wander: it must not drain. Without the wander the same window drains.
		at := func(rtt time.Duration, samples int) Window {
			return Window{Samples: samples, RTT: rtt, MinRTT: m, MaxInFlight: 9, Backlog: 3, Duration: 100 * ms}
		}
		knee := Window{Samples: 40, RTT: 25 * ms, MinRTT: m, MaxInFlight: 10, Backlog: 3, Duration: 100 * ms}
		wandering, steady := []step{{"the knee: land on the served 8", knee, 8}}, []step{{"the knee: land on the served 8", knee, 8}}
		for i := range 24 {
			rtt := []time.Duration{20 * ms, 20300 * time.Microsecond, 20100 * time.Microsecond, 20350 * time.Microsecond}[i%4]
			wandering = append(wandering, step{fmt.Sprintf("rest %d, median %s", i+1, rtt), at(rtt, 40), 8})
			steady = append(steady, step{fmt.Sprintf("rest %d", i+1), at(m, 40), 8})
		}
		slow := at(21500*time.Microsecond, 37)
		wandering = append(wandering, step{"7.5% slow: within the wander, rest on", slow, 8})
		steady = append(steady, step{"7.5% slow without wander: drain to 7", slow, 7})
		a := newAlg(t, NewGradient, DefaultGradient())
		runSteps(t, a, 10, wandering)
		if s := a.(*gradient).wander.sigma(); !(s > 0.2e-3 && s < 0.33e-3) {
			t.Errorf("the medians moved by 0.2-0.35 ms from window to window; the spread read is %v s", s)
		}
		runSteps(t, newAlg(t, NewGradient, DefaultGradient()), 10, steady)
	})
	t.Run("a stall during a rest is left out; a longer one drains, then the limit returns for what was left of the rest", func(t *testing.T) {
		// Resting at 8 on 8 workers x 20 ms, the node stalls: the median triples and half the
		// completions are missing. One or two such windows are left out: the rest goes on. A
		// third is followed (a stall and a lost half of the workers read alike): the limit
		// drains, rests a window there, returns to 8 and rests what was left of the rest, then
		// probes.
		a := newAlg(t, NewGradient, DefaultGradient())
		h := DefaultGradient().Hold
		clean := func(l float64) Window {
			return Window{Samples: int(math.Min(l, 8) * 5), RTT: m, MinRTT: m, MaxInFlight: int(l) + 1, Backlog: 3, Duration: 100 * ms}
		}
		stall := Window{Samples: 20, RTT: 60 * ms, MinRTT: m, MaxInFlight: 9, Backlog: 3, Duration: 100 * ms}
		steps := []step{{"the knee: land on the served 8", Window{Samples: 40, RTT: 25 * ms, MinRTT: m, MaxInFlight: 10, Backlog: 3, Duration: 100 * ms}, 8}}
		rest := func(n int) {
			for range n {
				steps = append(steps, step{"rest", clean(8), 8})
			}
		}
		rest(10)
		steps = append(steps, step{"a stall: left out", stall, 8})
		rest(5)
		steps = append(steps, step{"a longer stall: left out", stall, 8}, step{"and again", stall, 8},
			step{"a third window: drain to what was served, 4", stall, 4},
			step{"rest a window", clean(4), 4},
			step{"back to the rest's limit", clean(4), 8})
		rest(h - 15)
		steps = append(steps, step{"then the probe", clean(8), 9})
		runSteps(t, a, 10, steps)
	})
	t.Run("a stalled window does not judge a probe", func(t *testing.T) {
		// 4 workers x 40 ms, windows of 200 ms: a step from 3 to 4 served 4 in its first judged
		// window; in the next the node stalled and completions fell to 10 (2.0 served, less
		// than the 3 before the step, which a step that failed would still serve) with the
		// median clean. Judged by it, the step looked unused, marked 3 as the knee and rested
		// there for the doubled rest (a worker of four idle for 20 s).
		a := newAlg(t, NewGradient, DefaultGradient())
		a.(*gradient).ran = 3
		const m = 40 * ms
		at := func(n, inflight int) Window {
			return Window{Samples: n, RTT: m, MinRTT: m, MaxInFlight: inflight, Blocked: 30, Duration: 200 * ms}
		}
		runSteps(t, a, 3, []step{
			{"served 3 under 3: step to 4", at(15, 3), 4},
			{"let it act", at(18, 5), 4},
			{"served 4, over 3 + half the step: confirm", at(20, 5), 4},
			{"served 2.0, a stall: not judged", at(10, 5), 4},
			{"served 4 again: used, grow", at(20, 5), 5},
		})
	})
	t.Run("a used step is not failed by a window of noise", func(t *testing.T) {
		// 8 workers x 20 ms, a step from 7 to 8 after a rest: the upstream served 8, one more,
		// and the window's median read 5.5% over the estimate, over the allowance (5%, the
		// medians' own noise nil) but under what one request waiting per completion would add
		// (an eighth). That is the node's noise, not the step's queue.
		a := newAlg(t, NewGradient, DefaultGradient())
		a.(*gradient).ran = 7
		at := func(n int, rtt time.Duration) Window {
			return Window{Samples: n, RTT: rtt, MinRTT: m, MaxInFlight: 9, Blocked: 100, Duration: 100 * ms}
		}
		runSteps(t, a, 7, []step{
			{"served 7 under 7: step to 8", at(35, m), 8},
			{"let it act", at(38, m), 8},
			{"served 8, the median 5.5% over: used, confirm", at(40, 21100*time.Microsecond), 8},
			{"and again: grow", at(40, m), 9},
		})
	})
	t.Run("sidecar (25% buffer, no rest) drain floored at what the window served", func(t *testing.T) {
		a := newAlg(t, NewGradient, bufferGradient())
		// Recorded at 3x on 8 workers x 20 ms: the limit had reached 13, the window's median
		// (35.2 ms) still held requests admitted under a higher limit, and 40 completions in
		// 104.3 ms at a MinRTT of 20.6 ms say the backend served 7.9 at once.
		w := Window{Samples: 40, RTT: 35200 * time.Microsecond, MinRTT: 20600 * time.Microsecond, MaxInFlight: 13, Duration: 104300 * time.Microsecond}
		served := 40 / 0.1043 * 0.0206
		if got := a.Update(13, w); math.Abs(got-served) > 1e-9 {
			t.Errorf("drain: %v, want the served %v (L x MinRTT/RTT alone is %v)", got, served, 13*20.6/35.2)
		}
		// Without a duration the window says nothing about throughput: L x MinRTT/RTT.
		w.Duration = 0
		if got, want := a.Update(13, w), 13*20.6/35.2; math.Abs(got-want) > 1e-9 {
			t.Errorf("no duration: %v, want %v", got, want)
		}
		// The floor never raises the limit: more served than the limit (a window that spans a
		// limit change) drains to the limit itself at most.
		w.Duration, w.Samples = 50*time.Millisecond, 60
		if got := a.Update(10, w); got != 10 {
			t.Errorf("served above the limit: %v, want 10", got)
		}
	})
	t.Run("sidecar (25% buffer, no rest) app-limited may still decrease", func(t *testing.T) {
		a := newAlg(t, NewGradient, bufferGradient())
		if got := a.Update(10, win(40*ms, m, 2)); got != 5 {
			t.Errorf("Update = %v, want 5", got)
		}
	})
}

// longAfter applies the long average's update for n samples of rtt to long.
func longAfter(long, rtt float64, n, window int) float64 {
	return long + (rtt-long)*(1-math.Pow(1-2/float64(window+1), float64(n)))
}

func TestGradient2Field(t *testing.T) {
	a := newAlg(t, NewGradient2, FieldGradient2())
	g := a.(*gradient2)
	const m = 0.020
	// First window sets the long average; steady RTT: gradient 1 (clamped), +queueSize smoothed.
	runSteps(t, a, 20, []step{
		{"steady: L + 0.2*4", win(20*ms, 0, 20), 20.8},
		{"steady: L + 0.8", win(20*ms, 0, 21), 21.6},
		{"app-limited (10 < 21.6/2): hold", win(20*ms, 0, 10), 21.6},
	})
	if g.long != m {
		t.Fatalf("long = %v, want %v", g.long, m)
	}
	// RTT doubles: the long average moves by 50 samples' weight; gradient = 1.5 x long/short.
	long := longAfter(m, 0.040, 50, 600)
	grad := 1.5 * long / 0.040
	want := 21.6*0.8 + (21.6*grad+4)*0.2
	runSteps(t, a, 21.6, []step{{"RTT doubles: decrease", win(40*ms, 0, 21), want}})
	if math.Abs(g.long-long) > 1e-12 {
		t.Fatalf("long = %v, want %v (advanced by the sample count)", g.long, long)
	}
	// The long average advances by the window's sample count: 600 samples move it much further
	// than 50.
	b := newAlg(t, NewGradient2, FieldGradient2()).(*gradient2)
	b.Update(20, win(20*ms, 0, 20))
	b.Update(20, Window{Samples: 600, RTT: 40 * ms, MaxInFlight: 20})
	if want := longAfter(m, 0.040, 600, 600); math.Abs(b.long-want) > 1e-12 || b.long < 0.034 {
		t.Fatalf("after 600 samples long = %v, want %v", b.long, want)
	}
	// Drops are ignored by the field's Gradient2.
	if got := b.Update(20, Window{Samples: 1, Dropped: 9, RTT: 40 * ms, MaxInFlight: 20}); got < 20 {
		t.Fatalf("field gradient2 decreased on drops: %v", got)
	}
}

func TestGradient2DriftCorrection(t *testing.T) {
	a := newAlg(t, NewGradient2, FieldGradient2()).(*gradient2)
	a.Update(20, win(100*ms, 0, 20)) // long = 100 ms
	// One sample of 40 ms: the long average barely moves (100 -> ~99.8 ms), long/short > 2, so
	// it is multiplied by 0.95.
	a.Update(20, Window{Samples: 1, RTT: 40 * ms, MaxInFlight: 20})
	want := longAfter(0.100, 0.040, 1, 600) * 0.95
	if math.Abs(a.long-want) > 1e-12 {
		t.Fatalf("long = %v, want %v (drift-corrected)", a.long, want)
	}
	// At a ratio of 2 or less there is no correction.
	b := newAlg(t, NewGradient2, FieldGradient2()).(*gradient2)
	b.Update(20, win(80*ms, 0, 20))
	b.Update(20, Window{Samples: 1, RTT: 40 * ms, MaxInFlight: 20})
	if want := longAfter(0.080, 0.040, 1, 600); math.Abs(b.long-want) > 1e-12 {
		t.Fatalf("long = %v, want %v (no correction below ratio 2)", b.long, want)
	}
}

func TestGradient2Sidecar(t *testing.T) {
	const m = 20 * ms
	a := newAlg(t, NewGradient2, DefaultGradient2())
	runSteps(t, a, 8, []step{
		{"no MinRTT yet, steady: + 0.8", win(m, 0, 8), 8.8},
		{"unloaded against MinRTT: + 0.8", win(m, m, 8), 9.6},
		{"RTT +10% is within the tolerance: + 0.8", win(22*ms, m, 9), 10.4},
		{"RTT +25%: drain to L/1.25 at once", win(25*ms, m, 10), 10.4 / 1.25},
		{"RTT 4x: drain clamped at 0.5", win(80*ms, m, 8), 10.4 / 1.25 / 2},
		{"a drop: x0.9", Window{Dropped: 1}, 10.4 / 1.25 / 2 * 0.9},
		{"no samples: hold", Window{}, 10.4 / 1.25 / 2 * 0.9},
	})
	// The baseline is MinRTT, not the long average: after the backend became slower and the
	// estimate followed, the old long average does not hold the limit down.
	b := newAlg(t, NewGradient2, DefaultGradient2())
	b.Update(8, win(m, m, 8))
	if got := b.Update(8, win(40*ms, 40*ms, 8)); got != 8.8 {
		t.Fatalf("Update = %v, want 8.8 (baseline MinRTT)", got)
	}
}

// backlogWindow returns a window whose estimated backlog inside the backend is b of n in flight.
func backlogWindow(n, b int) Window {
	return win(rttForQueue(n, b, 20*ms), 20*ms, n)
}

func TestGreedShiftDynamics(t *testing.T) {
	a := newAlg(t, NewGreed, FieldGreed())
	g := a.(*greed)
	seq := []struct {
		what      string
		w         Window
		want      float64
		wantShift int
	}{
		{"backlog 0 < shift 1: double, shift 2", backlogWindow(4, 0), 8, 2},
		{"backlog 1 < shift 2: double, shift 3", backlogWindow(8, 1), 16, 3},
		{"backlog 2 < shift 3: double, shift stays 3", backlogWindow(16, 2), 32, 3},
		{"backlog 3 = shift 3: hold", backlogWindow(32, 3), 32, 3},
		{"backlog 20 > shift 3: halve, shift 2", backlogWindow(32, 20), 16, 2},
		{"backlog 5 > shift 2: halve, shift 1", backlogWindow(16, 5), 8, 1},
		{"backlog 2 > shift 1: halve, shift stays 1", backlogWindow(8, 2), 4, 1},
		{"backlog 2 > shift 1: not below the floor 3", backlogWindow(4, 2), 3, 1},
		{"no samples: hold", Window{}, 3, 1},
		{"MinRTT unknown: hold", win(40*ms, 0, 3), 3, 1},
		{"a drop: decrease", Window{Dropped: 1}, 3, 1},
	}
	limit := 4.0
	for i, s := range seq {
		got := a.Update(limit, s.w)
		if got != s.want || g.shift != s.wantShift {
			t.Fatalf("step %d (%s): limit %v shift %d, want %v and %d", i, s.what, got, g.shift, s.want, s.wantShift)
		}
		limit = got
	}
}

func TestGreedSidecar(t *testing.T) {
	c := DefaultGreed()
	c.NoiseBand = 0 // the steps measure a backlog of one exactly; the band is tested on its own
	a := newAlg(t, NewGreed, c)
	runSteps(t, a, 8, []step{
		{"backlog 0: x1.25", backlogWindow(8, 0), 10},
		{"backlog 1 = shift: decrease, not below the served 9", backlogWindow(10, 1), 9},
		{"backlog 6: x0.75, served (3) is lower", backlogWindow(9, 6), 6.75},
		{"app-limited: no increase", backlogWindow(2, 0), 6.75},
		{"a drop: x0.75 whatever was served", Window{Samples: 5, Dropped: 1, RTT: 20 * ms, MinRTT: 20 * ms, MaxInFlight: 6}, 6.75 * 0.75},
	})
	runSteps(t, newAlg(t, NewGreed, DefaultGreed()), 1.2, []step{
		{"a decrease stops at the floor 1", backlogWindow(2, 2), 1},
		{"at the floor: stays", backlogWindow(2, 2), 1},
	})
	runSteps(t, newAlg(t, NewGreed, DefaultGreed()), 0.5, []step{
		{"below the floor a decrease does not raise the limit", Window{Dropped: 1}, 0.5},
	})
	// The limiter's own queue (Window.Backlog) does not count: demand waiting at the door is not
	// a slow backend.
	b := newAlg(t, NewGreed, DefaultGreed())
	w := backlogWindow(8, 0)
	w.Backlog = 100
	if got := b.Update(8, w); got != 10 {
		t.Fatalf("with Window.Backlog 100: Update = %v, want 10", got)
	}
}

func TestAlgorithmsIncreaseUnloadedAndDecreaseOnDrops(t *testing.T) {
	for _, set := range []struct {
		name string
		p    Params
	}{{"sidecar", DefaultParams()}, {"field", FieldParams()}} {
		for _, name := range Names() {
			a := mustNew(t, name, set.p)
			if a.Name() != name {
				t.Errorf("New(%q).Name() = %q", name, a.Name())
			}
			// Two unloaded windows (gradient2 needs one to set its long average).
			l := a.Update(8, win(20*ms, 20*ms, 8))
			l = a.Update(l, win(20*ms, 20*ms, int(l)))
			if l <= 8 {
				t.Errorf("%s %s: unloaded windows did not raise the limit: %v", set.name, name, l)
			}
			if set.name == "field" && (name == NameGradient || name == NameGradient2) {
				continue // Envoy and Netflix's Gradient2 ignore drops.
			}
			fresh := mustNew(t, name, set.p)
			if got := fresh.Update(20, Window{Dropped: 1, MaxInFlight: 20}); got >= 20 {
				t.Errorf("%s %s: a drop did not lower the limit: %v", set.name, name, got)
			}
		}
	}
}

func TestAlgorithmsDecreaseWhenRTTRises(t *testing.T) {
	for _, name := range Names() {
		a := mustNew(t, name, DefaultParams())
		l := a.Update(16, win(20*ms, 20*ms, 16))
		if got := a.Update(l, win(60*ms, 20*ms, int(l))); got >= l {
			t.Errorf("%s: RTT x3 did not lower the limit %v: %v", name, l, got)
		}
	}
}

// TestNoiseBand: with the sidecar defaults a window median a little above MinRTT (scheduler
// noise, a varying service time) is no queue for vegas and greed, while a real queue still is.
func TestNoiseBand(t *testing.T) {
	const m = 20 * ms
	v := newAlg(t, NewVegas, DefaultVegas())
	if got := v.Update(8, win(22*ms, m, 8)); got <= 8 {
		t.Errorf("vegas: RTT +10%% (noise) took the limit from 8 to %v, want growth", got)
	}
	if got := v.Update(8, win(30*ms, m, 8)); got >= 8 {
		t.Errorf("vegas: RTT +50%% (a queue) left the limit at %v, want a decrease", got)
	}
	g := newAlg(t, NewGreed, DefaultGreed())
	if got := g.Update(8, win(22*ms, m, 8)); got <= 8 {
		t.Errorf("greed: RTT +10%% (noise) took the limit from 8 to %v, want growth", got)
	}
}

// bufferGradient is the sidecar's gradient before issue 35 (buffer 25%, no noise term, no rest):
// still a valid setting, and the one whose every-window rules these cases pin down.
func bufferGradient() Gradient {
	g := DefaultGradient()
	g.Buffer, g.NoiseBuffer, g.Hold, g.HoldMax = 0.25, 0, 0, 0
	return g
}
