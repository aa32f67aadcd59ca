package backend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// DefaultShutdownTimeout is how long Serve lets in-flight and waiting requests finish after its
// context ends, when ServeConfig.ShutdownTimeout is 0.
const DefaultShutdownTimeout = 15 * time.Second

// Server timeouts. There is no write timeout on the data port: a request may wait inside the
// backend for a long time, which is the behaviour being modelled.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = time.Minute
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 64 << 10
	adminWriteTimeout = 30 * time.Second
	// abortGrace is how long aborted requests get to send their 503 after the shutdown timeout,
	// and how long the admin port gets to finish a scrape after the data port has drained.
	abortGrace = time.Second
)

// ServeConfig says where Serve listens.
type ServeConfig struct {
	// Data is the listener of the data port. Required.
	Data net.Listener
	// Admin is the listener of the admin port (a test tool); nil serves no admin endpoint.
	Admin net.Listener
	// GRPC is the listener of the gRPC port (h2c: cleartext HTTP/2 with prior knowledge);
	// nil serves no gRPC. It serves loadshed.backend.v1.Backend on the same workers as the
	// data port, the standard health service and server reflection.
	GRPC net.Listener
	// ShutdownTimeout bounds the graceful shutdown; 0 means DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Logger receives server errors and shutdown notes; nil discards them.
	Logger *slog.Logger
}

// Validate reports a missing data listener or a negative timeout.
func (c ServeConfig) Validate() error {
	var errs []error
	if c.Data == nil {
		errs = append(errs, errors.New("backend: ServeConfig.Data: listener required"))
	}
	if c.ShutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("backend: ServeConfig.ShutdownTimeout: must be >= 0, got %s", c.ShutdownTimeout))
	}
	return errors.Join(errs...)
}

// Serve serves the data port (and the admin and gRPC ports, if given) until ctx ends, then
// shuts down gracefully: it stops accepting, lets running and waiting requests and calls finish
// for up to ShutdownTimeout, then closes the Server (what is left answers 503, or UNAVAILABLE)
// and the connections.
// It closes the listeners. It returns nil after a shutdown caused by ctx, or the first serving
// error.
func (s *Server) Serve(ctx context.Context, c ServeConfig) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	errLog := slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	servers := []*http.Server{{
		Handler:           s.Handler(),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          errLog,
	}}
	listeners := []net.Listener{c.Data}
	if c.Admin != nil {
		servers = append(servers, &http.Server{
			Handler:           s.AdminHandler(),
			ReadHeaderTimeout: readHeaderTimeout,
			ReadTimeout:       readTimeout,
			WriteTimeout:      adminWriteTimeout,
			IdleTimeout:       idleTimeout,
			MaxHeaderBytes:    maxHeaderBytes,
			ErrorLog:          errLog,
		})
		listeners = append(listeners, c.Admin)
	}
	errc := make(chan error, len(servers)+1)
	for i, srv := range servers {
		go func() { errc <- srv.Serve(listeners[i]) }()
	}
	var gs *grpcServer
	if c.GRPC != nil {
		gs = s.newGRPCServer()
		go func() {
			// Serve returns nil once stopped; an error of its own means the port is lost.
			if err := gs.srv.Serve(c.GRPC); err != nil {
				errc <- fmt.Errorf("gRPC port: %w", err)
			}
		}()
	}

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
		log.Error("serving failed", "err", serveErr)
	}

	log.Info("shutting down", "timeout", c.ShutdownTimeout, "busy", s.Stats().Busy, "waiting", s.Stats().Waiting)
	// The data and gRPC ports drain first; the admin port (metrics, healthz) stays up meanwhile.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.ShutdownTimeout)
	defer cancel()
	grpcDone := make(chan struct{})
	if gs != nil {
		gs.health.Shutdown() // NOT_SERVING from now on, for clients that watch
		go func() { gs.srv.GracefulStop(); close(grpcDone) }()
	} else {
		close(grpcDone)
	}
	err := servers[0].Shutdown(sctx)
	if err == nil {
		select {
		case <-grpcDone:
		case <-sctx.Done():
			err = sctx.Err()
		}
	}
	if err != nil {
		st := s.Stats()
		log.Warn("shutdown timeout reached; aborting what is left", "busy", st.Busy, "waiting", st.Waiting)
		// Aborted requests answer 503 (calls UNAVAILABLE) at once; give them a moment to get it
		// out, then cut.
		s.Close()
		shutdownOrClose(ctx, servers[0])
		if gs != nil {
			select {
			case <-grpcDone:
			case <-time.After(abortGrace):
				gs.srv.Stop()
				<-grpcDone
			}
		}
	}
	for _, srv := range servers[1:] {
		shutdownOrClose(ctx, srv)
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	return nil
}

// shutdownOrClose gives srv abortGrace to shut down gracefully, then closes it.
func shutdownOrClose(ctx context.Context, srv *http.Server) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortGrace)
	defer cancel()
	if srv.Shutdown(ctx) != nil {
		_ = srv.Close()
	}
}
