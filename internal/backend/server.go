// Package backend is the synthetic slow-tail service the proxy is shown in front of.
//
// A Server has a finite number of workers. A request holds a worker for a service time drawn from
// a slowtail.Sampler (a timer, no CPU burnt), then answers 200 with a short body. Beyond the
// worker count requests wait inside in FIFO order with no bound, and neither waiting nor service
// stops when the client goes away: this is the naive service that collapses under overload when
// nothing sheds in front of it.
//
// # Data port
//
// Every path answers after its service time. Query parameters, for tests:
//
//	?status=N    answer with status N (200..599) instead of 200
//	?sleep=D     use the Go duration D (0..1h) instead of a sampled service time
//	?bytes=N     answer with a body of N bytes (0..64MiB) instead of "ok\n"
//
// GET /stream?events=N&interval=D answers text/event-stream and writes N events (1..10000,
// default 5) D apart (0..1h, default 100ms), flushing each; it holds its worker the whole time.
// status, sleep and bytes do not apply to /stream, and events and interval apply only to it.
// An invalid value of any of these parameters gets 400 at once, naming the parameter, without
// taking a worker.
//
// Every answer after service carries the headers X-Backend-Wait (time spent waiting for a
// worker) and X-Backend-Service (time spent holding it), as Go durations; /stream, whose headers
// go out before its service, carries only X-Backend-Wait.
//
// # Frontend mode
//
// With WithCallAll (backend --call-all URL,URL,...) the data port is a frontend instead: each
// request is answered by calling every URL at once (GET) on one shared, bounded keep-alive
// transport, passing on traceparent, tracestate, baggage and the user id header; 200 when every
// leg answered 2xx, else 503 with Retry-After when a leg was refused (429/503), else 502. No
// leg is cancelled because another failed (see CallAll). backend_frontend_requests_total and
// backend_frontend_legs_total count user requests and legs by result.
//
// # gRPC port
//
// ServeConfig.GRPC serves, on cleartext HTTP/2 with prior knowledge (h2c), the unary method
// loadshed.backend.v1.Backend/Work (internal/backend/backendpb/backend.proto), the standard
// gRPC health service and server reflection. A Work call takes a worker from the same pool
// as an HTTP request, for one service time from the same sampler, and answers its WorkRequest
// like the query parameters above: sleep_micros for ?sleep, code (a gRPC status code) for
// ?status, reply_bytes for ?bytes. An invalid field gets INVALID_ARGUMENT at once, naming the
// field, without taking a worker. The trailers x-backend-wait and x-backend-service carry the
// two times, the reply the same in microseconds; calls are counted by backend_grpc_requests_total.
//
// # Admin port (a TEST TOOL: it changes behaviour at run time)
//
// AdminHandler serves GET /admin/config, POST /admin/config (a partial JSON object of the same
// fields, applied at once), GET /healthz and GET /metrics. See AdminHandler.
//
// # Determinism
//
// The sampler is seeded (Config.Seed) and draws when a request starts service. With one client
// at a time the sequence of service times is fixed; with concurrent clients the order of draws
// follows arrival order, which the scheduler decides.
package backend

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/loadshed/loadshed/internal/slowtail"
	"github.com/loadshed/loadshed/pkg/admission"
)

// Limits on what a request may ask for.
const (
	// MaxBodyBytes is the largest ?bytes= value.
	MaxBodyBytes = 64 << 20
	// MaxEvents is the largest ?events= value on /stream.
	MaxEvents = 10000
	// MaxRequestBody is how much of a request body the backend reads (and discards) before it
	// queues the request; the rest is left to net/http.
	MaxRequestBody = 1 << 20
)

// Stats is a snapshot of the worker pool.
type Stats struct {
	Workers int    // current worker count
	Busy    int    // requests holding a worker; may exceed Workers right after a shrink
	Waiting int    // requests waiting for a worker
	Served  uint64 // requests that completed their service time
}

// Option sets a collaborator of a Server.
type Option func(*options)

type options struct {
	clock    admission.Clock
	registry *prometheus.Registry
	callAll  *CallAll
}

// WithClock makes the Server read time and set its service timers on c (tests pass an
// admissiontest.Clock). The default is the real clock.
func WithClock(c admission.Clock) Option { return func(o *options) { o.clock = c } }

// WithRegistry registers the Server's metrics on r, which AdminHandler's /metrics serves. The
// default is a fresh registry of the Server's own. Never the global one.
func WithRegistry(r *prometheus.Registry) Option { return func(o *options) { o.registry = r } }

// WithCallAll turns the data port into a frontend (see CallAll): each request is answered by
// calling c.URLs at once instead of by a worker. Its metrics (backend_frontend_*) join the
// Server's registry; the admin port and the gRPC port are unchanged.
func WithCallAll(c CallAll) Option { return func(o *options) { o.callAll = &c } }

