package loadgen

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// MaxOffered bounds the number of requests one schedule may offer, which bounds the memory a run
// holds (a few dozen bytes per request).
const MaxOffered = 2_000_000

// MaxScheduleDuration bounds the length of one schedule.
const MaxScheduleDuration = 24 * time.Hour

// Phase is a stretch of a schedule with a constant arrival rate.
type Phase struct {
	// Rate is the arrival rate in requests per second; 0 makes a silent phase.
	Rate float64 `json:"rate"`
	// Duration is the length of the phase.
	Duration time.Duration `json:"duration"`
}

// Schedule says when each request of a run is due, as offsets from the start of the run.
//
// Arrivals follow the cumulative count Λ(t) = ∫ rate. Evenly spaced arrivals are due where Λ
// crosses 0, 1, 2, ...; so a constant rate r gives offsets i/r, and a rate change takes effect at
// the phase boundary without a gap or a burst. Poisson arrivals are due where Λ crosses the
// partial sums of unit exponential variables drawn from Seed (a Poisson process whose rate
// follows the phases).
type Schedule struct {
	// Phases run one after another from offset 0.
	Phases []Phase `json:"phases"`
	// Poisson selects random (Poisson) arrivals instead of evenly spaced ones.
	Poisson bool `json:"poisson,omitempty"`
	// Seed seeds the Poisson arrivals; the same seed gives the same offsets.
	Seed uint64 `json:"seed,omitempty"`
}

// ConstantRate returns a schedule of evenly spaced arrivals at rps requests per second for d.
func ConstantRate(rps float64, d time.Duration) Schedule {
	return Schedule{Phases: []Phase{{Rate: rps, Duration: d}}}
}

// Phases returns a schedule of evenly spaced arrivals that runs the phases in order.
func Phases(phases ...Phase) Schedule {
	return Schedule{Phases: append([]Phase(nil), phases...)}
}

// Spike returns the phases base for before, peak for during, base for after: the usual overload
// spike (for example 0.5x capacity, then 5x, then 0.5x again).
func Spike(base, peak float64, before, during, after time.Duration) Schedule {
	return Phases(Phase{base, before}, Phase{peak, during}, Phase{base, after})
}

// Poisson returns a schedule of Poisson arrivals with mean rate rps for d, drawn from seed.
func Poisson(rps float64, d time.Duration, seed uint64) Schedule {
	return ConstantRate(rps, d).WithPoisson(seed)
}

// WithPoisson returns a copy of s whose arrivals are Poisson, drawn from seed, with the rate of
// each phase as the mean rate.
func (s Schedule) WithPoisson(seed uint64) Schedule {
	s.Phases = append([]Phase(nil), s.Phases...)
	s.Poisson = true
	s.Seed = seed
	return s
}

// Duration is the total length of the schedule.
func (s Schedule) Duration() time.Duration {
	var d time.Duration
	for _, p := range s.Phases {
		d += p.Duration
	}
	return d
}

// PeakRate is the highest phase rate.
func (s Schedule) PeakRate() float64 {
	peak := 0.0
	for _, p := range s.Phases {
		peak = math.Max(peak, p.Rate)
	}
	return peak
}

// Expected is the mean number of arrivals, Λ at the end of the schedule. Evenly spaced
// schedules offer exactly ceil(Expected()) requests.
func (s Schedule) Expected() float64 {
	total := 0.0
	for _, p := range s.Phases {
		total += p.Rate * p.Duration.Seconds()
	}
	return total
}

// Validate reports every problem with the schedule, naming the field.
func (s Schedule) Validate() error {
	var errs []error
	if len(s.Phases) == 0 {
		errs = append(errs, errors.New("Schedule.Phases: at least one phase is required"))
	}
	for i, p := range s.Phases {
		if math.IsNaN(p.Rate) || math.IsInf(p.Rate, 0) || p.Rate < 0 {
			errs = append(errs, fmt.Errorf("Schedule.Phases[%d].Rate: must be a finite number >= 0, got %v", i, p.Rate))
		}
		if p.Duration <= 0 {
			errs = append(errs, fmt.Errorf("Schedule.Phases[%d].Duration: must be > 0, got %s", i, p.Duration))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if d := s.Duration(); d > MaxScheduleDuration {
		errs = append(errs, fmt.Errorf("Schedule.Phases: total duration %s exceeds %s", d, MaxScheduleDuration))
	}
	if n := s.Expected(); n > MaxOffered {
		errs = append(errs, fmt.Errorf("Schedule.Phases: about %.0f requests exceed the limit of %d", n, MaxOffered))
	}
	return errors.Join(errs...)
}

// Offsets returns the scheduled offset of every request, in order. All offsets lie in
// [0, Duration()).
func (s Schedule) Offsets() ([]time.Duration, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	end := s.Expected()
	inv := newInverse(s.Phases)
	if !s.Poisson {
		n := int(math.Ceil(end))
		out := make([]time.Duration, 0, n)
		for i := 0; i < n; i++ {
			out = append(out, inv.at(float64(i)))
		}
		return out, nil
	}
	rng := rand.New(rand.NewPCG(s.Seed, s.Seed^0x9e3779b97f4a7c15))
	// Room for the mean plus a few standard deviations; append grows it if needed.
	out := make([]time.Duration, 0, int(end+4*math.Sqrt(end))+1)
	x := rng.ExpFloat64()
	for x < end {
		if len(out) == MaxOffered {
			return nil, fmt.Errorf("Schedule: Poisson draw exceeds the limit of %d requests", MaxOffered)
		}
		out = append(out, inv.at(x))
		x += rng.ExpFloat64()
	}
	return out, nil
}

// inverse maps a cumulative arrival count x back to the time t with Λ(t) = x. Calls must come in
// non-decreasing order of x; each is then amortised O(1).
type inverse struct {
	phases []Phase
	k      int           // current phase
	start  time.Duration // start offset of phase k
	lam    float64       // Λ at the start of phase k
	end    time.Duration // end of the schedule
}

func newInverse(phases []Phase) *inverse {
	var end time.Duration
	for _, p := range phases {
		end += p.Duration
	}
	return &inverse{phases: phases, end: end}
}

func (v *inverse) at(x float64) time.Duration {
	for v.k < len(v.phases) {
		p := v.phases[v.k]
		top := v.lam + p.Rate*p.Duration.Seconds()
		if p.Rate > 0 && x < top {
			off := v.start + time.Duration(math.Round((x-v.lam)/p.Rate*float64(time.Second)))
			// Rounding must not push an arrival past its phase.
			return min(off, v.start+p.Duration-1)
		}
		v.start += p.Duration
		v.lam = top
		v.k++
	}
	// Only reached by rounding at the very end; keep the offset inside the schedule.
	return v.end - 1
}
