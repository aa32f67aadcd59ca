package backend

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/loadshed/loadshed/internal/slowtail"
	"github.com/loadshed/loadshed/internal/testwait"
	"github.com/loadshed/loadshed/pkg/admission/admissiontest"
)

const ms = time.Millisecond

// fixture is a Server on a fake clock behind an httptest server.
type fixture struct {
	t     *testing.T
	s     *Server
	clock *admissiontest.Clock
	reg   *prometheus.Registry
	ts    *httptest.Server
	admin *httptest.Server
}

// constant returns a Config of n workers and a constant service time d.
func constant(n int, d time.Duration) Config {
	return Config{Workers: n, Service: slowtail.Constant(d), Seed: 1}
}

func newFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	clock := admissiontest.NewClock(time.Unix(1_000_000, 0))
	reg := prometheus.NewRegistry()
	s, err := New(cfg, WithClock(clock), WithRegistry(reg))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	f := &fixture{t: t, s: s, clock: clock, reg: reg,
		ts: httptest.NewServer(s.Handler()), admin: httptest.NewServer(s.AdminHandler())}
	t.Cleanup(func() {
		s.Close() // wakes handlers still waiting on the fake clock
		f.ts.Close()
		f.admin.Close()
	})
	return f
}

// result is what a client saw.
type result struct {
	path    string
	code    int
	body    string
	wait    string
	service string
	err     error
}

// get starts a GET of path and returns a channel that receives its result.
func (f *fixture) get(path string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		resp, err := f.ts.Client().Get(f.ts.URL + path)
		if err != nil {
			ch <- result{path: path, err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		ch <- result{path: path, code: resp.StatusCode, body: string(b), err: err,
			wait: resp.Header.Get("X-Backend-Wait"), service: resp.Header.Get("X-Backend-Service")}
	}()
	return ch
}

// recv waits (bounded) for a result.
func (f *fixture) recv(ch <-chan result) result {
	f.t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			f.t.Fatalf("GET %s: %v", r.path, r.err)
		}
		return r
	case <-time.After(10 * time.Second):
		f.t.Fatalf("no answer within 10s (stats %+v)", f.s.Stats())
		return result{}
	}
}

// waitState waits until the pool and the fake clock show the given numbers.
func (f *fixture) waitState(busy, waiting int, served uint64, timers int) {
	f.t.Helper()
	var st Stats
	testwait.Until(f.t, 10*time.Second, "state", func() bool {
		st = f.s.Stats()
		return st.Busy == busy && st.Waiting == waiting && st.Served == served && f.clock.Pending() == timers
	})
}

// post sends body to the admin endpoint and returns status and body.
func (f *fixture) post(body string) (int, string) {
	f.t.Helper()
	return f.adminDo(http.MethodPost, "/admin/config", body)
}

func (f *fixture) adminDo(method, path, body string) (int, string) {
	f.t.Helper()
	req, err := http.NewRequest(method, f.admin.URL+path, strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	resp, err := f.admin.Client().Do(req)
	if err != nil {
		f.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