// Server is the synthetic backend. Create it with New; it is safe for concurrent use.
type Server struct {
	clock    admission.Clock
	registry *prometheus.Registry
	m        metrics
	pool     pool

	mu      sync.Mutex // guards sampler and cfg
	sampler *slowtail.Sampler
	cfg     Config // Workers is kept in pool

	front *frontend // nil unless WithCallAll

	adminMu   sync.Mutex // serializes read-modify-write updates
	done      chan struct{}
	closeOnce sync.Once
}

// New validates cfg and returns a Server.
func New(cfg Config, opts ...Option) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := options{clock: admission.SystemClock{}}
	for _, opt := range opts {
		opt(&o)
	}
	if o.clock == nil {
		return nil, errors.New("backend: WithClock: clock must not be nil")
	}
	if o.registry == nil {
		o.registry = prometheus.NewRegistry()
	}
	s := &Server{
		clock:    o.clock,
		registry: o.registry,
		sampler:  slowtail.New(cfg.Service, cfg.Seed),
		cfg:      cfg,
		done:     make(chan struct{}),
	}
	s.pool.workers = cfg.Workers
	if err := s.m.register(o.registry, &s.pool); err != nil {
		return nil, err
	}
	if o.callAll != nil {
		f, err := newFrontend(*o.callAll, o.registry)
		if err != nil {
			return nil, err
		}
		s.front = f
	}
	return s, nil
}

// Config returns the current configuration.
func (s *Server) Config() Config {
	s.mu.Lock()
	c := s.cfg
	s.mu.Unlock()
	c.Workers = s.pool.stats().Workers
	return c
}

// Update applies c's Workers and Service at once; Seed is ignored (see Reseed).
// Running and waiting requests keep their place; new service times come from the new model.
func (s *Server) Update(c Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	s.cfg.Service = c.Service
	s.sampler.SetConfig(c.Service)
	s.mu.Unlock()
	s.pool.setWorkers(c.Workers)
	return nil
}

// Reseed starts the service-time sequence over from seed: the next request to start service
// draws what the first one of a new Server with this seed and the current model would.
func (s *Server) Reseed(seed uint64) {
	s.mu.Lock()
	s.cfg.Seed = seed
	s.sampler = slowtail.New(s.cfg.Service, seed)
	s.mu.Unlock()
}

// SetWorkers changes the worker count under load. Growing starts waiting requests at once;
// shrinking lets running work finish and starts nothing new until fewer than n are busy.
func (s *Server) SetWorkers(n int) error {
	if err := checkWorkers(n); err != nil {
		return err
	}
	s.pool.setWorkers(n)
	return nil
}

// Stats returns a snapshot of the worker pool.
func (s *Server) Stats() Stats { return s.pool.stats() }

// Close aborts the Server: waiting and running requests answer 503 at once, and so do new ones.
// It is for shutdown after the grace period and for tests. Close is idempotent.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.done)
		s.pool.close()
		if s.front != nil {
			s.front.close() // running legs are cancelled and fail
		}
	})
}

// Handler returns the data-port handler; see the package documentation. With WithCallAll it is
// the frontend's.
func (s *Server) Handler() http.Handler {
	if s.front != nil {
		return s.front
	}
	return http.HandlerFunc(s.serveData)
}

type params struct {
	status   int
	sleep    time.Duration
	hasSleep bool
	bytes    int
	hasBytes bool
	events   int
	interval time.Duration
}

// paramError names the query parameter at fault.
type paramError struct{ name, problem string }

func (e *paramError) Error() string { return "query parameter " + e.name + ": " + e.problem }

func parseParams(rawQuery string) (params, error) {
	p := params{status: http.StatusOK, events: 5, interval: 100 * time.Millisecond}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return p, &paramError{"query", "malformed: " + err.Error()}
	}
	intParam := func(name string, lo, hi int, dst *int) (bool, error) {
		if !q.Has(name) {
			return false, nil
		}
		v := q.Get(name)
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			return false, &paramError{name, fmt.Sprintf("must be an integer in [%d, %d], got %q", lo, hi, v)}
		}
		*dst = n
		return true, nil
	}
	durParam := func(name string, dst *time.Duration) (bool, error) {
		if !q.Has(name) {
			return false, nil
		}
		v := q.Get(name)
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > slowtail.MaxDuration {
			return false, &paramError{name, fmt.Sprintf("must be a Go duration in [0, %s] such as 20ms, got %q", slowtail.MaxDuration, v)}
		}
		*dst = d
		return true, nil
	}
	if _, err := intParam("status", 200, 599, &p.status); err != nil {
		return p, err
	}
	if p.hasSleep, err = durParam("sleep", &p.sleep); err != nil {
		return p, err
	}
	if p.hasBytes, err = intParam("bytes", 0, MaxBodyBytes, &p.bytes); err != nil {
		return p, err
	}
	if _, err := intParam("events", 1, MaxEvents, &p.events); err != nil {
		return p, err
	}
	if _, err := durParam("interval", &p.interval); err != nil {
		return p, err
	}
	return p, nil
}

