package criteria

import (
	"strings"
	"testing"

	"github.com/loadshed/loadshed/bench/k6summary"
)

func quotaRun(ok, shed, n429 int64, coverage float64) *k6summary.Summary {
	return &k6summary.Summary{Script: "overload", Valid: true, OfferedRPS: 150, DurationS: 30, Requests: ok + shed,
		OK: ok, Shed: shed, ShedByStatus: map[string]int64{"429": n429}, RetryAfterCoverage: &coverage}
}

func TestQuotaChecks(t *testing.T) {
	pods := map[string]float64{"a": 800, "b": 710}
	good := Quota{Row: "store", QuotaRPS: 50, Burst: 10, Tolerance: 0.1, Run: quotaRun(1510, 2990, 2990, 1), PerPod: pods}
	if failed := Failed(QuotaChecks(good)); len(failed) != 0 {
		t.Fatalf("a good run failed %v", failed)
	}
	if got := good.AdmittedRPS(); got != 50 {
		t.Fatalf("admitted %v rps, want (1510 - 10) / 30 = 50", got)
	}
	for name, q := range map[string]Quota{
		"admitted rate":        {Row: "store", QuotaRPS: 50, Burst: 10, Tolerance: 0.1, Run: quotaRun(3010, 1490, 1490, 1), PerPod: pods},
		"every replica":        {Row: "store", QuotaRPS: 50, Burst: 10, Tolerance: 0.1, Run: quotaRun(1510, 2990, 2990, 1), PerPod: map[string]float64{"a": 1510, "b": 0}},
		"refusals are 429":     {Row: "store", QuotaRPS: 50, Burst: 10, Tolerance: 0.1, Run: quotaRun(1510, 2990, 2000, 1), PerPod: pods},
		"Retry-After":          {Row: "store", QuotaRPS: 50, Burst: 10, Tolerance: 0.1, Run: quotaRun(1510, 2990, 2990, 0.5), PerPod: pods},
		"measured":             {Row: "store", QuotaRPS: 50},
		"no timeouts or error": {Row: "store", QuotaRPS: 50, Burst: 10, Tolerance: 0.1, Run: func() *k6summary.Summary { s := quotaRun(1510, 2990, 2990, 1); s.Timeouts = 3; return s }(), PerPod: pods},
	} {
		failed := Failed(QuotaChecks(q))
		if len(failed) == 0 || !strings.Contains(strings.Join(failed, ";"), name) {
			t.Errorf("%s: failed %v, want the check on %s to fail", name, failed, name)
		}
	}
}
