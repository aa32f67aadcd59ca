package results

import (
	"fmt"
	"sort"
	"strings"

	"github.com/loadshed/loadshed/e2e/internal/criteria"
)

// QuotaRow is one run of a client over its per-client quota through a release whose replicas
// share it through one Redis (or, in the fallback row, with Redis scaled to 0).
type QuotaRow struct {
	Row         string             `json:"row"`
	Replicas    int                `json:"replicas"`
	QuotaRPS    float64            `json:"quota_rps"`
	Burst       int64              `json:"burst"`
	OfferedRPS  float64            `json:"offered_rps"`
	AdmittedRPS float64            `json:"admitted_rps"`
	PerPod      map[string]float64 `json:"admitted_by_pod"`
	Shed429     int64              `json:"shed_429"`
	ShedOther   int64              `json:"shed_other"`
	RetryAfter  *float64           `json:"retry_after_coverage"`
	Timeouts    int64              `json:"timeouts"`
	Unexpected  int64              `json:"unexpected"`
	// Decisions counts the quota checks by source (store, fallback); StoreErrors the failed
	// store calls by kind; StoreP99Ms the store's p99.
	Decisions   map[string]float64 `json:"decisions"`
	StoreErrors map[string]float64 `json:"store_errors"`
	StoreP99Ms  *float64           `json:"store_p99_ms"`
	// State is what the replicas' quota gauges showed during the run (replicas counted,
	// fallback active).
	State  string           `json:"state"`
	Checks []criteria.Check `json:"checks"`
	Pass   bool             `json:"pass"`
}

// NewQuotaRow builds a quota row from the run and its checks.
func NewQuotaRow(q criteria.Quota, replicas int, state string, checks []criteria.Check) QuotaRow {
	r := QuotaRow{Row: q.Row, Replicas: replicas, QuotaRPS: q.QuotaRPS, Burst: q.Burst, AdmittedRPS: q.AdmittedRPS(),
		PerPod: q.PerPod, Decisions: q.Decisions, StoreErrors: q.StoreErrors, StoreP99Ms: q.StoreP99Ms,
		State: state, Checks: checks, Pass: len(criteria.Failed(checks)) == 0}
	if s := q.Run; s != nil {
		r.OfferedRPS = s.OfferedRPS
		r.Shed429 = s.ShedByStatus["429"]
		r.ShedOther = s.Shed - r.Shed429
		r.RetryAfter = s.RetryAfterCoverage
		r.Timeouts = s.Timeouts
		r.Unexpected = s.Unexpected
	}
	return r
}

// writeQuota renders the quota rows.
func (r *Results) writeQuota(b *strings.Builder) {
	if len(r.Quota) == 0 {
		return
	}
	b.WriteString("\nOne client over its per-client quota through the Service of replicas sharing one Redis (`clients.store.redis`):\n\n")
	b.WriteString("| row | replicas | quota rps | offered rps | admitted rps (of quota) | admitted by pod | shed 429 / other | Retry-After | timeouts / errors | checks by the store / locally | store p99 ms, errors | quota gauges | verdict |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, q := range r.Quota {
		var by []string
		for _, p := range sortedKeys(q.PerPod) {
			by = append(by, fmt.Sprintf("%.0f", q.PerPod[p]))
		}
		var errs []string
		for _, k := range sortedKeys(q.StoreErrors) {
			errs = append(errs, fmt.Sprintf("%s %.0f", k, q.StoreErrors[k]))
		}
		store := num(q.StoreP99Ms)
		if len(errs) > 0 {
			store += ", " + strings.Join(errs, ", ")
		}
		fmt.Fprintf(b, "| %s | %d | %g | %.0f | %.1f (%s) | %s | %d / %d | %s | %d / %d | %.0f / %.0f | %s | %s | %s |\n",
			q.Row, q.Replicas, q.QuotaRPS, q.OfferedRPS, q.AdmittedRPS, pctv(q.AdmittedRPS/q.QuotaRPS), strings.Join(by, " / "),
			q.Shed429, q.ShedOther, pct(q.RetryAfter), q.Timeouts, q.Unexpected, q.Decisions["store"], q.Decisions["fallback"],
			store, q.State, verdict(q.Pass, q.Checks))
	}
}

func sortedKeys(m map[string]float64) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
