// Package proxy is the loadshed sidecar: admission at the door of a reverse proxy to one
// upstream, with an admin listener for metrics and health, and a graceful drain on shutdown.
package proxy

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/door/httpdoor"
	"github.com/loadshed/loadshed/internal/gate"
	"github.com/loadshed/loadshed/internal/metrics"
	"github.com/loadshed/loadshed/internal/selfload"
	"github.com/loadshed/loadshed/internal/status"
)

// Options are the collaborators of a Server.
type Options struct {
	// Logger receives operational logs (default: discard).
	Logger *slog.Logger
	// Registry receives the metrics (default: a new registry).
	Registry *prometheus.Registry
	// ConfigPath is the file the configuration came from, for reloads.
	ConfigPath string
	// Overrides re-applies command-line overrides to a reloaded configuration.
	Overrides func(*config.Config)
	// MaxConfigBytes caps the configuration file read on a reload (default config.MaxFileBytes).
	MaxConfigBytes int64
	// Doors are the front doors served beside the data port, over the same gate (extproc.Open,
	// Envoy's external processor); each opens when the configuration asks for it.
	Doors []gate.OpenDoor
	// SelfLoad replaces the proxy's watch on its own CPU (default: internal/selfload on this
	// process). Tests that run clients, proxy and upstream in one process set it: that
	// process's load is not the proxy's.
	SelfLoad gate.SelfLoad
	// ReplicaID names this replica among those sharing a quota store (clients.store): the pod's
	// name. Empty: the host name and a random suffix.
	ReplicaID string
	// DrainToken is what GET /drain on the admin port must present as "Authorization: Bearer
	// <token>" (DrainTokenEnv; see CheckDrainToken). Empty: /drain is refused to everyone.
	DrainToken string
}

// Server is a running proxy.
type Server struct {
	gate     *gate.Gate
	door     *httpdoor.Door // the data port's
	reg      *prometheus.Registry
	log      *slog.Logger
	draining atomic.Bool
	windows  atomic.Int32 // drain windows open (GET /drain): answers close their connections while any is
	drainTok string       // GET /drain's token (Options.DrainToken)

	data, admin     *http.Server
	dataLn, adminLn net.Listener // no dataLn: the other doors only (listen is empty)
	openDoors       []gate.OpenDoor
	doors           []gate.Door
	conns           *connTracker
	certs           *certReloader // nil without tls
	self            *selfload.Monitor
	status          *status.Page

	configPath      string
	overrides       func(*config.Config)
	maxConfigBytes  int64
	reloadMu        sync.Mutex
	lastConfig      []byte // the file content running now
	lastRejected    []byte // the last content that failed to load, not retried until it changes
	lastRejectedErr error  // why it failed
}

// New builds a proxy for cfg (which must be valid) without listening yet.
func New(cfg *config.Config, opts Options) (*Server, error) {
	s := &Server{reg: opts.Registry, log: opts.Logger, configPath: opts.ConfigPath, overrides: opts.Overrides,
		maxConfigBytes: opts.MaxConfigBytes, openDoors: opts.Doors, drainTok: opts.DrainToken}
	if err := CheckDrainToken(opts.DrainToken); err != nil {
		return nil, err
	}
	if s.maxConfigBytes <= 0 {
		s.maxConfigBytes = config.MaxFileBytes
	}
	if s.configPath != "" {
		s.lastConfig, _ = config.ReadFile(s.configPath, s.maxConfigBytes)
	}
	if s.reg == nil {
		s.reg = prometheus.NewRegistry()
	}
	s.status = status.New(s.reg, status.Options{})
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	for _, w := range cfg.Warnings() {
		s.log.Warn(w)
	}
	self := opts.SelfLoad
	if self == nil {
		sat := cfg.Server.Saturation
		s.self = selfload.New(selfload.Config{SaturatedAbove: sat.Above.D(), ShedAbove: sat.ShedAbove.D()}, selfload.Source{})
		self = s.self
	}
	metrics.NewSidecar(s.reg, func() metrics.SidecarState {
		if s.self == nil {
			return metrics.SidecarState{Delay: self.Delay().Seconds(), Shed: self.Shed()}
		}
		r := s.self.Last()
		return metrics.SidecarState{Delay: r.Delay.Seconds(), Saturated: r.Saturated, Shed: r.Shed, Throttled: r.Throttled}
	})
	g, err := gate.New(cfg, gate.Options{Registerer: s.reg, Self: self, Logger: s.log, ReplicaID: opts.ReplicaID})
	if err != nil {
		return nil, err
	}
	s.gate = g
	if s.door, err = httpdoor.New(g, gate.DoorOptions{Registerer: s.reg, Logger: s.log}); err != nil {
		g.Close()
		return nil, err
	}
	if cfg.TLS != nil {
		if s.certs, err = newCertReloader(cfg.TLS.CertFile, cfg.TLS.KeyFile, s.log); err != nil {
			g.Close()
			return nil, err
		}
	}
	return s, nil
}

