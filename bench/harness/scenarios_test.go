package harness

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/bench/k6summary"
	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/loadgen"
)

var testEP = endpoints{Listen: "127.0.0.1:18000", Admin: "127.0.0.1:19902", Backend: "127.0.0.1:18080", UpstreamURL: "http://127.0.0.1:18080",
	Sidecar: "127.0.0.1:18002", SidecarAdmin: "127.0.0.1:19901"}

func envoySetup(t *testing.T, name string) *EnvoySetup {
	t.Helper()
	for i := range EnvoySetups {
		if EnvoySetups[i].Name == name {
			return &EnvoySetups[i]
		}
	}
	t.Fatalf("no Envoy setup %s", name)
	return nil
}

func TestEnvoyConfigsCarryTheLimits(t *testing.T) {
	l := testLimits(t) // C 100, L 4, Q 6
	for _, tc := range []struct {
		setup string
		want  []string
	}{
		{"envoy/adaptive_concurrency", []string{
			"envoy.filters.http.adaptive_concurrency", "concurrency_update_interval: 0.1s", "min_rtt_calc_params: {interval: 60s}",
			"{max_requests: 1000000,",
		}},
		{"envoy/circuit_breaker", []string{"{max_requests: 4, max_connections: 1000000"}},
		{"envoy/local_ratelimit", []string{
			"token_bucket: {max_tokens: 10, tokens_per_fill: 10, fill_interval: 0.1s}", "numerator: 100", "{max_requests: 1000000,",
		}},
	} {
		text, err := envoyConfig(envoySetup(t, tc.setup), l, testEP)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range append(tc.want, "port_value: 19902", "port_value: 18000", "port_value: 18080", "envoy.filters.http.router", "timeout: 30s") {
			if !strings.Contains(text, want) {
				t.Errorf("%s config lacks %q:\n%s", tc.setup, want, text)
			}
		}
	}
	if _, err := envoyConfig(&EnvoyProxy, l, endpoints{Listen: "nonsense"}); err == nil || !strings.Contains(err.Error(), "listen") {
		t.Errorf("bad listen address: %v", err)
	}
	if got := envoyArgs("/x.yaml"); strings.Join(got, " ") != "-c /x.yaml --concurrency 1 --disable-hot-restart --log-level warn" {
		t.Errorf("envoy args %q", got)
	}
}

func TestEnvoyBucketKeepsTheRate(t *testing.T) {
	for _, tc := range []struct {
		c                float64
		q                int
		perFill, maxToks int
		interval         string
	}{
		{100, 6, 10, 10, "0.1s"},
		{400, 32, 40, 40, "0.1s"},
		{125, 8, 125, 125, "1s"},
		{5, 50, 5, 50, "1s"},
	} {
		b := envoyBucketFor(Limits{CapacityRPS: tc.c, Queue: tc.q})
		if b.perFill != tc.perFill || b.max != tc.maxToks || b.interval != tc.interval {
			t.Errorf("C %g Q %d: bucket %+v, want %d per %s, max %d", tc.c, tc.q, b, tc.perFill, tc.interval, tc.maxToks)
		}
	}
}

// envoyBinary is the Envoy scripts/install-tools.sh installed, or "" when there is none.
func envoyBinary() string {
	if p := os.Getenv("LOADSHED_ENVOY"); p != "" {
		return p
	}
	cache := os.Getenv("LOADSHED_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		cache = filepath.Join(home, ".cache", "loadshed")
	}
	p := filepath.Join(cache, "bin", "envoy")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// Every generated Envoy config must pass the real Envoy's own validation.
func TestEnvoyConfigsValidate(t *testing.T) {
	envoy := envoyBinary()
	if envoy == "" {
		t.Skip("no Envoy installed (scripts/install-tools.sh envoy)")
	}
	l := testLimits(t)
	dir := t.TempDir()
	for _, s := range append(append([]EnvoySetup(nil), EnvoySetups...), EnvoyProxy) {
		text, err := envoyConfig(&s, l, testEP)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, strings.ReplaceAll(s.Name, "/", "-")+".yaml")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(envoy, "--mode", "validate", "-c", path, "--disable-hot-restart").CombinedOutput()
		if err != nil {
			t.Errorf("%s: envoy --mode validate: %v\n%s", s.Name, err, out)
		}
	}
}

