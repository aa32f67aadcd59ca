// Package results turns the e2e test's measurements into the results table it writes, as
// markdown (results.md) and JSON (results.json).
package results

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/loadshed/loadshed/bench/k6summary"
	"github.com/loadshed/loadshed/e2e/internal/criteria"
)

// Schema names the layout of results.json.
const Schema = "loadshed.e2e-results/v1"

// Results is one e2e run.
type Results struct {
	Schema string `json:"schema"`
	// Command is the command that produced the run.
	Command   string    `json:"command"`
	Started   time.Time `json:"started"`
	Cluster   string    `json:"cluster"`
	NodeImage string    `json:"node_image"`
	// Steal is the E2E_STEAL setting the strategy rows were measured under, empty for none.
	Steal string `json:"steal,omitempty"`
	// CapacityRPS, SLOMs, LoadFactor and DurationS describe the overload every strategy got.
	CapacityRPS float64 `json:"capacity_rps"`
	SLOMs       float64 `json:"slo_ms"`
	LoadFactor  float64 `json:"load_factor"`
	DurationS   float64 `json:"duration_s"`
	// Strategies holds one row per strategy, Steady the runs with pods being replaced.
	Strategies []Row    `json:"strategies"`
	Steady     []Steady `json:"steady"`
	Timings    []Timing `json:"timings"`
	Pass       bool     `json:"pass"`

	// Quota holds the runs of a client over its quota shared by replicas (quota.go).
	Quota []QuotaRow `json:"quota,omitempty"`
	// Fanout is the fan-out row, cohorts off against on (fanout.go).
	Fanout *Fanout `json:"fanout,omitempty"`
}

// Row is one strategy's overload run and its verdict.
type Row struct {
	Strategy           string         `json:"strategy"`
	OfferedRPS         float64        `json:"offered_rps"`
	GoodputRPS         float64        `json:"goodput_rps"`
	GoodputRatio       *float64       `json:"goodput_ratio"`
	AdmittedP50Ms      *float64       `json:"admitted_p50_ms"`
	AdmittedP99Ms      *float64       `json:"admitted_p99_ms"`
	UnloadedP99Ms      *float64       `json:"unloaded_p99_ms"`
	ShedShare          float64        `json:"shed_share"`
	Shed429            int64          `json:"shed_429"`
	Shed503            int64          `json:"shed_503"`
	RetryAfterCoverage *float64       `json:"retry_after_coverage"`
	Timeouts           int64          `json:"timeouts"`
	Unexpected         int64          `json:"unexpected"`
	Alert              criteria.Alert `json:"high_shed_alert"`
	Attempts           int            `json:"attempts"`
	// Limit is the adaptive limit over the overload run (rows that have one).
	Limit *criteria.LimitRange `json:"adaptive_limit,omitempty"`
	// Earlier are attempts measured again because they missed timed checks only.
	Earlier []criteria.Earlier `json:"earlier_attempts,omitempty"`
	// CPU is the mean cores used during the overload by k6 and the pod's containers.
	CPU map[string]float64 `json:"cpu_cores,omitempty"`
	// EnvoyExtProc are the Envoy's ext_proc counters of an Envoy row, over both its runs.
	EnvoyExtProc map[string]int64 `json:"envoy_ext_proc,omitempty"`
	Checks       []criteria.Check `json:"checks"`
	Pass         bool             `json:"pass"`
}

// Steady is a run at steady load below capacity during a pod replacement.
type Steady struct {
	Operation     string           `json:"operation"`
	OfferedRPS    float64          `json:"offered_rps"`
	Requests      int64            `json:"requests"`
	OK            int64            `json:"ok"`
	AdmittedP99Ms *float64         `json:"admitted_p99_ms"`
	Checks        []criteria.Check `json:"checks"`
	Pass          bool             `json:"pass"`
}

// Timing is how long one phase of the run took.
type Timing struct {
	Phase   string  `json:"phase"`
	Seconds float64 `json:"seconds"`
}

