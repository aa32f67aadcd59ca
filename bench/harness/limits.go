package harness

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/loadshed/loadshed/internal/slowtail"
)

// Backend describes the synthetic backend every target fronts: Workers workers, each request
// taking Service (constant: StdDev 0, no tail), so its capacity is Workers/Service.
type Backend struct {
	Workers int
	Service time.Duration
	// SlowTail draws service times from the project's slow-tail model (slowtail.DefaultConfig)
	// scaled so that its normal path has mean Service: stddev Service/4, 1% of requests in an
	// exponential tail of mean 15 x Service clamped to [5, 100] x Service. Capacity is still
	// quoted as Workers/Service; the tail takes about an eighth of it.
	SlowTail bool `json:",omitempty"`
}

// CapacityRPS is the backend's capacity in requests per second.
func (b Backend) CapacityRPS() float64 { return float64(b.Workers) / b.Service.Seconds() }

// serviceTime is the service time distribution the backend is configured with.
func (b Backend) serviceTime() slowtail.Config {
	if !b.SlowTail {
		return slowtail.Constant(b.Service)
	}
	d := slowtail.DefaultConfig()
	scale := func(x time.Duration) time.Duration {
		return min(slowtail.MaxDuration, time.Duration(float64(x)*float64(b.Service)/float64(d.Mean)))
	}
	d.Stddev, d.TailMean, d.TailMin, d.TailMax = scale(d.Stddev), scale(d.TailMean), scale(d.TailMin), scale(d.TailMax)
	d.Mean = b.Service
	return d
}

// Limits are the admission settings every target derives from the same backend and SLO.
type Limits struct {
	CapacityRPS float64
	Service     time.Duration
	SLO         time.Duration
	// InFlight is L = C*S, the requests the backend serves at once.
	InFlight int
	// Queue is Q = C*(SLO-S), the requests that can wait and still finish within the SLO.
	Queue int
	// MaxWait is SLO-S, the longest a request may wait before its service starts.
	MaxWait time.Duration
}

// DeriveLimits applies Little's law to the backend and the SLO.
func DeriveLimits(b Backend, slo time.Duration) (Limits, error) {
	var errs []error
	if b.Workers < 1 {
		errs = append(errs, fmt.Errorf("backend workers: must be at least 1, got %d", b.Workers))
	}
	if b.Service <= 0 {
		errs = append(errs, fmt.Errorf("backend service time: must be above 0, got %s", b.Service))
	}
	if slo <= b.Service {
		errs = append(errs, fmt.Errorf("slo: must exceed the service time %s, got %s", b.Service, slo))
	}
	if err := errors.Join(errs...); err != nil {
		return Limits{}, err
	}
	c := b.CapacityRPS()
	return Limits{
		CapacityRPS: c,
		Service:     b.Service,
		SLO:         slo,
		InFlight:    max(1, int(math.Round(c*b.Service.Seconds()))),
		Queue:       max(1, int(math.Round(c*(slo-b.Service).Seconds()))),
		MaxWait:     slo - b.Service,
	}, nil
}
