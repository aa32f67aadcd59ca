package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
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
	if h.draining.Load() {
		// While the endpoints update, every answer closes its connection, so no idle
		// keep-alive connection is left for a client to send on as the listener closes.
		w.Header().Set("Connection", "close")
	}
	if r.Method == http.MethodConnect {
		// The proxy forwards requests to its one upstream; it opens no tunnels.
		w.Header().Set("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
		http.Error(w, "405 Method Not Allowed: CONNECT", http.StatusMethodNotAllowed)
		h.gate.Count(metrics.DoorHTTP, r.Method, r.URL.Path, metrics.OutcomeClientError, http.StatusMethodNotAllowed)
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
	if hasBody(r) && h.bodyBuffer > 0 && r.ContentLength <= h.bodyBuffer && (h.maxBody == 0 || r.ContentLength <= h.maxBody) {
		// A small body is read before admission, so a client that sends it slowly (or never)
		// waits without a permit.
		body, err := prefetch(w, r, h.bodyBuffer, h.bodyTimeout, readLimit)
		if err != nil {
			h.bodyFailed(w, r, classifyBodyError(err, r.Context().Err() != nil))
			return
		}
		r.Body = body
	}
	pass, err := h.gate.Admit(r.Context(), &gate.Request{
		Door: metrics.DoorHTTP, Method: r.Method, Path: r.URL.Path, Header: r.Header,
		Peer: r.RemoteAddr, ContentLength: r.ContentLength,
	}, nil)
	if err != nil {
		h.refuse(w, err)
		return
	}
	if hasBody(r) {
		if _, whole := r.Body.(*bufferedBody); !whole {
			// The rest of a large or streamed body comes with an idle timeout between reads.
			b := &idleBody{ReadCloser: r.Body, idle: h.bodyTimeout, limit: readLimit, pass: pass}
			if d, ok := w.(interface{ SetReadDeadline(time.Time) error }); ok {
				b.setDeadline = d.SetReadDeadline
			}
			r.Body = b
		}
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
func (h *handler) bodyFailed(w http.ResponseWriter, r *http.Request, problem bodyProblem) {
	code, outcome, msg := http.StatusBadRequest, metrics.OutcomeClientError, "malformed request body"
	switch problem {
	case bodyGone:
		code, outcome, msg = http.StatusRequestTimeout, metrics.OutcomeCanceled, "request body incomplete"
	case bodySlow:
		code, msg = http.StatusRequestTimeout, "request body not sent in time"
	case bodyTooLarge:
		code, msg = http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", h.maxBody)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Connection", "close") // the rest of the body is not worth reading
	w.WriteHeader(code)
	fmt.Fprintf(w, "%d %s: %s\n", code, http.StatusText(code), msg)
	count := code
	if outcome == metrics.OutcomeCanceled {
		count = 499
	}
	h.gate.Count(metrics.DoorHTTP, r.Method, r.URL.Path, outcome, count)
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
// 403) and a short body naming the reason; a client error 400 naming the header or 413; a
// client that left gets nothing.
func (h *handler) refuse(w http.ResponseWriter, err error) {
	var rej *gate.Refusal
	var bad *gate.ClientError
	switch {
	case errors.As(err, &rej):
		hdr := w.Header()
		hdr.Set("Content-Type", "text/plain; charset=utf-8")
		hdr.Set("X-Content-Type-Options", "nosniff")
		hdr.Set("Cache-Control", "no-store")
		hdr.Set("X-Loadshed-Reason", string(rej.Reason))
		if v := rej.RetryAfterHeader(); v != "" {
			hdr.Set("Retry-After", v)
		}
		w.WriteHeader(rej.Status)
		fmt.Fprintf(w, "%d %s: %s\n", rej.Status, http.StatusText(rej.Status), rej.Reason)
	case errors.As(err, &bad) && bad.Status == http.StatusRequestEntityTooLarge:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		fmt.Fprintf(w, "413 Request Entity Too Large: %s\n", bad)
	case errors.As(err, &bad):
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
				for _, name := range pass.StripHeaders() {
					pr.Out.Header.Del(name)
				}
				now := time.Now()
				pass.Forwarding(now)
				if dl := pass.ClientDeadline(); !dl.IsZero() {
					// Forward the remaining deadline, so the upstream can give up in time too.
					left := max(dl.Sub(now), time.Millisecond).Truncate(time.Millisecond)
					if name := pass.TimeoutHeader(); name != "" {
						pr.Out.Header.Set(name, left.String())
					}
					if pass.GRPCTimeout() {
						pr.Out.Header.Set("Grpc-Timeout", strconv.FormatInt(left.Milliseconds(), 10)+"m")
					}
				}
			}
		},
		Transport: transport,
		ModifyResponse: func(res *http.Response) error {
			pass := gate.PassFrom(res.Request.Context())
			if pass == nil {
				return nil
			}
			stream := res.StatusCode == http.StatusSwitchingProtocols || isStream(res.Header.Get("Content-Type"))
			pass.Responded(res.StatusCode, time.Now(), stream)
			if !stream && h.respBuffer > 0 && bufferResponse(res, h.respBuffer, h.respBudget) {
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
			if r.Context().Err() != nil && !errors.Is(r.Context().Err(), context.DeadlineExceeded) {
				// The client went away, or its body stopped at server.readTimeout (net/http cancels
				// the context on a read error). A departed client never sees this answer; a slow
				// one must not get the empty 200 net/http would send if nothing were written.
				fail(metrics.OutcomeCanceled, 0)
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
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				w.Header().Set("Connection", "close")
				w.WriteHeader(http.StatusRequestEntityTooLarge)
				fmt.Fprintf(w, "413 Request Entity Too Large: body over %d bytes\n", tooBig.Limit)
				return
			}
			switch classifyBodyError(bodyErr, false) {
			case bodyMalformed:
				// The client's body broke its own framing: its error, never the upstream's.
				fail(metrics.OutcomeClientError, http.StatusBadRequest)
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				w.Header().Set("Connection", "close")
				w.WriteHeader(http.StatusBadRequest)
				io.WriteString(w, "400 Bad Request: malformed request body\n")
				return
			case bodySlow, bodyGone:
				fail(metrics.OutcomeCanceled, 0)
				w.Header().Set("Connection", "close")
				w.WriteHeader(http.StatusRequestTimeout)
				return
			}
			code, outcome := http.StatusBadGateway, metrics.OutcomeUpstreamError
			var ne net.Error
			if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
				code, outcome = http.StatusGatewayTimeout, metrics.OutcomeUpstreamTimeout
			}
			fail(outcome, code)
			h.log.Debug("upstream failed", "err", err, "status", code)
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

// isStream reports a long-lived response whose duration is not a latency sample.
func isStream(contentType string) bool {
	ct, _, _ := strings.Cut(contentType, ";")
	ct = strings.TrimSpace(strings.ToLower(ct))
	return ct == "text/event-stream" || ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+")
}

// newTransport returns an upstream transport sized for the admission limit: enough idle
// connections per host that every admitted request can reuse one (the default keeps 2).
func newTransport(cfg *config.Config) *http.Transport {
	conns := max(64, 2*cfg.Admission.ConcurrencyHint())
	for _, r := range cfg.Routes {
		if r.Admission != nil {
			conns += 2 * r.Admission.ConcurrencyHint()
		}
	}
	return &http.Transport{
		Proxy:                 nil, // never an environment proxy: the upstream is local
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          conns,
		MaxIdleConnsPerHost:   conns,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: cfg.UpstreamTimeout.D(),
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true, // pass encodings through untouched
		ForceAttemptHTTP2:     false,
	}
}