// NewRow builds a strategy's row from its outcome and checks.
func NewRow(o criteria.Outcome, checks []criteria.Check) Row {
	r := Row{Strategy: o.Strategy, Alert: o.Alert, Attempts: o.Attempts, Earlier: o.Earlier, Limit: o.Limit, CPU: o.CPU, EnvoyExtProc: o.EnvoyExtProc, Checks: checks, Pass: len(criteria.Failed(checks)) == 0}
	if o.Unloaded != nil {
		r.UnloadedP99Ms = o.Unloaded.AdmittedMs.P99
	}
	if s := o.Overload; s != nil {
		r.OfferedRPS = s.OfferedRPS
		r.GoodputRPS = s.GoodputRPS
		r.GoodputRatio = s.GoodputRatio
		r.AdmittedP50Ms = s.AdmittedMs.P50
		r.AdmittedP99Ms = s.AdmittedMs.P99
		r.ShedShare = s.ShedShare
		r.Shed429 = s.ShedByStatus["429"]
		r.Shed503 = s.ShedByStatus["503"]
		r.RetryAfterCoverage = s.RetryAfterCoverage
		if s.Protocol == "grpc" {
			// The gRPC forms of the same refusals and of Retry-After.
			r.Shed429 = s.ShedByGRPCStatus["RESOURCE_EXHAUSTED"]
			r.Shed503 = s.ShedByGRPCStatus["UNAVAILABLE"]
			r.RetryAfterCoverage = s.PushbackCoverage
		}
		r.Timeouts = s.Timeouts
		r.Unexpected = s.Unexpected
	}
	return r
}

// NewSteady builds a steady-load row.
func NewSteady(operation string, s *k6summary.Summary, checks []criteria.Check) Steady {
	st := Steady{Operation: operation, Checks: checks, Pass: len(criteria.Failed(checks)) == 0}
	if s != nil {
		st.OfferedRPS = s.OfferedRPS
		st.Requests = s.Requests
		st.OK = s.OK
		st.AdmittedP99Ms = s.AdmittedMs.P99
	}
	return st
}

