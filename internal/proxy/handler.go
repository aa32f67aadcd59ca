package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/gate"
	"github.com/loadshed/loadshed/internal/metrics"
)

// handler is the HTTP front door: it turns a request into the gate's plain values, answers the
// gate's refusals, and forwards what the gate admits through the reverse proxy.
type handler struct {
	gate *gate.Gate
	log  *slog.Logger
	// transport carries requests to the upstream.
	transport http.RoundTripper
	upstream  atomic.Pointer[url.URL] // the configured upstream, replaced on reload
	draining  atomic.Bool             // shutting down: answers say Connection: close
	windows   atomic.Int32            // drain windows open (GET /drain): the same while any is

	// Fixed at start (server settings).
	maxBody     int64
	bodyBuffer  int64
	bodyTimeout time.Duration
	readTimeout time.Duration
	respBuffer  int64
	respBudget  *budget
	writeIdle   time.Duration
}

func newHandler(g *gate.Gate, cfg *config.Config, log *slog.Logger) *handler {
	sv := cfg.Server
	return &handler{gate: g, log: log, maxBody: sv.MaxBodyBytes, bodyBuffer: sv.RequestBodyBuffer,
		bodyTimeout: sv.RequestBodyTimeout.D(), readTimeout: sv.ReadTimeout.D(),
		respBuffer: sv.ResponseBodyBuffer, respBudget: newBudget(sv.ResponseBufferBudget), writeIdle: sv.WriteIdleTimeout.D()}
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	grpc := gate.IsGRPC(r.Header.Get("Content-Type"))
	door := metrics.DoorHTTP
	if grpc {
		door = metrics.DoorGRPC
	}
	if r.ProtoMajor == 2 {
		markHTTP2(r) // a drain leaves it to GOAWAY (connTracker.closeIdle)
	}
	if h.draining.Load() || h.windows.Load() > 0 {
		// While the endpoints update, every answer closes its connection, so no idle
		// keep-alive connection is left for a client to send on as the listener closes. Over
		// HTTP/2 net/http turns the header into GOAWAY: the connection's other streams finish,
		// and the client (a gRPC channel too) opens a new connection for its next request
		// instead of waiting for the listener to close after the application has gone.
		w.Header().Set("Connection", "close")
	}
	if r.Method == http.MethodConnect {
		// The proxy forwards requests to its one upstream; it opens no tunnels (and WebSocket
		// over HTTP/2, which would need CONNECT, is not offered).
		w.Header().Set("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
		http.Error(w, "405 Method Not Allowed: CONNECT", http.StatusMethodNotAllowed)
		h.gate.Count(door, r.Method, r.URL.Path, metrics.OutcomeClientError, http.StatusMethodNotAllowed)
		return
	}
	if msg, ok := checkTarget(r); !ok {
		// The gate judges the path the upstream receives: a target it could read differently
		// (no leading slash, an opaque form) is refused rather than rewritten.
		h.clientError(w, http.StatusBadRequest, msg, grpc)
		h.gate.Count(door, r.Method, r.URL.Path, metrics.OutcomeClientError, http.StatusBadRequest)
		return
	}
	start := time.Now()
	var readLimit time.Time
	if h.readTimeout > 0 {
		readLimit = start.Add(h.readTimeout)
	}
	if h.maxBody > 0 {
		r.Body = http.MaxBytesReader(w, r.Body, h.maxBody)
	}
	if hasBody(r) && !grpc && h.bodyBuffer > 0 && r.ContentLength <= h.bodyBuffer && (h.maxBody == 0 || r.ContentLength <= h.maxBody) &&
		!h.gate.Streaming(r.Method, r.URL.Path) {
		// A small body is read before admission, so a client that sends it slowly (or never)
		// waits without a permit. (A gRPC call's body is a stream of messages that may never
		// end on its own: it is admitted and streamed.)
		body, err := prefetch(w, r, h.bodyBuffer, h.bodyTimeout, readLimit)
		if err != nil {
			h.bodyFailed(w, r, door, grpc, classifyBodyError(err, r.Context().Err() != nil))
			return
		}
		r.Body = body
	}
	pass, err := h.gate.Admit(r.Context(), &gate.Request{
		Door: door, Method: r.Method, Path: r.URL.Path, Header: r.Header,
		Peer: r.RemoteAddr, ContentLength: r.ContentLength,
	}, nil)
	if err != nil {
		if b, ok := r.Body.(*bufferedBody); ok {
			b.recycle() // read before admission, never forwarded
		}
		h.refuse(w, err, grpc)
		return
	}
	streaming := pass.Streaming()
	if streaming {
		// A stream is not cut by server.readTimeout (HTTP/2 applies it per stream).
		if d, ok := w.(interface{ SetReadDeadline(time.Time) error }); ok {
			_ = d.SetReadDeadline(time.Time{})
		}
		readLimit = time.Time{}
	}
	if grpc && hasBody(r) {
		// Its messages' framing is followed as they go: a call its client broke is the client's.
		r.Body = newGRPCRequestBody(r, h.gate.Config().GRPC.MaxMessageBytes)
	}
	if hasBody(r) {
		if _, whole := r.Body.(*bufferedBody); !whole {
			// The rest of a large or streamed body comes with an idle timeout between reads.
			b := &idleBody{ReadCloser: r.Body, idle: h.bodyTimeout, limit: readLimit, pass: pass}
			if d, ok := w.(interface{ SetReadDeadline(time.Time) error }); ok && !streaming {
				b.setDeadline = d.SetReadDeadline
				defer b.end()
			}
			r.Body = b
		}
	}
	if grpc && !streaming {
		// A call still open after grpc.streamAfter is a stream the route does not say it is: its
		// permit goes back and its latency is no sample.
		t := time.AfterFunc(pass.StreamAfter(), pass.MarkStream)
		defer t.Stop()
	}
	defer func() {
		// A panic (http.ErrAbortHandler when the response copy fails) must still release the
		// permit and count the request; it is re-raised for net/http to abort the connection.
		rec := recover()
		if rec != nil {
			if r.Context().Err() != nil {
				pass.Failed(metrics.OutcomeCanceled, 0)
			} else if o := pass.Outcome(); o == metrics.OutcomeSuccess || o == metrics.OutcomeClientError {
				pass.Failed(metrics.OutcomeUpstreamError, 0)
			}
		}
		pass.Finish()
		if rec != nil {
			panic(rec)
		}
	}()
	var ctx context.Context = pass // the request's context, carrying the pass
	if dl := pass.ClientDeadline(); !dl.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl)
		defer cancel()
	}
	h.forward(w, r, pass, ctx)
}