// Close releases what New acquired (the quota store's connections, and this replica's place in
// the store's count of replicas) for a server that is not served: Serve releases it itself when
// it returns.
func (s *Server) Close() error { return s.gate.Close() }

// StageStates reports every strategy stage's current state (what the gauges show).
func (s *Server) StageStates() []metrics.StageState { return s.gate.StageStates() }

// QuotaState reports the quota store's state (what its gauges show); false without a store.
func (s *Server) QuotaState() (metrics.QuotaState, bool) { return s.gate.QuotaState() }

// Handler returns the data-port handler (for tests that serve it themselves).
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveData) }

// serveData is the data port: the HTTP door, with what the server knows of the connection.
func (s *Server) serveData(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 2 {
		markHTTP2(r) // a drain leaves it to GOAWAY (connTracker.closeIdle)
	}
	if s.draining.Load() || s.windows.Load() > 0 {
		// While the endpoints update, every answer closes its connection, so no idle
		// keep-alive connection is left for a client to send on as the listener closes. Over
		// HTTP/2 net/http turns the header into GOAWAY: the connection's other streams finish,
		// and the client (a gRPC channel too) opens a new connection for its next request
		// instead of waiting for the listener to close after the application has gone.
		w.Header().Set("Connection", "close")
	}
	s.door.ServeHTTP(w, r)
}

// AdminHandler returns the admin handler: /metrics, /healthz, /readyz, /drain (the
// application's preStop hook when the proxy runs as a native sidecar), and the status page at /.
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg, ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if s.draining.Load() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready\n")
	})
	mux.HandleFunc("GET /drain", s.drainWindow)
	mux.Handle("GET /{$}", s.status) // the status page (internal/status), read-only
	mux.Handle("GET /status/", s.status)
	return mux
}

// maxDrainWindow bounds the delay of GET /drain.
const maxDrainWindow = 10 * time.Minute

// drainWindow serves GET /drain?delay=D, the application container's preStop hook when the
// proxy runs as a Kubernetes native sidecar. Such a sidecar gets SIGTERM only after the
// application has exited, so without a word from the hook it would keep its clients'
// keep-alive connections (which kube-proxy keeps routing to a terminating pod) until the
// application is gone, and answer what arrives on them with 502. For D, answers say
// "Connection: close" and idle keep-alive connections are closed once quiet, so clients move to
// other pods while the endpoints update; then it answers 200 and the kubelet stops the
// application. Readiness is left alone (a terminating pod leaves the endpoints anyway) and the
// window ends by itself, or when the caller goes away. Only a caller with the pod's drain token
// (Options.DrainToken) may open one; any other gets 403 and nothing changes.
func (s *Server) drainWindow(w http.ResponseWriter, r *http.Request) {
	if !drainAuthorized(r, s.drainTok) {
		http.Error(w, "drain: forbidden: GET /drain needs the header Authorization: Bearer <the sidecar's "+DrainTokenEnv+">", http.StatusForbidden)
		return
	}
	v := r.URL.Query().Get("delay")
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > maxDrainWindow {
		http.Error(w, fmt.Sprintf("delay: %q, want a Go duration from 0s to %s, e.g. delay=5s", v, maxDrainWindow), http.StatusBadRequest)
		return
	}
	s.windows.Add(1)
	defer s.windows.Add(-1)
	s.log.Info("drain window: answers close their connections", "delay", d)
	s.closeIdleFor(r.Context(), d)
	io.WriteString(w, "drained\n")
}

