package lab

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/loadgen"
	"github.com/loadshed/loadshed/internal/slowtail"
	"github.com/loadshed/loadshed/pkg/admission"
)

func TestParseHop(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "hop.csv")
	if err := os.WriteFile(file, []byte("hop_ms\n1.5\n0.5\n1.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		spec string
		want Hop
	}{
		{"", Hop{}},
		{"none", Hop{}},
		{"0", Hop{}},
		{"1.2ms", Hop{Path: HopDist{Const: 1200 * time.Microsecond}}},
		{"path=1ms,worker=2ms", Hop{Path: HopDist{Const: time.Millisecond}, Worker: 2 * time.Millisecond}},
		{"worker=2ms", Hop{Worker: 2 * time.Millisecond}},
	} {
		got, err := ParseHop(c.spec)
		if err != nil {
			t.Errorf("%q: %v", c.spec, err)
			continue
		}
		if got.Path.Const != c.want.Path.Const || got.Worker != c.want.Worker || len(got.Path.Samples) != 0 {
			t.Errorf("%q: got %+v, want %+v", c.spec, got, c.want)
		}
	}
	h, err := ParseHop("file=" + file + ",worker=1ms")
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{500 * time.Microsecond, time.Millisecond, 1500 * time.Microsecond}
	if len(h.Path.Samples) != 3 || h.Path.Samples[0] != want[0] || h.Path.Samples[2] != want[2] || h.Worker != time.Millisecond {
		t.Errorf("file hop: %+v, want sorted samples %v and worker 1ms", h, want)
	}
	if h.Path.Mean() != time.Millisecond || h.Path.Quantile(0.5) != time.Millisecond {
		t.Errorf("file hop: mean %s, median %s, want 1ms", h.Path.Mean(), h.Path.Quantile(0.5))
	}

	bad := filepath.Join(dir, "bad.csv")
	if err := os.WriteFile(bad, []byte("hop_ms\n0.5\nsoon\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ spec, want string }{
		{"-1ms", "path: must be in"},
		{"path=2h", "path: must be in"},
		{"worker=soon", "worker:"},
		{"speed=2", "unknown key"},
		{"path=1ms,file=" + file, "give one"},
		{"file=" + filepath.Join(dir, "missing.csv"), "file:"},
		{"file=" + bad, "line 3: hop_ms"},
	} {
		if _, err := ParseHop(c.spec); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want it to contain %q", c.spec, err, c.want)
		}
	}
}