func hasBody(r *http.Request) bool {
	return r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0
}

// bodyFailed answers a request whose body could not be read before admission: the client's
// doing, counted as its error (no permit was taken, nothing reached the upstream).
func (h *handler) bodyFailed(w http.ResponseWriter, r *http.Request, door string, grpc bool, problem bodyProblem) {
	code, outcome, msg := http.StatusBadRequest, metrics.OutcomeClientError, "malformed request body"
	switch problem {
	case bodyGone:
		code, outcome, msg = http.StatusRequestTimeout, metrics.OutcomeCanceled, "request body incomplete"
	case bodySlow:
		code, msg = http.StatusRequestTimeout, "request body not sent in time"
	case bodyTooLarge:
		code, msg = http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", h.maxBody)
	}
	h.clientError(w, code, msg, grpc)
	count := code
	if outcome == metrics.OutcomeCanceled {
		count = 499
	}
	h.gate.Count(door, r.Method, r.URL.Path, outcome, count)
}

// clientError answers what the client got wrong: an HTTP status with a short body that closes
// the connection (the rest of the request is not worth reading), or, to a gRPC call, the
// matching grpc-status.
func (h *handler) clientError(w http.ResponseWriter, code int, msg string, grpc bool) {
	if grpc {
		writeGRPCStatus(w, gate.ClientGRPCCode(code), msg, "", "")
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if code != http.StatusBadRequest || msg != "" {
		w.Header().Set("Connection", "close")
	}
	w.WriteHeader(code)
	fmt.Fprintf(w, "%d %s: %s\n", code, http.StatusText(code), msg)
}

// setUpstream puts the configured upstream in force for new requests.
func (h *handler) setUpstream(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	h.upstream.Store(u)
	return nil
}

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
func (h *handler) refuse(w http.ResponseWriter, err error, grpc bool) {
	var rej *gate.Refusal
	var bad *gate.ClientError
	switch {
	case errors.As(err, &rej) && grpc:
		writeGRPCStatus(w, rej.GRPCCode, rej.GRPCMessage(), rej.PushbackMillis(), string(rej.Reason))
	case errors.As(err, &rej):
		hdr := w.Header()
		for _, f := range rej.Headers(false) {
			hdr.Set(f.Name, f.Value)
		}
		w.WriteHeader(rej.Status)
		fmt.Fprintf(w, "%d %s: %s\n", rej.Status, http.StatusText(rej.Status), rej.Reason)
	case errors.As(err, &bad) && bad.Status == http.StatusRequestEntityTooLarge:
		h.clientError(w, http.StatusRequestEntityTooLarge, bad.Error(), grpc)
	case errors.As(err, &bad):
		if grpc {
			writeGRPCStatus(w, gate.GRPCInvalidArgument, bad.Error(), "", "")
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, "400 Bad Request: %s\n", bad)
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