func TestAdaptiveTargets(t *testing.T) {
	l := testLimits(t)
	ts := AdaptiveTargets(l)
	var names []string
	for _, tg := range ts {
		names = append(names, tg.Name)
		if tg.ToldCapacity {
			t.Errorf("%s is told the capacity", tg.Name)
		}
	}
	want := "loadshed/adaptive loadshed/adaptive-gradient loadshed/adaptive-gradient2 loadshed/adaptive-vegas loadshed/adaptive-aimd loadshed/adaptive-greed envoy/adaptive_concurrency"
	if strings.Join(names, " ") != want {
		t.Fatalf("adaptive targets %v", names)
	}
	for _, tg := range ts[1 : len(ts)-1] {
		text, err := loadshedConfig(tg.strategy, l, testEP)
		if err != nil {
			t.Fatal(err)
		}
		c, err := config.Parse([]byte(text))
		if err != nil {
			t.Fatalf("%s: config rejected:\n%s\n%v", tg.Name, text, err)
		}
		want := config.DefaultAdaptive()
		want.Algorithm = strings.TrimPrefix(tg.Name, "loadshed/adaptive-")
		if got := config.BlockOf[*config.Adaptive](&c.Admission); c.Admission.Strategy != "adaptive" || !reflect.DeepEqual(*got, want) {
			t.Errorf("%s: config\n%s\nwant the defaults with algorithm %s", tg.Name, text, want.Algorithm)
		}
	}
	// A variant's block is read by the config package: what it sets, over the defaults; a block
	// it refuses leaves no config to run, with the reason naming the field.
	vs := AdaptiveTargets(l, AdaptiveVariant{Name: "noqueue", Block: "{queue: {depth: 0, depthPerLimit: 0}}"},
		AdaptiveVariant{Name: "typo", Block: "{queu: {depth: 0}}"})
	noqueue, typo := vs[len(vs)-3], vs[len(vs)-2]
	if noqueue.Name != "loadshed/adaptive~noqueue" || typo.Name != "loadshed/adaptive~typo" {
		t.Fatalf("variant targets %s, %s", noqueue.Name, typo.Name)
	}
	text, err := loadshedConfig(noqueue.strategy, l, testEP)
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse([]byte(text))
	if err != nil {
		t.Fatalf("noqueue: config rejected:\n%s\n%v", text, err)
	}
	defaultsNoQueue := config.DefaultAdaptive()
	defaultsNoQueue.Queue.DepthPerLimit = 0
	if got := config.BlockOf[*config.Adaptive](&c.Admission); !reflect.DeepEqual(*got, defaultsNoQueue) {
		t.Errorf("noqueue: config\n%s\nwant the defaults without the queue", text)
	}
	if _, err := loadshedConfig(typo.strategy, l, testEP); err == nil || !strings.Contains(err.Error(), "queu") || !strings.Contains(err.Error(), "typo") {
		t.Errorf("a variant with an unknown field: %v", err)
	}
	// The exact name selects the default only, not every algorithm it prefixes.
	got, err := SelectTargets(ts, DefaultAdaptive+","+EnvoyAdaptive)
	if err != nil || len(got) != 2 || got[0].Name != DefaultAdaptive || got[1].Name != EnvoyAdaptive {
		t.Fatalf("select %v, %v", got, err)
	}
	if got, _ := SelectTargets(ts, "loadshed/adaptive-"); len(got) != len(AdaptiveAlgorithms) {
		t.Fatalf("prefix loadshed/adaptive- selected %d targets", len(got))
	}
}

