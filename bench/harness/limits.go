package harness

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Backend describes the synthetic backend every target fronts: Workers workers, each request
// taking Service (constant: StdDev 0, no tail), so its capacity is Workers/Service.
type Backend struct {
	Workers int
	Service time.Duration
}

// CapacityRPS is the backend's capacity in requests per second.
func (b Backend) CapacityRPS() float64 { return float64(b.Workers) / b.Service.Seconds() }

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