// closeIdleFor closes idle keep-alive connections once they have been quiet for a moment,
// until d has passed or ctx ends.
func (s *Server) closeIdleFor(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	quiet := min(d/4, 500*time.Millisecond)
	tick := time.NewTicker(max(quiet/2, 10*time.Millisecond))
	defer tick.Stop()
	end := time.NewTimer(d)
	defer end.Stop()
	for {
		select {
		case <-tick.C:
			if s.conns != nil {
				s.conns.closeIdle(quiet)
			}
		case <-end.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// Listen opens the data and admin listeners, and those of the other doors the configuration
// asks for (":0" picks free ports; see Addrs and Doors).
func (s *Server) Listen() error {
	cfg := s.gate.Config()
	s.conns = newConnTracker(cfg.Server.MaxConnections, cfg.Server.MaxConnectionsPerSource)
	if cfg.Listen != "" {
		ln, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		s.dataLn = s.conns.listener(ln)
	}
	var err error
	if s.adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
		s.closeListeners()
		return fmt.Errorf("adminListen: %w", err)
	}
	for _, open := range s.openDoors {
		d, err := open(s.gate, gate.DoorOptions{Registerer: s.reg, Logger: s.log})
		if err != nil {
			s.closeListeners()
			return err
		}
		if d != nil {
			s.doors = append(s.doors, d)
		}
	}
	return nil
}

func (s *Server) closeListeners() {
	for _, ln := range []net.Listener{s.dataLn, s.adminLn} {
		if ln != nil {
			ln.Close()
		}
	}
	for _, d := range s.doors {
		d.Close()
	}
}

// Addrs returns the bound data and admin addresses after Listen (data is empty when the
// configuration has no data port).
func (s *Server) Addrs() (data, admin string) {
	if s.dataLn != nil {
		data = s.dataLn.Addr().String()
	}
	return data, s.adminLn.Addr().String()
}

// Doors returns the other doors opened by Listen.
func (s *Server) Doors() []gate.Door { return s.doors }

// Serve runs until ctx ends, then shuts down gracefully: /readyz fails at once; serving goes on
// for the drain delay; then the data listener closes, in-flight requests finish, queued requests
// whose turn comes within the grace period are served and the rest refused with 503; finally
// the admin listener closes, and the quota store with it. It returns nil after a clean shutdown.
func (s *Server) Serve(ctx context.Context) error {
	defer s.gate.Close() // last: every request has been answered
	if s.adminLn == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	cfg := s.gate.Config()
	s.data = &http.Server{
		Handler:           http.HandlerFunc(s.serveData),
		ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout.D(),
		ReadTimeout:       cfg.Server.ReadTimeout.D(),
		IdleTimeout:       cfg.Server.IdleTimeout.D(),
		MaxHeaderBytes:    cfg.Server.MaxHeaderBytes, // also HTTP/2's header list size
		ConnState:         s.conns.connState,
		ConnContext:       connContext,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: cfg.Server.HTTP2.MaxConcurrentStreams},
		Protocols:         dataProtocols(s.certs != nil),
	}
	serveData := func() error { return s.data.Serve(s.dataLn) }
	if s.certs != nil {
		s.data.TLSConfig = &tls.Config{GetCertificate: s.certs.GetCertificate, MinVersion: tls.VersionTLS12}
		serveData = func() error { return s.data.ServeTLS(s.dataLn, "", "") }
	}
	s.admin = &http.Server{
		Handler:           s.AdminHandler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		IdleTimeout:       60 * time.Second,
	}
	errc := make(chan error, 3+len(s.doors))
	listen := "" // none: the other doors only
	if s.dataLn != nil {
		listen = s.dataLn.Addr().String()
		go func() { errc <- serveErr("data", serveData()) }()
	}
	go func() { errc <- serveErr("admin", s.admin.Serve(s.adminLn)) }()
	for _, d := range s.doors {
		go func() {
			if err := d.Serve(); err != nil {
				errc <- fmt.Errorf("%s listener: %w", d.Addr(), err)
			}
		}()
	}
	s.log.Info("serving", "listen", listen, "admin", s.adminLn.Addr().String(),
		"upstream", cfg.Upstream, "strategy", cfg.Admission.Strategy)

	if s.configPath != "" {
		watchCtx, stopWatch := context.WithCancel(ctx)
		defer stopWatch()
		go s.watch(watchCtx)
	}
	statusCtx, stopStatus := context.WithCancel(context.WithoutCancel(ctx))
	defer stopStatus() // (sampling on through the drain)
	go s.status.Run(statusCtx)
	if s.self != nil {
		selfCtx, stopSelf := context.WithCancel(context.WithoutCancel(ctx))
		defer stopSelf() // (watching on through the drain: the drain is load too)
		go s.self.Run(selfCtx, selfload.Tick)
	}
	select {
	case err := <-errc:
		s.data.Close()
		s.admin.Close()
		for _, d := range s.doors {
			d.Close()
		}
		return err
	case <-ctx.Done():
	}
	return s.shutdown()
}

// dataProtocols are the data port's protocols: HTTP/1.1 and HTTP/2 on one listener, with prior
// knowledge (h2c) in cleartext, by ALPN with TLS.
func dataProtocols(tls bool) *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	if tls {
		p.SetHTTP2(true)
	} else {
		p.SetUnencryptedHTTP2(true)
	}
	return p
}

