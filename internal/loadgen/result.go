package loadgen

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
)

// Result summarises one run. It is a plain struct; encoding/json writes durations as integer
// nanoseconds and Codes with the status codes as keys. Every share is in [0, 1].
type Result struct {
	// Protocol is "http", or "grpc" for a run of gRPC calls (Config.GRPC). In a gRPC run the
	// status codes are grpc-status values: Codes counts them, Success and Goodput count OK, Shed
	// counts loadshed's refusals (IsGRPCShed), and pushback takes the place of Retry-After.
	Protocol string `json:"protocol"`
	// The run's settings, after defaults.
	Target          string        `json:"target"`
	Schedule        Schedule      `json:"schedule"`
	Duration        time.Duration `json:"duration"` // length of the schedule
	Timeout         time.Duration `json:"timeout"`
	SLO             time.Duration `json:"slo"`
	MaxInFlight     int           `json:"maxInFlight"`
	LateTolerance   time.Duration `json:"lateTolerance"`
	LateStartBudget float64       `json:"lateStartBudget"`
	// Elapsed is the wall time from the start of the schedule until the last request finished.
	Elapsed time.Duration `json:"elapsed"`

	// Offered counts requests whose scheduled time came during the run (all of them unless the
	// run was canceled); Sent those actually sent; Dropped those not sent because MaxInFlight was
	// reached; Completed those answered with a status and a fully read body.
	Offered   int `json:"offered"`
	Sent      int `json:"sent"`
	Dropped   int `json:"dropped"`
	Completed int `json:"completed"`
	// Codes counts completed answers by status code.
	Codes map[int]int `json:"codes"`
	// Timeouts counts sent requests not answered within Timeout of their scheduled time.
	Timeouts int `json:"timeouts"`
	// TransportErrors counts sent requests that failed otherwise (refused connection, reset, ...).
	TransportErrors int `json:"transportErrors"`
	// Canceled counts requests cut short, or never sent, because the run was canceled.
	Canceled int `json:"canceled"`
	// BuildErrors counts requests that could not be built from what Prepare returned.
	BuildErrors int `json:"buildErrors"`
	// ErrorSamples holds the first few distinct transport and build error messages.
	ErrorSamples []string `json:"errorSamples,omitempty"`

	// Success counts 2xx answers; Goodput the 2xx answers within SLO of their scheduled time.
	Success    int     `json:"success"`
	Goodput    int     `json:"goodput"`
	OfferedRPS float64 `json:"offeredRps"` // Offered / Duration
	GoodputRPS float64 `json:"goodputRps"` // Goodput / Duration
	// Shed counts refusals: 429, 503 and 403 answers (with or without Retry-After). Admitted
	// counts every other answer. ShedShare is Shed / Offered.
	Shed      int     `json:"shed"`
	Admitted  int     `json:"admitted"`
	ShedShare float64 `json:"shedShare"`
	// AdmittedLatency holds nearest-rank percentiles of admitted answers' latency from their
	// scheduled time; ShedLatencyP99 the same for refusals.
	AdmittedLatency Latency       `json:"admittedLatency"`
	ShedLatencyP99  time.Duration `json:"shedLatencyP99"`
	// SuccessLatency holds the same percentiles for the 2xx answers alone (a frontend's 502s
	// are admitted answers but no success).
	SuccessLatency Latency `json:"successLatency"`
	// RetryAfterEligible counts 429 and 503 answers, RetryAfterPresent those of them carrying a
	// Retry-After header; RetryAfterCoverage is their ratio (0 when there were none).
	RetryAfterEligible int     `json:"retryAfterEligible"`
	RetryAfterPresent  int     `json:"retryAfterPresent"`
	RetryAfterCoverage float64 `json:"retryAfterCoverage"`
	// gRPC runs only. ShedCodes counts refusals by grpc-status. PushbackPresent counts refusals
	// carrying a valid grpc-retry-pushback-ms trailer, PushbackCoverage is its share of Shed (0
	// when nothing was shed). TrailersOnly counts refusals sent as trailers-only responses
	// (status in the only HEADERS frame, as a gRPC refusal must be for clients to retry it).
	ShedCodes        map[int]int `json:"shedCodes,omitempty"`
	PushbackPresent  int         `json:"pushbackPresent,omitempty"`
	PushbackCoverage float64     `json:"pushbackCoverage,omitempty"`
	TrailersOnly     int         `json:"trailersOnly,omitempty"`

	// LateStarts counts requests sent more than LateTolerance after their scheduled time plus the
	// dropped ones. MaxLateness and LatenessP99 describe how late sent requests started.
	LateStarts  int           `json:"lateStarts"`
	MaxLateness time.Duration `json:"maxLateness"`
	LatenessP99 time.Duration `json:"latenessP99"`
	// PeakInFlight is the most requests in flight at once.
	PeakInFlight int `json:"peakInFlight"`

	// Seconds is the run by elapsed second of scheduled time.
	Seconds []Second `json:"seconds"`
	// Tags breaks the run down by Request.Tag; nil when no request had a tag.
	Tags map[string]*TagStats `json:"tags,omitempty"`

	// Valid is false when the figures cannot be trusted; InvalidReason says why.
	Valid         bool   `json:"valid"`
	InvalidReason string `json:"invalidReason,omitempty"`
}

