// Package k6summary reads the JSON summaries that the k6 scripts under loadtest/k6 write from
// handleSummary (schema "loadshed.k6summary/v1", described in loadtest/k6/README.md). The
// benchmark harness and the e2e tests use it to judge a run without parsing k6's own output.
package k6summary

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// Schema is the value of the "schema" field this package reads.
const Schema = "loadshed.k6summary/v1"

// Summary is one k6 run. Latencies are in milliseconds, rates in requests per second.
type Summary struct {
	Schema string `json:"schema"`
	// Script is the script that ran: smoke, overload, spike, capacity-drop, retry-storm or
	// grpc-overload.
	Script string `json:"script"`
	// Protocol is "grpc" for a script of gRPC calls, empty for HTTP. In a gRPC run OK counts
	// grpc-status OK, Shed counts loadshed's refusals (split in ShedByGRPCStatus, ShedByStatus
	// stays empty) and Pushback takes the place of RetryAfter (which stays 0, its coverage nil).
	Protocol  string `json:"protocol,omitempty"`
	TargetURL string `json:"target_url"`
	// CapacityRPS and SLOMs are the numbers the run was judged by (CAPACITY_RPS, SLO_MS).
	CapacityRPS     float64 `json:"capacity_rps"`
	SLOMs           float64 `json:"slo_ms"`
	ClientTimeoutMs float64 `json:"client_timeout_ms"`
	// LoadFactor is the offered load as a multiple of the capacity (the peak for spike and
	// retry-storm); OfferedRPS the mean scheduled rate of new iterations over DurationS.
	LoadFactor float64 `json:"load_factor"`
	OfferedRPS float64 `json:"offered_rps"`
	DurationS  float64 `json:"duration_s"`
	// Valid is false when the load generator did not keep its schedule (dropped iterations or
	// late starts); InvalidReason says why. An invalid run's figures must not be used.
	Valid             bool   `json:"valid"`
	InvalidReason     string `json:"invalid_reason"`
	Iterations        int64  `json:"iterations"`
	DroppedIterations int64  `json:"dropped_iterations"`
	// Requests counts every request sent (retries included).
	Requests int64 `json:"requests"`
	// OK counts 2xx answers, Slow the 2xx answers over the SLO, Goodput those within it.
	OK      int64 `json:"ok"`
	Slow    int64 `json:"slow"`
	Goodput int64 `json:"goodput"`
	// GoodputRPS is Goodput / DurationS; GoodputRatio divides it by min(offered, capacity)
	// (for capacity-drop, by the capacity in force each second). Nil when undefined.
	GoodputRPS   float64  `json:"goodput_rps"`
	GoodputRatio *float64 `json:"goodput_ratio"`
	// Shed counts refusals (429 and 503); ShedByStatus splits them by status.
	Shed         int64            `json:"shed"`
	ShedByStatus map[string]int64 `json:"shed_by_status"`
	ShedShare    float64          `json:"shed_share"`
	// RetryAfter counts refusals carrying a valid Retry-After; RetryAfterCoverage is its share
	// of Shed, nil when nothing was shed.
	RetryAfter         int64    `json:"retry_after"`
	RetryAfterCoverage *float64 `json:"retry_after_coverage"`
	// gRPC runs: ShedByGRPCStatus splits the refusals by grpc-status name ("UNAVAILABLE", ...);
	// Pushback counts those carrying a valid grpc-retry-pushback-ms, PushbackCoverage is its
	// share of Shed (nil when nothing was shed); TrailersOnly counts refusals that came as
	// trailers-only responses.
	ShedByGRPCStatus map[string]int64 `json:"shed_by_grpc_status,omitempty"`
	Pushback         int64            `json:"pushback,omitempty"`
	PushbackCoverage *float64         `json:"pushback_coverage,omitempty"`
	TrailersOnly     int64            `json:"trailers_only,omitempty"`
	// Timeouts are client timeouts; Unexpected is anything that is neither 2xx, 429, 503 nor a
	// client timeout (connection errors, 5xx other than 503, ...).
	Timeouts   int64 `json:"timeouts"`
	Unexpected int64 `json:"unexpected"`
	// UnexpectedByClass splits an HTTP run's Unexpected into "network" (no answer), "4xx",
	// "5xx" and "other"; empty for gRPC runs and for summaries written before it existed.
	UnexpectedByClass map[string]int64 `json:"unexpected_by_class,omitempty"`
	// AdmittedMs is the latency of 2xx answers, RejectionMs that of refusals.
	AdmittedMs  Latency `json:"admitted_ms"`
	RejectionMs Latency `json:"rejection_ms"`
	// OutsideBackendMs is each admitted answer's latency less the time the backend reports for
	// it (X-Backend-Wait + X-Backend-Service): the path outside the backend's worker, a proxy
	// included. Empty when the backend sends no such headers.
	OutsideBackendMs Latency `json:"outside_backend_ms"`
	// StartLateP99Ms is how late iterations started against their schedule, at p99.
	StartLateP99Ms *float64    `json:"start_late_p99_ms"`
	Thresholds     []Threshold `json:"thresholds"`
	ThresholdsOK   bool        `json:"thresholds_ok"`

	// RecoveryS (spike, retry-storm) is how many seconds after the trigger ended goodput got
	// back to 0.9 x min(offered, capacity) for good; nil when it did not within the run.
	// SettleS is the same for capacity-drop, counted from the drop.
	RecoveryS *float64 `json:"recovery_s,omitempty"`
	SettleS   *float64 `json:"settle_s,omitempty"`
	// Phases holds per-phase goodput (before, spike/trigger/after), keyed by phase name.
	Phases map[string]Phase `json:"phases,omitempty"`
	// Timeline is the per-second record of scripts that keep one.
	Timeline []Second `json:"timeline,omitempty"`
	// Amplification (retry-storm) is requests per iteration; UserSuccessRate the share of
	// iterations that got a 2xx in the end.
	Amplification   *float64 `json:"amplification,omitempty"`
	UserSuccessRate *float64 `json:"user_success_rate,omitempty"`
}