// A variant outside the adaptive scenario runs both loadshed doors with its block: the sidecar
// and Envoy's external processor, whose config file carries the block for the config package
// to read; a block it refuses fails the ext_proc point with the reason, before any process.
func TestVariantTargets(t *testing.T) {
	l := testLimits(t)
	vs := VariantTargets(l, AdaptiveVariant{Name: "lowtail", Block: "{queue: {lead: 1ms}}"}, AdaptiveVariant{Name: "typo", Block: "{queu: {lead: 1ms}}"})
	var names []string
	for _, v := range vs {
		names = append(names, v.Name)
	}
	if want := "loadshed/adaptive~lowtail envoy+loadshed~lowtail loadshed/adaptive~typo envoy+loadshed~typo"; strings.Join(names, " ") != want {
		t.Fatalf("variant targets %v, want %s", names, want)
	}
	side, door := vs[0], vs[1]
	if side.Kind != KindLoadshed || door.Kind != KindEnvoy || door.envoy.Sidecar == nil || !strings.Contains(door.Settings, "{queue: {lead: 1ms}}") {
		t.Fatalf("variant targets %+v, %+v", side, door)
	}
	dir := t.TempDir()
	lc, err := door.envoy.Sidecar(dir, Binaries{Proxy: "proxy"}, l, testEP)
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(lc.Args[len(lc.Args)-1])
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse(text)
	if err != nil {
		t.Fatalf("ext_proc variant: config rejected:\n%s\n%v", text, err)
	}
	want := config.DefaultAdaptive()
	want.Queue.Lead = config.Duration(time.Millisecond)
	if got := config.BlockOf[*config.Adaptive](&c.Admission); c.ExtProc.Listen != testEP.Sidecar || !reflect.DeepEqual(*got, want) {
		t.Errorf("ext_proc variant: config\n%s\nwant the defaults with a 1ms lead, serving ext_proc on %s", text, testEP.Sidecar)
	}
	if _, err := vs[3].envoy.Sidecar(t.TempDir(), Binaries{Proxy: "proxy"}, l, testEP); err == nil || !strings.Contains(err.Error(), "queu") || !strings.Contains(err.Error(), "typo") {
		t.Errorf("an ext_proc variant with an unknown field: %v", err)
	}
	// The default door stays as it was: no adaptive block, the defaults.
	def := envoySetup(t, EnvoyLoadshed)
	lc, err = def.Sidecar(t.TempDir(), Binaries{Proxy: "proxy"}, l, testEP)
	if err != nil {
		t.Fatal(err)
	}
	if text, _ := os.ReadFile(lc.Args[len(lc.Args)-1]); strings.Contains(string(text), "adaptive:") {
		t.Errorf("default ext_proc door's config names an adaptive block:\n%s", text)
	}
	// Selected by name next to the defaults.
	got, err := SelectTargets(append(AllTargets(l), vs...), "envoy+loadshed~lowtail,envoy+loadshed")
	if err != nil || len(got) != 2 || got[0].Name != "envoy+loadshed~lowtail" || got[1].Name != EnvoyLoadshed {
		t.Fatalf("select %v, %v", got, err)
	}
}

