package admission

import (
	"math"
	"sync/atomic"
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
	lim      *rate.Limiter // has its own lock: the bucket needs no other
	rate     float64
	burst    int64
	draining atomic.Bool
}

func (b *tokenBucket) Name() string { return "token-bucket" }

func (b *tokenBucket) Offer(now time.Time, t *Ticket, _ *Events) Verdict {
	if r := doorCheck(now, &t.Req, b.draining.Load(), b.Name()); r != nil {
		t.refuse(r)
		return Refused
	}
	if r := b.take(now, &t.Req); r != nil {
		t.refuse(r)
		return Refused
	}
	t.cost = min(t.Req.cost(), b.burst)
	t.admit(now)
	return Admitted
}

// take takes the request's tokens at now, or says when enough will have accumulated.
func (b *tokenBucket) take(now time.Time, req *Request) *Rejection {
	cost := min(req.cost(), b.burst)
	if b.lim.AllowN(now, int(cost)) {
		return nil
	}
	missing := float64(cost) - b.lim.TokensAt(now)
	wait := time.Duration(math.Ceil(missing / b.rate * float64(time.Second)))
	return &Rejection{Reason: ReasonRateLimited, RetryAfter: max(wait, 0), Stage: b.Name()}
}

// admitNow is the Limiter's lock-free path (see fastCore): the bucket is x/time/rate's.
func (b *tokenBucket) admitNow(clock Clock, req Request) (int64, *Rejection) {
	now := clock.Now()
	if r := doorCheck(now, &req, b.draining.Load(), b.Name()); r != nil {
		return 0, r
	}
	if r := b.take(now, &req); r != nil {
		return 0, r
	}
	return 0, nil
}

func (b *tokenBucket) releaseNow(int64) {}

func (b *tokenBucket) Release(time.Time, *Ticket, Outcome, *Events) {}
func (b *tokenBucket) Cancel(time.Time, *Ticket, *Events)           {}
func (b *tokenBucket) Advance(time.Time, *Events)                   {}
func (b *tokenBucket) Wake() time.Time                              { return time.Time{} }
func (b *tokenBucket) Drain(time.Time, *Events)                     { b.draining.Store(true) }
func (b *tokenBucket) maxQueueWait() time.Duration                  { return 0 }

func (b *tokenBucket) Stats(now time.Time) Stats {
	return Stats{Tokens: b.lim.TokensAt(now), Limit: float64(b.burst)}
}
