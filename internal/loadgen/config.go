package loadgen

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"time"
)

// Defaults applied by Run to zero fields of Config.
const (
	DefaultTimeout         = time.Second
	DefaultLateTolerance   = 10 * time.Millisecond
	DefaultLateStartBudget = 0.01
	// HardMaxInFlight caps Config.MaxInFlight: requests in flight each hold a goroutine and,
	// over HTTP/1.1, a connection.
	HardMaxInFlight = 10000
)

// Request is what Config.Prepare chooses for one request.
type Request struct {
	// Method is the HTTP method; empty means GET.
	Method string
	// Path replaces the path and query of Config.Target when non-empty; it must start with "/"
	// and may carry a query ("/items?id=7").
	Path string
	// Header is sent with the request. Run does not modify it, so one Header may be shared by
	// many requests.
	Header http.Header
	// Body is sent as the request body when non-empty. Run does not modify it.
	Body []byte
	// Tag groups the request in Result.Tags (for example its priority); empty means no tag.
	Tag string
}

// Config describes one run.
type Config struct {
	// Target is the base URL, for example "http://127.0.0.1:8000/".
	Target string
	// Schedule says when each request is due.
	Schedule Schedule
	// Timeout is the client timeout, counted from each request's scheduled time; a request still
	// unanswered then counts as a timeout. Zero means DefaultTimeout.
	Timeout time.Duration
	// SLO is the latency (from scheduled time) within which a 2xx answer counts as goodput.
	// Zero means Timeout. It may not exceed Timeout.
	SLO time.Duration
	// Prepare, when set, chooses the method, path, headers, body and tag of request i. It is
	// called once per offered request, in order of i, from a single goroutine, including for
	// requests that are then dropped; it must be quick and must not block. Nil sends GET Target.
	Prepare func(i int) Request
	// MaxInFlight caps the requests in flight. Zero means the peak rate times Timeout plus a
	// margin, capped by HardMaxInFlight. A request that finds the cap reached is not sent and
	// counts as a late start.
	MaxInFlight int
	// LateTolerance is how long after its scheduled time a request may start before it counts as
	// a late start. Zero means DefaultLateTolerance.
	LateTolerance time.Duration
	// Warmup leaves the requests scheduled in the first Warmup of the schedule out of the
	// result: they are sent like the others (the system under test sees one continuous load) but
	// the figures describe only what follows, the steady state. Zero measures everything.
	Warmup time.Duration
	// LateStartBudget is the share of offered requests (0 < budget <= 1) that may start late
	// before the run is marked invalid. Zero means DefaultLateStartBudget.
	LateStartBudget float64
	// Client sends the requests. Nil means a client built for the run: HTTP/1.1 keep-alive
	// connections, MaxIdleConnsPerHost equal to MaxInFlight, no redirects, no environment proxy.
	// It must be nil in a gRPC run.
	Client *http.Client
	// GRPC, when set, makes the run one of gRPC calls (see GRPC); Target is then "host:port"
	// or "http://host:port".
	GRPC *GRPC
}

// withDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.SLO == 0 {
		c.SLO = c.Timeout
	}
	if c.LateTolerance == 0 {
		c.LateTolerance = DefaultLateTolerance
	}
	if c.LateStartBudget == 0 {
		c.LateStartBudget = DefaultLateStartBudget
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = defaultMaxInFlight(c.Schedule.PeakRate(), c.Timeout)
	}
	return c
}

// defaultMaxInFlight allows for every request of one timeout window to be in flight at the peak
// rate, plus a margin for Poisson bursts and a floor for low rates.
func defaultMaxInFlight(peak float64, timeout time.Duration) int {
	n := peak*timeout.Seconds()*1.25 + 64
	if math.IsNaN(n) || n > HardMaxInFlight {
		return HardMaxInFlight
	}
	return int(math.Ceil(n))
}

// Validate reports every problem with the configuration, naming the field. Run calls it after
// applying defaults, so zero fields that have defaults are accepted.
func (c Config) Validate() error {
	var errs []error
	if c.GRPC == nil {
		if _, err := parseTarget(c.Target); err != nil {
			errs = append(errs, err)
		}
	} else {
		if _, err := parseGRPCTarget(c.Target); err != nil {
			errs = append(errs, err)
		}
		if c.GRPC.Conns < 0 || c.GRPC.Conns > MaxGRPCConns {
			errs = append(errs, fmt.Errorf("GRPC.Conns: must be in [0, %d], got %d", MaxGRPCConns, c.GRPC.Conns))
		}
		if c.Client != nil {
			errs = append(errs, errors.New("Client: must be nil in a gRPC run (it sends HTTP requests)"))
		}
	}
	if err := c.Schedule.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("Timeout: must be > 0, got %s", c.Timeout))
	}
	if c.SLO < 0 {
		errs = append(errs, fmt.Errorf("SLO: must be > 0, got %s", c.SLO))
	}
	if c.Timeout > 0 && c.SLO > c.Timeout {
		errs = append(errs, fmt.Errorf("SLO: %s exceeds Timeout %s", c.SLO, c.Timeout))
	}
	if c.MaxInFlight < 0 || c.MaxInFlight > HardMaxInFlight {
		errs = append(errs, fmt.Errorf("MaxInFlight: must be in [0, %d], got %d", HardMaxInFlight, c.MaxInFlight))
	}
	if c.LateTolerance < 0 {
		errs = append(errs, fmt.Errorf("LateTolerance: must be >= 0, got %s", c.LateTolerance))
	}
	if c.Warmup < 0 || (c.Warmup > 0 && c.Warmup >= c.Schedule.Duration()) {
		errs = append(errs, fmt.Errorf("Warmup: must be at least 0 and shorter than the schedule (%s), got %s", c.Schedule.Duration(), c.Warmup))
	}
	if math.IsNaN(c.LateStartBudget) || c.LateStartBudget < 0 || c.LateStartBudget > 1 {
		errs = append(errs, fmt.Errorf("LateStartBudget: must be in [0, 1], got %v", c.LateStartBudget))
	}
	return errors.Join(errs...)
}

// parseTarget checks Target and returns it parsed.
func parseTarget(target string) (*url.URL, error) {
	if target == "" {
		return nil, errors.New("Target: required")
	}
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("Target: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("Target: scheme must be http or https, got %q", u.Scheme)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("Target: no host in %q", target)
	}
	return u, nil
}
