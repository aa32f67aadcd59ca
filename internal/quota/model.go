package quota

import (
	"math"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

// gcraStep is the algorithm of gcraScript in Go: tat is the stored theoretical arrival time
// (-Inf or anything before now: none), all times in microseconds. The script's tests check
// that the script answers exactly this; the unit tests' fake backend and the lab's model of
// replicas sharing a store run it.
func gcraStep(tat, now, interval float64, burst, cost int64) (v verdict, newTAT float64) {
	tat = max(tat, now)
	next := tat + float64(cost)*interval
	allowAt := next - float64(burst)*interval
	if allowAt > now {
		return verdict{retryAfter: usec(math.Ceil(allowAt - now)), resetAfter: usec(math.Ceil(tat - now))}, 0
	}
	return verdict{allowed: true, remaining: int64(math.Floor((now - allowAt) / interval)), resetAfter: usec(math.Ceil(next - now))}, next
}

func usec(f float64) time.Duration { return time.Duration(f) * time.Microsecond }

// Bucket is one client's quota as the store keeps it, computed in this process: the store's
// algorithm (GCRA) on the caller's clock, for a simulation of replicas that share one store
// (the lab's). It is not safe for concurrent use.
type Bucket struct {
	interval float64 // microseconds per unit
	burst    int64
	tat      float64 // theoretical arrival time, µs since scriptEpoch; -Inf: none yet
}

// NewBucket returns a full bucket of rate units per second with burst, as a Shared limiter of
// that quota sees a client it has not seen.
func NewBucket(rate float64, burst int) *Bucket {
	return &Bucket{interval: 1e6 / rate, burst: int64(burst), tat: math.Inf(-1)}
}

// Take takes cost units (at least 1, at most the burst, as Shared.Check takes them) at now. It
// returns nil or a client_limited refusal with the store's Retry-After.
func (b *Bucket) Take(now time.Time, cost int64) *admission.Rejection {
	n := min(max(cost, 1), b.burst)
	v, next := gcraStep(b.tat, float64(now.Sub(scriptEpoch).Microseconds()), b.interval, b.burst, n)
	if !v.allowed {
		return &admission.Rejection{Reason: admission.ReasonClientLimited, RetryAfter: v.retryAfter, Stage: stage}
	}
	b.tat = next
	return nil
}

// FallbackLimits is what each replica enforces by itself while the store cannot answer:
// rate / replicas, and a burst of ceil(burst / replicas) (at least 1), so that the replicas
// together admit about the quota when a client's requests are spread over all of them.
func FallbackLimits(c admission.ClientLimitsConfig, replicas int64) admission.ClientLimitsConfig {
	n := max(replicas, 1)
	c.Rate /= float64(n)
	c.Burst = max(1, int(math.Ceil(float64(c.Burst)/float64(n))))
	return c
}
