package limit

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestParamsValidate(t *testing.T) {
	for _, p := range []Params{DefaultParams(), FieldParams()} {
		if err := p.Validate(); err != nil {
			t.Fatalf("built-in params invalid: %v", err)
		}
		for _, name := range Names() {
			if _, err := New(name, p); err != nil {
				t.Fatalf("New(%q): %v", name, err)
			}
		}
	}
	bad := DefaultParams()
	bad.AIMD.Backoff = 1
	bad.AIMD.Timeout = -time.Second
	bad.AIMD.RTTTolerance = 0.5
	bad.Vegas.Alpha, bad.Vegas.Beta = 3, 2
	bad.Vegas.DropBackoff = 1.5
	bad.Gradient2.Smoothing = 0
	bad.Gradient2.LongWindow = 0
	bad.Gradient2.Baseline = "short"
	bad.Gradient2.RTTTolerance = math.NaN()
	bad.Gradient.Buffer = -0.1
	bad.Gradient.MaxGradient = 0.9
	bad.Gradient.DropBackoff = 0
	bad.Greed.Increase = 1
	bad.Greed.Decrease = 0
	bad.Greed.MinShift, bad.Greed.MaxShift = 2, 1
	err := bad.Validate()
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Validate = %v, want *ConfigError", err)
	}
	for _, field := range []string{
		"aimd.backoff", "aimd.timeout", "aimd.rttTolerance",
		"vegas.beta", "vegas.dropBackoff",
		"gradient2.smoothing", "gradient2.longWindow", "gradient2.baseline", "gradient2.rttTolerance",
		"gradient.buffer", "gradient.maxGradient", "gradient.dropBackoff",
		"greed.increase", "greed.decrease", "greed.maxShift",
	} {
		if !strings.Contains(err.Error(), field+": ") {
			t.Errorf("error does not name %s: %v", field, err)
		}
	}
	// New validates only the selected block.
	if _, err := New(NameGradient, bad); err == nil || strings.Contains(err.Error(), "aimd.") {
		t.Errorf("New(gradient) = %v, want only gradient problems", err)
	}
	okGradient := bad
	okGradient.Gradient = DefaultGradient()
	if _, err := New(NameGradient, okGradient); err != nil {
		t.Errorf("New(gradient) with a valid gradient block: %v", err)
	}
}

func TestNewUnknownAlgorithm(t *testing.T) {
	_, err := New("pid", DefaultParams())
	if err == nil || !strings.Contains(err.Error(), "algorithm: ") || !strings.Contains(err.Error(), "gradient2") {
		t.Fatalf("New(pid) = %v, want an error naming the field and the choices", err)
	}
}

// edgeWindows are finite but hostile windows: every Update must still return a finite,
// non-negative limit no larger than MaxValue.
var edgeWindows = []Window{
	{},
	{Samples: 10},
	{Samples: 10, RTT: 20 * ms},
	{Samples: 10, MinRTT: 20 * ms, MaxInFlight: 5},
	{Samples: 10, RTT: 1, MinRTT: 1, MaxInFlight: 5},
	{Samples: 10, RTT: 20 * ms, MinRTT: 1, MaxInFlight: 5},
	{Samples: 10, RTT: math.MaxInt64, MinRTT: 20 * ms, MaxInFlight: 5},
	{Samples: 10, RTT: 20 * ms, MinRTT: math.MaxInt64, MaxInFlight: 5},
	{Samples: 10, RTT: math.MaxInt64, MinRTT: math.MaxInt64, MaxInFlight: math.MaxInt},
	{Samples: 10, RTT: 100 * time.Microsecond, MinRTT: time.Hour, MaxInFlight: 1},
	{Samples: -5, Dropped: -3, RTT: -time.Second, MinRTT: -time.Second, MaxInFlight: -1, Backlog: -1},
	{Samples: math.MaxInt, Dropped: math.MaxInt, RTT: 20 * ms, MinRTT: 20 * ms, MaxInFlight: math.MaxInt, Backlog: math.MaxInt},
	{Samples: math.MaxInt, RTT: 20 * ms, MinRTT: 20 * ms, MaxInFlight: math.MaxInt},
	{Samples: 1, RTT: 20 * ms, MinRTT: 20 * ms, MaxInFlight: 0},
}

var edgeLimits = []float64{0, 5e-324, 0.5, 1, 3, 20, 1e6, MaxValue, 1e300, math.MaxFloat64, math.Inf(1), math.Inf(-1), math.NaN(), -1}

func checkLimit(t *testing.T, what string, got float64) {
	t.Helper()
	if math.IsNaN(got) || math.IsInf(got, 0) || got < 0 || got > MaxValue {
		t.Fatalf("%s: Update returned %v", what, got)
	}
}

func TestUpdateEdgeCases(t *testing.T) {
	for _, set := range []Params{DefaultParams(), FieldParams()} {
		for _, name := range Names() {
			a := mustNew(t, name, set)
			for _, l := range edgeLimits {
				for i, w := range edgeWindows {
					checkLimit(t, name, a.Update(l, w))
					// Repeat on a fresh instance too: stateful algorithms must not depend on history.
					checkLimit(t, name, mustNew(t, name, set).Update(l, edgeWindows[(i+1)%len(edgeWindows)]))
				}
			}
		}
	}
}

// FuzzUpdate feeds arbitrary windows and limits to every algorithm, twice in a row so the
// stateful ones (gradient2's long average, greed's shift) see their own state.
func FuzzUpdate(f *testing.F) {
	for i, w := range edgeWindows {
		f.Add(edgeLimits[i%len(edgeLimits)], w.Samples, w.Dropped, int64(w.RTT), int64(w.MinRTT), w.MaxInFlight, w.Backlog)
	}
	f.Fuzz(func(t *testing.T, limit float64, samples, dropped int, rtt, minRTT int64, inflight, backlog int) {
		w := Window{Samples: samples, Dropped: dropped, RTT: time.Duration(rtt), MinRTT: time.Duration(minRTT), MaxInFlight: inflight, Backlog: backlog}
		for _, set := range []Params{DefaultParams(), FieldParams()} {
			for _, name := range Names() {
				a := mustNew(t, name, set)
				l := a.Update(limit, w)
				checkLimit(t, name, l)
				checkLimit(t, name, a.Update(l, w))
			}
		}
	})
}

func TestDeterministic(t *testing.T) {
	for _, name := range Names() {
		run := func() []float64 {
			return newModel(8, true).run(mustNew(t, name, DefaultParams()), 1, 100, nil)
		}
		a, b := run(), run()
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("%s: run differs at window %d: %v vs %v", name, i, a[i], b[i])
			}
		}
	}
}
