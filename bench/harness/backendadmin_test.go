package harness

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/backend"
)

// startBackendAdmin serves a real backend's admin endpoint for the test's lifetime.
func startBackendAdmin(t *testing.T) (*backend.Server, *httptest.Server) {
	t.Helper()
	s, err := backend.New(backend.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.AdminHandler())
	t.Cleanup(srv.Close)
	return s, srv
}

// The harness drives the real backend's admin: its workers and service time for a point, and
// the start of its service-time sequence for each measured window.
func TestBackendAdminCalls(t *testing.T) {
	_, srv := startBackendAdmin(t)
	admin := strings.TrimPrefix(srv.URL, "http://")
	ctx := context.Background()
	if err := configureBackend(ctx, admin, Backend{Workers: 3, Service: 30 * time.Millisecond, SlowTail: true}); err != nil {
		t.Fatalf("configureBackend: %v", err)
	}
	if err := reseedBackend(ctx, admin, 9); err != nil {
		t.Fatalf("reseedBackend: %v", err)
	}
	resp, err := http.Get(srv.URL + "/admin/config")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		Workers int    `json:"workers"`
		Mean    string `json:"mean"`
		Seed    uint64 `json:"seed"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.Workers != 3 || got.Mean != "30ms" || got.Seed != 9 {
		t.Fatalf("backend config after both calls: %+v, want 3 workers, mean 30ms, seed 9", got)
	}
}

func TestBackendAdminCallsFailLoudly(t *testing.T) {
	answer := func(code int, body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(code)
			_, _ = w.Write([]byte(body))
		}))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	ctx := context.Background()
	for _, c := range []struct {
		name, admin, want string
	}{
		{"refused", answer(http.StatusBadRequest, `seed: must be a whole number`), "status 400"},
		{"an answer without the seed", answer(http.StatusOK, `{"workers":4}`), "does not show seed 2"},
		{"another seed", answer(http.StatusOK, `{"seed":1}`), "does not show seed 2"},
	} {
		err := reseedBackend(ctx, c.admin, 2)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: reseedBackend = %v, want an error with %q", c.name, err, c.want)
		}
	}
	err := configureBackend(ctx, answer(http.StatusOK, `{"workers":2}`), Backend{Workers: 4, Service: 20 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "does not show 4 workers") {
		t.Errorf("configureBackend with an answer of 2 workers = %v, want an error", err)
	}
}

// The measured window's backend usage is the difference of two reads of the real backend's
// /metrics: the services that ended between them and the worker time they held.
func TestBackendUsageFromTheBackendsMetrics(t *testing.T) {
	s, admin := startBackendAdmin(t)
	data := httptest.NewServer(s.Handler())
	defer data.Close()
	addr := strings.TrimPrefix(admin.URL, "http://")
	ctx := context.Background()
	serve := func(sleep string) {
		resp, err := http.Get(data.URL + "/?sleep=" + sleep)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("backend answered %d", resp.StatusCode)
		}
	}
	serve("1ms")
	before, err := scrapeBackend(ctx, addr)
	if err != nil {
		t.Fatalf("scrapeBackend: %v", err)
	}
	serve("3ms")
	serve("4ms")
	after, err := scrapeBackend(ctx, addr)
	if err != nil {
		t.Fatalf("scrapeBackend: %v", err)
	}
	d := after.minus(before)
	if d.Served != 2 || d.ServiceSeconds < 0.007 || d.ServiceSeconds > 1 {
		t.Fatalf("usage between the reads: %+v, want 2 served holding at least 7ms", d)
	}
	if got := d.Busy(2, d.ServiceSeconds); got != 0.5 {
		t.Fatalf("Busy of 2 workers over the service time: %v, want 0.5", got)
	}
}

func TestBackendUsageNeedsTheServiceHistogram(t *testing.T) {
	_, err := parseBackendUsage(strings.NewReader("# TYPE backend_requests_total counter\nbackend_requests_total{code=\"200\"} 3\n"))
	if err == nil || !strings.Contains(err.Error(), "backend_service_seconds") {
		t.Fatalf("a page without the service histogram: %v, want an error naming it", err)
	}
}
