package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/gate"
	"github.com/loadshed/loadshed/internal/metrics"
)

// handler is the HTTP front door: it turns a request into the gate's plain values, answers the
// gate's refusals, and forwards what the gate admits through the reverse proxy.
type handler struct {
	gate     *gate.Gate
	log      *slog.Logger
	proxy    *httputil.ReverseProxy
	upstream atomic.Pointer[url.URL] // the configured upstream, replaced on reload
	draining atomic.Bool             // answers say Connection: close

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
	if h.draining.Load() && r.ProtoMajor == 1 {
		// While the endpoints update, every answer closes its connection, so no idle
		// keep-alive connection is left for a client to send on as the listener closes. (HTTP/2
		// connections get GOAWAY when the listener closes.)
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
	if hasBody(r) {
		if _, whole := r.Body.(*bufferedBody); !whole {
			// The rest of a large or streamed body comes with an idle timeout between reads.
			b := &idleBody{ReadCloser: r.Body, idle: h.bodyTimeout, limit: readLimit, pass: pass}
			if d, ok := w.(interface{ SetReadDeadline(time.Time) error }); ok && !streaming {
				b.setDeadline = d.SetReadDeadline
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
	h.proxy.ServeHTTP(&idleWriter{ResponseWriter: w, idle: h.writeIdle}, r.WithContext(ctx))
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

// refuse answers a request the gate did not admit: a shed gets its status, Retry-After (except
// 403) and a short body naming the reason, or, to a gRPC call, a trailers-only answer with its
// grpc-status and grpc-retry-pushback-ms; a client error 400 naming the header or 413; a
// client that left gets nothing.
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
	}
}

// newReverseProxy builds the forwarding half. Rewrite (not Director) pins every request to the
// configured upstream whatever its URL or Host says; hop-by-hop headers are removed by
// httputil; forwarding headers are replaced unless the configuration trusts them.
func (h *handler) newReverseProxy(transport http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			cfg := h.gate.Config()
			if cfg.TrustForwardedHeaders {
				// Keep what a trusted ingress said, then append this hop.
				if v := pr.In.Header.Values("X-Forwarded-For"); len(v) > 0 {
					pr.Out.Header["X-Forwarded-For"] = append([]string(nil), v...)
				}
			}
			pr.SetURL(h.upstream.Load())
			pr.SetXForwarded()
			if cfg.TrustForwardedHeaders {
				if v := pr.In.Header.Get("X-Forwarded-Proto"); v != "" {
					pr.Out.Header.Set("X-Forwarded-Proto", v)
				}
				if v := pr.In.Header.Get("X-Forwarded-Host"); v != "" {
					pr.Out.Header.Set("X-Forwarded-Host", v)
				}
			}
			if cfg.PreserveHost {
				pr.Out.Host = pr.In.Host
			}
			if pass := gate.PassFrom(pr.In.Context()); pass != nil {
				// The admission headers go; the remaining deadline is forwarded, so the upstream
				// can give up in time too.
				remove, set := pass.Forward(time.Now())
				for _, name := range remove {
					pr.Out.Header.Del(name)
				}
				for _, f := range set {
					pr.Out.Header.Set(f.Name, f.Value)
				}
			}
		},
		Transport: transport,
		ModifyResponse: func(res *http.Response) error {
			pass := gate.PassFrom(res.Request.Context())
			if pass == nil {
				return nil
			}
			now := time.Now()
			if gate.IsGRPC(res.Request.Header.Get("Content-Type")) && res.StatusCode == http.StatusOK {
				// A gRPC call ends with its grpc-status: in the headers of a trailers-only answer,
				// else in the trailers after the last message.
				pass.Responded(res.StatusCode, now, pass.Streaming())
				switch {
				case res.Header.Get("Grpc-Status") != "":
					pass.CallEnded(gate.GRPCStatus(res.Header.Get("Grpc-Status")), now)
				case pass.Streaming():
					pass.Complete()
				default:
					res.Body = &grpcBody{ReadCloser: res.Body, res: res, pass: pass}
				}
				return nil
			}
			// Upgrades (WebSocket) and event streams are streams: their permit goes back as they
			// start, and their duration is no sample.
			stream := pass.Streaming() || res.StatusCode == http.StatusSwitchingProtocols || gate.IsEventStream(res.Header.Get("Content-Type"))
			pass.Responded(res.StatusCode, now, stream)
			switch {
			case stream:
				pass.Complete()
			case h.respBuffer > 0 && bufferResponse(res, h.respBuffer, h.respBudget):
				// The upstream is done: the permit goes back now, not when a slow client has
				// read the answer.
				pass.Complete()
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			pass := gate.PassFrom(r.Context())
			fail := func(outcome string, status int) {
				if pass != nil {
					pass.Failed(outcome, status)
				}
			}
			grpc := gate.IsGRPC(r.Header.Get("Content-Type"))
			if r.Context().Err() != nil && !errors.Is(r.Context().Err(), context.DeadlineExceeded) {
				// The client went away, or its body stopped at server.readTimeout (net/http cancels
				// the context on a read error). A departed client never sees this answer; a slow
				// one must not get the empty 200 net/http would send if nothing were written.
				fail(metrics.OutcomeCanceled, 0)
				if grpc {
					writeGRPCStatus(w, gate.GRPCCanceled, "request canceled", "", "")
					return
				}
				w.Header().Set("Connection", "close")
				w.WriteHeader(http.StatusRequestTimeout)
				return
			}
			var bodyErr error
			if pass != nil {
				bodyErr = pass.BodyError()
			}
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) || errors.As(bodyErr, &tooBig) {
				// A streamed (chunked) body outgrew server.maxBodyBytes: the client's fault.
				fail(metrics.OutcomeClientError, http.StatusRequestEntityTooLarge)
				h.clientError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", tooBig.Limit), grpc)
				return
			}
			switch classifyBodyError(bodyErr, false) {
			case bodyMalformed:
				// The client's body broke its own framing: its error, never the upstream's.
				fail(metrics.OutcomeClientError, http.StatusBadRequest)
				h.clientError(w, http.StatusBadRequest, "malformed request body", grpc)
				return
			case bodySlow, bodyGone:
				fail(metrics.OutcomeCanceled, 0)
				h.clientError(w, http.StatusRequestTimeout, "", grpc)
				return
			}
			code, outcome := http.StatusBadGateway, metrics.OutcomeUpstreamError
			var ne net.Error
			if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
				code, outcome = http.StatusGatewayTimeout, metrics.OutcomeUpstreamTimeout
			}
			fail(outcome, code)
			h.log.Debug("upstream failed", "err", err, "status", code)
			if grpc {
				// Never confused with a shed: no pushback, no X-Loadshed-Reason.
				g := gate.GRPCUnavailable
				if code == http.StatusGatewayTimeout {
					g = gate.GRPCDeadlineExceeded
				}
				writeGRPCStatus(w, g, "upstream "+strings.ReplaceAll(outcome, "_", " "), "", "")
				return
			}
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(code)
			fmt.Fprintf(w, "%d %s: upstream %s\n", code, http.StatusText(code), strings.ReplaceAll(outcome, "_", " "))
		},
		ErrorLog:   slog.NewLogLogger(h.log.Handler(), slog.LevelDebug),
		BufferPool: copyBuffers{},
	}
}

// copyBuffers recycles the response-copy buffers (httputil allocates 32 KiB per response
// without a pool, which under load is most of the proxy's garbage).
type copyBuffers struct{}

var copyBufferPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (copyBuffers) Get() []byte  { return *copyBufferPool.Get().(*[]byte) }
func (copyBuffers) Put(b []byte) { copyBufferPool.Put(&b) }