func TestCostTargets(t *testing.T) {
	l, err := DeriveLimits(Backend{Workers: 64, Service: 20 * time.Millisecond}, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tg := range CostTargets(l) {
		names = append(names, tg.Name)
	}
	if strings.Join(names, " ") != "loadshed/none loadshed/inflight loadshed/adaptive nginx/proxy haproxy/proxy envoy/proxy plainproxy direct" {
		t.Fatalf("cost targets %v", names)
	}
	if l.InFlight != 64 {
		t.Fatalf("inflight limit %d in front of 64 x 20ms, want 64 (never binding at 64 connections)", l.InFlight)
	}
	hc := haproxyPlainConfig(testEP)
	if strings.Contains(hc, "maxconn 4") || strings.Contains(hc, "timeout queue") || !strings.Contains(hc, "server backend 127.0.0.1:18080\n") {
		t.Errorf("plain haproxy config:\n%s", hc)
	}
	fc := fastUpstreamConfig("/x", "127.0.0.1:18080")
	for _, want := range []string{"listen 127.0.0.1:18080;", `return 200 "ok\n";`, "worker_processes 1;"} {
		if !strings.Contains(fc, want) {
			t.Errorf("fast upstream config lacks %q", want)
		}
	}
}

func TestSlowTailScalesWithTheServiceTime(t *testing.T) {
	c := Backend{Workers: 8, Service: 80 * time.Millisecond, SlowTail: true}.serviceTime()
	if c.Mean != 80*time.Millisecond || c.Stddev != 20*time.Millisecond || c.TailProb != 0.01 ||
		c.TailMean != 1200*time.Millisecond || c.TailMin != 400*time.Millisecond || c.TailMax != 8*time.Second || c.Fanout != 1 {
		t.Fatalf("slow tail at 80ms: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	k := Backend{Workers: 8, Service: 80 * time.Millisecond}.serviceTime()
	if k.Mean != 80*time.Millisecond || k.Stddev != 0 || k.TailProb != 0 {
		t.Fatalf("constant: %+v", k)
	}
}

func TestAdaptiveCasesKeepTheCapacity(t *testing.T) {
	cfg := AdaptiveConfig{Config: Config{Backend: Backend{Workers: 4, Service: 40 * time.Millisecond}, SLO: 100 * time.Millisecond},
		Workers: []int{4, 16}, Services: []string{ServiceConstant, ServiceSlowTail}}
	cs, err := cfg.cases()
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 4 || cs[0].Name != "w4-constant" || cs[1].Name != "w4-slow-tail" || cs[3].Name != "w16-slow-tail" {
		t.Fatalf("cases %+v", cs)
	}
	w16 := cs[2]
	if w16.Backend.Service != 160*time.Millisecond || w16.SLO != 400*time.Millisecond || w16.Limits.CapacityRPS != 100 || w16.Limits.InFlight != 16 {
		t.Fatalf("W=16 case %+v", w16)
	}
	if !cs[3].Backend.SlowTail || cs[2].Backend.SlowTail {
		t.Fatal("service shapes swapped")
	}
	cfg.FixedService = true
	if cs, err = cfg.cases(); err != nil {
		t.Fatal(err)
	}
	if w16 := cs[2]; w16.Backend.Service != 40*time.Millisecond || w16.SLO != 100*time.Millisecond || w16.Limits.CapacityRPS != 400 {
		t.Fatalf("W=16 case with a fixed service time %+v", w16)
	}
	bad := AdaptiveConfig{Workers: []int{0}, Services: []string{"bursty"}, Warmup: -time.Second}
	err = bad.Validate()
	for _, want := range []string{"Workers", "Services", "Warmup", "RepoRoot"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate does not name %s: %v", want, err)
		}
	}
}

func TestParsers(t *testing.T) {
	prom := `# HELP loadshed_limit Current concurrency, depth or burst limit, by route and strategy stage.
# TYPE loadshed_limit gauge
loadshed_limit{route="default",strategy="codel"} 128
loadshed_limit{route="default",strategy="adaptive"} 7.5
loadshed_limit{route="export",strategy="adaptive"} 2
`
	if x, ok := loadshedLimit([]byte(prom)); !ok || x != 7.5 {
		t.Errorf("loadshed limit %v %v, want the default route's adaptive stage 7.5", x, ok)
	}
	if x, ok := loadshedLimit([]byte(`loadshed_limit{route="default",strategy="inflight"} 64` + "\n")); !ok || x != 64 {
		t.Errorf("inflight limit %v %v", x, ok)
	}
	if _, ok := loadshedLimit([]byte("go_goroutines 8\n")); ok {
		t.Error("a limit read from a body without one")
	}
	stats := "http.ingress.adaptive_concurrency.gradient_controller.burst_queue_size: 2\nhttp.ingress.adaptive_concurrency.gradient_controller.concurrency_limit: 17\n"
	if x, ok := envoyStat([]byte(stats), "gradient_controller.concurrency_limit"); !ok || x != 17 {
		t.Errorf("envoy stat %v %v", x, ok)
	}

	wrk := `Running 3s test @ http://127.0.0.1:40000/
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     5.01ms    1.20ms  41.02ms   90.00%
    Req/Sec    12.80k   400.00    13.50k    70.00%
  Latency Distribution
     50%  812.00us
     75%    5.50ms
     90%    6.10ms
     99%    1.02s
  38400 requests in 3.00s, 5.20MB read
  Socket errors: connect 0, read 2, write 0, timeout 3
  Non-2xx or 3xx responses: 400
Requests/sec:  12800.00
Transfer/sec:      1.73MB
`
	r, err := parseWrk(wrk)
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != 38400 || r.Seconds != 3 || r.Non2xx != 400 || r.SocketErrors != 5 || math.Abs(r.P50Ms-0.812) > 1e-9 || r.P99Ms != 1020 {
		t.Fatalf("wrk %+v", r)
	}
	if _, err := parseWrk("unable to connect to 127.0.0.1:1 Connection refused\n"); err == nil {
		t.Error("wrk output with no result parsed")
	}

	a := parseCPUTimes("cpu  1 1 1 1\ncpu0 100 0 50 800 50 0 0 0 0 0\ncpu1 10 0 10 80 0 0 0 0\nintr 5\n")
	b := parseCPUTimes("cpu  2 2 2 2\ncpu0 400 0 150 850 50 0 0 0 0 0\ncpu1 20 0 10 170 0 0 0 0\n")
	if got := busyShare(a, b, 0); math.Abs(got-400.0/450) > 1e-9 {
		t.Errorf("cpu0 busy %v, want 400/450", got)
	}
	if got := busyShare(a, b, 1); math.Abs(got-0.1) > 1e-9 {
		t.Errorf("cpu1 busy %v, want 0.1", got)
	}
	if !math.IsNaN(busyShare(a, b, 7)) {
		t.Error("busy share of a CPU that is not there")
	}
}

// The tracer reads the limit while it runs and returns the samples once stopped.
func TestTraceReadsTheLimit(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`loadshed_limit{route="default",strategy="adaptive"} 9` + "\n"))
	}))
	defer srv.Close()
	tr := startTrace(context.Background(), limitProbe{url: srv.URL, parse: loadshedLimit}, 5*time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for {
		tr.mu.Lock()
		n := len(tr.samples)
		tr.mu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d samples after 5s", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	got := tr.stop()
	if len(got) < 3 || got[0].Limit != 9 || got[len(got)-1].T < got[0].T {
		t.Fatalf("trace %+v", got)
	}
	if again := tr.stop(); len(again) != len(got) {
		t.Fatal("a second stop changed the trace")
	}
	p := Point{Trace: []Sample{{0, 2}, {1, 4}, {2, 6}, {3, 10}}, TraceStart: 1.5}
	if m := meanLimit(p); m != 8 {
		t.Fatalf("mean limit after the warm-up %v, want 8", m)
	}
}

// Each adaptive target's limit is read where it lives: loadshed's own /metrics, the external
// processor's beside Envoy, Envoy's gradient controller in its /stats; a fixed limit has none.
func TestLimitProbes(t *testing.T) {
	l := testLimits(t)
	all := append(AllTargets(l), AdaptiveTargets(l)...)
	want := map[string]string{
		DefaultAdaptive:         "http://" + testEP.Admin + "/metrics",
		EnvoyLoadshed:           "http://" + testEP.SidecarAdmin + "/metrics",
		EnvoyAdaptive:           "http://" + testEP.Admin + "/stats?filter=adaptive_concurrency.gradient_controller.concurrency_limit$",
		"envoy/circuit_breaker": "",
	}
	for name, url := range want {
		ts, err := SelectTargets(all, name)
		if err != nil || len(ts) == 0 {
			t.Fatalf("no target %s: %v", name, err)
		}
		got := ""
		if p := ts[0].limitProbe(testEP); p != nil {
			got = p.url
		}
		if got != url {
			t.Errorf("%s: limit read from %q, want %q", name, got, url)
		}
	}
}

// outside sets a rate point's latency outside the backend.
func outside(p CostPoint, p50, p99 float64) CostPoint {
	p.OutP50Ms, p.OutP99Ms = &p50, &p99
	return p
}

// generated sets a rate point's latency through the open-loop generator.
func generated(p CostPoint, p50, p99 float64) CostPoint {
	p.GenP50Ms, p.GenP99Ms = &p50, &p99
	return p
}

func costPoint(target, phase string, rep int, served int64, cpuUs, p50, p99, load float64) CostPoint {
	return CostPoint{Target: target, Phase: phase, Repeat: rep, Requests: served, Served: served, Seconds: 10,
		CPUNanos: int64(cpuUs * 1e3 * float64(served)), P50Ms: p50, P99Ms: p99, LoadBusy: load, LoadOwn: load / 2, ProxyBusy: 0.99}
}

// The cost report takes medians over valid points, pairs added latency with direct per repeat,
// and compares with Envoy, nginx and the plain proxy.
func TestCostReport(t *testing.T) {
	l, _ := DeriveLimits(Backend{Workers: 64, Service: 20 * time.Millisecond}, 100*time.Millisecond)
	targets, _ := SelectTargets(CostTargets(l), "loadshed/none,nginx/proxy,envoy/proxy,plainproxy,direct")
	r := &CostResult{Kind: "cost", Limits: l, Targets: targets,
		Config: CostConfig{Repeats: 2, Connections: 64, Rate: 300, BusyLimit: 0.9, Backend: Backend{Workers: 64, Service: 20 * time.Millisecond}}}
	for rep := 1; rep <= 2; rep++ {
		r.Points = append(r.Points,
			costPoint("loadshed/none", PhaseCeiling, rep, 100000, 100, 5, 9, 0.5),
			costPoint("envoy/proxy", PhaseCeiling, rep, 80000, 120, 6, 12, 0.5),
			costPoint("nginx/proxy", PhaseCeiling, rep, 300000, 30, 1, 3, 0.95), // load core saturated: invalid
			costPoint("plainproxy", PhaseCeiling, rep, 90000, 110, 5, 10, 0.5),
			generated(outside(costPoint("loadshed/none", PhaseRate, rep, 3000, 250, 21.2, 22.5, 0.3), 0.5, 0.9), 21.3, 21.9+float64(rep)),
			generated(outside(costPoint("envoy/proxy", PhaseRate, rep, 3000, 300, 21.3, 23, 0.3), 0.6, 1.2), 21.5, 22.5),
			outside(costPoint("nginx/proxy", PhaseRate, rep, 3000, 100, 21.1, 21.5, 0.3), 0.4, 0.6),
			generated(outside(costPoint("plainproxy", PhaseRate, rep, 3000, 280, 21.2, 22, 0.3), 0.5, 0.8), 21.25, 21.8),
			generated(outside(costPoint("direct", PhaseRate, rep, 3000, 0, 21, 21.5, 0.3), 0.3, 0.5), 21.2, 21.6+float64(rep)),
		)
	}
	// The generator's run of plainproxy in repeat 2 could not be used: only repeat 1 counts.
	r.Points[len(r.Points)-2].GenP50Ms, r.Points[len(r.Points)-2].GenP99Ms = nil, nil
	r.Points[len(r.Points)-2].GenInvalid = "2990 of 3000 requests answered 2xx"
	for i := range r.Points {
		if r.Points[i].LoadBusy >= 0.9 {
			r.Points[i].Invalid = loadCoreVerdict(r.Points[i].LoadBusy, 0.9)
		}
	}
	var md strings.Builder
	r.markdown(&md)
	out := md.String()
	mustContain(t, "cost report", out,
		"| loadshed/none | 2/2 | 10000 | 1.25 | n/a | 0% |",
		"| nginx/proxy | 0/2 | INVALID (30000 rps measured) |",
		// Added latency from the open-loop generator (paired with direct's in the same repeat),
		// then per request outside the backend and from the whole latency in k6's run.
		"| loadshed/none | 2/2 | 250.0 | 0.89 | 2.50 | 0.10 / 0.30 | 0.20 / 0.40 | 0.20 / 1.00 | 23.4 | 22.5 |",
		"| plainproxy | 2/2 | 280.0 | 1.00 | 2.80 | 0.05 / -0.80 |",
		"| nginx/proxy | 2/2 | 100.0 | 0.36 | 1.00 | n/a / n/a | 0.10 / 0.10 |",
		"- loadshed/none over envoy/proxy, repeat by repeat: 1.25, 1.25 (median 1.25, range 1.25-1.25)",
		"| forwarding ceiling >= 1.5 x Envoy's | none | 1.250 | FAIL |",
		"| CPU per request at the fixed rate <= 1.0 x plainproxy's | none | 0.893 | PASS |",
		"| added p99 at the fixed rate <= 1 ms (open-loop generator) | none | 0.30 | PASS |",
		"| added p99 at the fixed rate <= 1 ms (k6, per request outside the backend) | none | 0.40 | PASS |",
		"| loadshed/none | 10000 | 1.25 | 250.0 us | 0.89 | 0.10 / 0.30 | 0.20 / 0.40 |",
		"INVALID: load core 95% busy (limit 90%)",
		"- plainproxy rate repeat 2: open-loop latency run INVALID: 2990 of 3000 requests answered 2xx",
	)
	dir := t.TempDir()
	r.Config.OutDir = dir
	if err := r.writeOutputs(&strings.Builder{}); err != nil {
		t.Fatal(err)
	}
	mustRerender(t, dir, out, "report.md", "points.csv", "readme-table.md")
}

func mustContain(t *testing.T, what, out string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("%s lacks %q:\n%s", what, want, out)
		}
	}
}

