package quota

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/loadshed/loadshed/pkg/admission"
)

// stage is the Stage of the limiters' refusals: the same as pkg/admission's client limits, so
// a shared quota sheds under the same label as a local one.
const stage = "clients"

// Shared is a quota enforced through a Store: one GCRA state per client key in Redis, so every
// replica sharing the store draws from the same quota. It is safe for concurrent use.
type Shared struct {
	s        *Store
	q        Quota
	base     string  // key prefix of this quota
	interval float64 // microseconds between two units at the quota's rate
	burst    int64
	allow    map[string]bool
	deny     map[string]bool

	fbMu sync.Mutex
	fb   atomic.Pointer[fallback]

	closed atomic.Bool

	storeAllowed, storeLimited, fbAllowed, fbLimited prometheus.Counter
}

var _ Limiter = (*Shared)(nil)

// fallback is the local quota used while the store cannot answer: rate / n per replica.
type fallback struct {
	n      int64
	limits *admission.ClientLimits
}

// Limiter returns the shared limiter of quota q. Limiters of one store share its connections,
// its breaker and its replica count.
func (s *Store) Limiter(q Quota) (*Shared, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	l := &Shared{
		s:        s,
		q:        q,
		base:     quotaBase(s.cfg.KeyPrefix, q.Name),
		interval: 1e6 / q.Limits.Rate,
		burst:    int64(q.Limits.Burst),
		allow:    map[string]bool{},
		deny:     map[string]bool{},
	}
	for _, k := range q.Limits.Allow {
		l.allow[k] = true
	}
	for _, k := range q.Limits.Deny {
		l.deny[k] = true
	}
	if _, err := l.local(); err != nil {
		return nil, err
	}
	if m := s.m; m != nil {
		l.storeAllowed = m.Decisions.WithLabelValues(q.Name, "store", "allowed")
		l.storeLimited = m.Decisions.WithLabelValues(q.Name, "store", "limited")
		l.fbAllowed = m.Decisions.WithLabelValues(q.Name, "fallback", "allowed")
		l.fbLimited = m.Decisions.WithLabelValues(q.Name, "fallback", "limited")
	}
	return l, nil
}

// Check takes cost units (at least 1, at most the burst) from key's quota. The store decides
// with its own clock (one clock for every replica); now is the time of the local fallback.
func (l *Shared) Check(ctx context.Context, now time.Time, key string, cost int64) *admission.Rejection {
	if l.deny[key] {
		return &admission.Rejection{Reason: admission.ReasonDenied, Stage: stage}
	}
	if l.allow[key] {
		return nil
	}
	s := l.s
	if !s.br.calls() || l.closed.Load() || s.done.Load() {
		return l.checkLocally(now, key, cost)
	}
	n := min(max(cost, 1), l.burst)
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	start := s.clock.Now()
	v, err := s.be.take(cctx, keyOf(l.base, key), l.interval, l.burst, n, time.Time{})
	cancel()
	if err != nil {
		if ctx.Err() == nil { // else the caller left: not the store's fault
			s.observe("take", start, err)
			s.failed(err)
		}
		return l.checkLocally(now, key, cost)
	}
	s.observe("take", start, nil)
	s.br.success()
	if v.allowed {
		inc(l.storeAllowed)
		return nil
	}
	inc(l.storeLimited)
	return &admission.Rejection{Reason: admission.ReasonClientLimited, RetryAfter: v.retryAfter, Stage: stage}
}

// checkLocally decides at rate / replicas in this process.
func (l *Shared) checkLocally(now time.Time, key string, cost int64) *admission.Rejection {
	lim, err := l.local()
	if err != nil { // cannot happen with a validated quota; never refuse for our own fault
		return nil
	}
	r := lim.Check(now, key, cost)
	if r == nil {
		inc(l.fbAllowed)
	} else {
		inc(l.fbLimited)
	}
	return r
}

// local returns the fallback limits for the current replica count, rebuilding them when the
// count changed. The count only changes while the store answers (it is read from there), so
// the buckets a rebuild forgets were not in use.
func (l *Shared) local() (*admission.ClientLimits, error) {
	n := l.s.Replicas()
	if f := l.fb.Load(); f != nil && f.n == n {
		return f.limits, nil
	}
	l.fbMu.Lock()
	defer l.fbMu.Unlock()
	if f := l.fb.Load(); f != nil && f.n == n {
		return f.limits, nil
	}
	lim, err := admission.NewClientLimits(FallbackLimits(l.q.Limits, n))
	if err != nil {
		return nil, err
	}
	l.fb.Store(&fallback{n: n, limits: lim})
	return lim, nil
}

// Close stops this limiter from calling the store; it decides locally afterwards. The store
// itself is closed by its owner.
func (l *Shared) Close() error {
	l.closed.Store(true)
	return nil
}

func inc(c prometheus.Counter) {
	if c != nil {
		c.Inc()
	}
}
