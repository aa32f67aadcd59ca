// Package httpdoor is the sidecar's HTTP front door: HTTP/1.1 and HTTP/2 requests, gRPC calls
// among them, admitted by the gate and forwarded to the one upstream through net/http. The
// server that serves it (internal/proxy) owns the listeners, the connections and reloads.
package httpdoor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/loadshed/loadshed/internal/gate"
	"github.com/loadshed/loadshed/pkg/admission"
)

// Door is the HTTP front door: it turns a request into the gate's plain values, answers the
// gate's refusals, and forwards what the gate admits to the upstream (forward.go). It is an
// http.Handler for the data port's server.
type Door struct {
	gate  *gate.Gate
	clock admission.Clock // the gate's: exchanges are timed on it
	log   *slog.Logger
	// transport carries requests to the upstream.
	transport *upstreamTransport
	upstream  atomic.Pointer[url.URL] // the configured upstream, replaced on reload

	// Fixed at start (server settings).
	maxBody     int64
	bodyBuffer  int64
	bodyTimeout time.Duration
	readTimeout time.Duration
	respBuffer  int64
	respBudget  *budget
	writeIdle   time.Duration

	orca *orcaService // the out-of-band load report stream (loadReports.orca)
}

// New opens the HTTP door over g, with the server settings of the gate's configuration (they
// are fixed at start; the upstream follows reloads through SetUpstream).
func New(g *gate.Gate, opts gate.DoorOptions) (*Door, error) {
	cfg := g.Config()
	sv := cfg.Server
	d := &Door{gate: g, clock: g.Clock(), log: opts.Logger, transport: newUpstreamTransport(cfg),
		maxBody: sv.MaxBodyBytes, bodyBuffer: sv.RequestBodyBuffer, bodyTimeout: sv.RequestBodyTimeout.D(),
		readTimeout: sv.ReadTimeout.D(), respBuffer: sv.ResponseBodyBuffer, respBudget: newBudget(sv.ResponseBufferBudget),
		writeIdle: sv.WriteIdleTimeout.D(), orca: newORCAService(g)}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if err := d.SetUpstream(cfg.Upstream); err != nil {
		return nil, err
	}
	return d, nil
}

// ServeHTTP admits the request and forwards it, or answers it at the door.
func (d *Door) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	grpc := gate.IsGRPC(r.Header.Get("Content-Type"))
	door := gate.DoorHTTP
	if grpc {
		door = gate.DoorGRPC
		if d.orca.serves(r) {
			d.orca.ServeHTTP(w, r) // the sidecar's own: never admitted, never forwarded
			return
		}
	}
	if !d.screen(w, r, door, grpc) {
		return
	}
	var readLimit time.Time
	if d.readTimeout > 0 {
		readLimit = time.Now().Add(d.readTimeout) // a socket deadline: the wall clock's
	}
	if d.maxBody > 0 {
		r.Body = http.MaxBytesReader(w, r.Body, d.maxBody)
	}
	if !d.readSmallBody(w, r, door, grpc, readLimit) {
		return
	}
	pass, err := d.gate.Admit(r.Context(), &gate.Request{
		Door: door, Method: r.Method, Path: r.URL.Path, Header: r.Header,
		Peer: r.RemoteAddr, ContentLength: r.ContentLength, GRPC: grpc,
	}, nil)
	if err != nil {
		if b, ok := r.Body.(*bufferedBody); ok {
			b.recycle() // read before admission, never forwarded
		}
		d.refuse(w, err, grpc)
		return
	}
	x := &exchange{d: d, pass: pass, in: r, grpc: grpc, w: idleWriter{ResponseWriter: w, idle: d.writeIdle}}
	defer x.finish()
	if pass.Streaming() {
		// A stream is not cut by server.readTimeout (HTTP/2 applies it per stream).
		if rd, ok := w.(interface{ SetReadDeadline(time.Time) error }); ok {
			_ = rd.SetReadDeadline(time.Time{})
		}
		readLimit = time.Time{}
	}
	x.followBody(w, readLimit)
	ctx := r.Context()
	if dl := pass.Deadline(); !dl.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl)
		defer cancel()
	}
	x.forward(ctx)
}

