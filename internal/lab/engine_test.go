package lab

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/slowtail"
	"github.com/loadshed/loadshed/pkg/admission"
)

// arrivalsAt replays requests arriving at the given offsets.
func arrivalsAt(offs ...time.Duration) Arrivals {
	recs := make([]Arrival, len(offs))
	for i, o := range offs {
		recs[i] = Arrival{At: o, Priority: admission.Critical}
	}
	return TraceArrivals{Records: recs, Name: "test"}
}

func mustStrategy(t *testing.T, spec string) Strategy {
	t.Helper()
	st, err := ParseStrategy(spec)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func mustRun(t *testing.T, sc Scenario, spec string) *Result {
	t.Helper()
	r, err := Run(sc, mustStrategy(t, spec), RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

const ms1 = time.Millisecond

func TestPercentileNearestRank(t *testing.T) {
	seq := func(n int) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = time.Duration(i+1) * ms1
		}
		return out
	}
	for _, c := range []struct {
		vals     []time.Duration
		num, den int
		want     time.Duration
	}{
		{seq(100), 50, 100, 50 * ms1},
		{seq(100), 99, 100, 99 * ms1},
		{seq(100), 100, 100, 100 * ms1},
		{seq(10), 50, 100, 5 * ms1},
		{seq(10), 99, 100, 10 * ms1}, // rank ceil(9.9) = 10
		{seq(11), 50, 100, 6 * ms1},  // rank ceil(5.5) = 6
		{seq(1000), 999, 1000, 999 * ms1},
		{seq(1001), 999, 1000, 1000 * ms1}, // rank ceil(999.999) = 1000
		{seq(1), 1, 100, 1 * ms1},
		{seq(3), 0, 100, 1 * ms1}, // rank 0 is clamped to the first value
		{nil, 50, 100, 0},
	} {
		if got := Percentile(c.vals, c.num, c.den); got != c.want {
			t.Errorf("Percentile(n=%d, %d/%d) = %s, want %s", len(c.vals), c.num, c.den, got, c.want)
		}
	}
}

// A slot freed at exactly the instant of an arrival is free for that arrival: completions run
// before arrivals at the same time.
func TestCompletionBeforeArrivalAtSameInstant(t *testing.T) {
	sc := Scenario{Arrivals: arrivalsAt(0, 10*ms1, 15*ms1), Service: slowtail.Constant(10 * ms1)}
	r := mustRun(t, sc, "{strategy: inflight, inflight: {limit: 1}}")
	// 0 admitted (done at 10), 10 admitted as the first leaves, 15 refused (busy until 20).
	if s := r.Summary; s.Accepted != 2 || s.Rejected != 1 {
		t.Fatalf("accepted %d rejected %d, want 2 and 1", s.Accepted, s.Rejected)
	}
}

// A completion at the instant the client's timeout runs out is a success, not a timeout.
func TestCompletionBeforeClientTimeoutAtSameInstant(t *testing.T) {
	sc := Scenario{Arrivals: arrivalsAt(0), Service: slowtail.Constant(10 * ms1), Client: Client{Timeout: 10 * ms1}}
	r := mustRun(t, sc, "none")
	if s := r.Summary; s.Successes != 1 || s.Timeouts != 0 {
		t.Fatalf("successes %d timeouts %d, want 1 and 0", s.Successes, s.Timeouts)
	}
}

// The strategy's due work (Advance: here a queue expiry) runs before an arrival at the same
// instant, so the place the expired request leaves is free for the newcomer.
func TestAdvanceBeforeArrivalAtSameInstant(t *testing.T) {
	sc := Scenario{Arrivals: arrivalsAt(0, 1*ms1, 6*ms1), Service: slowtail.Constant(100 * ms1)}
	r := mustRun(t, sc, "{strategy: bounded-queue, boundedQueue: {concurrency: 1, depth: 1, maxWait: 5ms}}")
	// 0 is admitted; 1 waits and expires at 6 ms; 6 arrives as it leaves, takes its place and
	// expires at 11 ms. Had the arrival gone first it would have found the queue full.
	got := r.Summary.Refusals
	if got[admission.ReasonQueueTimeout] != 2 || got[admission.ReasonQueueFull] != 0 {
		t.Fatalf("refusals %v, want 2 queue timeouts and no queue_full", got)
	}
}

// Several arrivals at one instant are offered in their order, and the backend's FIFO serves
// admitted requests in order when workers are limited.
func TestBackendFIFO(t *testing.T) {
	sc := Scenario{Arrivals: arrivalsAt(0, 0, 0), Service: slowtail.Constant(10 * ms1), Servers: 1}
	r := mustRun(t, sc, "none")
	s := r.Summary
	if s.P50 != 20*ms1 || s.P99 != 30*ms1 || s.MaxBackendQueue != 2 {
		t.Fatalf("p50 %s p99 %s backend queue %d, want 20ms 30ms 2", s.P50, s.P99, s.MaxBackendQueue)
	}
}

// A client that gives up while queued withdraws; the leaky bucket takes its water out, so the
// next request waits less.
func TestClientTimeoutWithdrawsQueued(t *testing.T) {
	sc := Scenario{
		Arrivals: arrivalsAt(0, 0, 60*ms1),
		Service:  slowtail.Constant(1 * ms1),
		Client:   Client{Timeout: 50 * ms1},
	}
	r := mustRun(t, sc, "{strategy: leaky-bucket, leakyBucket: {rate: 10, depth: 5}}")
	// 0: admitted at once (its water drains until 100 ms). 0: would start at 100 ms, leaves at
	// 50 and takes its water out. 60: waits only for the first's water, starts at 100 ms and is
	// served by 101 ms (41 ms), inside its timeout; had the water stayed it would start at 200.
	s := r.Summary
	if s.Accepted != 2 || s.Abandoned != 1 || s.Successes != 2 || s.Incoming != 3 {
		t.Fatalf("accepted %d abandoned %d successes %d incoming %d, want 2 1 2 3", s.Accepted, s.Abandoned, s.Successes, s.Incoming)
	}
	if s.P99 != 41*ms1 {
		t.Errorf("p99 %s, want 41ms", s.P99)
	}
}

// After admission a client that gives up leaves the backend working and the permit is released
// at once, so the next request is admitted before the backend is free.
func TestClientTimeoutAfterAdmissionReleasesPermit(t *testing.T) {
	sc := Scenario{
		Arrivals: arrivalsAt(0, 60*ms1),
		Service:  slowtail.Constant(100 * ms1),
		Servers:  1,
		Client:   Client{Timeout: 50 * ms1},
	}
	r := mustRun(t, sc, "{strategy: inflight, inflight: {limit: 1}}")
	s := r.Summary
	// Both admitted (the first released its permit at 50 ms); both time out, the second while
	// waiting behind the abandoned work in the backend.
	if s.Accepted != 2 || s.Timeouts != 2 || s.Successes != 0 || s.MaxBackendQueue != 1 {
		t.Fatalf("accepted %d timeouts %d successes %d backend queue %d, want 2 2 0 1", s.Accepted, s.Timeouts, s.Successes, s.MaxBackendQueue)
	}
	if s.P99 != 50*ms1 {
		t.Errorf("p99 %s, want the 50ms timeout", s.P99)
	}
}

func TestUpstreamTimeoutAnswers504(t *testing.T) {
	sc := Scenario{Arrivals: arrivalsAt(0, 10*ms1), Service: slowtail.Constant(100 * ms1), UpstreamTimeout: 30 * ms1}
	r := mustRun(t, sc, "{strategy: inflight, inflight: {limit: 1}}")
	s := r.Summary
	// The first holds its permit until the proxy gives up on the backend at 30 ms (504), so the
	// second, at 10 ms, is refused.
	if s.UpstreamTimeouts != 1 || s.Rejected != 1 || s.Successes != 0 {
		t.Fatalf("504s %d rejected %d successes %d, want 1 1 0", s.UpstreamTimeouts, s.Rejected, s.Successes)
	}
}

func TestPropagatedDeadlineRefusesHopelessWork(t *testing.T) {
	sc := Scenario{
		Arrivals: arrivalsAt(0, 0, 0),
		Service:  slowtail.Constant(10 * ms1),
		Client:   Client{Timeout: 15 * ms1, PropagateDeadline: true},
	}
	// A leaky bucket at 100/s would start the third request at 20 ms, past its 15 ms deadline:
	// it is refused at once instead of queued.
	r := mustRun(t, sc, "{strategy: leaky-bucket, leakyBucket: {rate: 100, depth: 10}}")
	if got := r.Summary.Refusals[admission.ReasonDeadline]; got != 1 {
		t.Fatalf("deadline refusals %d, want 1 (summary %+v)", got, r.Summary)
	}
}

func TestRetriesBounded(t *testing.T) {
	sc := Scenario{
		Arrivals: arrivalsAt(0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		Service:  slowtail.Constant(10 * ms1),
		Client:   Client{Retry: Retry{Max: 3, Backoff: 1 * ms1, OnRefusal: true}},
	}
	// One token per second: nearly every attempt is refused and retried within a few ms.
	r := mustRun(t, sc, "{strategy: token-bucket, tokenBucket: {rate: 1, burst: 1}}")
	s := r.Summary
	if s.Requests != 10 || s.Retries != 27 || s.Incoming != 37 || s.Accepted != 1 {
		t.Fatalf("requests %d retries %d incoming %d accepted %d; want 10, 9x3=27, 37, 1", s.Requests, s.Retries, s.Incoming, s.Accepted)
	}
}

// A retry storm: clients that time out retry at once, so offered attempts multiply while
// goodput falls, and still every request stops at Max retries.
func TestRetryStormStaysBounded(t *testing.T) {
	arr, err := ParseArrivals("poisson:rate=500", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	base := Scenario{Arrivals: arr, Service: slowtail.DefaultConfig(), Servers: 8, Seed: 7,
		Client: Client{Timeout: 200 * ms1}, SLO: 200 * ms1}
	storm := base
	storm.Client.Retry = Retry{Max: 5, Backoff: 1 * ms1, OnRefusal: true, OnTimeout: true}
	calm := mustRun(t, base, "none").Summary
	r := mustRun(t, storm, "none").Summary
	if r.Incoming > r.Requests*6 || r.Retries == 0 {
		t.Fatalf("incoming %d for %d requests with up to 5 retries each (retries %d)", r.Incoming, r.Requests, r.Retries)
	}
	if r.Incoming <= calm.Incoming || r.Good >= calm.Good {
		t.Errorf("storm: incoming %d good %d; calm: incoming %d good %d; want more offered and less good", r.Incoming, r.Good, calm.Incoming, calm.Good)
	}
}

func TestDeterministic(t *testing.T) {
	arr, err := ParseArrivals("spike:base=200,peak=1200,at=1s,for=1s,poisson=true", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	sc := Scenario{Arrivals: arr, Service: slowtail.DefaultConfig(), Servers: 8, Seed: 42,
		Client: Client{Timeout: 300 * ms1, Retry: Retry{Max: 2, Backoff: 20 * ms1, Jitter: true, OnRefusal: true, OnTimeout: true}},
		SLO:    250 * ms1}
	strategies, err := ParseStrategies([]string{"none", "{strategy: token-bucket, tokenBucket: {rate: 300, burst: 20}}", "{strategy: leaky-bucket, leakyBucket: {rate: 300, depth: 20}}",
		"{strategy: bounded-queue, boundedQueue: {concurrency: 8, depth: 16, maxWait: 50ms}}", "{strategy: inflight, inflight: {limit: 8}}", "{strategy: chain, chain: [{tokenBucket: {rate: 500, burst: 50}}, {boundedQueue: {concurrency: 8, depth: 8, maxWait: 80ms}}]}"})
	if err != nil {
		t.Fatal(err)
	}
	render := func(seed uint64) string {
		sc := sc
		sc.Seed = seed
		var res []Named
		for _, st := range strategies {
			r, err := Run(sc, st, RunOptions{})
			if err != nil {
				t.Fatal(err)
			}
			res = append(res, Named{Strategy: st.Name, Result: r})
		}
		var b bytes.Buffer
		if err := WriteSummaryCSV(&b, res, true); err != nil {
			t.Fatal(err)
		}
		if err := WriteSnapshotsCSV(&b, res, true); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	a, b, c := render(42), render(42), render(43)
	if a != b {
		t.Fatal("two runs with the same seed differ")
	}
	if a == c {
		t.Fatal("runs with different seeds are identical: the seed is not used")
	}
}

// brokenCore claims work is due at a fixed instant but never does it.
type brokenCore struct{ admission.Core }

func (brokenCore) Wake() time.Time { return Base.Add(time.Second) }

func TestStuckWakeIsAnError(t *testing.T) {
	sc := Scenario{Arrivals: arrivalsAt(0), Service: slowtail.Constant(ms1)}
	st := Strategy{Name: "broken", New: func() (admission.Core, error) { return &brokenCore{admission.NewNone()}, nil }}
	_, err := Run(sc, st, RunOptions{})
	if err == nil || !strings.Contains(err.Error(), "Wake") {
		t.Fatalf("err = %v, want a Wake contract error", err)
	}
}

func TestScenarioValidateNamesFields(t *testing.T) {
	sc := Scenario{
		Service: slowtail.Config{Fanout: 0}, Servers: -1,
		Client: Client{Timeout: -1, Retry: Retry{Max: 1000, Multiplier: 0.5}},
		SLO:    -1,
	}
	err := sc.Validate()
	if err == nil {
		t.Fatal("invalid scenario accepted")
	}
	for _, field := range []string{"arrivals", "service", "servers", "client.timeout", "client.retry.max", "client.retry.multiplier", "slo"} {
		if !strings.Contains(err.Error(), field+":") {
			t.Errorf("error does not name %s: %v", field, err)
		}
	}
}

func TestProgressIsReported(t *testing.T) {
	arr, err := ParseArrivals("constant:rate=1000", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	var last Progress
	_, err = Run(Scenario{Arrivals: arr, Service: slowtail.Constant(ms1)}, mustStrategy(t, "{strategy: inflight, inflight: {limit: 4}}"),
		RunOptions{ProgressEvery: 100, Progress: func(p Progress) { calls++; last = p }})
	if err != nil {
		t.Fatal(err)
	}
	if calls < 10 || last.Strategy != "inflight" || last.Offered == 0 || last.Span != 2*time.Second {
		t.Fatalf("%d progress calls, last %+v", calls, last)
	}
}

// The adaptive and CoDel cores run in the lab unchanged. Behind a noiseless backend of 8 workers
// offered twice its capacity, the adaptive limit grows from its warm start of 4 and the
// strategies serve close to capacity, where the fixed 4 would serve half.
func TestAdaptiveCoresRun(t *testing.T) {
	arr, err := ParseArrivals("poisson:rate=800", 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	sc := Scenario{Arrivals: arr, Service: slowtail.Constant(20 * ms1), Servers: 8, Seed: 11,
		Client: Client{Timeout: time.Second}, SLO: 500 * ms1}
	capacity := Capacity(sc)
	for _, spec := range []string{"adaptive", "{strategy: adaptive, adaptive: {algorithm: gradient2}}", "{strategy: adaptive, adaptive: {algorithm: vegas}}", "codel", "{strategy: codel, codel: {concurrency: 8}}"} {
		s := mustRun(t, sc, spec).Summary
		if g := s.GoodputRPS(); g < 0.85*capacity {
			t.Errorf("%s: goodput %.1f rps, want at least 85%% of capacity %.1f", spec, g, capacity)
		}
		if s.MaxBuffered <= 4 {
			t.Errorf("%s: held at most %d at once: the limit never grew", spec, s.MaxBuffered)
		}
	}
}
