package proxy

import (
	"context"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/loadshed/loadshed/internal/config"
)

// running is a proxy a test started from YAML.
type running struct {
	srv *Server
	reg *prometheus.Registry
	// front serves the data handler on an httptest server (frontProxy); data and admin are the
	// proxy's own listeners (serveProxy).
	front       *httptest.Server
	data, admin string
	stopOnce    sync.Once
	stopErr     error
	cancel      context.CancelFunc
	served      chan error
}

// newProxy builds a proxy from a whole configuration file's YAML, with a fresh registry.
func newProxy(t testing.TB, yaml string, opts Options) *running {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.SelfLoad == nil {
		// Clients, proxy and upstream share this process: its load is not the proxy's.
		opts.SelfLoad = idleSelf{}
	}
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	return &running{srv: s, reg: opts.Registry}
}

// frontProxy builds a proxy from YAML and serves its data handler on an httptest server (net/http's
// server, as on the proxy's data port), closed when the test ends.
func frontProxy(t testing.TB, yaml string) *running {
	t.Helper()
	r := newProxy(t, yaml, Options{})
	r.front = httptest.NewServer(r.srv.Handler())
	t.Cleanup(r.front.Close)
	return r
}

// serveProxy builds a proxy from YAML (opts may name its file) and runs Serve on its own
// loopback listeners until stop, or the end of the test.
func serveProxy(t testing.TB, yaml string, opts Options) *running {
	t.Helper()
	r := newProxy(t, yaml, opts)
	if err := r.srv.Listen(); err != nil {
		t.Fatal(err)
	}
	r.data, r.admin = r.srv.Addrs()
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.served = cancel, make(chan error, 1)
	go func() { r.served <- r.srv.Serve(ctx) }()
	t.Cleanup(func() { r.stop() })
	return r
}

// stop cancels Serve (a graceful shutdown) and returns what it returned; later calls return the
// same.
func (r *running) stop() error {
	r.stopOnce.Do(func() {
		r.cancel()
		r.stopErr = <-r.served
	})
	return r.stopErr
}

// shutdown cancels Serve without waiting for it; wait collects its result.
func (r *running) shutdown() { r.cancel() }

func (r *running) wait() error { return r.stop() }

// idleSelf is a proxy that never finds itself short of CPU.
type idleSelf struct{}

func (idleSelf) Delay() time.Duration { return 0 }
func (idleSelf) Shed() float64        { return 0 }
