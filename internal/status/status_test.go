package status

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/loadshed/loadshed/internal/metrics"
)

// fixture is the proxy's real metrics on a fresh registry, with stage gauges the test sets, and
// a fake clock that only the test moves.
type fixture struct {
	t      *testing.T
	reg    *prometheus.Registry
	m      *metrics.Proxy
	stages []metrics.StageState
	page   *Page
	now    time.Time
}

func newFixture(t *testing.T, opts Options) *fixture {
	f := &fixture{t: t, reg: prometheus.NewRegistry(), now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	f.m = metrics.New(f.reg, func() []metrics.StageState { return f.stages })
	f.page = New(f.reg, opts)
	return f
}

// tick moves the clock on by d and samples.
func (f *fixture) tick(d time.Duration) {
	f.now = f.now.Add(d)
	f.page.Sample(f.now)
}

// view decodes the latest view.
func (f *fixture) view() view {
	f.t.Helper()
	var v view
	if err := json.Unmarshal(*f.page.json.Load(), &v); err != nil {
		f.t.Fatal(err)
	}
	return v
}

func (n *num) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*n = num(math.NaN())
		return nil
	}
	var v float64
	err := json.Unmarshal(b, &v)
	*n = num(v)
	return err
}

// admit counts n admitted requests on route through door, each observed at latency seconds.
func (f *fixture) admit(route, door, outcome string, n int, latency float64) {
	f.m.Requests.WithLabelValues(route, "inflight", door, outcome, "200").Add(float64(n))
	for range n {
		f.m.RequestDuration.WithLabelValues(route).Observe(latency)
	}
}

func (f *fixture) refuse(route, door, reason string, n int) {
	f.m.Requests.WithLabelValues(route, "inflight", door, metrics.OutcomeShed, "503").Add(float64(n))
	f.m.Shed.WithLabelValues(route, "inflight", reason, "sheddable", door).Add(float64(n))
}

func near(got num, want float64) bool {
	return math.Abs(float64(got)-want) <= 1e-9*max(1, math.Abs(want))
}

func route(v view, name string) routeView {
	for _, r := range v.Routes {
		if r.Route == name {
			return r
		}
	}
	return routeView{}
}

