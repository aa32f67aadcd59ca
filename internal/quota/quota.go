// Package quota enforces per-client limits across every replica of a service: the quotas live
// in a store the replicas share (Redis), so "client X may send 100 requests/s" holds however
// many replicas serve X. The store's failures are invisible to clients: every call is bounded
// by a short timeout, a circuit breaker stops calling a store that is away, and meanwhile each
// replica enforces rate / replicas by itself.
//
// A Limiter is one quota. Local keeps the buckets in this process (pkg/admission's
// ClientLimits); a Store's limiters keep them in Redis, one GCRA state per client key.
package quota

import (
	"context"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

// Limiter is one per-client quota.
type Limiter interface {
	// Check takes cost units from key's quota at now. nil: go on. A *admission.Rejection:
	// refuse, with ReasonClientLimited and the wait until the units are there (RetryAfter), or
	// ReasonDenied for a deny-listed key. It never blocks longer than the store's timeout and
	// never fails a request because the store failed: then it decides locally.
	Check(ctx context.Context, now time.Time, key string, cost int64) *admission.Rejection
	// Close releases the limiter.
	Close() error
}

// Local is a Limiter whose buckets live in this process: pkg/admission's ClientLimits.
type Local struct {
	limits *admission.ClientLimits
}

var _ Limiter = (*Local)(nil)

// NewLocal returns a local limiter.
func NewLocal(c admission.ClientLimitsConfig) (*Local, error) {
	l, err := admission.NewClientLimits(c)
	if err != nil {
		return nil, err
	}
	return &Local{limits: l}, nil
}

// Check takes cost units from key's bucket at now.
func (l *Local) Check(_ context.Context, now time.Time, key string, cost int64) *admission.Rejection {
	return l.limits.Check(now, key, cost)
}

// Close does nothing: a local limiter holds no resources beyond memory.
func (l *Local) Close() error { return nil }