// Latency holds nearest-rank percentiles of a set of latencies.
type Latency struct {
	Count int           `json:"count"`
	P50   time.Duration `json:"p50"`
	P90   time.Duration `json:"p90"`
	P99   time.Duration `json:"p99"`
	P999  time.Duration `json:"p999"`
	Max   time.Duration `json:"max"`
}

// Second is one second of a run, counting the requests scheduled in it.
type Second struct {
	// Second is the index: requests scheduled in [Second, Second+1) seconds after the start.
	Second      int           `json:"second"`
	Offered     int           `json:"offered"`
	Dropped     int           `json:"dropped"`
	Success     int           `json:"success"`
	Goodput     int           `json:"goodput"`
	Shed        int           `json:"shed"`
	Admitted    int           `json:"admitted"`
	Timeouts    int           `json:"timeouts"`
	Errors      int           `json:"errors"` // transport and build errors
	AdmittedP99 time.Duration `json:"admittedP99"`
}

// TagStats is the breakdown of the requests with one Request.Tag.
type TagStats struct {
	Offered     int           `json:"offered"`
	Sent        int           `json:"sent"`
	Success     int           `json:"success"`
	Goodput     int           `json:"goodput"`
	GoodputRPS  float64       `json:"goodputRps"`
	Shed        int           `json:"shed"`
	Admitted    int           `json:"admitted"`
	Timeouts    int           `json:"timeouts"`
	Errors      int           `json:"errors"`
	AdmittedP99 time.Duration `json:"admittedP99"`
}

// IsShed reports whether an answer with this status is a refusal: 429, 503 or 403. Peers such as
// nginx send 503 without Retry-After; it is a refusal all the same.
func IsShed(code int) bool {
	return code == 429 || code == 503 || code == 403
}

// NearestRank returns the p-th percentile (0 < p <= 100) of sorted by the nearest-rank method:
// the smallest value with at least p percent of the values at or below it. p <= 0 gives the
// minimum; an empty slice gives 0.
func NearestRank(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	// The small epsilon keeps p*n/100 from landing just above an integer by rounding (99.9*1000).
	rank := int(math.Ceil(p*float64(n)/100 - 1e-9))
	rank = max(1, min(rank, n))
	return sorted[rank-1]
}

// latencyOf sorts d in place and returns its percentiles.
func latencyOf(d []time.Duration) Latency {
	slices.Sort(d)
	return Latency{
		Count: len(d),
		P50:   NearestRank(d, 50),
		P90:   NearestRank(d, 90),
		P99:   NearestRank(d, 99),
		P999:  NearestRank(d, 99.9),
		Max:   NearestRank(d, 100),
	}
}

// outcome is what became of one offered request.
type outcome uint8

const (
	outcomePending  outcome = iota // never resolved: the run ended first
	outcomeDropped                 // not sent: MaxInFlight reached
	outcomeAnswered                // status and full body received
	outcomeTimeout                 // deadline passed
	outcomeError                   // transport error
	outcomeCanceled                // the run's context was canceled
	outcomeBuild                   // the request could not be built
)

// sample is the record of one offered request.
type sample struct {
	tag      string
	lateness time.Duration // start - scheduled (sent requests only)
	latency  time.Duration // end - scheduled (answered requests only)
	code     int32         // HTTP status, or grpc-status in a gRPC run
	outcome  outcome
	// retryAfter: the answer carried a Retry-After header (HTTP) or a valid
	// grpc-retry-pushback-ms trailer (gRPC).
	retryAfter bool
	// gRPC only: the answer carried x-loadshed-reason; it came as a trailers-only response.
	reason, trailersOnly bool
}

// classify says whether an answered sample is a refusal and whether it succeeded.
func (s *sample) classify(grpcRun bool) (shed, success bool) {
	code := int(s.code)
	if grpcRun {
		return IsGRPCShed(codes.Code(code), s.reason), code == int(codes.OK)
	}
	return IsShed(code), code >= 200 && code < 300
}

