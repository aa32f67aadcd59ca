package lab

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

func quotaScenario(t *testing.T, offered float64, replicas, conns int) QuotaScenario {
	t.Helper()
	arr, err := ParseArrivals("poisson:rate="+strconv.FormatFloat(offered, 'g', -1, 64), 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return QuotaScenario{Arrivals: arr, Limits: admission.ClientLimitsConfig{Rate: 100, Burst: 20}, Replicas: replicas, Connections: conns, Seed: 1}
}

// TestQuotaAcrossReplicas predicts what a quota of 100/s (burst 20) gives a client offering
// 3x that over 60 s: with the store, the quota at every replica count; without one, the quota
// from every replica the client reaches; with the store away, rate / replicas on each, the
// quota again when requests spread over the replicas, less when a few connections pin them.
func TestQuotaAcrossReplicas(t *testing.T) {
	run := func(mode QuotaMode, replicas, conns int) QuotaResult {
		t.Helper()
		r, err := RunQuota(quotaScenario(t, 300, replicas, conns), mode)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	near := func(what string, got, want, tol float64) {
		t.Helper()
		if math.Abs(got/want-1) > tol {
			t.Errorf("%s: %.3f of the quota, want %.3f within %.0f%%", what, got, want, 100*tol)
		}
	}
	for _, n := range []int{1, 2, 3, 5} {
		// The burst (20 over 60 s) adds at most 0.34% to the quota.
		near("store", run(QuotaStore, n, 0).OfQuota(), 1, 0.01)
		near("fallback, spread per request", run(QuotaFallback, n, 0).OfQuota(), 1, 0.05)
		local := run(QuotaLocal, n, 0)
		near("local, spread per request", local.OfQuota(), min(float64(n), 3), 0.05)
		if n > 1 && local.Busiest > 0.6 {
			t.Errorf("%d replicas, local: the busiest replica admitted %.2f of the requests, want them spread", n, local.Busiest)
		}
	}
	// One keep-alive connection pins the client to one replica: without a store it gets the
	// quota (from that one replica), with the store too, and with the store away only its
	// replica's share.
	near("local, one connection, 3 replicas", run(QuotaLocal, 3, 1).OfQuota(), 1, 0.01)
	near("store, one connection, 3 replicas", run(QuotaStore, 3, 1).OfQuota(), 1, 0.01)
	near("fallback, one connection, 3 replicas", run(QuotaFallback, 3, 1).OfQuota(), 1.0/3, 0.02)
}

func TestQuotaRunsAreReproducible(t *testing.T) {
	sc := quotaScenario(t, 250, 3, 4)
	a, err := RunQuota(sc, QuotaFallback)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := RunQuota(sc, QuotaFallback)
	if a != b {
		t.Fatalf("same scenario and seed, different results: %+v and %+v", a, b)
	}
}

func TestQuotaScenarioProblems(t *testing.T) {
	sc := quotaScenario(t, 10, 0, -1)
	sc.Limits.Burst = 0
	err := sc.Validate()
	for _, want := range []string{"replicas", "connections", "burst"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("problems %v do not name %s", err, want)
		}
	}
	if _, err := RunQuota(quotaScenario(t, 10, 1, 0), "global"); err == nil {
		t.Error("an unknown mode ran")
	}
}