// screen answers what the door refuses before the gate sees it, and reports whether the request
// goes on: a CONNECT (the proxy forwards requests to its one upstream; it opens no tunnels, and
// WebSocket over HTTP/2, which would need CONNECT, is not offered), and a target the gate could
// read differently from the upstream (checkTarget): refused rather than rewritten.
func (d *Door) screen(w http.ResponseWriter, r *http.Request, door gate.DoorKind, grpc bool) bool {
	if r.Method == http.MethodConnect {
		w.Header().Set("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
		http.Error(w, "405 Method Not Allowed: CONNECT", http.StatusMethodNotAllowed)
		d.gate.Count(door, r.Method, r.URL.Path, gate.OutcomeClientError, http.StatusMethodNotAllowed)
		return false
	}
	if msg, ok := checkTarget(r); !ok {
		d.clientError(w, http.StatusBadRequest, msg, grpc)
		d.gate.Count(door, r.Method, r.URL.Path, gate.OutcomeClientError, http.StatusBadRequest)
		return false
	}
	return true
}

// readSmallBody reads a small body before admission, so a client that sends it slowly (or
// never) waits without a permit, and reports whether the request goes on. (A gRPC call's body is
// a stream of messages that may never end on its own: it is admitted and streamed; so is a
// streaming route's.)
func (d *Door) readSmallBody(w http.ResponseWriter, r *http.Request, door gate.DoorKind, grpc bool, readLimit time.Time) bool {
	if !hasBody(r) || grpc || d.bodyBuffer <= 0 || r.ContentLength > d.bodyBuffer || d.maxBody > 0 && r.ContentLength > d.maxBody ||
		d.gate.Streaming(r.Method, r.URL.Path) {
		return true
	}
	body, err := prefetch(w, r, d.bodyBuffer, d.bodyTimeout, readLimit)
	if err != nil {
		d.bodyFailed(w, r, door, grpc, classifyBodyError(err, r.Context().Err() != nil))
		return false
	}
	r.Body = body
	return true
}

func hasBody(r *http.Request) bool {
	return r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0
}

// bodyFailed answers a request whose body could not be read before admission: the client's
// doing, counted as its error (no permit was taken, nothing reached the upstream).
func (d *Door) bodyFailed(w http.ResponseWriter, r *http.Request, door gate.DoorKind, grpc bool, problem bodyProblem) {
	code, outcome, msg := http.StatusBadRequest, gate.OutcomeClientError, "malformed request body"
	switch problem {
	case bodyGone:
		code, outcome, msg = http.StatusRequestTimeout, gate.OutcomeCanceled, "request body incomplete"
	case bodySlow:
		code, msg = http.StatusRequestTimeout, "request body not sent in time"
	case bodyTooLarge:
		code, msg = http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", d.maxBody)
	}
	d.clientError(w, code, msg, grpc)
	count := code
	if outcome == gate.OutcomeCanceled {
		count = 499
	}
	d.gate.Count(door, r.Method, r.URL.Path, outcome, count)
}

// clientError answers what the client got wrong: an HTTP status with a short body that closes
// the connection (the rest of the request is not worth reading), or, to a gRPC call, the
// matching grpc-status.
func (d *Door) clientError(w http.ResponseWriter, code int, msg string, grpc bool) {
	if grpc {
		writeGRPCStatus(w, gate.ClientGRPCCode(code), msg, "", "")
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if code != http.StatusBadRequest || msg != "" {
		w.Header().Set("Connection", "close")
	}
	w.WriteHeader(code)
	io.WriteString(w, gate.AnswerText(code, msg))
}

// SetUpstream puts the configured upstream in force for new requests (a reload).
func (d *Door) SetUpstream(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	d.upstream.Store(u)
	return nil
}

// StopStreams ends the door's own long-lived streams (the load report streams): the server is
// shutting down, and they would hold its drain open.
func (d *Door) StopStreams() { d.orca.stopStreams() }

// CloseIdleConnections closes the door's idle upstream connections (at shutdown).
func (d *Door) CloseIdleConnections() { d.transport.CloseIdleConnections() }

// checkTarget checks the request target before the gate judges its path, so that the path a
// route is matched on is the one the upstream receives, and no spelling of a target reaches a
// route's path by a way the gate does not see. The path must begin with "/" (net/http resolves
// an absolute-form target to its path; an empty one is "/", as the request line will carry), or
// be "*" for OPTIONS; it may hold no dot-segment ("." or "..", escaped or not, with "/" or "\"
// as the separator), which an upstream would resolve to a path the gate did not judge. Nothing
// else is rewritten or refused ("//" passes as it is). It reports what is wrong and false
// otherwise.
func checkTarget(r *http.Request) (string, bool) {
	u := r.URL
	switch {
	case u.Opaque != "":
		return fmt.Sprintf("request target %q: the path must begin with /", r.RequestURI), false
	case r.Method == http.MethodOptions && r.RequestURI == "*":
		return "", true
	case u.Path == "" && u.Host != "" && u.RawPath == "":
		u.Path = "/"
		return "", true
	case !strings.HasPrefix(u.Path, "/"):
		return fmt.Sprintf("request target %q: the path must begin with /", r.RequestURI), false
	}
	for seg := range strings.FieldsFuncSeq(u.Path, func(c rune) bool { return c == '/' || c == '\\' }) {
		if seg == "." || seg == ".." {
			return fmt.Sprintf("request target %q: the path has a dot-segment", r.RequestURI), false
		}
	}
	return "", true
}

// refuse answers a request the gate did not admit: a shed gets its status, Retry-After (except
// 403) and a short body naming the reason, or, to a gRPC call, a trailers-only answer with its
// grpc-status and grpc-retry-pushback-ms; a client error 400 naming the header or 413; a
// client that left while it waited 408 with Connection: close (gRPC: CANCELLED), as one that
// leaves after admission: never the empty 200 net/http would send if nothing were written.
func (d *Door) refuse(w http.ResponseWriter, err error, grpc bool) {
	var rej *gate.Refusal
	var bad *gate.ClientError
	switch {
	case errors.As(err, &rej) && grpc:
		hdr := w.Header()
		for _, f := range rej.Headers(true) { // the reason, the pushback, the load report
			hdr.Set(f.Name, f.Value)
		}
		writeGRPCStatus(w, rej.GRPCCode, rej.GRPCMessage(), "", "")
	case errors.As(err, &rej):
		hdr := w.Header()
		for _, f := range rej.Headers(false) {
			hdr.Set(f.Name, f.Value)
		}
		w.WriteHeader(rej.Status)
		io.WriteString(w, rej.Body())
	case errors.As(err, &bad) && bad.Status == http.StatusRequestEntityTooLarge:
		d.clientError(w, http.StatusRequestEntityTooLarge, bad.Error(), grpc)
	case errors.As(err, &bad):
		if grpc {
			writeGRPCStatus(w, gate.GRPCInvalidArgument, bad.Error(), "", "")
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, bad.Body())
	default:
		// The client went away while it waited (the gate counted it as canceled).
		if grpc {
			writeGRPCStatus(w, gate.GRPCCanceled, "request canceled", "", "")
			return
		}
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusRequestTimeout)
	}
}
