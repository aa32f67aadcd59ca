package criteria

import (
	"fmt"
	"math"
	"sort"

	"github.com/loadshed/loadshed/bench/k6summary"
)

// Quota is one run of a client over its per-client quota through the Service of a release
// whose replicas share (or, with the store away, split) the quota.
type Quota struct {
	// Row names the run ("store", "fallback").
	Row string
	// QuotaRPS and Burst are the quota; Tolerance the share the admitted rate may miss it by.
	QuotaRPS  float64
	Burst     int64
	Tolerance float64
	// Run is k6's summary; PerPod the requests each replica admitted during it.
	Run    *k6summary.Summary
	PerPod map[string]float64
	// Decisions counts the replicas' quota checks by source (store, fallback), StoreErrors
	// their failed store calls by kind; StoreP99Ms is the p99 of the store calls (informational).
	Decisions, StoreErrors map[string]float64
	StoreP99Ms             *float64
}

// AdmittedRPS is the client's admitted rate over the run, its initial burst left out.
func (q Quota) AdmittedRPS() float64 {
	if q.Run == nil || !(q.Run.DurationS > 0) {
		return math.NaN()
	}
	return float64(max(q.Run.OK-q.Burst, 0)) / q.Run.DurationS
}

// QuotaChecks judges a quota run: the admitted rate holds the quota within its tolerance;
// every replica admitted some of it (the requests were spread); every refusal is a 429 with
// Retry-After; no request timed out or failed otherwise.
func QuotaChecks(q Quota) []Check {
	var cs []Check
	add := func(name string, ok bool, format string, args ...any) {
		cs = append(cs, Check{Name: q.Row + ": " + name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	s := q.Run
	if s == nil {
		add("measured", false, "no summary")
		return cs
	}
	err := s.Usable()
	add("run valid", err == nil, "%v", orOK(err))
	got := q.AdmittedRPS()
	dev := got/q.QuotaRPS - 1
	add(fmt.Sprintf("admitted rate within %.0f%% of the quota", 100*q.Tolerance), math.Abs(dev) <= q.Tolerance,
		"%.1f rps admitted (burst of %d left out) vs quota %g rps: %+.1f%%, offered %.0f rps", got, q.Burst, q.QuotaRPS, 100*dev, s.OfferedRPS)
	var pods []string
	for p := range q.PerPod {
		pods = append(pods, p)
	}
	sort.Strings(pods)
	spread := len(pods) >= 2
	for _, p := range pods {
		if !(q.PerPod[p] > 0) {
			spread = false
		}
	}
	add("every replica admitted part of it", spread, "admitted by pod %v", q.PerPod)
	n429 := s.ShedByStatus["429"]
	add("refusals are 429", s.Shed > 0 && n429 == s.Shed, "%d of %d refusals are 429", n429, s.Shed)
	cov := k6summary.Value(s.RetryAfterCoverage)
	add("Retry-After on every refusal", cov == 1, "coverage %s", frac(cov))
	add("no timeouts or errors", s.Timeouts == 0 && s.Unexpected == 0, "timeouts %d, unexpected %d", s.Timeouts, s.Unexpected)
	return cs
}