// mustRerender checks that dir holds the files and that --report-from renders the same report.
func mustRerender(t *testing.T, dir, report string, files ...string) {
	t.Helper()
	for _, f := range files {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Size() == 0 {
			t.Errorf("%s not written: %v", f, err)
		}
	}
	var again strings.Builder
	if err := Rerender(dir, &again); err != nil {
		t.Fatal(err)
	}
	if again.String() != report {
		t.Error("the report rendered from points.json differs from the original")
	}
}

func adaptivePoint(target, scenario string, goodput, p99 float64, trace []Sample) Point {
	return Point{Target: target, Scenario: scenario, Load: 5, Repeat: 1, Trace: trace, TraceStart: 1,
		Summary: &k6summary.Summary{Script: "overload", Valid: true, Requests: 1000, GoodputRatio: ptr(goodput),
			AdmittedMs: k6summary.Latency{P50: ptr(p99 / 2), P99: ptr(p99), P999: ptr(p99 + 1)}}}
}

// The adaptive report judges loadshed's default against Envoy at every point and draws the
// limit traces.
func TestAdaptiveReport(t *testing.T) {
	cfg := AdaptiveConfig{Config: Config{Backend: Backend{Workers: 4, Service: 40 * time.Millisecond}, SLO: 100 * time.Millisecond, Repeats: 1},
		Workers: []int{8}, Services: []string{ServiceConstant}, Warmup: time.Second}
	cfg.TraceEvery = 100 * time.Millisecond
	cases, err := cfg.cases()
	if err != nil {
		t.Fatal(err)
	}
	targets, _ := SelectTargets(AdaptiveTargets(cases[0].Limits), DefaultAdaptive+","+EnvoyAdaptive)
	r := &AdaptiveResult{Kind: "adaptive", Config: cfg, Cases: cases, Targets: targets}
	tr := []Sample{{0, 3}, {0.5, 6}, {1, 8}, {1.5, 8}, {2, 10}}
	for _, load := range []float64{2, 5} {
		name := "w8-constant-" + map[float64]string{2: "2x", 5: "5x"}[load]
		r.Runs = append(r.Runs, AdaptiveRun{Case: 0, Scenario: Scenario{Name: name, Script: "overload.js", Load: load}})
	}
	r.Points = []Point{
		adaptivePoint(DefaultAdaptive, "w8-constant-2x", 0.97, 50, tr),
		adaptivePoint(EnvoyAdaptive, "w8-constant-2x", 0.96, 48, tr),
		adaptivePoint(DefaultAdaptive, "w8-constant-5x", 0.95, 60, tr),
		adaptivePoint(EnvoyAdaptive, "w8-constant-5x", 0.96, 45, tr),
	}
	// The backend's usage read over the measured run: 8 workers 99.5% busy for 16 s.
	r.Points[3].Summary.DurationS = 16
	r.Points[3].Backend = &BackendUsage{Served: 6000, ServiceSeconds: 0.995 * 8 * 16}
	var md strings.Builder
	r.markdown(&md)
	out := md.String()
	mustContain(t, "adaptive report", out,
		"| 8 | constant | 2x | 0.970 | 0.960 | 1.01 | 50.0 | 48.0 | 1.04 | PASS |",
		"| 8 | constant | 5x | 0.950 | 0.960 | 0.99 | 60.0 | 45.0 | 1.33 | FAIL |",
		"1 of 2 judged points PASS",
		"| 5x | envoy/adaptive_concurrency | 1/1 | 0.960 | 22.5 | 45.0 | 46.0 | 0.000 | 0.000 | 8.7 | 0.9950 | 21.23 |",
		"| 5x | loadshed/adaptive | 1/1 | 0.950 | 30.0 | 60.0 | 61.0 | 0.000 | 0.000 | 8.7 | n/a | n/a |",
		"![limit over time](limit-w8-constant.png)",
	)
	dir := t.TempDir()
	r.Config.OutDir = dir
	if err := r.writeOutputs(&strings.Builder{}); err != nil {
		t.Fatal(err)
	}
	mustRerender(t, dir, out, "report.md", "points.csv", "summary.csv", "limit-w8-constant.png")
}

