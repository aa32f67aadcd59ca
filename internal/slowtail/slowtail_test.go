package slowtail

import (
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const ms = time.Millisecond

// draw returns n samples of a fresh Sampler for c and seed.
func draw(c Config, seed uint64, n int) []time.Duration {
	s := New(c, seed)
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = s.Sample()
	}
	return out
}

// quantile returns the q-quantile (nearest rank) of sorted.
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// share returns the fraction of xs for which keep is true.
func share(xs []time.Duration, keep func(time.Duration) bool) float64 {
	n := 0
	for _, x := range xs {
		if keep(x) {
			n++
		}
	}
	return float64(n) / float64(len(xs))
}

// within5Sigma fails t unless the observed share of n Bernoulli trials is within five standard
// deviations of p. With fixed seeds the outcome is fixed, but the bound is the statistical one.
func within5Sigma(t *testing.T, what string, got, p float64, n int) {
	t.Helper()
	sd := math.Sqrt(p * (1 - p) / float64(n))
	if math.Abs(got-p) > 5*sd {
		t.Errorf("%s = %.5f, want %.5f ± %.5f (5 sigma, n=%d)", what, got, p, 5*sd, n)
	}
}

func TestDefaultConfig(t *testing.T) {
	want := Config{
		Mean: 20 * ms, Stddev: 5 * ms, TailProb: 0.01,
		TailMean: 300 * ms, TailMin: 100 * ms, TailMax: 2 * time.Second, Fanout: 1,
	}
	if got := DefaultConfig(); got != want {
		t.Fatalf("DefaultConfig() = %+v, want %+v", got, want)
	}
	if err := want.Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v", err)
	}
	if err := Constant(20 * ms).Validate(); err != nil {
		t.Fatalf("Constant(20ms).Validate() = %v", err)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Config)
		fields []string // fields that must be named, in order
	}{
		{"negative mean", func(c *Config) { c.Mean = -1 }, []string{"mean"}},
		{"huge stddev", func(c *Config) { c.Stddev = MaxDuration + 1 }, []string{"stddev"}},
		{"tailProb above 1", func(c *Config) { c.TailProb = 1.5 }, []string{"tailProb"}},
		{"tailProb negative", func(c *Config) { c.TailProb = -0.1 }, []string{"tailProb"}},
		{"tailProb NaN", func(c *Config) { c.TailProb = math.NaN() }, []string{"tailProb"}},
		{"tailMax below tailMin", func(c *Config) { c.TailMax = 50 * ms }, []string{"tailMax"}},
		{"tailMean zero with tail", func(c *Config) { c.TailMean = 0 }, []string{"tailMean"}},
		{"negative tailMin", func(c *Config) { c.TailMin = -ms }, []string{"tailMin"}},
		{"fanout zero", func(c *Config) { c.Fanout = 0 }, []string{"fanout"}},
		{"fanout huge", func(c *Config) { c.Fanout = MaxFanout + 1 }, []string{"fanout"}},
		{"several", func(c *Config) { c.Mean, c.TailProb, c.Fanout = -1, 2, -3 }, []string{"mean", "tailProb", "fanout"}},
		{"zero tailMean without tail is fine", func(c *Config) { c.TailProb, c.TailMean = 0, 0 }, nil},
		{"tailProb 1 is fine", func(c *Config) { c.TailProb = 1 }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.modify(&c)
			err := c.Validate()
			if len(tt.fields) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want errors naming %v", tt.fields)
			}
			var got []string
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				var fe *FieldError
				if !errors.As(e, &fe) {
					t.Fatalf("problem %v is not a *FieldError", e)
				}
				if !strings.Contains(e.Error(), fe.Field+": ") {
					t.Errorf("message %q does not name field %q", e.Error(), fe.Field)
				}
				got = append(got, fe.Field)
			}
			if !slices.Equal(got, tt.fields) {
				t.Fatalf("Validate() named %v, want %v (err: %v)", got, tt.fields, err)
			}
		})
	}
}

func TestDeterministic(t *testing.T) {
	c := DefaultConfig()
	c.Fanout = 3
	a, b := draw(c, 42, 20000), draw(c, 42, 20000)
	if !slices.Equal(a, b) {
		t.Fatal("two samplers with seed 42 gave different sequences")
	}
	if other := draw(c, 43, 20000); slices.Equal(a, other) {
		t.Fatal("seeds 42 and 43 gave the same sequence")
	}
	// The values vary: the sequence is not constant.
	if slices.Min(a) == slices.Max(a) {
		t.Fatalf("all samples equal %s", a[0])
	}
}