func (s *Server) serveData(w http.ResponseWriter, r *http.Request) {
	p, err := parseParams(r.URL.RawQuery)
	if err != nil {
		s.reply(w, http.StatusBadRequest, err.Error()+"\n")
		return
	}
	// A naive service reads the request before it queues it. The error does not matter: the
	// request is answered either way.
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, MaxRequestBody))

	started, wait, ok := s.takeWorker()
	if !ok {
		s.reply(w, http.StatusServiceUnavailable, "backend closed\n")
		return
	}
	served := false
	defer func() { s.pool.release(served) }()

	if r.URL.Path == "/stream" {
		served = s.stream(w, p, wait, started)
		return
	}
	service, ok := s.serve(started, p.sleep, p.hasSleep)
	if !ok {
		s.reply(w, http.StatusServiceUnavailable, "backend closed\n")
		return
	}
	h := w.Header()
	h.Set("X-Backend-Wait", wait.String())
	h.Set("X-Backend-Service", service.String())
	if p.hasBytes {
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Length", strconv.Itoa(p.bytes))
		s.count(p.status)
		w.WriteHeader(p.status)
		writeFiller(w, p.bytes)
	} else {
		s.reply(w, p.status, "ok\n")
	}
	served = true
}

// takeWorker waits, in FIFO order and without bound, for a free worker and returns when its
// service started and how long it waited. ok is false when the Server closed first; otherwise
// the caller holds a worker and must release it. There is no context on purpose: the naive
// service keeps a request whose client has gone.
func (s *Server) takeWorker() (started time.Time, wait time.Duration, ok bool) {
	arrived := s.clock.Now()
	wt := s.pool.acquire()
	<-wt.ready
	if !wt.ok {
		return time.Time{}, 0, false
	}
	started = s.clock.Now()
	wait = started.Sub(arrived)
	s.m.wait.Observe(wait.Seconds())
	return started, wait, true
}

// serve holds the worker taken at started for d (fixed) or a sampled service time, and returns
// the service time. ok is false when the Server closed first.
func (s *Server) serve(started time.Time, d time.Duration, fixed bool) (service time.Duration, ok bool) {
	if !fixed {
		d = s.sample()
	}
	if !s.sleep(d) {
		return 0, false
	}
	service = s.clock.Now().Sub(started)
	s.m.service.Observe(service.Seconds())
	return service, true
}

// stream writes the events of /stream and reports whether it wrote them all.
func (s *Server) stream(w http.ResponseWriter, p params, wait time.Duration, started time.Time) bool {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Backend-Wait", wait.String())
	s.count(http.StatusOK)
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for i := 1; i <= p.events; i++ {
		if i > 1 && !s.sleep(p.interval) {
			return false
		}
		// Write errors (client gone) do not stop the naive service; it streams to no one.
		_, _ = fmt.Fprintf(w, "id: %d\ndata: event %d of %d\n\n", i, i, p.events)
		_ = rc.Flush()
	}
	s.m.service.Observe(s.clock.Now().Sub(started).Seconds())
	return true
}

func (s *Server) sample() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sampler.Sample()
}

// sleep waits d on the Server's clock; false means the Server closed first.
func (s *Server) sleep(d time.Duration) bool {
	select {
	case <-s.done:
		return false
	default:
	}
	if d <= 0 {
		return true
	}
	fired := make(chan struct{})
	t := s.clock.AfterFunc(d, func() { close(fired) })
	select {
	case <-fired:
		return true
	case <-s.done:
		t.Stop()
		return false
	}
}

// reply writes a short text answer and counts it.
func (s *Server) reply(w http.ResponseWriter, code int, body string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	s.count(code)
	w.WriteHeader(code)
	_, _ = io.WriteString(w, body)
}

func (s *Server) count(code int) { s.m.requests.WithLabelValues(strconv.Itoa(code)).Inc() }

var filler = func() []byte {
	b := make([]byte, 32<<10)
	for i := range b {
		b[i] = "abcdefghijklmnopqrstuvwxyz012345"[i%32]
	}
	return b
}()

// writeFiller writes n bytes of a fixed pattern; it stops early when the client has gone.
func writeFiller(w io.Writer, n int) {
	for n > 0 {
		k := min(n, len(filler))
		if _, err := w.Write(filler[:k]); err != nil {
			return
		}
		n -= k
	}
}