// Markdown renders the tables.
func (r *Results) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Produced by `%s` on %s (kind cluster, node image `%s`).\n\n", r.Command, r.Started.UTC().Format("2006-01-02"), r.NodeImage)
	if r.Steal != "" {
		fmt.Fprintf(&b, "The node was stalled through each strategy row's unloaded and overload runs (`E2E_STEAL=%s`): frozen in short random spells, as a busy hypervisor's steal time stalls a virtual machine.\n\n", r.Steal)
	}
	fmt.Fprintf(&b, "Backend capacity C = %g requests/s (4 workers x 20 ms), SLO %g ms; offered load %gx C = %g requests/s for %g s, from k6 in the cluster.\n\n",
		r.CapacityRPS, r.SLOMs, r.LoadFactor, r.CapacityRPS*r.LoadFactor, r.DurationS)
	b.WriteString("| strategy | goodput rps (of C) | admitted p50 / p99 ms | unloaded p99 ms | shed (429 / 503) | Retry-After | timeouts / errors | high-shed alert fired / resolved | CPU cores k6 / sidecar / app | verdict |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range r.Strategies {
		alert := "not fired"
		if strings.HasPrefix(row.Strategy, criteria.InjectPrefix) {
			alert = "not watched" // an injected workload is not among Prometheus's targets
		}
		if row.Alert.Fired {
			alert = fmt.Sprintf("after %.0f s", row.Alert.FiredAfterS)
			if row.Alert.Resolved {
				alert += fmt.Sprintf(" / %.0f s after", row.Alert.ResolvedAfterS)
			} else {
				alert += " / not resolved"
			}
		}
		fmt.Fprintf(&b, "| %s | %.0f (%s) | %s / %s | %s | %s (%d / %d) | %s | %d / %d | %s | %s / %s / %s | %s |\n",
			row.Strategy, row.GoodputRPS, pct(row.GoodputRatio), num(row.AdmittedP50Ms), num(row.AdmittedP99Ms), num(row.UnloadedP99Ms),
			pctv(row.ShedShare), row.Shed429, row.Shed503, pct(row.RetryAfterCoverage), row.Timeouts, row.Unexpected, alert,
			cores(row.CPU, "k6"), cores(row.CPU, "loadshed"), cores(row.CPU, "app"), verdict(row.Pass, row.Checks))
	}
	var limits []string
	for _, row := range r.Strategies {
		if row.Limit != nil {
			limits = append(limits, row.Strategy+" "+limitRange(row.Limit))
		}
	}
	if len(limits) > 0 {
		fmt.Fprintf(&b, "\nAdaptive limit over the overload (min / mean / max of Prometheus's scrapes): %s.\n", strings.Join(limits, ", "))
	}
	for _, row := range r.Strategies {
		for i, e := range row.Earlier {
			limit := ""
			if e.Limit != nil {
				limit = ", adaptive limit " + limitRange(e.Limit)
			}
			fmt.Fprintf(&b, "\nRow %s, measured again: attempt %d of %d missed %s (goodput %s of C, admitted p99 %s ms, unloaded p99 %s ms%s); the row shows attempt %d.\n",
				row.Strategy, i+1, row.Attempts, strings.Join(e.Missed, "; "), pct(e.GoodputRatio), num(e.AdmittedP99Ms), num(e.UnloadedP99Ms), limit, row.Attempts)
		}
	}
	for _, row := range r.Strategies {
		if strings.HasPrefix(row.Strategy, criteria.GRPCPrefix) {
			fmt.Fprintf(&b, "\nRows %s*: the strategy in front of the backend's gRPC port (4 workers x 40 ms, C = 100 calls/s), "+
				"with unary calls from k6's gRPC module (grpc-overload.js) at the same multiples of C; their shed columns count "+
				"RESOURCE_EXHAUSTED / UNAVAILABLE, their Retry-After column grpc-retry-pushback-ms.\n", criteria.GRPCPrefix)
			break
		}
	}
	if len(r.Steady) > 0 {
		b.WriteString("\nPods replaced under steady load below capacity (no request may fail; in the injected rows nothing may be lost and at most 0.5% be refused with Retry-After):\n\n")
		b.WriteString("| operation | offered rps | requests | 2xx | admitted p99 ms | verdict |\n|---|---|---|---|---|---|\n")
		for _, s := range r.Steady {
			fmt.Fprintf(&b, "| %s | %.0f | %d | %d | %s | %s |\n", s.Operation, s.OfferedRPS, s.Requests, s.OK, num(s.AdmittedP99Ms), detailedVerdict(s.Pass, s.Checks))
		}
	}
	r.writeQuota(&b)
	r.writeFanout(&b)
	if len(r.Timings) > 0 {
		b.WriteString("\nTimings:")
		for i, t := range r.Timings {
			sep := ","
			if i == 0 {
				sep = ""
			}
			fmt.Fprintf(&b, "%s %s %.0f s", sep, t.Phase, t.Seconds)
		}
		b.WriteString(".\n")
	}
	return b.String()
}

// Write writes results.md and results.json into dir.
func (r *Results) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	r.Schema = Schema
	j, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(j, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "results.md"), []byte(r.Markdown()), 0o644)
}

func verdict(pass bool, checks []criteria.Check) string {
	if pass {
		return fmt.Sprintf("pass (%d checks)", len(checks))
	}
	return "FAIL: " + strings.Join(criteria.Failed(checks), "; ")
}

// detailedVerdict is verdict with each failed check's detail, for tables whose columns do not
// say what went wrong (a steady row's lost requests: timeouts, refusals or which errors).
func detailedVerdict(pass bool, checks []criteria.Check) string {
	if pass {
		return verdict(pass, checks)
	}
	var failed []string
	for _, c := range checks {
		if !c.OK {
			failed = append(failed, fmt.Sprintf("%s (%s)", c.Name, strings.ReplaceAll(c.Detail, "|", "/")))
		}
	}
	return "FAIL: " + strings.Join(failed, "; ")
}

func num(p *float64) string {
	v := k6summary.Value(p)
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.1f", v)
}

func pct(p *float64) string {
	v := k6summary.Value(p)
	if math.IsNaN(v) {
		return "n/a"
	}
	return pctv(v)
}

func cores(m map[string]float64, name string) string {
	v, ok := m[name]
	if !ok {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", v)
}

func pctv(v float64) string { return fmt.Sprintf("%.0f%%", v*100) }

func limitRange(l *criteria.LimitRange) string {
	return fmt.Sprintf("%.1f / %.1f / %.1f", l.Min, l.Mean, l.Max)
}