// summarize builds a Result from the samples of the offered requests; offsets[i] is the
// scheduled offset of samples[i]. c has its defaults applied.
func summarize(c Config, offsets []time.Duration, samples []sample) *Result {
	dur := c.Schedule.Duration() - c.Warmup
	grpcRun := c.GRPC != nil
	r := &Result{
		Protocol:        "http",
		Target:          c.Target,
		Schedule:        c.Schedule,
		Duration:        dur,
		Timeout:         c.Timeout,
		SLO:             c.SLO,
		MaxInFlight:     c.MaxInFlight,
		LateTolerance:   c.LateTolerance,
		LateStartBudget: c.LateStartBudget,
		Offered:         len(samples),
		Codes:           map[int]int{},
		Seconds:         make([]Second, int((dur+time.Second-1)/time.Second)),
	}
	for i := range r.Seconds {
		r.Seconds[i].Second = i
	}
	if grpcRun {
		r.Protocol = "grpc"
	}
	var admitted, succeeded, shed, lateness []time.Duration
	perSecond := make([][]time.Duration, len(r.Seconds))
	perTag := map[string][]time.Duration{}
	for i := range samples {
		s := &samples[i]
		sec := &r.Seconds[min(int(offsets[i]/time.Second), len(r.Seconds)-1)]
		sec.Offered++
		var tag *TagStats
		if s.tag != "" {
			if r.Tags == nil {
				r.Tags = map[string]*TagStats{}
			}
			if tag = r.Tags[s.tag]; tag == nil {
				tag = &TagStats{}
				r.Tags[s.tag] = tag
			}
			tag.Offered++
		}
		if s.outcome == outcomePending {
			r.Canceled++
			continue
		}
		if s.outcome == outcomeDropped {
			r.Dropped++
			r.LateStarts++
			sec.Dropped++
			continue
		}
		if s.outcome == outcomeBuild {
			r.BuildErrors++
			sec.Errors++
			if tag != nil {
				tag.Errors++
			}
			continue
		}
		r.Sent++
		if tag != nil {
			tag.Sent++
		}
		lateness = append(lateness, s.lateness)
		if s.lateness > c.LateTolerance {
			r.LateStarts++
		}
		switch s.outcome {
		case outcomeTimeout:
			r.Timeouts++
			sec.Timeouts++
			if tag != nil {
				tag.Timeouts++
			}
		case outcomeError:
			r.TransportErrors++
			sec.Errors++
			if tag != nil {
				tag.Errors++
			}
		case outcomeCanceled:
			r.Canceled++
		case outcomeAnswered:
			r.Completed++
			code := int(s.code)
			r.Codes[code]++
			isShed, success := s.classify(grpcRun)
			if !grpcRun && (code == 429 || code == 503) {
				r.RetryAfterEligible++
				if s.retryAfter {
					r.RetryAfterPresent++
				}
			}
			if grpcRun && isShed {
				if r.ShedCodes == nil {
					r.ShedCodes = map[int]int{}
				}
				r.ShedCodes[code]++
				if s.retryAfter {
					r.PushbackPresent++
				}
				if s.trailersOnly {
					r.TrailersOnly++
				}
			}
			if isShed {
				r.Shed++
				sec.Shed++
				shed = append(shed, s.latency)
				if tag != nil {
					tag.Shed++
				}
				continue
			}
			r.Admitted++
			sec.Admitted++
			admitted = append(admitted, s.latency)
			perSecond[sec.Second] = append(perSecond[sec.Second], s.latency)
			if tag != nil {
				tag.Admitted++
				perTag[s.tag] = append(perTag[s.tag], s.latency)
			}
			if success {
				r.Success++
				sec.Success++
				succeeded = append(succeeded, s.latency)
				good := s.latency <= c.SLO
				if good {
					r.Goodput++
					sec.Goodput++
				}
				if tag != nil {
					tag.Success++
					if good {
						tag.Goodput++
					}
				}
			}
		}
	}
	r.AdmittedLatency = latencyOf(admitted)
	r.SuccessLatency = latencyOf(succeeded)
	r.ShedLatencyP99 = latencyOf(shed).P99
	lat := latencyOf(lateness)
	r.LatenessP99, r.MaxLateness = lat.P99, lat.Max
	for i, d := range perSecond {
		r.Seconds[i].AdmittedP99 = latencyOf(d).P99
	}
	for name, t := range r.Tags {
		t.AdmittedP99 = latencyOf(perTag[name]).P99
		t.GoodputRPS = ratio(float64(t.Goodput), dur.Seconds())
	}
	r.OfferedRPS = ratio(float64(r.Offered), dur.Seconds())
	r.GoodputRPS = ratio(float64(r.Goodput), dur.Seconds())
	r.ShedShare = ratio(float64(r.Shed), float64(r.Offered))
	r.RetryAfterCoverage = ratio(float64(r.RetryAfterPresent), float64(r.RetryAfterEligible))
	r.PushbackCoverage = ratio(float64(r.PushbackPresent), float64(r.Shed))
	r.Valid, r.InvalidReason = true, ""
	var reasons []string
	if r.Offered == 0 {
		reasons = append(reasons, "no requests offered")
	}
	if allowed := int(c.LateStartBudget * float64(r.Offered)); r.LateStarts > allowed {
		reasons = append(reasons, fmt.Sprintf("%d late starts (%d dropped at MaxInFlight %d; max lateness %s) exceed the budget of %d (%.2g of %d offered)",
			r.LateStarts, r.Dropped, r.MaxInFlight, r.MaxLateness, allowed, c.LateStartBudget, r.Offered))
	}
	if r.BuildErrors > 0 {
		reasons = append(reasons, fmt.Sprintf("%d requests could not be built", r.BuildErrors))
	}
	if len(reasons) > 0 {
		r.Valid, r.InvalidReason = false, strings.Join(reasons, "; ")
	}
	return r
}

// ratio is a/b, or 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
