package admission

import (
	"math"
	"time"

	"golang.org/x/time/rate"
)

// TokenBucketConfig configures a token bucket: Rate tokens per second, at most Burst stored. The
// bucket starts full. A request takes Cost tokens or is refused at once.
type TokenBucketConfig struct {
	Rate  float64
	Burst int
}

// Validate reports every problem with the configuration.
func (c TokenBucketConfig) Validate() error {
	var errs fieldErrors
	if !(c.Rate > 0) || math.IsInf(c.Rate, 0) {
		errs.add("rate", "must be a positive number of requests per second, got %v", c.Rate)
	}
	if c.Burst < 1 {
		errs.add("burst", "must be at least 1, got %d", c.Burst)
	}
	return errs.err()
}

// NewTokenBucket returns the token bucket strategy as a Core. It is built on
// golang.org/x/time/rate, whose Limiter is a token bucket driven by the time passed in.
func NewTokenBucket(c TokenBucketConfig) (Core, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &tokenBucket{lim: rate.NewLimiter(rate.Limit(c.Rate), c.Burst), rate: c.Rate, burst: int64(c.Burst)}, nil
}

type tokenBucket struct {
	lim      *rate.Limiter
	rate     float64
	burst    int64
	draining bool
}

func (b *tokenBucket) Name() string { return "token-bucket" }

func (b *tokenBucket) Offer(now time.Time, t *Ticket, _ *Events) Verdict {
	if r := doorCheck(now, t, b.draining, b.Name()); r != nil {
		t.refuse(r)
		return Refused
	}
	t.cost = min(t.Req.cost(), b.burst)
	if b.lim.AllowN(now, int(t.cost)) {
		t.admit(now)
		return Admitted
	}
	// Retry-After: the time until enough tokens have accumulated.
	missing := float64(t.cost) - b.lim.TokensAt(now)
	wait := time.Duration(math.Ceil(missing / b.rate * float64(time.Second)))
	t.refuse(&Rejection{Reason: ReasonRateLimited, RetryAfter: max(wait, 0), Stage: b.Name()})
	return Refused
}

func (b *tokenBucket) Release(time.Time, *Ticket, Outcome, *Events) {}
func (b *tokenBucket) Cancel(time.Time, *Ticket, *Events)           {}
func (b *tokenBucket) Advance(time.Time, *Events)                   {}
func (b *tokenBucket) Wake() time.Time                              { return time.Time{} }
func (b *tokenBucket) Drain(time.Time, *Events)                     { b.draining = true }

func (b *tokenBucket) Stats(now time.Time) Stats {
	return Stats{Tokens: b.lim.TokensAt(now), Limit: float64(b.burst)}
}

// stateless reports that Release does nothing, so a driver may skip it.
func (b *tokenBucket) stateless() bool { return true }