// TestViewTotalsRatesAndState: under a steady load the view's totals equal the counters, its
// rates are their growth over the window per second, split by route, door and reason, and the
// state gauges are the stage gauges, the default route's limit and strategy at the head.
func TestViewTotalsRatesAndState(t *testing.T) {
	f := newFixture(t, Options{})
	f.stages = []metrics.StageState{
		{Route: "default", Strategy: "inflight", Limit: 8, InFlight: 8, QueueDepth: 3, Tokens: -1},
		{Route: "export", Strategy: "bounded-queue", Limit: 2, InFlight: 1, QueueDepth: 2, Tokens: -1},
	}
	f.tick(0)
	if v := f.view(); v.Samples != 1 || !math.IsNaN(float64(v.Totals.AdmittedRate)) || v.Totals.Limit != 8 {
		t.Fatalf("first sample: %+v, want no rates yet (null) and limit 8", v.Totals)
	}
	for range 10 {
		f.admit("default", metrics.DoorHTTP, metrics.OutcomeSuccess, 90, 0.02)
		f.admit("default", metrics.DoorHTTP, metrics.OutcomeUpstreamError, 5, 0.002)
		f.admit("export", metrics.DoorGRPC, metrics.OutcomeSuccess, 10, 0.2)
		f.refuse("default", metrics.DoorHTTP, "queue_full", 30)
		f.refuse("export", metrics.DoorGRPC, "queue_timeout", 4)
		f.tick(time.Second)
	}
	v := f.view()
	if v.Samples != 11 || v.Window != 5 || v.Strategy != "inflight" || v.Draining {
		t.Fatalf("view head: samples %d window %v strategy %q draining %v, want 11, 5, inflight, false", v.Samples, v.Window, v.Strategy, v.Draining)
	}
	tot := v.Totals
	for _, c := range []struct {
		name string
		got  num
		want float64
	}{
		{"admitted total", tot.Admitted, 1050}, {"admitted/s", tot.AdmittedRate, 105},
		{"refused total", tot.Refused, 340}, {"refused/s", tot.RefusedRate, 34},
		{"upstream errors total", tot.UpstreamErrors, 50}, {"upstream errors/s", tot.UpstreamErrorRate, 5},
		{"canceled/s", tot.CanceledRate, 0},
		{"limit (default route)", tot.Limit, 8}, {"in flight", tot.Inflight, 9}, {"queued", tot.Queued, 5},
		{"default admitted/s", route(v, "default").AdmittedRate, 95},
		{"default refused/s", route(v, "default").RefusedRate, 30},
		{"export admitted/s", route(v, "export").AdmittedRate, 10},
		{"export limit", route(v, "export").Limit, 2},
		{"export queued", route(v, "export").Queued, 2},
	} {
		if !near(c.got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
	if len(v.Routes) != 2 || v.Routes[0].Route != "default" || v.Routes[1].Strategy != "inflight" {
		t.Errorf("routes: %+v, want default then export (strategy from loadshed_requests_total)", v.Routes)
	}
	if len(v.Doors) != 2 || v.Doors[0].Door != "grpc" || !near(v.Doors[0].AdmittedRate, 10) || !near(v.Doors[1].RefusedRate, 30) {
		t.Errorf("doors: %+v, want grpc 10 admitted/s, http 30 refused/s", v.Doors)
	}
	reasons := map[string]reasonView{}
	for _, r := range v.Reasons {
		reasons[r.Reason] = r
	}
	if r := reasons["queue_full"]; !near(r.Rate, 30) || !near(r.Total, 300) {
		t.Errorf("queue_full: %+v, want 30/s, 300 in all", r)
	}
	if r := reasons["queue_timeout"]; !near(r.Rate, 4) || !near(r.Total, 40) {
		t.Errorf("queue_timeout: %+v, want 4/s, 40 in all", r)
	}
	if len(v.Reasons) != 2 || v.Reasons[0].Reason != "queue_full" {
		t.Errorf("reasons: %+v, want queue_full, queue_timeout (those /metrics names, in the core's order)", v.Reasons)
	}
	// Latency: default's admitted requests took 20 ms (90 a second) or 2 ms (5 a second);
	// export's 200 ms. The quantiles interpolate inside metrics.LatencyBuckets.
	if r := route(v, "export"); float64(r.P50) <= 0.15 || float64(r.P50) > 0.25 || float64(r.P99) <= 0.15 || float64(r.P99) > 0.25 {
		t.Errorf("export p50 %v p99 %v, want both in the 150-250 ms bucket", r.P50, r.P99)
	}
	if float64(tot.P50) <= 0.01 || float64(tot.P50) > 0.025 || float64(tot.P99) <= 0.15 || float64(tot.P99) > 0.25 {
		t.Errorf("all p50 %v p99 %v, want the 10-25 ms and 150-250 ms buckets", tot.P50, tot.P99)
	}

	// The load stops: the rates fall to 0 once the window has passed, the totals stay.
	for range 5 {
		f.tick(time.Second)
	}
	v = f.view()
	if v.Totals.AdmittedRate != 0 || v.Totals.RefusedRate != 0 || !near(v.Totals.Admitted, 1050) || !math.IsNaN(float64(v.Totals.P99)) {
		t.Errorf("after the load: %+v, want rates 0, totals kept, no p99 (nothing observed in the window)", v.Totals)
	}
}

// TestHistoryIsBoundedAndTimed: the chart holds one point per sample for the history's length,
// oldest first, timed relative to the latest, each point the rate since the sample before it.
func TestHistoryIsBoundedAndTimed(t *testing.T) {
	f := newFixture(t, Options{History: 10 * time.Second})
	f.tick(0)
	for i := range 25 {
		f.admit("default", metrics.DoorHTTP, metrics.OutcomeSuccess, i, 0.01)
		f.tick(time.Second)
	}
	h := f.view().History
	if len(h.T) != 10 || len(h.Admitted) != 10 || len(h.Limit) != 10 {
		t.Fatalf("history of %d points (%d admitted), want 10", len(h.T), len(h.Admitted))
	}
	for i := range 10 {
		if want := float64(i - 9); h.T[i] != num(want) {
			t.Errorf("point %d at %vs, want %vs", i, h.T[i], want)
		}
		if want := float64(15 + i); h.Admitted[i] != num(want) {
			t.Errorf("point %d: %v admitted/s, want %v", i, h.Admitted[i], want)
		}
	}
	if !math.IsNaN(float64(h.Limit[9])) {
		t.Errorf("limit %v with no default stage, want null", h.Limit[9])
	}
	// A gap between samples (a slow tick) divides by the real time between them.
	f.admit("default", metrics.DoorHTTP, metrics.OutcomeSuccess, 100, 0.01)
	f.tick(4 * time.Second)
	if h := f.view().History; h.Admitted[9] != 25 || h.T[8] != -4 {
		t.Errorf("after a 4 s gap: last point %v/s at %v s before, want 25/s, 4 s", h.Admitted[9], h.T[8])
	}
}

// TestCounterRestart: a counter that goes down (a new registry behind the same page) counts
// from zero, as Prometheus's rate does, instead of a negative rate.
func TestCounterRestart(t *testing.T) {
	f := newFixture(t, Options{})
	regs := []*prometheus.Registry{f.reg}
	f.page.gather = prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) { return regs[len(regs)-1].Gather() })
	f.admit("default", metrics.DoorHTTP, metrics.OutcomeSuccess, 1000, 0.01)
	f.tick(0)
	f2 := newFixture(t, Options{})
	regs = append(regs, f2.reg)
	f2.admit("default", metrics.DoorHTTP, metrics.OutcomeSuccess, 7, 0.01)
	f.tick(time.Second)
	v := f.view()
	if v.Totals.AdmittedRate != 7 || v.Totals.Admitted != 7 || v.History.Admitted[1] != 7 {
		t.Fatalf("after a restart: %v/s, %v in all, chart %v; want 7, 7, 7", v.Totals.AdmittedRate, v.Totals.Admitted, v.History.Admitted)
	}
}