// Latency is a Trend's statistics in milliseconds; a nil field had no samples.
type Latency struct {
	Avg  *float64 `json:"avg"`
	P50  *float64 `json:"p50"`
	P90  *float64 `json:"p90"`
	P99  *float64 `json:"p99"`
	P999 *float64 `json:"p999"`
	Max  *float64 `json:"max"`
}

// Threshold is one k6 threshold and whether it held.
type Threshold struct {
	Metric string `json:"metric"`
	Expr   string `json:"expr"`
	OK     bool   `json:"ok"`
}

// Phase is the goodput of one phase of a run.
type Phase struct {
	Offered      int64    `json:"offered"`
	Attempts     int64    `json:"attempts,omitempty"`
	Good         int64    `json:"good"`
	GoodputRatio *float64 `json:"goodput_ratio"`
}

// Second is one second of a run's timeline: iterations started, requests sent, goodput and
// refusals, each attributed to the second in which it started.
type Second struct {
	T        int   `json:"t"`
	Offered  int64 `json:"offered"`
	Attempts int64 `json:"attempts"`
	Good     int64 `json:"good"`
	Shed     int64 `json:"shed"`
}

// Read reads the summary at path.
func Read(path string) (*Summary, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s, err := Parse(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Parse decodes a summary and checks that it is one this package understands. Unknown fields
// are accepted (a script may add its own); a wrong schema or missing essentials are errors.
func Parse(r io.Reader) (*Summary, error) {
	var s Summary
	if err := json.NewDecoder(r).Decode(&s); err != nil {
		return nil, fmt.Errorf("decode k6 summary: %w", err)
	}
	if err := s.check(); err != nil {
		return nil, err
	}
	return &s, nil
}

func (s *Summary) check() error {
	var errs []error
	if s.Schema != Schema {
		errs = append(errs, fmt.Errorf("schema: got %q, want %q", s.Schema, Schema))
	}
	if s.Script == "" {
		errs = append(errs, errors.New("script: missing"))
	}
	if s.CapacityRPS <= 0 {
		errs = append(errs, fmt.Errorf("capacity_rps: must be above 0, got %v", s.CapacityRPS))
	}
	if s.DurationS <= 0 {
		errs = append(errs, fmt.Errorf("duration_s: must be above 0, got %v", s.DurationS))
	}
	if !s.Valid && s.InvalidReason == "" {
		errs = append(errs, errors.New("invalid_reason: missing on an invalid run"))
	}
	return errors.Join(errs...)
}

// Usable returns nil when the run's figures may be used, or an error giving the reason.
func (s *Summary) Usable() error {
	if !s.Valid {
		return fmt.Errorf("%s run invalid: %s", s.Script, s.InvalidReason)
	}
	return nil
}

// UnexpectedClasses are the keys of UnexpectedByClass, in the order UnexpectedDetail names them.
var UnexpectedClasses = []string{"network", "4xx", "5xx", "other"}

// UnexpectedDetail is Unexpected with its classes, as "59 (network 3, 4xx 56)"; the count
// alone when there are no classes to name.
func (s *Summary) UnexpectedDetail() string {
	var parts []string
	for _, c := range UnexpectedClasses {
		if n := s.UnexpectedByClass[c]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", c, n))
		}
	}
	if len(parts) == 0 {
		return strconv.FormatInt(s.Unexpected, 10)
	}
	return fmt.Sprintf("%d (%s)", s.Unexpected, strings.Join(parts, ", "))
}

// FailedThresholds returns the thresholds that did not hold.
func (s *Summary) FailedThresholds() []Threshold {
	var out []Threshold
	for _, t := range s.Thresholds {
		if !t.OK {
			out = append(out, t)
		}
	}
	return out
}

// Value returns *p, or NaN when p is nil, for tables and charts.
func Value(p *float64) float64 {
	if p == nil {
		return nan
	}
	return *p
}

var nan = math.NaN()