func TestHopSamplesRoundTrip(t *testing.T) {
	in := []time.Duration{2500 * time.Microsecond, 734 * time.Microsecond, 0}
	var buf bytes.Buffer
	if err := WriteHopSamples(&buf, in); err != nil {
		t.Fatal(err)
	}
	if buf.String() != "hop_ms\n2.500\n0.734\n0.000\n" {
		t.Errorf("file:\n%s", buf.String())
	}
	out, err := ReadHopSamples(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 3 || out[0] != 0 || out[1] != 734*time.Microsecond || out[2] != 2500*time.Microsecond {
		t.Errorf("read back %v", out)
	}
	for _, text := range []string{"", "ms\n1\n", "hop_ms,x\n1,2\n", "hop_ms\n", "hop_ms\n-1\n"} {
		if _, err := ReadHopSamples(strings.NewReader(text)); err == nil {
			t.Errorf("%q: no error", text)
		}
	}
}

// evenScenario offers n requests every gap to servers workers with a constant service time.
func evenScenario(n int, gap, service time.Duration, servers int) Scenario {
	return Scenario{
		Arrivals: ScheduleArrivals{Schedule: loadgen.ConstantRate(float64(time.Second)/float64(gap), time.Duration(n)*gap),
			Priority: admission.Critical},
		Service: slowtail.Constant(service), Servers: servers, Seed: 1,
	}
}

func TestHopAddsToLatencyAndHoldsThePermit(t *testing.T) {
	inflight1, err := ParseStrategy("{strategy: inflight, inflight: {limit: 1}}")
	if err != nil {
		t.Fatal(err)
	}
	// One request every 11 ms, 10 ms of service: an in-flight limit of 1 admits them all.
	sc := evenScenario(100, 11*time.Millisecond, 10*time.Millisecond, 1)
	r, err := Run(sc, inflight1, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Summary.Accepted != 100 || r.Summary.P99 != 10*time.Millisecond {
		t.Fatalf("no hop: accepted %d, p99 %s; want 100 and 10ms", r.Summary.Accepted, r.Summary.P99)
	}
	// A 2 ms path hop holds the permit for 12 ms: every second request finds it taken.
	sc.Hop = Hop{Path: HopDist{Const: 2 * time.Millisecond}}
	r, err = Run(sc, inflight1, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Summary.Accepted != 50 || r.Summary.P99 != 12*time.Millisecond {
		t.Errorf("path hop 2ms: accepted %d, p99 %s; want 50 and 12ms", r.Summary.Accepted, r.Summary.P99)
	}
	// A worker overhead of 1.5 ms makes each request hold the one worker 11.5 ms: behind no
	// admission control, a queue builds in the backend 0.5 ms per request.
	none, err := ParseStrategy("none")
	if err != nil {
		t.Fatal(err)
	}
	sc.Hop = Hop{Worker: 1500 * time.Microsecond}
	r, err = Run(sc, none, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := 11500*time.Microsecond + 99*500*time.Microsecond; r.Summary.P999 != want || r.Summary.MaxBackendQueue != 5 {
		t.Errorf("worker overhead: max latency %s, max backend queue %d; want %s and 5", r.Summary.P999, r.Summary.MaxBackendQueue, want)
	}
	if got := EffectiveCapacity(sc); got < 86.9 || got > 87.0 {
		t.Errorf("effective capacity %v, want 1/11.5ms = 86.96", got)
	}
	// Twice the speed halves the service, the overhead and the hop.
	sc.Hop = Hop{Path: HopDist{Const: 2 * time.Millisecond}, Worker: 2 * time.Millisecond}
	sc.Speed = 2
	r, err = Run(sc, none, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Summary.P99 != 7*time.Millisecond {
		t.Errorf("speed 2: p99 %s, want (2+10+2)/2 = 7ms", r.Summary.P99)
	}
	if got := EffectiveCapacity(sc); got < 166.6 || got > 166.7 {
		t.Errorf("speed 2: effective capacity %v, want 2/12ms = 166.7", got)
	}
}

func TestSampledHopIsDeterministic(t *testing.T) {
	st, err := ParseStrategy("{strategy: inflight, inflight: {limit: 4}}")
	if err != nil {
		t.Fatal(err)
	}
	sc := evenScenario(2000, 2*time.Millisecond, 10*time.Millisecond, 8)
	sc.Arrivals = ScheduleArrivals{Schedule: loadgen.Poisson(500, 4*time.Second, 0), Priority: admission.Critical}
	sc.Hop = Hop{Path: HopDist{Samples: []time.Duration{0, time.Millisecond, 3 * time.Millisecond, 20 * time.Millisecond}}}
	run := func(seed uint64) Summary {
		s := sc
		s.Seed = seed
		r, err := Run(s, st, RunOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r.Summary
	}
	a, b, c := run(7), run(7), run(8)
	if a.Accepted != b.Accepted || a.P99 != b.P99 || a.P50 != b.P50 {
		t.Errorf("same seed, different runs: %+v vs %+v", a, b)
	}
	if a.P999 != 30*time.Millisecond {
		t.Errorf("p99.9 %s, want the largest hop plus the service: 30ms", a.P999)
	}
	if a.Accepted == c.Accepted && a.P50 == c.P50 && a.P99 == c.P99 {
		t.Errorf("another seed gave the very same run")
	}
}

func TestServiceSeedDrawsTheBackendsSequence(t *testing.T) {
	none, err := ParseStrategy("none")
	if err != nil {
		t.Fatal(err)
	}
	sc := evenScenario(1, time.Second, 0, 0)
	sc.Service = slowtail.DefaultConfig()
	sc.ServiceSeed = 42
	r, err := Run(sc, none, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := slowtail.New(sc.Service, 42).Sample(); r.Summary.P50 != want {
		t.Errorf("latency %s, want the first sample of seed 42: %s", r.Summary.P50, want)
	}
}

func TestScenarioValidateNamesHopFields(t *testing.T) {
	sc := evenScenario(1, time.Second, ms1, 1)
	sc.Hop = Hop{Path: HopDist{Const: -1}, Worker: 2 * time.Hour}
	sc.Speed = 50
	err := sc.Validate()
	for _, field := range []string{"hop.path", "hop.worker", "speed"} {
		if err == nil || !strings.Contains(err.Error(), field+":") {
			t.Errorf("error does not name %s: %v", field, err)
		}
	}
	sc = evenScenario(1, time.Second, ms1, 1)
	sc.Hop.Path.Samples = []time.Duration{ms1, -ms1}
	if err := sc.Validate(); err == nil || !strings.Contains(err.Error(), "hop.path:") {
		t.Errorf("a negative sample: %v", err)
	}
}