func TestQuantile(t *testing.T) {
	inf := math.Inf(1)
	b := []float64{0.01, 0.025, 0.05, inf}
	for _, c := range []struct {
		name   string
		counts []float64
		q      float64
		want   float64
	}{
		{"first bucket, from 0", []float64{10, 10, 10, 10}, 0.5, 0.005},
		{"inside a bucket", []float64{0, 10, 10, 10}, 0.5, 0.0175},
		{"upper edge", []float64{0, 10, 10, 10}, 1, 0.025},
		{"two buckets", []float64{50, 50, 100, 100}, 0.99, 0.025 + 0.025*0.98},
		{"in +Inf: the largest finite bound", []float64{0, 0, 0, 5}, 0.5, 0.05},
		{"empty", []float64{0, 0, 0, 0}, 0.5, math.NaN()},
	} {
		got := histogram{bounds: b, counts: c.counts}.quantile(c.q)
		if math.IsNaN(c.want) != math.IsNaN(got) || !math.IsNaN(got) && math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%s: q%v = %v, want %v", c.name, c.q, got, c.want)
		}
	}
	h := histogram{bounds: b, counts: []float64{1, 2, 3, 4}}
	if d := h.minus(histogram{bounds: b, counts: []float64{1, 1, 1, 1}}); d.counts[3] != 3 || d.counts[0] != 0 {
		t.Errorf("minus: %v, want [0 1 2 3]", d.counts)
	}
	if d := h.minus(histogram{bounds: b, counts: []float64{2, 2, 2, 9}}); d.counts[3] != 4 {
		t.Errorf("minus after a restart: %v, want h itself", d.counts)
	}
}

// TestViewRevealsNothingMore: every string in the view (route, strategy, door, reason) is a
// label value /metrics shows; the configuration reaches the page only through the registry.
func TestViewRevealsNothingMore(t *testing.T) {
	f := newFixture(t, Options{})
	f.stages = []metrics.StageState{{Route: "default", Strategy: "adaptive", Limit: 20, Tokens: -1}, {Route: "api", Strategy: "token-bucket", Tokens: 3}}
	f.admit("api", metrics.DoorExtProc, metrics.OutcomeSuccess, 3, 0.01)
	f.refuse("default", metrics.DoorHTTP, "concurrency_limit", 2)
	f.tick(0)
	f.tick(time.Second)
	var exposition bytes.Buffer
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	enc := expfmt.NewEncoder(&exposition, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	var doc any
	if err := json.Unmarshal(*f.page.json.Load(), &doc); err != nil {
		t.Fatal(err)
	}
	n := 0
	var walk func(any)
	walk = func(x any) {
		switch x := x.(type) {
		case map[string]any:
			for _, v := range x {
				walk(v)
			}
		case []any:
			for _, v := range x {
				walk(v)
			}
		case string:
			n++
			if x != "" && !strings.Contains(exposition.String(), `"`+x+`"`) {
				t.Errorf("the view shows %q, which no label of /metrics has", x)
			}
		}
	}
	walk(doc)
	if n < 8 {
		t.Fatalf("only %d strings in the view: %s", n, *f.page.json.Load())
	}
}

// TestRunSamplesAtOnceAndStops: Run takes a sample as it starts and returns when its context
// ends.
func TestRunSamplesAtOnceAndStops(t *testing.T) {
	f := newFixture(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f.page.Run(ctx) // returns: the context has ended
	if v := f.view(); v.Samples != 1 {
		t.Fatalf("samples %d, want 1", v.Samples)
	}
}
