package metrics

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestLintAndState(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	state := []StageState{{Route: "default", Strategy: "inflight", InFlight: 3, QueueDepth: 0, Limit: 8, Tokens: -1}}
	m := New(reg, func() []StageState { return state })
	m.Requests.WithLabelValues("default", "inflight", DoorHTTP, OutcomeSuccess, "200").Inc()
	m.Shed.WithLabelValues("default", "inflight", "concurrency_limit", "critical", DoorHTTP).Inc()
	m.QueueWait.WithLabelValues("default", "inflight").Observe(0.002)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "loadshed_") {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
	want := `
# HELP loadshed_inflight Cost units held by admitted requests, by route and strategy stage.
# TYPE loadshed_inflight gauge
loadshed_inflight{route="default",strategy="inflight"} 3
# HELP loadshed_limit Current concurrency, depth or burst limit, by route and strategy stage.
# TYPE loadshed_limit gauge
loadshed_limit{route="default",strategy="inflight"} 8
# HELP loadshed_shed_total Requests refused by admission, by route, refusing strategy stage, reason, priority and front door.
# TYPE loadshed_shed_total counter
loadshed_shed_total{door="http",priority="critical",reason="concurrency_limit",route="default",strategy="inflight"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "loadshed_inflight", "loadshed_limit", "loadshed_shed_total"); err != nil {
		t.Fatal(err)
	}
	// The gauges follow the live state: no stale value after it changes.
	state[0].InFlight = 5
	want = `
# HELP loadshed_inflight Cost units held by admitted requests, by route and strategy stage.
# TYPE loadshed_inflight gauge
loadshed_inflight{route="default",strategy="inflight"} 5
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "loadshed_inflight"); err != nil {
		t.Fatal(err)
	}
	// Tokens are reported only for buckets.
	if n, _ := testutil.GatherAndCount(reg, "loadshed_tokens_available"); n != 0 {
		t.Fatalf("tokens reported for a non-bucket: %d series", n)
	}
}

func TestNamesListsEveryFamily(t *testing.T) {
	names := Names()
	for _, want := range []string{"loadshed_requests_total", "loadshed_shed_total", "loadshed_inflight", "loadshed_queue_depth",
		"loadshed_queue_wait_seconds", "loadshed_upstream_latency_seconds", "loadshed_limit", "loadshed_tokens_available",
		"loadshed_limit_floor", "loadshed_config_reloads_total", "loadshed_build_info", "go_goroutines"} {
		if !slices.Contains(names, want) {
			t.Errorf("Names() lacks %s", want)
		}
	}
}
