package limit

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// The closed-loop model: a backend of W workers with a constant service time S, offered more
// load than it can take, so the limiter always fills its enforced limit n = floor(L). When
// n > W the extra requests wait inside the backend: every request's RTT is S*max(1, n/W), the
// backend completes min(n, W)/S requests per second. The limiter clamps each Update to
// [minLimit, maxLimit], as the enforcing strategy does.
type model struct {
	W        int
	S        time.Duration
	Interval time.Duration // update window, to turn throughput into a sample count
	MinLimit float64
	MaxLimit float64
	// Estimator, when set, replaces the exact MinRTT = S with the probe-free estimator fed each
	// window's RTT (the window's p50: in this model every request of a window has the same RTT).
	Estimator *MinRTT
}

func (m model) window(limit float64) Window {
	n := int(math.Floor(limit))
	rtt := time.Duration(float64(m.S) * math.Max(1, float64(n)/float64(m.W)))
	served := min(n, m.W)
	samples := int(math.Round(float64(served) / m.S.Seconds() * m.Interval.Seconds()))
	return Window{Samples: samples, RTT: rtt, MinRTT: m.S, MaxInFlight: n}
}

// run iterates Update steps times from limit and returns the limit after each step (before
// flooring). A non-nil onStep may change the model between steps (capacity halving).
func (m *model) run(a Algorithm, limit float64, steps int, onStep func(i int, m *model)) []float64 {
	out := make([]float64, 0, steps)
	for i := range steps {
		if onStep != nil {
			onStep(i, m)
		}
		w := m.window(limit)
		if m.Estimator != nil {
			w.MinRTT = m.Estimator.Observe(w.RTT)
		}
		limit = math.Min(math.Max(a.Update(limit, w), m.MinLimit), m.MaxLimit)
		out = append(out, limit)
	}
	return out
}

// settle summarises the enforced (floored) limits of the last n steps.
type settle struct {
	Lo, Hi  int     // range of enforced limits
	Mean    float64 // mean enforced limit
	Goodput float64 // mean of min(n, W)/W: the share of capacity used
	Latency float64 // worst RTT/S
}

func summarise(ls []float64, n, w int) settle {
	s := settle{Lo: math.MaxInt}
	for _, l := range ls[len(ls)-n:] {
		e := int(math.Floor(l))
		s.Lo, s.Hi = min(s.Lo, e), max(s.Hi, e)
		s.Mean += float64(e) / float64(n)
		s.Goodput += float64(min(e, w)) / float64(w) / float64(n)
		s.Latency = math.Max(s.Latency, math.Max(1, float64(e)/float64(w)))
	}
	return s
}

func (s settle) String() string {
	return fmt.Sprintf("[%d..%d] mean %.2f goodput %.3f latency x%.3f", s.Lo, s.Hi, s.Mean, s.Goodput, s.Latency)
}

func mustNew(t testing.TB, name string, p Params) Algorithm {
	t.Helper()
	a, err := New(name, p)
	if err != nil {
		t.Fatalf("New(%q): %v", name, err)
	}
	return a
}

func TestModelTable(t *testing.T) {
	for _, set := range []struct {
		name string
		p    Params
	}{{"sidecar", DefaultParams()}, {"field", FieldParams()}} {
		for _, est := range []bool{false, true} {
			var b strings.Builder
			for _, name := range Names() {
				for _, w := range []int{4, 8, 16, 64} {
					m := model{W: w, S: 20 * time.Millisecond, Interval: 250 * time.Millisecond, MinLimit: 1, MaxLimit: 256}
					if est {
						m.Estimator = NewMinRTT(DefaultMinRTTWindows)
					}
					ls := m.run(mustNew(t, name, set.p), 4, 400, nil)
					fmt.Fprintf(&b, "%-9s W=%-3d %s | last100 %s\n", name, w, summarise(ls[:200], 50, w), summarise(ls, 100, w))
				}
			}
			t.Logf("%s estimator=%v\n%s", set.name, est, b.String())
		}
	}
}
