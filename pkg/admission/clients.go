package admission

import (
	"math"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2/simplelru"
	"golang.org/x/time/rate"
)

// ClientLimitsConfig configures per-client token buckets: each client key gets Rate requests
// per second with Burst, keys in Allow are never limited, keys in Deny are always refused. At
// most MaxKeys buckets are kept; the least recently used is forgotten first (a forgotten client
// starts again with a full bucket), so memory stays bounded however many keys arrive.
type ClientLimitsConfig struct {
	Rate    float64
	Burst   int
	MaxKeys int
	Allow   []string
	Deny    []string
}

// Validate reports every problem with the configuration.
func (c ClientLimitsConfig) Validate() error {
	var errs fieldErrors
	if !(c.Rate > 0) || math.IsInf(c.Rate, 0) {
		errs.add("rate", "must be a positive number of requests per second, got %v", c.Rate)
	}
	if c.Burst < 1 {
		errs.add("burst", "must be at least 1, got %d", c.Burst)
	}
	if c.MaxKeys < 1 {
		errs.add("maxKeys", "must be at least 1, got %d", c.MaxKeys)
	}
	allowed := map[string]bool{}
	for _, k := range c.Allow {
		allowed[k] = true
	}
	for _, k := range c.Deny {
		if allowed[k] {
			errs.add("deny", "key %q is also allow-listed", k)
		}
	}
	return errs.err()
}

// ClientLimits applies per-client limits. It is safe for concurrent use.
type ClientLimits struct {
	cfg   ClientLimitsConfig
	allow map[string]bool
	deny  map[string]bool
	mu    sync.Mutex
	keys  *lru.LRU[string, *rate.Limiter]
}

// NewClientLimits returns per-client limits.
func NewClientLimits(c ClientLimitsConfig) (*ClientLimits, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	keys, err := lru.NewLRU[string, *rate.Limiter](c.MaxKeys, nil)
	if err != nil {
		return nil, err
	}
	l := &ClientLimits{cfg: c, allow: map[string]bool{}, deny: map[string]bool{}, keys: keys}
	for _, k := range c.Allow {
		l.allow[k] = true
	}
	for _, k := range c.Deny {
		l.deny[k] = true
	}
	return l, nil
}

// Check takes cost tokens from the client's bucket at now. It returns nil when the request may
// go on, or a *Rejection with ReasonDenied (deny-listed) or ReasonClientLimited (with the time
// until enough tokens).
func (l *ClientLimits) Check(now time.Time, key string, cost int64) *Rejection {
	if l.deny[key] {
		return &Rejection{Reason: ReasonDenied, Stage: "clients"}
	}
	if l.allow[key] {
		return nil
	}
	n := int(min(max(cost, 1), int64(l.cfg.Burst)))
	l.mu.Lock()
	b, ok := l.keys.Get(key)
	if !ok {
		b = rate.NewLimiter(rate.Limit(l.cfg.Rate), l.cfg.Burst)
		l.keys.Add(key, b)
	}
	l.mu.Unlock()
	if b.AllowN(now, n) {
		return nil
	}
	wait := time.Duration(math.Ceil((float64(n) - b.TokensAt(now)) / l.cfg.Rate * float64(time.Second)))
	return &Rejection{Reason: ReasonClientLimited, RetryAfter: max(wait, 0), Stage: "clients"}
}

// Len is the number of clients currently tracked (at most MaxKeys).
func (l *ClientLimits) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.keys.Len()
}
