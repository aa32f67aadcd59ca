package lab

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/loadshed/loadshed/internal/loadgen"
	"github.com/loadshed/loadshed/internal/slowtail"
	"github.com/loadshed/loadshed/pkg/admission"
)

// Limits that keep a run bounded in memory and time whatever the input.
const (
	// MaxRetries is the largest Retry.Max.
	MaxRetries = 100
	// MaxServers is the largest Scenario.Servers.
	MaxServers = 1 << 20
)

// Scenario is a workload and a service model. A strategy runs against it with Run; the same
// Scenario and seed give the same arrivals and service times to every strategy.
type Scenario struct {
	// Arrivals says when fresh requests arrive.
	Arrivals Arrivals
	// MaxRequests caps the number of fresh requests; 0 leaves the count to Arrivals.
	MaxRequests int
	// Service is the backend's service-time distribution (slowtail.Constant for a fixed time).
	Service slowtail.Config
	// Servers is the number of backend workers; 0 means unlimited. Admitted requests beyond
	// Servers wait in one unbounded FIFO inside the backend, which goes on working for clients
	// that have gone (a naive service).
	Servers int
	// Client is how callers behave: timeouts and retries.
	Client Client
	// UpstreamTimeout is the proxy's limit on waiting for the backend's answer after admission;
	// past it the proxy answers 504 and releases the permit as Dropped. 0: no limit.
	UpstreamTimeout time.Duration
	// SLO is the end-to-end latency (from a request's first attempt) within which a success
	// counts as goodput; 0 counts every success.
	SLO time.Duration
	// Seed seeds Poisson arrivals, service times, hops and retry jitter.
	Seed uint64
	// ServiceSeed, when not 0, seeds the service times instead of a stream derived from Seed:
	// the synthetic backend's own seed, so that a comparison with it draws the same sequence of
	// service times (in the order requests start service) and differs only by the model.
	ServiceSeed uint64
	// Hop is what each admitted request pays on the way through the proxy to the backend and
	// back beyond the service-time model; the zero value is none.
	Hop Hop
	// Speed runs the backend and the hop Speed times as fast as modelled (0 means 1): every
	// service time, worker overhead and path hop is divided by it. A prediction's sensitivity to
	// capacity is the same run at Speed 0.95 and 1.05.
	Speed float64
	// Warmup leaves the requests that arrive in the first Warmup (whole seconds) out of the
	// summary's latency percentiles: a strategy that learns (the adaptive limit's slow start)
	// is then judged where it settled. Counts and goodput still cover the whole run.
	Warmup time.Duration
	// Node slows service times and path hops down by moments, as other processes on a busy node
	// do; the zero value is a quiet node.
	Node Node
}

// Client models callers.
type Client struct {
	// Timeout is how long a caller waits for an answer; 0 waits for ever. A caller that gives up
	// while queued in the strategy withdraws (Cancel); one that gives up after admission leaves
	// the backend working and the proxy releases the permit at once (Ignore), as a real proxy
	// does when its client disconnects.
	Timeout time.Duration
	// PropagateDeadline sets each request's admission deadline to arrival + Timeout (the
	// X-Request-Timeout header), so strategies refuse work that cannot finish in time.
	PropagateDeadline bool
	// Retry is the retry policy; the zero value never retries.
	Retry Retry
}

// Retry is a client retry policy with exponential backoff.
type Retry struct {
	// Max is how many times one request is retried at most (0: never).
	Max int
	// Backoff is the wait before the first retry; each later retry waits Multiplier times longer,
	// up to MaxBackoff (0: no cap).
	Backoff    time.Duration
	Multiplier float64 // 0 means 2
	MaxBackoff time.Duration
	// Jitter draws each wait uniformly from [0, backoff] ("full jitter").
	Jitter bool
	// OnRefusal retries refused requests (429/503); OnTimeout retries requests the client gave
	// up on and 504s.
	OnRefusal, OnTimeout bool
	// HonorRetryAfter waits at least the refusal's Retry-After before retrying.
	HonorRetryAfter bool
}

