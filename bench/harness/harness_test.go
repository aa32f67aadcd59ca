package harness

import (
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/loadshed/loadshed/bench/k6summary"
	"github.com/loadshed/loadshed/internal/config"
)

func testLimits(t *testing.T) Limits {
	t.Helper()
	l, err := DeriveLimits(Backend{Workers: 4, Service: 40 * time.Millisecond}, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestDeriveLimitsLittlesLaw(t *testing.T) {
	l := testLimits(t)
	if l.CapacityRPS != 100 || l.InFlight != 4 || l.Queue != 6 || l.MaxWait != 60*time.Millisecond {
		t.Fatalf("got C %v L %d Q %d wait %s; want 100, 4, 6, 60ms", l.CapacityRPS, l.InFlight, l.Queue, l.MaxWait)
	}
	l2, err := DeriveLimits(Backend{Workers: 8, Service: 20 * time.Millisecond}, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if l2.CapacityRPS != 400 || l2.InFlight != 8 || l2.Queue != 32 {
		t.Fatalf("benchmarks.md's setup: got C %v L %d Q %d; want 400, 8, 32", l2.CapacityRPS, l2.InFlight, l2.Queue)
	}
}

func TestDeriveLimitsRejects(t *testing.T) {
	_, err := DeriveLimits(Backend{Workers: 0, Service: 0}, 0)
	for _, want := range []string{"workers", "service time", "slo"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
}

// TestEveryStrategyIsBenchmarked walks the strategy registry (internal/config): every strategy
// the proxy accepts has its target "loadshed/NAME", whose generated config the proxy's own loader
// accepts and which holds what the registry sizes for the bench's backend (so the bench knows no
// strategy of its own), told the capacity exactly when the registry sizes it from the capacity.
func TestEveryStrategyIsBenchmarked(t *testing.T) {
	l := testLimits(t)
	ep := endpoints{Listen: "127.0.0.1:18000", Admin: "127.0.0.1:19901", Backend: "127.0.0.1:18080", UpstreamURL: "http://127.0.0.1:18080"}
	targets := map[string]Target{}
	for _, tg := range AllTargets(l) {
		targets[tg.Name] = tg
	}
	backend := config.Backend{Workers: 4, Service: 40 * time.Millisecond, SLO: 100 * time.Millisecond}
	for _, k := range config.Kinds() {
		t.Run(k.Name, func(t *testing.T) {
			tg, ok := targets["loadshed/"+k.Name]
			if !ok {
				t.Fatalf("no target loadshed/%s", k.Name)
			}
			if tg.ToldCapacity != k.ToldCapacity() {
				t.Errorf("told capacity %v, the registry says %v", tg.ToldCapacity, k.ToldCapacity())
			}
			text, err := loadshedConfig(tg.strategy, l, ep)
			if err != nil {
				t.Fatal(err)
			}
			c, err := config.Parse([]byte(text))
			if err != nil {
				t.Fatalf("config rejected:\n%s\n%v", text, err)
			}
			got, _ := yaml.Marshal(c.Admission)
			want, _ := yaml.Marshal(config.Sized(&k, backend))
			if string(got) != string(want) {
				t.Errorf("the bench runs\n%s\nthe registry sizes\n%s", got, want)
			}
		})
	}
	if got := targets["loadshed/bounded-queue"].Settings; got != "boundedQueue: {concurrency: 4, depth: 6, maxWait: 60ms}" {
		t.Errorf("bounded-queue settings in the report: %q", got)
	}
	if got := targets["loadshed/chain"].Settings; got != "chain: [{tokenBucket: {rate: 90, burst: 4}}, {boundedQueue: {concurrency: 4, depth: 6, maxWait: 60ms}}]" {
		t.Errorf("chain settings in the report: %q", got)
	}
}

func TestPeerConfigsCarryTheLimits(t *testing.T) {
	l := testLimits(t)
	ep := endpoints{Listen: "127.0.0.1:18000", Backend: "127.0.0.1:18080"}
	targets := AllTargets(l)
	var conn, req Target
	for _, tg := range targets {
		switch tg.Name {
		case "nginx/limit_conn":
			conn = tg
		case "nginx/limit_req":
			req = tg
		}
	}
	nc := nginxConfig(conn.nginxLoc, l, "/x", ep)
	for _, want := range []string{"limit_conn conns 4;", "server_name bench;", "listen 127.0.0.1:18000;", "server 127.0.0.1:18080;", "worker_processes 1;"} {
		if !strings.Contains(nc, want) {
			t.Errorf("nginx limit_conn config lacks %q", want)
		}
	}
	nr := nginxConfig(req.nginxLoc, l, "/x", ep)
	for _, want := range []string{"rate=100r/s", "limit_req zone=rate burst=6 nodelay;", "limit_req_status 429;"} {
		if !strings.Contains(nr, want) {
			t.Errorf("nginx limit_req config lacks %q", want)
		}
	}
	hc := haproxyConfig(l, ep)
	for _, want := range []string{"bind 127.0.0.1:18000", "timeout queue 60ms", "maxconn 4 maxqueue 6", "nbthread 1"} {
		if !strings.Contains(hc, want) {
			t.Errorf("haproxy config lacks %q", want)
		}
	}
}

func TestSelectTargets(t *testing.T) {
	all := AllTargets(testLimits(t))
	got, err := SelectTargets(all, "loadshed/inflight, nginx,direct")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tg := range got {
		names = append(names, tg.Name)
	}
	if strings.Join(names, " ") != "loadshed/inflight nginx/limit_conn nginx/limit_req direct" {
		t.Fatalf("selected %v", names)
	}
	if _, err := SelectTargets(all, "traefik"); err == nil || !strings.Contains(err.Error(), "--targets") {
		t.Fatalf("unknown prefix: %v", err)
	}
	if got, _ := SelectTargets(all, ""); len(got) != len(all) {
		t.Fatal("empty spec must keep every target")
	}
}

func TestConfigValidateNamesFields(t *testing.T) {
	err := Config{Pin: "sideways"}.Validate()
	for _, want := range []string{"RepoRoot", "OutDir", "ClientTimeout", "Loads", "PointDuration", "Repeats", "MaxLateMs", "Pin", "workers"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error does not name %s: %v", want, err)
		}
	}
}

func TestMedianAndStat(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Fatalf("median = %v", m)
	}
	if m := median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Fatalf("median = %v", m)
	}
	if m := median([]float64{1, math.Inf(1)}); !math.IsInf(m, 1) {
		t.Fatalf("median with a never-recovered run = %v, want +Inf", m)
	}
	st := statOf([]float64{math.NaN(), 5, 1})
	if st.N != 2 || st.Median != 3 || st.Min != 1 || st.Max != 5 {
		t.Fatalf("statOf = %+v", st)
	}
	if st := statOf([]float64{math.NaN()}); st.N != 0 || !math.IsNaN(st.Median) {
		t.Fatalf("statOf(NaN) = %+v", st)
	}
}

func ptr(x float64) *float64 { return &x }

func point(target, scenario string, rep int, goodput, p50, p99 float64, valid bool) Point {
	s := &k6summary.Summary{Script: "overload", Valid: valid, Requests: 1000, GoodputRatio: ptr(goodput),
		AdmittedMs: k6summary.Latency{P50: ptr(p50), P99: ptr(p99)}, ShedShare: 0.5}
	if !valid {
		s.InvalidReason = "k6 dropped 3 iterations"
	}
	return Point{Target: target, Scenario: scenario, Load: 0.5, Repeat: rep, Summary: s, CPUNanos: 50e6, PeakRSS: 10 << 20}
}

// The report takes medians over valid repeats only, pairs added latency with direct per repeat
// and compares loadshed's best with the best peer.
func TestReportFromPoints(t *testing.T) {
	l := testLimits(t)
	all := AllTargets(l)
	targets, _ := SelectTargets(all, "loadshed/inflight,nginx/limit_conn,direct")
	r := &Result{
		Config:    Config{Backend: Backend{Workers: 4, Service: 40 * time.Millisecond}, SLO: 100 * time.Millisecond, Repeats: 3},
		Limits:    l,
		Targets:   targets,
		Scenarios: []Scenario{{Name: "0.5x", Script: "overload.js", Load: 0.5}},
		Points: []Point{
			point("direct", "0.5x", 1, 1, 40, 41, true),
			point("direct", "0.5x", 2, 1, 42, 43, true),
			point("direct", "0.5x", 3, 1, 40, 41, true),
			point("loadshed/inflight", "0.5x", 1, 0.9, 40.5, 41.5, true),
			point("loadshed/inflight", "0.5x", 2, 0.95, 42.5, 43.5, true),
			point("loadshed/inflight", "0.5x", 3, 0.1, 900, 990, false), // invalid: must not count
			point("nginx/limit_conn", "0.5x", 1, 0.8, 40.2, 41.2, true),
			point("nginx/limit_conn", "0.5x", 2, 0.8, 42.2, 43.2, true),
			{Target: "nginx/limit_conn", Scenario: "0.5x", Load: 0.5, Repeat: 3, Err: "nginx exited early"},
		},
	}
	cells := r.Cells()
	c := cells["loadshed/inflight"]["0.5x"]
	if c.Valid != 2 || c.Total != 3 || len(c.Invalid) != 1 {
		t.Fatalf("cell valid %d/%d invalid %v", c.Valid, c.Total, c.Invalid)
	}
	if got := c.Stats["goodput_ratio"].Median; math.Abs(got-0.925) > 1e-9 {
		t.Fatalf("goodput median %v, want 0.925 (invalid repeat left out)", got)
	}
	if got := cells["nginx/limit_conn"]["0.5x"]; got.Valid != 2 || got.Total != 3 {
		t.Fatalf("nginx cell %d/%d", got.Valid, got.Total)
	}
	added := r.addedOverDirect("loadshed/inflight", "0.5x", figureByKey("admitted_p99_ms"))
	if added.N != 2 || math.Abs(added.Median-0.5) > 1e-9 {
		t.Fatalf("added p99 %+v, want 0.5 ms over 2 paired repeats", added)
	}
	var md strings.Builder
	r.markdown(&md, cells)
	out := md.String()
	for _, want := range []string{
		"| loadshed/inflight | 2/3 | 0.925 |",
		"| 0.5x | goodput / min(offered, C) | loadshed/inflight | 0.925 | nginx/limit_conn | 0.800 | 1.16 |",
		"| loadshed/inflight | 0.50 | 0.50 |",
		"INVALID: k6 dropped 3 iterations",
		"FAILED: nginx exited early",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}

	dir := t.TempDir()
	r.Config.OutDir = dir
	if err := writeOutputs(r, &strings.Builder{}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"report.md", "points.csv", "summary.csv", "points.json", "goodput_ratio.png", "admitted_p99_ms.png"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Size() == 0 {
			t.Errorf("%s not written: %v", f, err)
		}
	}
	var again strings.Builder
	if err := Rerender(dir, &again); err != nil {
		t.Fatal(err)
	}
	if again.String() != out {
		t.Error("report rendered from points.json differs from the original")
	}
}

func TestTreeUsageSeesChildren(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 5 & wait")
	if err := cmd.Start(); err != nil {
		t.Skip("no sh:", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	deadline := time.Now().Add(5 * time.Second)
	for len(descendants(cmd.Process.Pid)) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the child of sh never showed up in descendants")
		}
		time.Sleep(10 * time.Millisecond)
	}
	u := treeUsage(os.Getpid())
	if u.Procs < 3 || u.CPUNanos <= 0 || u.PeakRSS <= 0 {
		t.Fatalf("treeUsage(self) = %+v; want this process, sh and sleep with CPU and RSS", u)
	}
}