// A target's sidecar is watched, measured with the target and stopped with it.
func TestStackCountsTheSidecar(t *testing.T) {
	dir := t.TempDir()
	start := func(name string) *proc {
		p, err := startProc(name, "sleep", []string{"30"}, nil, filepath.Join(dir, name+".log"), "", -1, false)
		if err != nil {
			t.Skip("no sleep:", err)
		}
		return p
	}
	st := &stack{backend: start("backend"), target: start("target"), sidecar: start("sidecar")}
	defer st.stop()
	if got := len(st.watch()); got != 3 {
		t.Fatalf("watching %d processes, want backend, sidecar and target", got)
	}
	if u := st.usage(); u.Procs != 2 || u.PeakRSS <= 0 {
		t.Fatalf("usage %+v, want the target and its sidecar", u)
	}
	st.stop()
	for _, p := range st.watch() {
		if p.exited() == nil {
			t.Errorf("%s still running after stop", p.name)
		}
	}
}

// The open-loop generator's latency counts only from a valid run that every request passed
// with a 2xx: a refused or failed request has no forwarded latency to compare with direct's.
func TestGenLatency(t *testing.T) {
	ok := &loadgen.Result{Valid: true, Offered: 3000, Success: 3000,
		AdmittedLatency: loadgen.Latency{P50: 21500 * time.Microsecond, P99: 22750 * time.Microsecond}}
	p50, p99, why := genLatency(ok)
	if why != "" || p50 == nil || p99 == nil || *p50 != 21.5 || *p99 != 22.75 {
		t.Errorf("valid run: got %v %v %q, want 21.5 22.75 and no reason", v(p50), v(p99), why)
	}
	late := *ok
	late.Valid, late.InvalidReason = false, "late starts 4.0% > budget 1.0%"
	refused := *ok
	refused.Success = 2990
	for name, tc := range map[string]struct {
		r    *loadgen.Result
		want string
	}{
		"invalid": {&late, "late starts 4.0% > budget 1.0%"},
		"refused": {&refused, "2990 of 3000 requests answered 2xx"},
		"empty":   {&loadgen.Result{Valid: true}, "0 of 0 requests answered 2xx"},
	} {
		p50, p99, why := genLatency(tc.r)
		if p50 != nil || p99 != nil || why != tc.want {
			t.Errorf("%s: got %v %v %q, want no figures and %q", name, v(p50), v(p99), why, tc.want)
		}
	}
}