// Validate reports every problem with the scenario, each naming its field.
func (s Scenario) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if s.Arrivals == nil {
		bad("arrivals", "required")
	}
	if s.MaxRequests < 0 {
		bad("maxRequests", "must not be negative, got %d", s.MaxRequests)
	}
	if err := s.Service.Validate(); err != nil {
		bad("service", "%v", err)
	}
	if s.Servers < 0 || s.Servers > MaxServers {
		bad("servers", "must be in [0, %d], got %d", MaxServers, s.Servers)
	}
	if s.Client.Timeout < 0 {
		bad("client.timeout", "must not be negative, got %s", s.Client.Timeout)
	}
	if s.Client.PropagateDeadline && s.Client.Timeout == 0 {
		bad("client.propagateDeadline", "needs client.timeout")
	}
	r := s.Client.Retry
	if r.Max < 0 || r.Max > MaxRetries {
		bad("client.retry.max", "must be in [0, %d], got %d", MaxRetries, r.Max)
	}
	if r.Backoff < 0 {
		bad("client.retry.backoff", "must not be negative, got %s", r.Backoff)
	}
	if r.MaxBackoff < 0 {
		bad("client.retry.maxBackoff", "must not be negative, got %s", r.MaxBackoff)
	}
	if r.Multiplier != 0 && (r.Multiplier < 1 || r.Multiplier > 100 || math.IsNaN(r.Multiplier)) {
		bad("client.retry.multiplier", "must be in [1, 100] (or 0 for 2), got %v", r.Multiplier)
	}
	if r.Max > 0 && !r.OnRefusal && !r.OnTimeout {
		bad("client.retry", "max is %d but neither onRefusal nor onTimeout is set", r.Max)
	}
	if r.OnTimeout && r.Max > 0 && s.Client.Timeout == 0 && s.UpstreamTimeout == 0 {
		bad("client.retry.onTimeout", "needs client.timeout or upstreamTimeout")
	}
	if s.UpstreamTimeout < 0 {
		bad("upstreamTimeout", "must not be negative, got %s", s.UpstreamTimeout)
	}
	if s.SLO < 0 {
		bad("slo", "must not be negative, got %s", s.SLO)
	}
	if s.Hop.Worker < 0 || s.Hop.Worker > MaxHop {
		bad("hop.worker", "must be in [0, %s], got %s", MaxHop, s.Hop.Worker)
	}
	if s.Hop.Path.Const < 0 || s.Hop.Path.Const > MaxHop {
		bad("hop.path", "must be in [0, %s], got %s", MaxHop, s.Hop.Path.Const)
	}
	for _, d := range s.Hop.Path.Samples {
		if d < 0 || d > MaxHop {
			bad("hop.path", "samples must be in [0, %s], got %s", MaxHop, d)
			break
		}
	}
	s.Node.validate(bad)
	if s.Warmup < 0 || (s.Arrivals != nil && s.Warmup >= s.Arrivals.Span() && s.Warmup > 0) {
		bad("warmup", "must be at least 0 and shorter than the arrivals' span, got %s", s.Warmup)
	}
	if s.Speed != 0 && !(s.Speed >= 0.1 && s.Speed <= 10) {
		bad("speed", "must be in [0.1, 10] (or 0 for 1), got %v", s.Speed)
	}
	return errors.Join(errs...)
}

// Arrival is one fresh request offered by a workload.
type Arrival struct {
	// At is the offset from the start of the run.
	At time.Duration
	// Priority and Cost are passed to the strategy in admission.Request.
	Priority admission.Priority
	Cost     int64
}

// Arrivals is an arrival process.
type Arrivals interface {
	// Open starts the process for one run. The same seed gives the same arrivals.
	Open(seed uint64) (ArrivalStream, error)
	// Span is the length of the window over which requests are offered; rates (goodput per
	// second) are computed over it.
	Span() time.Duration
	// String describes the process for reports.
	String() string
}

// ArrivalStream yields arrivals in non-decreasing order of At.
type ArrivalStream interface {
	// Next returns the next arrival, or false when the process has ended.
	Next() (Arrival, bool)
}

// ScheduleArrivals offers requests on a loadgen.Schedule, the same schedule the live load
// generator follows, so lab and live runs see identical arrivals. Poisson schedules are drawn
// from the run's seed (Schedule.Seed is ignored).
type ScheduleArrivals struct {
	Schedule loadgen.Schedule
	// Priority and Cost are given to every request (a Cost below 1 counts as 1).
	Priority admission.Priority
	Cost     int64
	// Label, when set, replaces the generated description.
	Label string
}

// Open implements Arrivals.
func (a ScheduleArrivals) Open(seed uint64) (ArrivalStream, error) {
	s := a.Schedule
	if s.Poisson {
		s = s.WithPoisson(seed)
	}
	offs, err := s.Offsets()
	if err != nil {
		return nil, err
	}
	return &offsetStream{offs: offs, prio: a.Priority, cost: max(a.Cost, 1)}, nil
}

// Span implements Arrivals.
func (a ScheduleArrivals) Span() time.Duration { return a.Schedule.Duration() }

func (a ScheduleArrivals) String() string {
	if a.Label != "" {
		return a.Label
	}
	kind := "even"
	if a.Schedule.Poisson {
		kind = "poisson"
	}
	s := kind
	for i, p := range a.Schedule.Phases {
		sep := " "
		if i > 0 {
			sep = ", "
		}
		s += fmt.Sprintf("%s%g rps for %s", sep, p.Rate, p.Duration)
	}
	return s
}

type offsetStream struct {
	offs []time.Duration
	i    int
	prio admission.Priority
	cost int64
}

func (o *offsetStream) Next() (Arrival, bool) {
	if o.i >= len(o.offs) {
		return Arrival{}, false
	}
	at := o.offs[o.i]
	o.i++
	return Arrival{At: at, Priority: o.prio, Cost: o.cost}, true
}

// TraceArrivals replays recorded arrivals (see ReadTrace).
type TraceArrivals struct {
	Records []Arrival
	// Name describes the trace (its file name) in reports.
	Name string
}

// Open implements Arrivals. Records must be in non-decreasing order of At.
func (t TraceArrivals) Open(uint64) (ArrivalStream, error) {
	for i := 1; i < len(t.Records); i++ {
		if t.Records[i].At < t.Records[i-1].At {
			return nil, fmt.Errorf("trace %s: record %d arrives at %s, before record %d (%s)",
				t.Name, i+1, t.Records[i].At, i, t.Records[i-1].At)
		}
	}
	return &traceStream{recs: t.Records}, nil
}

// Span implements Arrivals: up to the last arrival, rounded up to whole seconds.
func (t TraceArrivals) Span() time.Duration {
	if len(t.Records) == 0 {
		return 0
	}
	last := t.Records[len(t.Records)-1].At
	return (last/time.Second + 1) * time.Second
}

func (t TraceArrivals) String() string {
	return fmt.Sprintf("trace %s (%d requests)", t.Name, len(t.Records))
}

type traceStream struct {
	recs []Arrival
	i    int
}

func (s *traceStream) Next() (Arrival, bool) {
	if s.i >= len(s.recs) {
		return Arrival{}, false
	}
	s.i++
	return s.recs[s.i-1], true
}
