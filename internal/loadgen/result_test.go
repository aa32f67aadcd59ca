package loadgen

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

const ms = time.Millisecond

func TestNearestRank(t *testing.T) {
	d := []time.Duration{15, 20, 35, 40, 50}
	cases := []struct {
		p    float64
		want time.Duration
	}{
		{0, 15}, {5, 15}, {20, 15}, {30, 20}, {40, 20}, {50, 35}, {90, 50}, {100, 50}, {150, 50},
	}
	for _, tc := range cases {
		if got := NearestRank(d, tc.p); got != tc.want {
			t.Errorf("NearestRank(p=%v) = %d, want %d", tc.p, got, tc.want)
		}
	}
	if got := NearestRank(nil, 50); got != 0 {
		t.Errorf("NearestRank of nothing = %d, want 0", got)
	}

	// 1..1000: p99 is the 990th value, p99.9 the 999th (no rounding up to 1000).
	thousand := make([]time.Duration, 1000)
	for i := range thousand {
		thousand[i] = time.Duration(i + 1)
	}
	l := latencyOf(thousand)
	if l.P50 != 500 || l.P90 != 900 || l.P99 != 990 || l.P999 != 999 || l.Max != 1000 || l.Count != 1000 {
		t.Fatalf("latencyOf(1..1000) = %+v", l)
	}

	// latencyOf sorts its input.
	l = latencyOf([]time.Duration{50, 15, 40, 20, 35})
	if l.P50 != 35 || l.Max != 50 {
		t.Fatalf("latencyOf(unsorted) = %+v", l)
	}
}

func TestIsShed(t *testing.T) {
	for code, want := range map[int]bool{200: false, 403: true, 404: false, 429: true, 500: false, 502: false, 503: true, 504: false} {
		if IsShed(code) != want {
			t.Errorf("IsShed(%d) = %v, want %v", code, !want, want)
		}
	}
}

// answered builds the sample of an answered request.
func answered(code int, latency time.Duration, tag string, retryAfter bool) sample {
	return sample{tag: tag, code: int32(code), latency: latency, outcome: outcomeAnswered, retryAfter: retryAfter}
}

