package extproc

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/loadshed/loadshed/internal/gate"
	"github.com/loadshed/loadshed/pkg/admission"
)

// Limits of the gRPC server. Envoy multiplexes every request of its listener over a few
// connections, so one connection carries as many streams as Envoy has requests in progress (its
// circuit breaker on the loadshed cluster, max_requests, bounds them first).
const (
	maxStreams = 1 << 14
	// maxMessage bounds one message from Envoy: the request's headers and attributes (Envoy's own
	// limit on request headers is 60 KiB by default).
	maxMessage = 1 << 20
)

// Server is the ext_proc door. It is safe for concurrent use.
type Server struct {
	gate  *gate.Gate
	clock admission.Clock
	log   *slog.Logger
	srv   *grpc.Server
	ln    net.Listener
	m     *doorMetrics

	warnMu   sync.Mutex
	warnedAt map[string]time.Time // the last warning of each kind (one a minute)
}

// Options are a Server's collaborators.
type Options struct {
	// Registerer receives the door's own metrics (default: none kept).
	Registerer prometheus.Registerer
	// Logger receives operational logs (default: discard).
	Logger *slog.Logger
}

// Open is the gate.OpenDoor of Envoy's external processor: it listens on extProc.listen, or
// returns nil when the configuration leaves it empty.
func Open(g *gate.Gate, opts gate.DoorOptions) (gate.Door, error) {
	addr := g.Config().ExtProc.Listen
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("extProc.listen: %w", err)
	}
	return New(g, ln, Options{Registerer: opts.Registerer, Logger: opts.Logger}), nil
}

// New returns a server of ext_proc on ln over g. Serve starts it.
func New(g *gate.Gate, ln net.Listener, opts Options) *Server {
	s := newServer(g, opts)
	s.ln = ln
	return s
}

func newServer(g *gate.Gate, opts Options) *Server {
	s := &Server{gate: g, clock: g.Clock(), log: opts.Logger, warnedAt: map[string]time.Time{}}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	reg := opts.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	s.m = newDoorMetrics(reg)
	s.srv = grpc.NewServer(
		grpc.MaxConcurrentStreams(maxStreams),
		grpc.MaxRecvMsgSize(maxMessage),
		// Envoy may ping an idle connection; a ping more often than this closes it.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	extprocv3.RegisterExternalProcessorServer(s.srv, &service{s: s})
	return s
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve serves until Shutdown or Close, then returns nil.
func (s *Server) Serve() error {
	s.log.Info("serving ext_proc", "listen", s.ln.Addr().String())
	return s.srv.Serve(s.ln)
}

// Shutdown stops accepting streams and waits for those in progress to end: admitted requests
// end at their response headers (or trailers), queued ones when the gate admits or refuses them
// (Gate.Drain refuses them all). When ctx ends first, the remaining streams are cut.
func (s *Server) Shutdown(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		s.srv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.srv.Stop()
		<-done
		return ctx.Err()
	}
}

// Close stops at once: every stream is cut (Envoy then answers per its failure_mode_allow).
func (s *Server) Close() { s.srv.Stop() }

// warn logs a configuration problem of Envoy's at most once a minute per kind.
func (s *Server) warn(kind, msg string, args ...any) {
	now := s.clock.Now()
	s.warnMu.Lock()
	last, seen := s.warnedAt[kind]
	if seen && now.Sub(last) < time.Minute {
		s.warnMu.Unlock()
		return
	}
	s.warnedAt[kind] = now
	s.warnMu.Unlock()
	s.log.Warn(msg, args...)
}

// service implements Envoy's ExternalProcessor.
type service struct {
	extprocv3.UnimplementedExternalProcessorServer
	s *Server
}

// Process serves one request's stream.
func (sv *service) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	s := sv.s
	s.m.streams.Inc()
	defer s.m.streams.Dec()
	first, err := stream.Recv()
	if err != nil {
		return nil // Envoy gave up before it sent anything
	}
	hdrs := first.GetRequestHeaders()
	switch {
	case first.GetObservabilityMode():
		s.m.misconfigured.WithLabelValues("observability_mode").Inc()
		s.warn("observability", "Envoy's ext_proc filter runs in observability_mode: it ignores every answer, so nothing is admitted or refused; turn observability_mode off")
		return status.Error(codes.FailedPrecondition, "loadshed admits requests: observability_mode must be false")
	case hdrs == nil:
		s.m.misconfigured.WithLabelValues("request_header_mode").Inc()
		s.warn("phase", "Envoy's ext_proc filter did not send the request headers first; set processing_mode.request_header_mode: SEND")
		return status.Error(codes.FailedPrecondition, "loadshed admits at the request headers: processing_mode.request_header_mode must be SEND")
	}
	x := &exchange{s: s, stream: stream}
	x.serve(first, hdrs)
	return nil
}

// doorMetrics are the door's own metrics; requests, sheds and latencies are the gate's.
type doorMetrics struct {
	streams       prometheus.Gauge
	overrides     prometheus.Counter
	due           prometheus.Counter
	answer        prometheus.Observer
	misconfigured *prometheus.CounterVec
}

func newDoorMetrics(reg prometheus.Registerer) *doorMetrics {
	m := &doorMetrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "loadshed_extproc_streams",
			Help: "ext_proc streams open with Envoy: requests waiting for admission or for their answer.",
		}),
		overrides: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "loadshed_extproc_timeout_overrides_total",
			Help: "Queued requests for which Envoy was asked to wait longer than its message timeout (override_message_timeout).",
		}),
		due: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "loadshed_extproc_answers_due_total",
			Help: "Queued requests refused (queue_timeout) because Envoy's message timeout was about to expire.",
		}),
		answer: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "loadshed_extproc_answer_seconds",
			Help: "Time from a request's headers reaching loadshed to its answer (CONTINUE or a refusal), queue waits included: Envoy's message timeout bounds it.",
			// From 100 us: an answer that did not wait takes well under a millisecond.
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .15, .2, .5, 1, 2.5},
		}),
		misconfigured: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loadshed_extproc_misconfigured_total",
			Help: "ext_proc streams refused because Envoy's filter configuration cannot admit requests, by the setting to change.",
		}, []string{"setting"}),
	}
	answer := m.answer.(prometheus.Histogram)
	reg.MustRegister(m.streams, m.overrides, m.due, answer, m.misconfigured)
	return m
}
