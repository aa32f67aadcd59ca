package proxy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/loadshed/loadshed/internal/testwait"
)

func TestMalformedHeadersGet400NamingTheHeader(t *testing.T) {
	g := newValve()
	h := start(t, g, "  strategy: inflight\n  inflight: {limit: 4}")
	for _, c := range []struct{ header, value string }{
		{"X-Loadshed-Priority", "urgent"},
		{"X-Loadshed-Cost", "0"},
		{"X-Loadshed-Cost", "1e9"},
		{"X-Request-Timeout", "soon"},
		{"X-Request-Timeout", "-1s"},
		{"Grpc-Timeout", "5x"},
		{"Grpc-Timeout", "123456789S"},
	} {
		res, body := get(t, h.front.URL+"/", c.header, c.value)
		if res.StatusCode != 400 || !strings.Contains(strings.ToLower(body), strings.ToLower(c.header)) {
			t.Errorf("%s: %q -> %d %q, want 400 naming the header", c.header, c.value, res.StatusCode, body)
		}
	}
	if g.hits.Load() != 0 {
		t.Fatalf("malformed requests reached the upstream %d times", g.hits.Load())
	}
}

func TestDeadlineThatCannotBeMetNeverReachesUpstream(t *testing.T) {
	g := newValve()
	h := start(t, g, "  strategy: none")
	// Teach the route its upstream latency: 50 ms.
	g.delay.Store(int64(50 * time.Millisecond))
	for range 3 {
		get(t, h.front.URL+"/")
	}
	before := g.hits.Load()
	res, body := get(t, h.front.URL+"/", "X-Request-Timeout", "10ms")
	if res.StatusCode != 503 || !strings.Contains(body, "deadline") || res.Header.Get("Retry-After") == "" {
		t.Fatalf("%d %q: want 503 deadline with Retry-After", res.StatusCode, body)
	}
	if g.hits.Load() != before {
		t.Fatal("a request that cannot meet its deadline must not reach the upstream")
	}
	// A feasible deadline is forwarded, shortened by the time already spent.
	res, _ = get(t, h.front.URL+"/", "X-Request-Timeout", "2s", "Grpc-Timeout", "5S")
	if res.StatusCode != 200 {
		t.Fatalf("feasible deadline: %d", res.StatusCode)
	}
	r := g.last.Load()
	fwd, err := time.ParseDuration(r.Header.Get("X-Request-Timeout"))
	if err != nil || fwd <= 0 || fwd > 2*time.Second {
		t.Fatalf("forwarded X-Request-Timeout %q", r.Header.Get("X-Request-Timeout"))
	}
	if gt := r.Header.Get("Grpc-Timeout"); !strings.HasSuffix(gt, "m") || gt == "2000m" {
		t.Fatalf("forwarded grpc-timeout %q: want the remaining milliseconds (under 2 s)", gt)
	}
}

func TestRoutesHaveTheirOwnPolicy(t *testing.T) {
	g := newValve()
	h := start(t, g, "  strategy: inflight\n  inflight: {limit: 1}",
		"routes:\n  - name: heavy\n    pathPrefix: /heavy\n    cost: 2\n    admission: {strategy: inflight, inflight: {limit: 2}}\n  - name: free\n    pathPrefix: /free\n    admission: {strategy: none}")
	done := make(chan int, 1)
	go func() {
		res, _ := get(t, h.front.URL+"/heavy?wait=1")
		done <- res.StatusCode
	}()
	testwait.Until(t, 5*time.Second, "the heavy request upstream", func() bool { return g.waiting.Load() == 1 })
	// The heavy route's limit (2) is used up by one request of cost 2...
	if res, _ := get(t, h.front.URL+"/heavy/x"); res.StatusCode != 503 {
		t.Fatalf("second heavy: %d, want 503", res.StatusCode)
	}
	// ...while the default route and the free route are untouched.
	if res, _ := get(t, h.front.URL+"/other"); res.StatusCode != 200 {
		t.Fatalf("default route: %d", res.StatusCode)
	}
	if res, _ := get(t, h.front.URL+"/free"); res.StatusCode != 200 {
		t.Fatalf("free route: %d", res.StatusCode)
	}
	close(g.release)
	<-done
	if got := testutil.ToFloat64(h.srv.gate.Metrics().Shed.WithLabelValues("heavy", "inflight", "concurrency_limit", "critical", "http")); got != 1 {
		t.Fatalf("heavy route shed metric = %v", got)
	}
}

func TestPerClientLimitsAndDenyList(t *testing.T) {
	// The key header is honoured from a trusted hop only: the test client is one.
	h := start(t, newValve(), "  strategy: none", "headers: {clientKey: X-Client}\nclients: {rate: 0.001, burst: 2, maxKeys: 10, allow: [vip], deny: [bad]}",
		"trust: {sources: [127.0.0.1, '::1']}")
	for range 2 {
		if res, _ := get(t, h.front.URL+"/", "X-Client", "a"); res.StatusCode != 200 {
			t.Fatalf("within burst: %d", res.StatusCode)
		}
	}
	res, body := get(t, h.front.URL+"/", "X-Client", "a")
	if res.StatusCode != 429 || res.Header.Get("Retry-After") == "" || !strings.Contains(body, "client_limited") {
		t.Fatalf("over the client's rate: %d %q", res.StatusCode, body)
	}
	if res, _ := get(t, h.front.URL+"/", "X-Client", "b"); res.StatusCode != 200 {
		t.Fatalf("another client: %d", res.StatusCode)
	}
	for range 5 {
		if res, _ := get(t, h.front.URL+"/", "X-Client", "vip"); res.StatusCode != 200 {
			t.Fatalf("allow-listed: %d", res.StatusCode)
		}
	}
	res, _ = get(t, h.front.URL+"/", "X-Client", "bad")
	if res.StatusCode != 403 || res.Header.Get("Retry-After") != "" {
		t.Fatalf("deny-listed: %d Retry-After %q, want 403 without Retry-After", res.StatusCode, res.Header.Get("Retry-After"))
	}
}

