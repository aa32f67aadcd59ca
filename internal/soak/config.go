// Package soak runs the proxy as its own process under sustained overload, in front of a
// backend whose capacity and latency change on a schedule, samples the process every second
// (resident memory, goroutines, open file descriptors, requests in flight) and judges whether it
// stays bounded and leaks nothing.
//
// A soak fails when a sample crosses a ceiling, when the mean of the last third of the run
// exceeds the mean of the middle third by more than MaxGrowth (for memory, goroutines and file
// descriptors: the first third is warm-up), when in-flight does not return to zero once the load
// stops, or when any admitted request fails: a 5xx that is not a shed (a shed is a 503 naming
// its reason in X-Loadshed-Reason), any other unexpected status, a transport error, or a
// timeout.
package soak

import (
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/loadshed/loadshed/internal/config"
)

// DefaultAdmission is the proxy's admission block for a soak: the adaptive limit with a short
// queue, the strategy with the most moving parts, capped so in-flight has a ceiling to hold.
const DefaultAdmission = "strategy: adaptive\nadaptive: {maxLimit: 64, queue: {depth: 32, maxWait: 50ms}}"

// Ceilings are the bounds no sample may cross.
type Ceilings struct {
	RSSBytes   int64
	Goroutines int
	FDs        int
	InFlight   float64
}

// Config describes a soak run.
type Config struct {
	// Duration of the load (the run also takes the build, a settle and a final drain).
	Duration time.Duration
	// Load is the offered rate as a multiple of the backend's nominal capacity Workers/Service.
	Load float64
	// Workers and Service are the backend's nominal capacity; the schedule varies both.
	Workers int
	Service time.Duration
	// Admission is the proxy's admission block (YAML, as under "admission:").
	Admission string
	// ProxyBinary runs this proxy binary; empty builds ./cmd/proxy into WorkDir first.
	ProxyBinary string
	// WorkDir receives the built binary, the proxy's log, samples.csv and summary.json.
	WorkDir string
	// Interval between samples (default 1 s).
	Interval time.Duration
	// ClientTimeout bounds every request (default 10 s; the proxy's upstream timeout is 10 s).
	ClientTimeout time.Duration
	// Chunk is the length of one load-generator run; runs follow each other without a gap, so
	// the generator keeps no per-request record longer than a chunk (default 10 s).
	Chunk time.Duration
	// Conns is the clients' connection pool: all of them are opened before the load starts and
	// kept open (the proxy's idle timeout is raised for the run), so the proxy's goroutines and
	// descriptors do not follow the clients' demand and growth measures leaks (default 256).
	Conns    int
	Ceilings Ceilings
	// MaxGrowth bounds the last third's mean over the middle third's, as a fraction (0.10).
	MaxGrowth float64
	// Log receives progress lines (default: discarded).
	Log io.Writer
}

// Default returns the 10-minute soak: 10x overload of a 4-worker, 20 ms backend (200 rps
// nominal, 2000 rps offered).
func Default() Config {
	return Config{
		Duration:      10 * time.Minute,
		Load:          10,
		Workers:       4,
		Service:       20 * time.Millisecond,
		Admission:     DefaultAdmission,
		Interval:      time.Second,
		ClientTimeout: 10 * time.Second,
		Chunk:         10 * time.Second,
		Conns:         256,
		Ceilings:      Ceilings{RSSBytes: 256 << 20, Goroutines: 5000, FDs: 4096, InFlight: 64},
		MaxGrowth:     0.10,
	}
}

// NominalRPS is the backend's nominal capacity.
func (c Config) NominalRPS() float64 { return float64(c.Workers) / c.Service.Seconds() }

// Validate reports every problem, naming the field.
func (c Config) Validate() error {
	var errs []error
	add := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if c.Interval <= 0 {
		add("Interval", "must be positive, got %s", c.Interval)
	}
	if c.Duration < 3*c.Interval || c.Duration < 3*time.Second {
		add("Duration", "must hold at least three samples and three seconds, got %s", c.Duration)
	}
	if c.Duration > 24*time.Hour {
		add("Duration", "at most 24h, got %s", c.Duration)
	}
	if !(c.Load > 0) || math.IsInf(c.Load, 0) {
		add("Load", "must be a positive multiple of capacity, got %v", c.Load)
	}
	if c.Workers < 1 || c.Workers > 10000 {
		add("Workers", "must be in [1, 10000], got %d", c.Workers)
	}
	if c.Service < time.Millisecond || c.Service > time.Minute {
		add("Service", "must be in [1ms, 1m], got %s", c.Service)
	}
	if c.Workers >= 1 && c.Service > 0 {
		if rps := c.Load * c.NominalRPS(); rps > 20000 {
			add("Load", "offers %.0f rps; at most 20000 on loopback", rps)
		}
	}
	if c.Admission == "" {
		add("Admission", "required (an admission block, e.g. %q)", DefaultAdmission)
	} else if _, err := config.ParseAdmission([]byte(c.Admission)); err != nil {
		add("Admission", "%v", err)
	}
	if c.WorkDir == "" {
		add("WorkDir", "required")
	}
	if c.ClientTimeout <= 0 {
		add("ClientTimeout", "must be positive, got %s", c.ClientTimeout)
	}
	if c.Chunk < time.Second {
		add("Chunk", "must be at least 1s, got %s", c.Chunk)
	}
	if c.Conns < 1 || c.Conns > 4096 {
		add("Conns", "must be in [1, 4096], got %d", c.Conns)
	}
	if c.Ceilings.RSSBytes <= 0 || c.Ceilings.Goroutines <= 0 || c.Ceilings.FDs <= 0 || !(c.Ceilings.InFlight > 0) {
		add("Ceilings", "every ceiling must be positive, got %+v", c.Ceilings)
	}
	if !(c.MaxGrowth >= 0) || math.IsInf(c.MaxGrowth, 0) {
		add("MaxGrowth", "must be a fraction of at least 0, got %v", c.MaxGrowth)
	}
	return errors.Join(errs...)
}
