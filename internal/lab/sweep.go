package lab

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/loadshed/loadshed/internal/loadgen"
	"github.com/loadshed/loadshed/internal/slowtail"
	"github.com/loadshed/loadshed/pkg/admission"
)

// DefaultLoads are the offered loads of a sweep, as multiples of capacity.
func DefaultLoads() []float64 {
	return []float64{0.25, 0.5, 0.75, 1, 1.25, 1.5, 2, 3, 4, 6, 8, 10}
}

// MeanService estimates the mean of a service-time distribution from a fixed number of samples
// drawn with a fixed seed, so the estimate is the same on every run.
func MeanService(c slowtail.Config) time.Duration {
	const n = 200_000
	s := slowtail.New(c, 1)
	var sum float64
	for i := 0; i < n; i++ {
		sum += float64(s.Sample())
	}
	return time.Duration(sum / n)
}

// Capacity is the backend's throughput when every worker is busy: Servers / mean service time,
// in requests per second. It is 0 when Servers is unlimited (then the caller must say).
func Capacity(sc Scenario) float64 {
	if sc.Servers == 0 {
		return 0
	}
	m := MeanService(sc.Service)
	if m <= 0 {
		return 0
	}
	return float64(sc.Servers) / m.Seconds()
}

// SweepConfig describes a sweep: the same strategies at several offered loads.
type SweepConfig struct {
	// Base is the scenario each point runs in; its Arrivals are replaced by arrivals at the
	// point's rate for Duration.
	Base Scenario
	// Capacity is the backend's capacity in requests per second; 0 derives it with Capacity.
	Capacity float64
	// Loads are the offered loads as multiples of Capacity (DefaultLoads when empty).
	Loads []float64
	// Duration is how long each point offers requests.
	Duration time.Duration
	// Even selects evenly spaced arrivals instead of Poisson ones.
	Even bool
}

// SweepPoint is one strategy at one offered load.
type SweepPoint struct {
	Strategy string
	// Load is the multiple of capacity offered; Offered the rate in requests per second.
	Load, Offered float64
	Summary       Summary
}

// Sweep runs every strategy at every load. progress, when set, is told each point as it
// starts.
func Sweep(cfg SweepConfig, strategies []Strategy, progress func(done, total int, st string, load float64)) ([]SweepPoint, float64, error) {
	capacity := cfg.Capacity
	if capacity == 0 {
		capacity = Capacity(cfg.Base)
	}
	if !(capacity > 0) || math.IsInf(capacity, 0) {
		return nil, 0, errors.New("capacity: unknown; give the backend a number of servers or set the capacity")
	}
	if cfg.Duration <= 0 {
		return nil, 0, fmt.Errorf("duration: must be positive, got %s", cfg.Duration)
	}
	loads := cfg.Loads
	if len(loads) == 0 {
		loads = DefaultLoads()
	}
	for _, l := range loads {
		if !(l > 0) || l > 1000 {
			return nil, 0, fmt.Errorf("loads: %v is not in (0, 1000]", l)
		}
	}
	var out []SweepPoint
	total := len(loads) * len(strategies)
	for _, st := range strategies {
		for _, l := range loads {
			if progress != nil {
				progress(len(out), total, st.Name, l)
			}
			sc := cfg.Base
			sc.Arrivals = loadArrivals(capacity*l, cfg.Duration, !cfg.Even)
			r, err := Run(sc, st, RunOptions{})
			if err != nil {
				return nil, 0, fmt.Errorf("load %gx: %w", l, err)
			}
			out = append(out, SweepPoint{Strategy: st.Name, Load: l, Offered: capacity * l, Summary: r.Summary})
		}
	}
	return out, capacity, nil
}

func loadArrivals(rps float64, d time.Duration, poisson bool) Arrivals {
	s := loadgen.ConstantRate(rps, d)
	if poisson {
		s = s.WithPoisson(0)
	}
	return ScheduleArrivals{Schedule: s, Priority: admission.Critical}
}

// WriteSweepCSV writes one row per strategy and load.
func WriteSweepCSV(w io.Writer, points []SweepPoint) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"strategy", "load", "offered_rps", "incoming", "accepted", "acceptance_pct",
		"throughput_rps", "goodput_rps", "goodput_pct", "p50_ms", "p99_ms", "timeouts", "retries", "max_backend_queue"}); err != nil {
		return err
	}
	for _, p := range points {
		s := p.Summary
		thr := 0.0
		if s.Span > 0 {
			thr = float64(s.Successes) / s.Span.Seconds()
		}
		if err := cw.Write([]string{p.Strategy, strconv.FormatFloat(p.Load, 'g', -1, 64), rate(p.Offered),
			i64(s.Incoming), i64(s.Accepted), pct(s.Accepted, s.Incoming), rate(thr), rate(s.GoodputRPS()),
			pct(s.Good, s.Requests), ms(s.P50), ms(s.P99), i64(s.Timeouts + s.UpstreamTimeouts + s.Abandoned),
			i64(s.Retries), i64(s.MaxBackendQueue)}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