func TestDryRunCountsButAdmits(t *testing.T) {
	g := newValve()
	h := start(t, g, "  strategy: token-bucket\n  dryRun: true\n  tokenBucket: {rate: 0.001, burst: 1}")
	for i := range 4 {
		if res, _ := get(t, h.front.URL+"/"); res.StatusCode != 200 {
			t.Fatalf("request %d: %d, a dry run admits everything", i, res.StatusCode)
		}
	}
	if got := testutil.ToFloat64(h.srv.gate.Metrics().DryRunShed.WithLabelValues("default", "token-bucket", "rate_limited", "critical", "http")); got != 3 {
		t.Fatalf("would-shed = %v, want 3", got)
	}
	if n, _ := testutil.GatherAndCount(h.reg, "loadshed_shed_total"); n != 0 {
		t.Fatalf("a dry run must not count real sheds (%d series)", n)
	}
}

func TestReloadKeepsStateAndRejectsInvalid(t *testing.T) {
	g := newValve()
	up := newUpstream(t, g)
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	write := func(admissionYAML string) {
		t.Helper()
		// Write then rename, as a ConfigMap update swaps the file in one step.
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte("upstream: "+up+"\nreload: {watch: false}\nadmission:\n"+admissionYAML), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("  strategy: inflight\n  inflight: {limit: 1}")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := newProxy(t, string(data), Options{ConfigPath: path}).srv
	front := newFront(t, s)
	done := make(chan int, 1)
	go func() {
		res, _ := get(t, front+"/?wait=1")
		done <- res.StatusCode
	}()
	testwait.Until(t, 5*time.Second, "a request in flight", func() bool { return g.waiting.Load() == 1 })
	before := s.gate.Policies()[0]

	// An invalid change is rejected; the running configuration (and its state) stays.
	write("  strategy: inflight\n  inflight: {limit: -3}")
	if err := s.Reload(); err == nil || !strings.Contains(err.Error(), "admission.inflight.limit") {
		t.Fatalf("invalid reload: %v, want an error naming admission.inflight.limit", err)
	}
	if s.gate.Policies()[0] != before {
		t.Fatal("an invalid reload replaced the running policy")
	}
	if got := testutil.ToFloat64(s.gate.Metrics().Reloads.WithLabelValues("failure")); got != 1 {
		t.Fatalf("failure count %v", got)
	}
	if res, _ := get(t, front+"/"); res.StatusCode != 503 {
		t.Fatalf("limit 1 still applies: %d", res.StatusCode)
	}

	// An unrelated change keeps the policy and its in-flight count.
	write("  strategy: inflight\n  inflight: {limit: 1}\nheaders: {maxCost: 7}")
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if s.gate.Policies()[0] != before || s.StageStates()[0].InFlight != 1 {
		t.Fatal("an unchanged policy must carry its state across a reload")
	}
	// A new limit takes effect for new requests; the one in flight still completes.
	write("  strategy: inflight\n  inflight: {limit: 5}")
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if res, _ := get(t, front+"/"); res.StatusCode != 200 {
		t.Fatalf("after raising the limit: %d", res.StatusCode)
	}
	close(g.release)
	if code := <-done; code != 200 {
		t.Fatalf("the request in flight across reloads got %d", code)
	}
	testwait.Until(t, 5*time.Second, "the old policy to drain", func() bool { return before.Stats().InFlight == 0 })
}

// TestExpiredGRPCDeadlineIsRefused: gRPC clients send "grpc-timeout: 0n" when their deadline has
// already passed. Such a request is refused as past its deadline and never reaches the upstream;
// before the fix a zero timeout read as "no deadline" and the request was served.
func TestExpiredGRPCDeadlineIsRefused(t *testing.T) {
	for _, admissionYAML := range []string{"  strategy: none", "  strategy: inflight\n  inflight: {limit: 4}"} {
		g := newValve()
		h := start(t, g, admissionYAML)
		for _, hdr := range [][]string{{"Grpc-Timeout", "0n"}, {"Grpc-Timeout", "0S"}, {"X-Request-Timeout", "1e-10"}} {
			res, body := get(t, h.front.URL+"/", hdr...)
			if res.StatusCode != 503 || res.Header.Get("X-Loadshed-Reason") != "deadline" || res.Header.Get("Retry-After") == "" {
				t.Errorf("%s %s: %d %q, want 503 deadline with Retry-After", admissionYAML, hdr, res.StatusCode, body)
			}
		}
		if g.hits.Load() != 0 {
			t.Errorf("%s: %d requests past their deadline reached the upstream", admissionYAML, g.hits.Load())
		}
	}
}