func TestSummarize(t *testing.T) {
	c := Config{
		Target:   "http://127.0.0.1:1",
		Schedule: ConstantRate(4, 3*time.Second), // 12 requests, 250 ms apart
		Timeout:  time.Second,
		SLO:      100 * ms,
	}.withDefaults()
	offsets, err := c.Schedule.Offsets()
	if err != nil {
		t.Fatal(err)
	}
	samples := []sample{
		// second 0
		answered(200, 10*ms, "critical", false),
		answered(200, 100*ms, "critical", false),  // exactly the SLO: goodput
		answered(200, 101*ms, "sheddable", false), // success, not goodput
		answered(503, 2*ms, "sheddable", false),   // shed without Retry-After
		// second 1
		answered(429, 3*ms, "sheddable", true),
		answered(403, 1*ms, "", false),                                // shed, not eligible for Retry-After
		answered(500, 40*ms, "", false),                               // admitted, not success
		{outcome: outcomeTimeout, tag: "critical", lateness: 20 * ms}, // late start too
		// second 2
		{outcome: outcomeError, tag: "critical"},
		{outcome: outcomeDropped, tag: "sheddable"},
		answered(404, 30*ms, "", false),
		answered(200, 20*ms, "", false),
	}
	r := summarize(c, offsets, samples)

	checks := []struct {
		name      string
		got, want int
	}{
		{"Offered", r.Offered, 12},
		{"Sent", r.Sent, 11},
		{"Dropped", r.Dropped, 1},
		{"Completed", r.Completed, 9},
		{"Timeouts", r.Timeouts, 1},
		{"TransportErrors", r.TransportErrors, 1},
		{"Success", r.Success, 4},
		{"Goodput", r.Goodput, 3},
		{"Shed", r.Shed, 3},
		{"Admitted", r.Admitted, 6},
		{"RetryAfterEligible", r.RetryAfterEligible, 2},
		{"RetryAfterPresent", r.RetryAfterPresent, 1},
		{"LateStarts", r.LateStarts, 2}, // the dropped one and the one 20 ms late
		{"Codes[200]", r.Codes[200], 4},
		{"Codes[503]", r.Codes[503], 1},
		{"Codes[404]", r.Codes[404], 1},
		{"AdmittedLatency.Count", r.AdmittedLatency.Count, 6},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %d, want %d", ch.name, ch.got, ch.want)
		}
	}
	if r.GoodputRPS != 1 || r.OfferedRPS != 4 {
		t.Errorf("GoodputRPS %v OfferedRPS %v, want 1 and 4", r.GoodputRPS, r.OfferedRPS)
	}
	if r.ShedShare != 0.25 || r.RetryAfterCoverage != 0.5 {
		t.Errorf("ShedShare %v RetryAfterCoverage %v, want 0.25 and 0.5", r.ShedShare, r.RetryAfterCoverage)
	}
	// Admitted latencies sorted: 10 20 30 40 100 101 ms.
	if l := r.AdmittedLatency; l.P50 != 30*ms || l.P90 != 101*ms || l.Max != 101*ms {
		t.Errorf("AdmittedLatency = %+v", l)
	}
	// Successes alone: 10 20 100 101 ms (the 500's and the 404's 40 and 30 ms are not).
	if l := r.SuccessLatency; l.Count != 4 || l.P50 != 20*ms || l.Max != 101*ms {
		t.Errorf("SuccessLatency = %+v", l)
	}
	if r.ShedLatencyP99 != 3*ms {
		t.Errorf("ShedLatencyP99 = %s, want 3ms", r.ShedLatencyP99)
	}
	if r.MaxLateness != 20*ms {
		t.Errorf("MaxLateness = %s, want 20ms", r.MaxLateness)
	}

	wantSeconds := []Second{
		{Second: 0, Offered: 4, Success: 3, Goodput: 2, Shed: 1, Admitted: 3, AdmittedP99: 101 * ms},
		{Second: 1, Offered: 4, Shed: 2, Admitted: 1, Timeouts: 1, AdmittedP99: 40 * ms},
		{Second: 2, Offered: 4, Dropped: 1, Success: 1, Goodput: 1, Admitted: 2, Errors: 1, AdmittedP99: 30 * ms},
	}
	if len(r.Seconds) != len(wantSeconds) {
		t.Fatalf("%d seconds, want %d", len(r.Seconds), len(wantSeconds))
	}
	for i, w := range wantSeconds {
		if r.Seconds[i] != w {
			t.Errorf("Seconds[%d] = %+v, want %+v", i, r.Seconds[i], w)
		}
	}

	wantTags := map[string]TagStats{
		"critical":  {Offered: 4, Sent: 4, Success: 2, Goodput: 2, GoodputRPS: 2.0 / 3, Admitted: 2, Timeouts: 1, Errors: 1, AdmittedP99: 100 * ms},
		"sheddable": {Offered: 4, Sent: 3, Success: 1, Shed: 2, Admitted: 1, AdmittedP99: 101 * ms},
	}
	if len(r.Tags) != len(wantTags) {
		t.Fatalf("tags %v, want %v", r.Tags, wantTags)
	}
	for name, w := range wantTags {
		if got := r.Tags[name]; got == nil || *got != w {
			t.Errorf("Tags[%q] = %+v, want %+v", name, got, w)
		}
	}

	// 2 late starts of 12 offered exceed the default 1% budget.
	if r.Valid || !strings.Contains(r.InvalidReason, "2 late starts") {
		t.Errorf("Valid %v (%q), want invalid for late starts", r.Valid, r.InvalidReason)
	}
	c.LateStartBudget = 0.2
	if r := summarize(c, offsets, samples); !r.Valid {
		t.Errorf("invalid within a 20%% budget: %s", r.InvalidReason)
	}

	// The result survives a JSON round trip: no NaN or Inf anywhere.
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	var back Result
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	if back.Codes[200] != 4 || back.Tags["critical"].Goodput != 2 || back.AdmittedLatency.P90 != 101*ms {
		t.Errorf("round trip lost data: %s", b)
	}
}

func TestSummarizeCountsUnresolvedAsCanceled(t *testing.T) {
	c := Config{Target: "http://127.0.0.1:1", Schedule: ConstantRate(2, time.Second)}.withDefaults()
	r := summarize(c, []time.Duration{0, 500 * ms}, []sample{answered(200, ms, "", false), {}})
	if r.Canceled != 1 || r.Sent != 1 || r.Dropped != 0 || r.LateStarts != 0 {
		t.Fatalf("canceled %d sent %d dropped %d late %d, want 1 1 0 0", r.Canceled, r.Sent, r.Dropped, r.LateStarts)
	}
}

func TestSummarizeEmpty(t *testing.T) {
	c := Config{Target: "http://127.0.0.1:1", Schedule: ConstantRate(0, time.Second)}.withDefaults()
	r := summarize(c, nil, nil)
	if r.Valid || !strings.Contains(r.InvalidReason, "no requests") {
		t.Fatalf("empty run: Valid %v %q", r.Valid, r.InvalidReason)
	}
	if r.RetryAfterCoverage != 0 || r.ShedShare != 0 || r.GoodputRPS != 0 {
		t.Fatalf("empty run has non-zero shares: %+v", r)
	}
	if _, err := json.Marshal(r); err != nil {
		t.Fatal(err)
	}
}
