// Package slowtail draws synthetic service times with a slow tail.
//
// It is the one latency model of the project: the backend (internal/backend) sleeps for its
// samples and the lab simulator advances virtual time by them, so both see the same shape.
//
// A sample is drawn like this:
//
//   - with probability 1-TailProb, a normal sample with mean Mean and standard deviation Stddev,
//     clamped to [max(0, Mean-4*Stddev), Mean+4*Stddev];
//   - with probability TailProb, an exponential sample with mean TailMean, clamped to
//     [TailMin, TailMax].
//
// With Fanout k > 1 one call draws k such samples and returns the largest: a top-level request
// that waits for the slowest of k downstream calls. Its chance of meeting at least one slow call is
// 1-(1-TailProb)^k, so p50 barely moves while p99 jumps into the tail.
//
// Stddev 0 and TailProb 0 give a constant service time of Mean.
//
// A Sampler is deterministic: the same Config and seed give the same sequence of samples.
package slowtail

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Limits on Config values. They keep arithmetic far from overflow and loops short.
const (
	// MaxDuration is the largest duration any Config field may hold.
	MaxDuration = time.Hour
	// MaxFanout is the largest Fanout.
	MaxFanout = 1000
	// ClampSigmas is how many standard deviations a normal sample may lie from Mean.
	ClampSigmas = 4
)

// Config describes the service-time distribution. The zero value is not valid (Fanout 0); start
// from DefaultConfig.
type Config struct {
	// Mean and Stddev describe the normal (fast) path.
	Mean, Stddev time.Duration
	// TailProb is the probability, in [0, 1], that a sample takes the slow path.
	TailProb float64
	// TailMean is the mean of the exponential slow path before clamping to [TailMin, TailMax].
	TailMean, TailMin, TailMax time.Duration
	// Fanout is how many samples one call draws; the call returns the largest. At least 1.
	Fanout int
}

// DefaultConfig returns the sampler of the project's background notes: mean 20ms, stddev 5ms,
// tail probability 0.01, tail mean 300ms clamped to [100ms, 2s], fanout 1.
func DefaultConfig() Config {
	return Config{
		Mean:     20 * time.Millisecond,
		Stddev:   5 * time.Millisecond,
		TailProb: 0.01,
		TailMean: 300 * time.Millisecond,
		TailMin:  100 * time.Millisecond,
		TailMax:  2 * time.Second,
		Fanout:   1,
	}
}

// Constant returns a Config whose every sample is d.
func Constant(d time.Duration) Config {
	return Config{Mean: d, Fanout: 1}
}

// FieldError is one problem with one Config field. Field uses the lowerCamel spelling of config
// files and JSON ("mean", "tailProb", ...).
type FieldError struct {
	Field   string
	Problem string
}

func (e *FieldError) Error() string { return "slowtail: " + e.Field + ": " + e.Problem }

// Validate reports every problem with c, each as a *FieldError, joined with errors.Join.
// It returns nil when c is valid.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Problem: fmt.Sprintf(format, args...)})
	}
	dur := func(field string, d time.Duration) {
		if d < 0 || d > MaxDuration {
			bad(field, "must be in [0, %s], got %s", MaxDuration, d)
		}
	}
	dur("mean", c.Mean)
	dur("stddev", c.Stddev)
	dur("tailMean", c.TailMean)
	dur("tailMin", c.TailMin)
	dur("tailMax", c.TailMax)
	if math.IsNaN(c.TailProb) || c.TailProb < 0 || c.TailProb > 1 {
		bad("tailProb", "must be in [0, 1], got %v", c.TailProb)
	}
	if c.TailMax < c.TailMin {
		bad("tailMax", "must be >= tailMin (%s), got %s", c.TailMin, c.TailMax)
	}
	if c.TailProb > 0 && c.TailMean <= 0 {
		bad("tailMean", "must be > 0 when tailProb > 0, got %s", c.TailMean)
	}
	if c.Fanout < 1 || c.Fanout > MaxFanout {
		bad("fanout", "must be in [1, %d], got %d", MaxFanout, c.Fanout)
	}
	return errors.Join(errs...)
}

// Sampler draws service times from a Config. It is not safe for concurrent use: guard it with a
// mutex or give each goroutine its own Sampler (with its own seed).
type Sampler struct {
	rng *rand.Rand
	c   Config // sanitized copy, see sanitize
}

// New returns a Sampler for c whose randomness is a PCG generator seeded with seed.
// Call c.Validate first: New does not reject an invalid Config, it draws from the nearest
// valid one (negative durations as 0, TailProb clamped to [0, 1], Fanout to [1, MaxFanout],
// TailMax raised to TailMin), so Sample never panics.
func New(c Config, seed uint64) *Sampler {
	// The second PCG word is a fixed odd constant so that one seed names one stream.
	return NewWithRand(c, rand.New(rand.NewPCG(seed, 0xda3e39cb94b95bdb)))
}

// NewWithRand is like New but draws from r, which the caller owns (the Sampler uses it from the
// caller's goroutine only). It lets a simulation share one generator between several models.
func NewWithRand(c Config, r *rand.Rand) *Sampler {
	return &Sampler{rng: r, c: sanitize(c)}
}

// Config returns the Config the Sampler draws from (after the adjustments described at New).
func (s *Sampler) Config() Config { return s.c }

// SetConfig changes the distribution for later samples; the random stream goes on where it was.
// Like New it accepts any Config and adjusts invalid values.
func (s *Sampler) SetConfig(c Config) { s.c = sanitize(c) }

// Sample returns one service time: the largest of Fanout draws.
func (s *Sampler) Sample() time.Duration {
	d := s.one()
	for i := 1; i < s.c.Fanout; i++ {
		d = max(d, s.one())
	}
	return d
}

// one draws a single (not fanned-out) sample. It consumes one uniform variate for the path
// choice only when 0 < TailProb < 1, one normal variate only when Stddev > 0, and one exponential
// variate on the slow path.
func (s *Sampler) one() time.Duration {
	c := &s.c
	slow := c.TailProb >= 1 || (c.TailProb > 0 && s.rng.Float64() < c.TailProb)
	if slow {
		d := float64(c.TailMean) * s.rng.ExpFloat64()
		return clamp(d, c.TailMin, c.TailMax)
	}
	if c.Stddev == 0 {
		return c.Mean
	}
	lo := max(0, c.Mean-ClampSigmas*c.Stddev)
	hi := c.Mean + ClampSigmas*c.Stddev
	d := float64(c.Mean) + float64(c.Stddev)*s.rng.NormFloat64()
	return clamp(d, lo, hi)
}

// clamp converts d (nanoseconds) to a Duration in [lo, hi]; it works in float64 so that huge
// values never overflow.
func clamp(d float64, lo, hi time.Duration) time.Duration {
	switch {
	case !(d >= float64(lo)): // also catches NaN
		return lo
	case d >= float64(hi):
		return hi
	default:
		return time.Duration(d)
	}
}

func sanitize(c Config) Config {
	fix := func(d time.Duration) time.Duration { return min(max(d, 0), MaxDuration) }
	c.Mean, c.Stddev = fix(c.Mean), fix(c.Stddev)
	c.TailMean, c.TailMin, c.TailMax = fix(c.TailMean), fix(c.TailMin), fix(c.TailMax)
	c.TailMax = max(c.TailMax, c.TailMin)
	if math.IsNaN(c.TailProb) {
		c.TailProb = 0
	}
	c.TailProb = min(max(c.TailProb, 0), 1)
	c.Fanout = min(max(c.Fanout, 1), MaxFanout)
	return c
}
