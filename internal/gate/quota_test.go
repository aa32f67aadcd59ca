package gate

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/pkg/admission"
	"github.com/loadshed/loadshed/pkg/admission/admissiontest"
)

const quotaHeaders = "headers: {clientKey: X-Client}\ntrust: {sources: [192.0.2.0/24]}\n"

func clientRequest(path, client string) *Request {
	r := request(headers{"X-Client": client})
	r.Path = path
	return r
}

// admitted counts how many of n requests of client on path the gate admits.
func admittedOf(g *Gate, path, client string, n int) int {
	ok := 0
	for range n {
		p, err := g.Admit(context.Background(), clientRequest(path, client), nil)
		if err == nil {
			p.Finish()
			ok++
		}
	}
	return ok
}

// TestRouteQuotas: a route with its own clients block has its own quota per client, counted
// apart from the top-level one; a route without one shares the top-level quota; the top-level
// deny list holds on every route; a refusal is 429 client_limited with a Retry-After.
func TestRouteQuotas(t *testing.T) {
	g, clk, _ := newGate(t, "admission: {strategy: none}\n"+quotaHeaders+`clients: {rate: 1, burst: 3, deny: [abuser]}
routes:
  - {name: export, pathPrefix: /export, clients: {rate: 0.5, burst: 1}}
  - {name: search, pathPrefix: /search}
`)
	if n := admittedOf(g, "/export", "alice", 5); n != 1 {
		t.Errorf("export admitted %d of 5, want its own burst of 1", n)
	}
	_, err := g.Admit(context.Background(), clientRequest("/export", "alice"), nil)
	if rej := refusal(t, err); rej.Reason != admission.ReasonClientLimited || rej.Status != 429 || rej.RetryAfter != 2*time.Second {
		t.Errorf("export refusal %+v, want 429 client_limited after 2s (1 / 0.5 per second)", rej)
	}
	// The export quota took nothing from the top-level one, which /search shares with /.
	if n := admittedOf(g, "/search", "alice", 2) + admittedOf(g, "/", "alice", 5); n != 3 {
		t.Errorf("/search and / admitted %d, want the top-level burst of 3 between them", n)
	}
	if n := admittedOf(g, "/export", "bob", 2); n != 1 {
		t.Errorf("another client on export admitted %d, want its own 1", n)
	}
	_, err = g.Admit(context.Background(), clientRequest("/export", "abuser"), nil)
	if rej := refusal(t, err); rej.Reason != admission.ReasonDenied {
		t.Errorf("a deny-listed client on a route with its own quota: %+v", rej)
	}
	clk.Advance(2 * time.Second)
	if n := admittedOf(g, "/export", "alice", 2); n != 1 {
		t.Errorf("export after 2 s admitted %d, want 1", n)
	}
}