func serveErr(which string, err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("%s listener: %w", which, err)
}

func (s *Server) shutdown() error {
	cfg := s.gate.Config()
	s.draining.Store(true)
	s.gate.Metrics().Draining.Set(1)
	// Answers from now on say "Connection: close", so clients move to other pods while the
	// endpoints update instead of reusing a connection that will close. Idle keep-alive
	// connections are not cut at once (a client may be sending on one right now): each is closed
	// once it has stayed quiet for a moment, so none is left idle when the listener closes.
	drain := cfg.Shutdown.DrainDelay.D()
	s.log.Info("draining: readiness off, still serving", "drainDelay", drain)
	s.closeIdleFor(context.Background(), drain)

	grace := cfg.Shutdown.GracePeriod.D()
	s.log.Info("closing the data listener; finishing in-flight and queued requests", "gracePeriod", grace)
	// At the end of the grace period, whatever still waits in a queue is refused (503 draining,
	// with Retry-After); admitted requests keep going until they finish.
	refuseQueued := time.AfterFunc(grace, s.gate.Drain)
	defer refuseQueued.Stop()
	// In-flight requests are bounded by the upstream timeout; past that, the connections close.
	hard, cancel := context.WithTimeout(context.Background(), grace+cfg.UpstreamTimeout.D()+5*time.Second)
	defer cancel()
	// The other doors stop accepting at the same moment and finish their admitted exchanges too.
	doorErrs := make(chan error, len(s.doors))
	for _, d := range s.doors {
		go func() { doorErrs <- d.Shutdown(hard) }()
	}
	s.door.StopStreams()
	err := s.data.Shutdown(hard)
	if err != nil {
		s.log.Warn("in-flight requests did not finish in time; closing", "err", err)
		s.data.Close()
	}
	for range s.doors {
		if derr := <-doorErrs; derr != nil {
			s.log.Warn("a door's admitted exchanges did not finish in time; closed", "err", derr)
			err = cmp.Or(err, derr)
		}
	}
	s.door.CloseIdleConnections()
	adminCtx, cancelAdmin := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelAdmin()
	s.admin.Shutdown(adminCtx)
	s.log.Info("stopped")
	return err
}
