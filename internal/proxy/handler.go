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
	maxBody  int64                   // server.maxBodyBytes, fixed at start
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		// The proxy forwards requests to its one upstream; it opens no tunnels.
		w.Header().Set("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
		http.Error(w, "405 Method Not Allowed: CONNECT", http.StatusMethodNotAllowed)
		h.gate.Count(metrics.DoorHTTP, r.Method, r.URL.Path, metrics.OutcomeClientError, http.StatusMethodNotAllowed)
		return
	}
	pass, err := h.gate.Admit(r.Context(), &gate.Request{
		Door: metrics.DoorHTTP, Method: r.Method, Path: r.URL.Path, Header: r.Header,
		Peer: r.RemoteAddr, ContentLength: r.ContentLength,
	}, nil)
	if err != nil {
		h.refuse(w, err)
		return
	}
	if h.maxBody > 0 {
		r.Body = http.MaxBytesReader(w, r.Body, h.maxBody)
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
	h.proxy.ServeHTTP(w, r.WithContext(ctx))
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
			if pass := gate.PassFrom(res.Request.Context()); pass != nil {
				stream := res.StatusCode == http.StatusSwitchingProtocols || isStream(res.Header.Get("Content-Type"))
				pass.Responded(res.StatusCode, time.Now(), stream)
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
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				// A streamed (chunked) body outgrew server.maxBodyBytes: the client's fault.
				fail(metrics.OutcomeClientError, http.StatusRequestEntityTooLarge)
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				w.Header().Set("Connection", "close")
				w.WriteHeader(http.StatusRequestEntityTooLarge)
				fmt.Fprintf(w, "413 Request Entity Too Large: body over %d bytes\n", tooBig.Limit)
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