// TestReloadKeepsUnchangedQuotas: a reload that leaves a quota unchanged keeps its buckets
// (a client that used its burst does not get a fresh one); a changed quota starts afresh.
func TestReloadKeepsUnchangedQuotas(t *testing.T) {
	base := "upstream: http://127.0.0.1:1\nadmission: {strategy: none}\n" + quotaHeaders + "clients: {rate: 1, burst: 2}\n"
	g, _, _ := newGate(t, strings.TrimPrefix(base, "upstream: http://127.0.0.1:1\n"))
	if n := admittedOf(g, "/", "alice", 3); n != 2 {
		t.Fatalf("admitted %d, want the burst of 2", n)
	}
	update := func(y string) {
		t.Helper()
		cfg, err := config.Parse([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Update(cfg); err != nil {
			t.Fatal(err)
		}
	}
	update(base + "routes: [{name: other, pathPrefix: /other}]\n")
	if n := admittedOf(g, "/", "alice", 1); n != 0 {
		t.Errorf("an unchanged quota forgot alice's use after a reload")
	}
	update(base + "routes: [{name: other, pathPrefix: /other, clients: {rate: 1, burst: 1}}]\n")
	if n := admittedOf(g, "/", "alice", 1); n != 0 {
		t.Errorf("adding a route's quota reset the unchanged top-level one")
	}
	update(strings.Replace(base, "burst: 2", "burst: 4", 1))
	if n := admittedOf(g, "/", "alice", 5); n != 4 {
		t.Errorf("a changed quota admitted %d, want a fresh burst of 4", n)
	}
}

// TestStoreLifetime: a configured store is opened with the gate and kept across reloads while
// its settings are unchanged; changed settings open a new one and close the old; a store that
// cannot be opened fails the reload and leaves the running one; Close closes it. With Redis
// unreachable every quota is decided locally, the requests never fail, and the gauges show the
// store.
func TestStoreLifetime(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "password")
	if err := os.WriteFile(pw, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Port 1 on loopback refuses connections at once: a store that is down from the start.
	store := func(timeout string) string {
		return "upstream: http://127.0.0.1:1\nadmission: {strategy: none}\n" + quotaHeaders +
			"clients: {rate: 1, burst: 2, store: {redis: {addr: \"127.0.0.1:1\", passwordFile: " + pw + ", timeout: " + timeout + "}}}\n"
	}
	cfg, err := config.Parse([]byte(store("20ms")))
	if err != nil {
		t.Fatal(err)
	}
	g, _, reg := newGateFrom(t, cfg)
	first := g.state.Load().quotas.store
	if first == nil {
		t.Fatal("no store opened for clients.store")
	}
	if n := admittedOf(g, "/", "alice", 4); n != 2 {
		t.Errorf("with the store down: admitted %d of 4, want the local burst of 2", n)
	}
	if n, _ := testutil.GatherAndCount(reg, "loadshed_quota_replicas", "loadshed_quota_store_breaker_state"); n != 4 {
		t.Errorf("%d quota gauge series with a store, want 4", n)
	}

	update := func(y string) error {
		t.Helper()
		cfg, err := config.Parse([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		return g.Update(cfg)
	}
	if err := update(store("20ms") + "routes: [{name: a, pathPrefix: /a}]\n"); err != nil {
		t.Fatal(err)
	}
	if got := g.state.Load().quotas.store; got != first {
		t.Error("a reload that left the store's settings alone opened a new store")
	}
	if err := update(store("30ms")); err != nil {
		t.Fatal(err)
	}
	second := g.state.Load().quotas.store
	if second == first || second == nil {
		t.Fatal("changed store settings did not open a new store")
	}
	if _, open := first.State(); open {
		t.Error("the replaced store was not closed")
	}
	if err := os.Remove(pw); err != nil {
		t.Fatal(err)
	}
	err = update(store("40ms"))
	if err == nil || !strings.Contains(err.Error(), "clients.store.redis") || !strings.Contains(err.Error(), "passwordFile") {
		t.Errorf("a store whose password file is gone: %v, want an error naming clients.store.redis and passwordFile", err)
	}
	if got := g.state.Load().quotas.store; got != second {
		t.Error("a failed reload replaced the running store")
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if _, open := second.State(); open {
		t.Error("Close left the store open")
	}
	if n, _ := testutil.GatherAndCount(reg, "loadshed_quota_replicas"); n != 0 {
		t.Errorf("%d replica gauges after Close", n)
	}
	if err := update(store("30ms")); err == nil {
		t.Error("Update after Close opened a store")
	}
	if n := admittedOf(g, "/", "bob", 3); n != 2 {
		t.Errorf("after Close: admitted %d of 3, want the local burst of 2", n)
	}
}

// TestNoStoreNoGauges: without a store the quota gauges are absent (the counters exist).
func TestNoStoreNoGauges(t *testing.T) {
	_, _, reg := newGate(t, "admission: {strategy: none}\nclients: {rate: 1, burst: 1}\n")
	if n, _ := testutil.GatherAndCount(reg, "loadshed_quota_fallback_active", "loadshed_quota_replicas"); n != 0 {
		t.Errorf("%d quota gauges without a store", n)
	}
}

// newGateFrom builds a gate on a fake clock from a parsed configuration; it is closed when the
// test ends.
func newGateFrom(t *testing.T, cfg *config.Config) (*Gate, *admissiontest.Clock, *prometheus.Registry) {
	t.Helper()
	clk := admissiontest.NewClock(t0)
	reg := prometheus.NewRegistry()
	g, err := New(cfg, Options{Registerer: reg, Clock: clk, ReplicaID: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return g, clk, reg
}
