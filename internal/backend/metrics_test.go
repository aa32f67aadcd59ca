package backend

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetrics(t *testing.T) {
	f := newFixture(t, constant(2, 20*ms))
	// Two in service, one waiting, one refused with 400.
	chans := []<-chan result{f.get("/"), f.get("/?status=500")}
	f.waitState(2, 0, 0, 2)
	chans = append(chans, f.get("/"))
	f.waitState(2, 1, 0, 2)
	f.recv(f.get("/?status=bad"))

	const gauges = `
# HELP backend_inflight Requests holding a worker (busy workers).
# TYPE backend_inflight gauge
backend_inflight 2
# HELP backend_queue_depth Requests waiting inside the backend for a worker.
# TYPE backend_queue_depth gauge
backend_queue_depth 1
# HELP backend_workers Configured worker count.
# TYPE backend_workers gauge
backend_workers 2
`
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(gauges),
		"backend_inflight", "backend_queue_depth", "backend_workers"); err != nil {
		t.Fatal(err)
	}

	f.clock.Advance(20 * ms)
	f.waitState(1, 0, 2, 1)
	f.clock.Advance(20 * ms)
	for _, ch := range chans {
		f.recv(ch)
	}
	f.waitState(0, 0, 3, 0)

	const counts = `
# HELP backend_requests_total Requests answered by the backend, by HTTP status code.
# TYPE backend_requests_total counter
backend_requests_total{code="200"} 2
backend_requests_total{code="400"} 1
backend_requests_total{code="500"} 1
`
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(counts), "backend_requests_total"); err != nil {
		t.Fatal(err)
	}
	// The fake clock makes the histograms exact: three services of 20ms, waits of 0, 0 and 20ms.
	checkHistogram(t, f.reg, "backend_service_seconds", 3, 0.060)
	checkHistogram(t, f.reg, "backend_wait_seconds", 3, 0.020)

	problems, err := testutil.GatherAndLint(f.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	for _, c := range []prometheus.Collector{f.s.m.requests, f.s.m.service, f.s.m.wait} {
		problems, err := testutil.CollectAndLint(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}

	// The admin endpoint serves the same registry.
	resp, err := f.admin.Client().Get(f.admin.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `backend_requests_total{code="200"} 2`) {
		t.Fatalf("GET /metrics = %d:\n%s", resp.StatusCode, b)
	}
}

func checkHistogram(t *testing.T, g prometheus.Gatherer, name string, count uint64, sum float64) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() != count || h.GetSampleSum() < sum-1e-9 || h.GetSampleSum() > sum+1e-9 {
			t.Errorf("%s: count %d sum %v, want %d and %v", name, h.GetSampleCount(), h.GetSampleSum(), count, sum)
		}
		return
	}
	t.Errorf("%s not gathered", name)
}

func TestRegisterTwiceFails(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(DefaultConfig(), WithRegistry(reg)); err != nil {
		t.Fatal(err)
	}
	if _, err := New(DefaultConfig(), WithRegistry(reg)); err == nil {
		t.Fatal("a second Server registered the same metrics on one registry")
	}
}
