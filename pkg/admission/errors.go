package admission

import (
	"errors"
	"fmt"
	"time"
)

// Reason names why a request was refused. Reasons are stable strings used as metric labels.
type Reason string

const (
	ReasonRateLimited      Reason = "rate_limited"      // token or leaky bucket empty/full
	ReasonQueueFull        Reason = "queue_full"        // no room to wait
	ReasonQueueTimeout     Reason = "queue_timeout"     // waited the longest allowed
	ReasonConcurrencyLimit Reason = "concurrency_limit" // in-flight limit reached
	ReasonDeadline         Reason = "deadline"          // the request's deadline cannot be met
	ReasonDraining         Reason = "draining"          // shutting down
	ReasonClientLimited    Reason = "client_limited"    // a per-client limit refused it
	ReasonDenied           Reason = "denied"            // the client is deny-listed
	ReasonSidecarOverload  Reason = "sidecar_overload"  // the sidecar's own CPU is overloaded
)

// Rejection is the error returned for every refusal. RetryAfter is the strategy's estimate of
// when a retry could succeed (zero when it has none).
type Rejection struct {
	Reason     Reason
	RetryAfter time.Duration
	// Stage names the strategy that refused (the stage of a chain), for metrics.
	Stage string
}

func (r *Rejection) Error() string {
	if r.RetryAfter > 0 {
		return fmt.Sprintf("admission refused by %s: %s (retry after %s)", r.Stage, r.Reason, r.RetryAfter)
	}
	return fmt.Sprintf("admission refused by %s: %s", r.Stage, r.Reason)
}

// Is reports whether target is ErrRejected or a sentinel with the same Reason, so that
// errors.Is(err, ErrQueueFull) works on any refusal for a full queue.
func (r *Rejection) Is(target error) bool {
	if target == ErrRejected {
		return true
	}
	t, ok := target.(*Rejection)
	return ok && t.Stage == "" && t.Reason == r.Reason
}

// Sentinels for errors.Is. Every refusal matches ErrRejected and the sentinel of its reason.
var (
	ErrRejected         = errors.New("admission: rejected")
	ErrRateLimited      = &Rejection{Reason: ReasonRateLimited}
	ErrQueueFull        = &Rejection{Reason: ReasonQueueFull}
	ErrQueueTimeout     = &Rejection{Reason: ReasonQueueTimeout}
	ErrConcurrencyLimit = &Rejection{Reason: ReasonConcurrencyLimit}
	ErrDeadline         = &Rejection{Reason: ReasonDeadline}
	ErrDraining         = &Rejection{Reason: ReasonDraining}
	ErrClientLimited    = &Rejection{Reason: ReasonClientLimited}
	ErrDenied           = &Rejection{Reason: ReasonDenied}
	ErrSidecarOverload  = &Rejection{Reason: ReasonSidecarOverload}
)

// AllReasons lists every reason, in a stable order (for metrics pre-initialisation and docs).
var AllReasons = []Reason{
	ReasonRateLimited, ReasonQueueFull, ReasonQueueTimeout, ReasonConcurrencyLimit,
	ReasonDeadline, ReasonDraining, ReasonClientLimited, ReasonDenied, ReasonSidecarOverload,
	ReasonCohort,
}
