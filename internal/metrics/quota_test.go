package metrics

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestQuotaGaugesFollowTheStore(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	state, ok := QuotaState{Breaker: BreakerClosed, Replicas: 3}, false
	m := NewQuota(reg, func() (QuotaState, bool) { return state, ok })
	m.StoreErrors.WithLabelValues("take", "timeout").Inc()
	if n, _ := testutil.GatherAndCount(reg, "loadshed_quota_fallback_active", "loadshed_quota_replicas"); n != 0 {
		t.Fatalf("%d gauge series without a store", n)
	}
	ok = true
	state.Breaker = BreakerHalfOpen
	want := `
# HELP loadshed_quota_fallback_active 1 while the quota store is not called (its breaker is open or probing) and shared quotas are enforced locally at rate / replicas.
# TYPE loadshed_quota_fallback_active gauge
loadshed_quota_fallback_active 1
# HELP loadshed_quota_replicas Live replicas sharing the quota store, as last counted from their heartbeats (the divisor of the local fallback).
# TYPE loadshed_quota_replicas gauge
loadshed_quota_replicas 3
# HELP loadshed_quota_store_breaker_state State of the quota store's circuit breaker: 1 for the current state (closed, open, half_open), 0 for the others.
# TYPE loadshed_quota_store_breaker_state gauge
loadshed_quota_store_breaker_state{state="closed"} 0
loadshed_quota_store_breaker_state{state="half_open"} 1
loadshed_quota_store_breaker_state{state="open"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "loadshed_quota_fallback_active", "loadshed_quota_replicas", "loadshed_quota_store_breaker_state"); err != nil {
		t.Fatal(err)
	}
	state.Breaker = BreakerClosed
	if v := gaugeValue(t, reg, "loadshed_quota_fallback_active"); v != 0 {
		t.Fatalf("fallback %v with the breaker closed", v)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	names := Names()
	for _, n := range []string{"loadshed_quota_store_latency_seconds", "loadshed_quota_store_errors_total", "loadshed_quota_decisions_total",
		"loadshed_quota_fallback_active", "loadshed_quota_store_breaker_state", "loadshed_quota_replicas"} {
		if !slices.Contains(names, n) {
			t.Errorf("Names() lacks %s", n)
		}
	}
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("%s not gathered", name)
	return 0
}