func TestSetConfigContinuesStream(t *testing.T) {
	a := New(Constant(ms), 7)
	b := New(DefaultConfig(), 7)
	a.Sample() // a constant config draws no randomness
	a.SetConfig(DefaultConfig())
	if a.Config() != DefaultConfig() {
		t.Fatalf("Config() = %+v after SetConfig", a.Config())
	}
	for i := range 1000 {
		if x, y := a.Sample(), b.Sample(); x != y {
			t.Fatalf("sample %d: %s after SetConfig, %s from a fresh sampler", i, x, y)
		}
	}
}

func TestConstant(t *testing.T) {
	for _, c := range []Config{
		Constant(20 * ms),
		{Mean: 20 * ms, TailMean: 300 * ms, TailMin: 100 * ms, TailMax: time.Second, Fanout: 1},
		{Mean: 20 * ms, Fanout: 5},
	} {
		for i, d := range draw(c, 1, 1000) {
			if d != 20*ms {
				t.Fatalf("%+v: sample %d = %s, want 20ms", c, i, d)
			}
		}
	}
}

func TestNormalPath(t *testing.T) {
	const n = 100000
	c := Config{Mean: 20 * ms, Stddev: 5 * ms, Fanout: 1}
	xs := draw(c, 3, n)
	if lo, hi := slices.Min(xs), slices.Max(xs); lo < 0 || hi > 40*ms {
		t.Fatalf("samples span [%s, %s], want within [0, 40ms]", lo, hi)
	}
	var sum, sq float64
	for _, x := range xs {
		sum += float64(x)
	}
	mean := sum / n
	for _, x := range xs {
		sq += (float64(x) - mean) * (float64(x) - mean)
	}
	sd := math.Sqrt(sq / (n - 1))
	// Standard error of the mean is 5ms/sqrt(n) ≈ 0.016ms; allow 5 of them.
	if math.Abs(mean-float64(20*ms)) > 5*float64(5*ms)/math.Sqrt(n) {
		t.Errorf("mean = %s, want 20ms", time.Duration(mean))
	}
	// Clamping at 4 sigma trims a negligible share; the spread stays close to 5ms.
	if sd < float64(4800*time.Microsecond) || sd > float64(5100*time.Microsecond) {
		t.Errorf("stddev = %s, want about 5ms", time.Duration(sd))
	}
	// About 68.3% of a normal lies within one sigma.
	within5Sigma(t, "share within 1 sigma", share(xs, func(d time.Duration) bool {
		return d >= 15*ms && d <= 25*ms
	}), 0.6827, n)
}

func TestNormalClampAtZero(t *testing.T) {
	const n = 100000
	// Mean-4*Stddev is negative, so the floor is 0; P(normal < 0) = P(z < -1) ≈ 0.1587.
	xs := draw(Config{Mean: 5 * ms, Stddev: 5 * ms, Fanout: 1}, 4, n)
	if lo, hi := slices.Min(xs), slices.Max(xs); lo != 0 || hi > 25*ms {
		t.Fatalf("samples span [%s, %s], want [0, <=25ms] with 0 reached", lo, hi)
	}
	within5Sigma(t, "share clamped to 0", share(xs, func(d time.Duration) bool { return d == 0 }), 0.1587, n)
}

func TestTailClamp(t *testing.T) {
	const n = 100000
	c := Config{TailProb: 1, TailMean: 300 * ms, TailMin: 100 * ms, TailMax: 2 * time.Second, Fanout: 1}
	xs := draw(c, 5, n)
	if lo, hi := slices.Min(xs), slices.Max(xs); lo != c.TailMin || hi != c.TailMax {
		t.Fatalf("samples span [%s, %s], want exactly [%s, %s]", lo, hi, c.TailMin, c.TailMax)
	}
	// P(Exp(300ms) < 100ms) = 1-e^(-1/3); P(Exp(300ms) > 2s) = e^(-20/3).
	within5Sigma(t, "share at tailMin", share(xs, func(d time.Duration) bool { return d == c.TailMin }),
		1-math.Exp(-1.0/3), n)
	within5Sigma(t, "share at tailMax", share(xs, func(d time.Duration) bool { return d == c.TailMax }),
		math.Exp(-20.0/3), n)
}

