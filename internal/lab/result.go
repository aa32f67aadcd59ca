package lab

import (
	"slices"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

// Result is what one strategy did in one scenario.
type Result struct {
	Summary Summary
	// Seconds holds one entry per elapsed second, from the first (arrivals in [0 s, 1 s)) to the
	// one holding the run's last event.
	Seconds []Second
}

// Summary totals a run. Counts of attempts (Incoming, Accepted, Rejected, Abandoned) include
// retries; Requests counts fresh requests only.
type Summary struct {
	Strategy string
	// Incoming is the number of attempts offered to the strategy: Accepted + Rejected +
	// Abandoned.
	Incoming int64
	// Accepted attempts were admitted; Rejected ones refused (at once or after waiting);
	// Abandoned ones withdrawn by their client while queued.
	Accepted, Rejected, Abandoned int64
	// Latency percentiles (nearest rank) of admitted attempts, each measured from the attempt's
	// arrival until its client had the answer or gave up (wait + service, or the timeout).
	P50, P95, P99, P999 time.Duration
	// P99Lo and P99Hi are P99's neighbours, the percentiles half a point either side (98.5 and
	// 99.5): where P99 would lie had half a percent of the samples fallen the other way.
	P99Lo, P99Hi time.Duration
	// MaxBuffered is the most requests the strategy held at once (admission.Stats.Buffered).
	MaxBuffered int64
	// MaxBackendQueue is the most admitted requests waiting for a backend worker at once.
	MaxBackendQueue int64
	// Requests is the number of fresh requests; Retries the number of retry attempts.
	Requests, Retries int64
	// Successes are admitted attempts answered before their client gave up.
	Successes int64
	// Timeouts are admitted attempts whose client gave up first; UpstreamTimeouts those the
	// proxy answered with 504.
	Timeouts, UpstreamTimeouts int64
	// Good is the number of requests answered successfully within the SLO of their first
	// attempt.
	Good int64
	// Refusals counts Rejected by reason (nil when nothing was refused).
	Refusals map[admission.Reason]int64
	// Span is the arrival window; End the virtual time of the run's last event.
	Span, End time.Duration
}

// AcceptancePct is the share of offered attempts that were admitted, in percent.
func (s Summary) AcceptancePct() float64 {
	if s.Incoming == 0 {
		return 0
	}
	return 100 * float64(s.Accepted) / float64(s.Incoming)
}

// GoodputRPS is good requests per second of the arrival window.
func (s Summary) GoodputRPS() float64 {
	if s.Span <= 0 {
		return 0
	}
	return float64(s.Good) / s.Span.Seconds()
}

// OfferedRPS is fresh requests per second of the arrival window.
func (s Summary) OfferedRPS() float64 {
	if s.Span <= 0 {
		return 0
	}
	return float64(s.Requests) / s.Span.Seconds()
}

// Second is one elapsed second of a run. Attempts are counted in the second they arrive
// (Elapsed 1 holds arrivals in [0 s, 1 s)); Completed and Good in the second they finish.
type Second struct {
	Elapsed int
	// Incoming, Accepted, Rejected, Abandoned, Timeouts: attempts arriving in this second.
	Incoming, Accepted, Rejected, Abandoned, Timeouts int64
	// Completed is the throughput: successful answers that finished in this second.
	Completed int64
	// Good is the goodput: successes finished in this second within the SLO.
	Good int64
	// P50 and P99 (nearest rank) of admitted attempts arriving in this second; Samples is how
	// many there were (0: the percentiles are undefined).
	P50, P99 time.Duration
	Samples  int
	// MaxBuffered is the most requests the strategy held at once during this second.
	MaxBuffered int64
	// Limit is the strategy's limit at the second's first instant (admission.Stats.Limit; 0
	// for one without a limit, and for the first second).
	Limit float64
}

// Percentile returns the nearest-rank percentile num/den (for example 99/100) of sorted values:
// the value at rank ceil(num/den * n), counting from 1. It returns 0 for no values.
func Percentile(sorted []time.Duration, num, den int) time.Duration {
	n := len(sorted)
	if n == 0 || den <= 0 {
		return 0
	}
	rank := (num*n + den - 1) / den
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

func sec(t int64) int { return int(t / int64(time.Second)) }

// secBucket accumulates one second.
type secBucket struct {
	incoming, accepted, rejected, abandoned, timeouts int64
	completed, good                                   int64
	lat                                               []time.Duration
	maxBuffered                                       int64
	limit                                             float64
}

// recorder accumulates a run's counts.
type recorder struct {
	slo      int64
	warm     int // seconds whose arrivals the summary's percentiles leave out
	secs     []secBucket
	total    Summary
	nLat     int
	maxQueue int64
}

func (r *recorder) init(slo, warmup time.Duration) {
	r.slo, r.warm = int64(slo), int(warmup/time.Second)
}

func (r *recorder) at(t int64) *secBucket {
	i := sec(t)
	for len(r.secs) <= i {
		r.secs = append(r.secs, secBucket{})
	}
	return &r.secs[i]
}

func (r *recorder) offered(t int64, retry bool) {
	r.at(t).incoming++
	r.total.Incoming++
	if retry {
		r.total.Retries++
	} else {
		r.total.Requests++
	}
}

func (r *recorder) accepted(arrive int64) {
	r.at(arrive).accepted++
	r.total.Accepted++
}

func (r *recorder) rejected(arrive int64, why admission.Reason) {
	r.at(arrive).rejected++
	r.total.Rejected++
	if r.total.Refusals == nil {
		r.total.Refusals = map[admission.Reason]int64{}
	}
	r.total.Refusals[why]++
}

func (r *recorder) abandoned(arrive int64) {
	r.at(arrive).abandoned++
	r.total.Abandoned++
}

func (r *recorder) latency(arrive, now int64) {
	b := r.at(arrive)
	b.lat = append(b.lat, time.Duration(now-arrive))
	r.nLat++
}

func (r *recorder) success(arrive, origin, now int64) {
	r.latency(arrive, now)
	r.total.Successes++
	b := r.at(now)
	b.completed++
	if r.slo == 0 || now-origin <= r.slo {
		b.good++
		r.total.Good++
	}
}

func (r *recorder) timedOut(arrive, now int64) {
	r.latency(arrive, now)
	r.at(arrive).timeouts++
	r.total.Timeouts++
}

func (r *recorder) upstreamTimedOut(arrive, now int64) {
	r.latency(arrive, now)
	r.at(arrive).timeouts++
	r.total.UpstreamTimeouts++
}

// buffered records the strategy's and the backend's holdings at t.
func (r *recorder) buffered(t, strategy, backendQueue int64) {
	b := r.at(t)
	b.maxBuffered = max(b.maxBuffered, strategy)
	r.maxQueue = max(r.maxQueue, backendQueue)
}

// crossSeconds records, for every second that starts after from and at or before to, what the
// strategy held at that second's first instant (nothing happens in between, so that is its
// holding until the next event).
func (r *recorder) crossSeconds(from, to int64, statsAt func(int64) admission.Stats, backendQueue int64) {
	for k := sec(from) + 1; k <= sec(to); k++ {
		start := int64(k) * int64(time.Second)
		st := statsAt(start)
		r.buffered(start, st.Buffered, backendQueue)
		r.at(start).limit = st.Limit
	}
}

func (r *recorder) result(name string, span time.Duration, end int64) *Result {
	r.at(end) // make sure the second of the last event exists
	res := &Result{Seconds: make([]Second, len(r.secs))}
	all := make([]time.Duration, 0, r.nLat)
	for i := range r.secs {
		b := &r.secs[i]
		slices.Sort(b.lat)
		if i >= r.warm {
			all = append(all, b.lat...)
		}
		res.Seconds[i] = Second{
			Elapsed:  i + 1,
			Incoming: b.incoming, Accepted: b.accepted, Rejected: b.rejected,
			Abandoned: b.abandoned, Timeouts: b.timeouts,
			Completed: b.completed, Good: b.good,
			P50: Percentile(b.lat, 50, 100), P99: Percentile(b.lat, 99, 100), Samples: len(b.lat),
			MaxBuffered: b.maxBuffered, Limit: b.limit,
		}
		r.total.MaxBuffered = max(r.total.MaxBuffered, b.maxBuffered)
	}
	slices.Sort(all)
	s := r.total
	s.Strategy = name
	s.P50, s.P95 = Percentile(all, 50, 100), Percentile(all, 95, 100)
	s.P99, s.P999 = Percentile(all, 99, 100), Percentile(all, 999, 1000)
	s.P99Lo, s.P99Hi = Percentile(all, 985, 1000), Percentile(all, 995, 1000)
	s.MaxBackendQueue = r.maxQueue
	s.Span, s.End = span, time.Duration(end)
	res.Summary = s
	return res
}
