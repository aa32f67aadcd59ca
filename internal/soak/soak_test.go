package soak

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestParseVmRSS(t *testing.T) {
	status := "Name:\tproxy\nVmPeak:\t  1000 kB\nVmRSS:\t   20480 kB\nThreads:\t7\n"
	got, err := parseVmRSS([]byte(status))
	if err != nil || got != 20480<<10 {
		t.Fatalf("%d %v, want %d", got, err, 20480<<10)
	}
	for _, bad := range []string{"Name: x\n", "VmRSS: 12 MB\n", "VmRSS: many kB\n"} {
		if _, err := parseVmRSS([]byte(bad)); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

func TestMetricSums(t *testing.T) {
	text := `# HELP go_goroutines Number of goroutines.
# TYPE go_goroutines gauge
go_goroutines 42
go_goroutines_extra 7
loadshed_inflight{route="default",strategy="adaptive"} 3
loadshed_inflight{route="api",strategy="inflight"} 2.5 1700000000000
loadshed_limit{route="x}y",strategy="adaptive"} 16
`
	m, err := metricSums(strings.NewReader(text), "go_goroutines", "loadshed_inflight", "loadshed_limit", "loadshed_queue_depth")
	if err != nil {
		t.Fatal(err)
	}
	if m["go_goroutines"] != 42 || m["loadshed_inflight"] != 5.5 || m["loadshed_limit"] != 16 {
		t.Fatalf("sums %v", m)
	}
	if _, ok := m["loadshed_queue_depth"]; ok {
		t.Fatal("an absent metric must be absent from the result")
	}
	if _, err := metricSums(strings.NewReader("go_goroutines many\n"), "go_goroutines"); err == nil {
		t.Fatal("a malformed value must be an error")
	}
}

func series(n int, f func(i int) Sample) []Sample {
	out := make([]Sample, n)
	for i := range out {
		out[i] = f(i)
		out[i].Elapsed = time.Duration(i+1) * time.Second
	}
	return out
}

func TestJudgeFlatPasses(t *testing.T) {
	c := Default().Ceilings
	flat := series(30, func(i int) Sample {
		// Noise within a few percent, the first third higher (warm-up is not judged).
		w := int64(0)
		if i < 10 {
			w = 20 << 20
		}
		return Sample{RSSBytes: 40<<20 + w + int64(i%3)<<18, Goroutines: 200 + i%5, FDs: 150 + i%4, InFlight: float64(i % 8)}
	})
	trends, problems := Judge(flat, c, 0.10)
	if len(problems) != 0 {
		t.Fatalf("a flat run failed: %v", problems)
	}
	if len(trends) != 4 || trends[0].Metric != "rss_bytes" || trends[3].Checked {
		t.Fatalf("trends %+v", trends)
	}
}

func TestJudgeCatchesLeaksAndCeilings(t *testing.T) {
	c := Ceilings{RSSBytes: 100 << 20, Goroutines: 1000, FDs: 500, InFlight: 8}
	// A goroutine and descriptor leak: one more of each per second; memory grows 1 MiB a second.
	leak := series(30, func(i int) Sample {
		return Sample{RSSBytes: int64(40+i) << 20, Goroutines: 100 + 10*i, FDs: 50 + 5*i, InFlight: 4}
	})
	_, problems := Judge(leak, c, 0.10)
	joined := strings.Join(problems, "\n")
	for _, m := range []string{"rss_bytes grew", "goroutines grew", "open_fds grew"} {
		if !strings.Contains(joined, m) {
			t.Errorf("problems %q do not report %q", joined, m)
		}
	}
	// A ceiling crossed once, even without growth.
	spike := series(30, func(i int) Sample {
		s := Sample{RSSBytes: 40 << 20, Goroutines: 100, FDs: 50, InFlight: 4}
		if i == 5 {
			s.InFlight = 9
		}
		return s
	})
	_, problems = Judge(spike, c, 0.10)
	if len(problems) != 1 || !strings.Contains(problems[0], "inflight crossed its ceiling 8 in 1 samples (first at 6s: 9)") {
		t.Fatalf("problems %q", problems)
	}
	if _, problems := Judge(spike[:2], c, 0.10); len(problems) != 1 {
		t.Fatalf("two samples must not pass: %q", problems)
	}
}

func TestCycleFitsTheThirds(t *testing.T) {
	for _, c := range []struct {
		d, want time.Duration
	}{
		{10 * time.Minute, 40 * time.Second},
		{45 * time.Second, 15 * time.Second},
		{9 * time.Second, 3 * time.Second},
		{time.Hour, 40 * time.Second},
	} {
		got := CycleLength(c.d)
		if got != c.want {
			t.Errorf("%s: cycle %s, want %s", c.d, got, c.want)
		}
		if third := c.d / 3; third%got != 0 {
			t.Errorf("%s: a third (%s) is not a whole number of cycles of %s", c.d, third, got)
		}
	}
	cycle := BackendCycle(4, 20*time.Millisecond)
	want := []Phase{{4, 20 * time.Millisecond}, {2, 20 * time.Millisecond}, {8, 10 * time.Millisecond}, {4, 40 * time.Millisecond}}
	for i, p := range want {
		if cycle[i] != p {
			t.Fatalf("cycle %v, want %v", cycle, want)
		}
		if got := PhaseAt(cycle, 40*time.Second, time.Duration(i)*10*time.Second+time.Second); got != p {
			t.Fatalf("phase %d: %v, want %v", i, got, p)
		}
	}
	if got := PhaseAt(cycle, 40*time.Second, 41*time.Second); got != want[0] {
		t.Fatalf("the cycle must repeat: %v", got)
	}
	if got := string(want[2].patch()); got != `{"mean":"10ms","stddev":"2.5ms","workers":8}` {
		t.Fatalf("patch %s", got)
	}
}

// TestCountingClassifiesAnswers: served answers, sheds (which name their reason) and failures
// (a 5xx without a reason, a 503 without a reason, a transport error) are told apart.
func TestCountingClassifiesAnswers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/shed":
			w.Header().Set("X-Loadshed-Reason", "queue_full")
			w.WriteHeader(503)
		case "/limited":
			w.Header().Set("X-Loadshed-Reason", "rate_limited")
			w.WriteHeader(429)
		case "/bad-gateway":
			w.WriteHeader(502)
		case "/bare-503":
			w.WriteHeader(503)
		}
	}))
	defer srv.Close()
	c := newCounting(&http.Transport{})
	client := &http.Client{Transport: c}
	for _, p := range []string{"/", "/", "/shed", "/limited", "/bad-gateway", "/bare-503"} {
		res, err := client.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	if _, err := client.Get("http://127.0.0.1:1/"); err == nil {
		t.Fatal("want a transport error")
	}
	if c.ok.Load() != 2 || c.shed.Load() != 2 || c.failed.Load() != 3 {
		t.Fatalf("ok %d shed %d failed %d, want 2 2 3", c.ok.Load(), c.shed.Load(), c.failed.Load())
	}
	r := Requests{Shed: map[string]int64{}}
	c.fold(&r)
	if r.OK != 2 || r.Unexpected != 2 || r.Shed["queue_full"] != 1 || r.Shed["rate_limited"] != 1 || len(r.FailureSamples) != 2 {
		t.Fatalf("totals %+v", r)
	}
	if r.Failed() != 2 {
		t.Fatalf("failed %d", r.Failed())
	}
}

func TestConfigValidateNamesFields(t *testing.T) {
	c := Default()
	c.WorkDir = t.TempDir()
	if err := c.Validate(); err != nil {
		t.Fatalf("the default config: %v", err)
	}
	bad := Config{Duration: time.Second, Load: -1, Chunk: time.Millisecond, MaxGrowth: -1}
	err := bad.Validate()
	for _, field := range []string{"Interval", "Duration", "Load", "Workers", "Service", "Admission", "WorkDir", "ClientTimeout", "Chunk", "Ceilings", "MaxGrowth"} {
		if err == nil || !strings.Contains(err.Error(), field+":") {
			t.Errorf("error %v does not name %s", err, field)
		}
	}
	huge := Default()
	huge.WorkDir, huge.Load = "x", 1000
	if err := huge.Validate(); err == nil || !strings.Contains(err.Error(), "Load:") {
		t.Fatalf("200000 rps: %v", err)
	}
}