func TestTailMeanUnclamped(t *testing.T) {
	const n = 100000
	c := Config{TailProb: 1, TailMean: 300 * ms, TailMax: MaxDuration, Fanout: 1}
	var sum float64
	for _, x := range draw(c, 6, n) {
		sum += float64(x)
	}
	// An exponential's standard deviation equals its mean.
	if mean := sum / n; math.Abs(mean-float64(300*ms)) > 5*float64(300*ms)/math.Sqrt(n) {
		t.Errorf("tail mean = %s, want 300ms", time.Duration(mean))
	}
}

func TestTailShare(t *testing.T) {
	const n = 200000
	xs := draw(DefaultConfig(), 7, n)
	// Normal samples end at 40ms and tail samples start at 100ms, so the split is exact.
	if got := share(xs, func(d time.Duration) bool { return d > 40*ms && d < 100*ms }); got != 0 {
		t.Fatalf("share in (40ms, 100ms) = %v, want 0", got)
	}
	within5Sigma(t, "tail share", share(xs, func(d time.Duration) bool { return d >= 100*ms }), 0.01, n)
}

func TestFanoutIsMaxOfDraws(t *testing.T) {
	c := DefaultConfig()
	one := New(c, 9)
	c.Fanout = 5
	five := New(c, 9)
	for i := range 2000 {
		want := one.Sample()
		for range 4 {
			want = max(want, one.Sample())
		}
		if got := five.Sample(); got != want {
			t.Fatalf("call %d: fanout 5 gave %s, max of 5 single draws is %s", i, got, want)
		}
	}
}

func TestFanoutTail(t *testing.T) {
	const n = 200000
	c := DefaultConfig()
	single := draw(c, 11, n)
	c.Fanout = 5
	fanned := draw(c, 11, n)
	slices.Sort(single)
	slices.Sort(fanned)

	// P(at least one of 5 is slow) = 1 - 0.99^5 ≈ 0.049.
	within5Sigma(t, "fan-out 5 slow share", share(fanned, func(d time.Duration) bool { return d >= 100*ms }),
		1-math.Pow(0.99, 5), n)

	p50a, p50b := quantile(single, 0.50), quantile(fanned, 0.50)
	p98a, p99b := quantile(single, 0.98), quantile(fanned, 0.99)
	t.Logf("fanout 1: p50 %s p98 %s; fanout 5: p50 %s p99 %s", p50a, p98a, p50b, p99b)
	if r := float64(p50b) / float64(p50a); r < 1 || r > 1.5 {
		t.Errorf("p50 moved by x%.2f with fan-out 5 (%s -> %s), want a small move (< x1.5)", r, p50a, p50b)
	}
	if p98a >= 100*ms {
		t.Errorf("fanout 1 p98 = %s, want on the fast path (< 100ms)", p98a)
	}
	if p99b < 10*p50b {
		t.Errorf("fanout 5 p99 = %s, want >= 10 x p50 (%s)", p99b, p50b)
	}
}

func TestInvalidConfigDoesNotPanic(t *testing.T) {
	bad := Config{
		Mean: -ms, Stddev: -ms, TailProb: math.NaN(), TailMean: -ms,
		TailMin: 10 * ms, TailMax: ms, Fanout: -5,
	}
	s := New(bad, 1)
	got := s.Config()
	if err := got.Validate(); err != nil {
		t.Fatalf("sanitized config %+v is invalid: %v", got, err)
	}
	for range 1000 {
		if d := s.Sample(); d != 0 {
			t.Fatalf("Sample() = %s, want 0 from the sanitized config %+v", d, got)
		}
	}
	s.SetConfig(Config{TailProb: 7, TailMean: 10 * time.Hour, TailMax: 100 * time.Hour, Fanout: 1 << 30})
	got = s.Config()
	if got.TailProb != 1 || got.TailMax != MaxDuration || got.Fanout != MaxFanout {
		t.Fatalf("sanitized config = %+v", got)
	}
	if d := s.Sample(); d < 0 || d > MaxDuration {
		t.Fatalf("Sample() = %s, want within [0, %s]", d, MaxDuration)
	}
}

func BenchmarkSample(b *testing.B) {
	for _, k := range []int{1, 5} {
		b.Run("fanout="+strconv.Itoa(k), func(b *testing.B) {
			c := DefaultConfig()
			c.Fanout = k
			s := New(c, 1)
			var sink time.Duration
			for b.Loop() {
				sink += s.Sample()
			}
			if sink < 0 {
				b.Fatal("negative total")
			}
		})
	}
}
