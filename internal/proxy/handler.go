package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/metrics"
	"github.com/loadshed/loadshed/pkg/admission"
)

// handler is the data-port handler: admission, then the reverse proxy.
type handler struct {
	state   atomic.Pointer[runtimeState]
	metrics *metrics.Proxy
	log     *slog.Logger
	proxy   *httputil.ReverseProxy
}

type ctxKey struct{}

// exchange carries per-request facts from the handler into the reverse proxy's hooks.
type exchange struct {
	policy        *policy
	deadline      time.Time
	grpc          bool // the client sent grpc-timeout: forward the remaining time in it too
	upstreamStart time.Time
	headersAt     time.Time
	outcome       string
	status        int
	stream        bool
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	st := h.state.Load()
	p, routeCost := st.match(r.Method, r.URL.Path)
	if r.Method == http.MethodConnect {
		// The proxy forwards requests to its one upstream; it opens no tunnels.
		w.Header().Set("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
		http.Error(w, "405 Method Not Allowed: CONNECT", http.StatusMethodNotAllowed)
		h.metrics.Requests.WithLabelValues(p.route, p.strategy, metrics.OutcomeClientError, "405").Inc()
		return
	}
	start := time.Now()
	req, herr := st.spec.parseRequest(r, start, routeCost)
	if herr != nil {
		// A malformed admission header is the client's mistake: 400 naming the header.
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, "400 Bad Request: %s\n", herr)
		h.metrics.Requests.WithLabelValues(p.route, p.strategy, metrics.OutcomeClientError, "400").Inc()
		return
	}
	if max := st.cfg.Server.MaxBodyBytes; max > 0 {
		if r.ContentLength > max {
			h.refuseTooLarge(w, p, max)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, max)
	}
	if st.clients != nil {
		if rej := st.clients.Check(start, req.Key, req.Cost); rej != nil && !h.dryRun(p, req, rej) {
			h.refuse(w, st, p, req, rej)
			return
		}
	}
	if !req.Deadline.IsZero() {
		// Work whose client will have given up is not started: refuse a request whose remaining
		// time is shorter than the route's typical upstream latency (queueing strategies also
		// add their expected wait, in the strategy).
		if exp := p.latency.value(); !req.Deadline.After(start) || exp > 0 && req.Deadline.Sub(start) < exp {
			rej := &admission.Rejection{Reason: admission.ReasonDeadline, Stage: p.strategy}
			if !h.dryRun(p, req, rej) {
				h.refuse(w, st, p, req, rej)
				return
			}
		}
	}

	var permit admission.Permit
	held := false
	if p.limiter != nil {
		var err error
		if p.dryRun {
			// Shadow mode: learn what the strategy would do, never delay or refuse.
			permit, err = p.limiter.TryAdmit(req)
			var rej *admission.Rejection
			if errors.As(err, &rej) {
				h.dryRun(p, req, rej)
			}
			held = err == nil
		} else {
			permit, err = p.limiter.Admit(r.Context(), req)
			if err != nil {
				var rej *admission.Rejection
				if errors.As(err, &rej) {
					h.refuse(w, st, p, req, rej)
					return
				}
				// The client went away while it waited: no answer, no upstream call.
				h.metrics.Requests.WithLabelValues(p.route, p.strategy, metrics.OutcomeCanceled, "499").Inc()
				return
			}
			held = true
			h.metrics.QueueWait.WithLabelValues(p.route, p.strategy).Observe(permit.Waited.Seconds())
		}
	}

	ex := &exchange{policy: p, outcome: metrics.OutcomeSuccess, deadline: req.Deadline, grpc: r.Header.Get("Grpc-Timeout") != ""}
	defer func() {
		// A panic (http.ErrAbortHandler when the response copy fails) must still release the
		// permit and count the request; it is re-raised for net/http to abort the connection.
		rec := recover()
		if rec != nil {
			if r.Context().Err() != nil {
				ex.outcome = metrics.OutcomeCanceled
			} else if ex.outcome == metrics.OutcomeSuccess || ex.outcome == metrics.OutcomeClientError {
				ex.outcome = metrics.OutcomeUpstreamError
			}
		}
		if held {
			permit.Done(classify(ex))
		}
		code := ex.status
		if code == 0 {
			code = 499
		}
		h.metrics.Requests.WithLabelValues(p.route, p.strategy, ex.outcome, strconv.Itoa(code)).Inc()
		if rec != nil {
			panic(rec)
		}
	}()
	ctx := context.WithValue(r.Context(), ctxKey{}, ex)
	if !req.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, req.Deadline)
		defer cancel()
	}
	h.proxy.ServeHTTP(w, r.WithContext(ctx))
	if !ex.headersAt.IsZero() {
		h.metrics.RequestDuration.WithLabelValues(p.route).Observe(ex.headersAt.Sub(start).Seconds())
	}
}

// dryRun counts a would-be refusal of a dry-run policy and reports whether the request goes on.
func (h *handler) dryRun(p *policy, req admission.Request, rej *admission.Rejection) bool {
	if !p.dryRun {
		return false
	}
	stage := rej.Stage
	if stage == "" {
		stage = p.strategy
	}
	h.metrics.DryRunShed.WithLabelValues(p.route, stage, string(rej.Reason), req.Priority.String()).Inc()
	return true
}

// classify maps how a request ended to what the admission strategy learns from it.
func classify(ex *exchange) admission.Outcome {
	switch {
	case ex.stream:
		return admission.Ignore // long-lived streams say nothing about latency
	case ex.outcome == metrics.OutcomeSuccess:
		return admission.Success
	case ex.outcome == metrics.OutcomeClientError && ex.status != http.StatusTooManyRequests:
		return admission.Ignore
	case ex.outcome == metrics.OutcomeCanceled:
		return admission.Ignore
	}
	return admission.Dropped
}

// refuse answers a shed request: the configured status, Retry-After (except 403) and a short
// body naming the reason.
func (h *handler) refuse(w http.ResponseWriter, st *runtimeState, p *policy, req admission.Request, rej *admission.Rejection) {
	code := statusFor(&st.cfg.StatusCodes, rej.Reason)
	hdr := w.Header()
	hdr.Set("Content-Type", "text/plain; charset=utf-8")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Loadshed-Reason", string(rej.Reason))
	if code != http.StatusForbidden {
		hdr.Set("Retry-After", retryAfterSeconds(rej.RetryAfter))
	}
	w.WriteHeader(code)
	fmt.Fprintf(w, "%d %s: %s\n", code, http.StatusText(code), rej.Reason)
	stage := rej.Stage
	if stage == "" {
		stage = p.strategy
	}
	h.metrics.Shed.WithLabelValues(p.route, stage, string(rej.Reason), req.Priority.String()).Inc()
	h.metrics.Requests.WithLabelValues(p.route, p.strategy, metrics.OutcomeShed, strconv.Itoa(code)).Inc()
}

func (h *handler) refuseTooLarge(w http.ResponseWriter, p *policy, max int64) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Connection", "close")
	w.WriteHeader(http.StatusRequestEntityTooLarge)
	fmt.Fprintf(w, "413 Request Entity Too Large: body over %d bytes\n", max)
	h.metrics.Requests.WithLabelValues(p.route, p.strategy, metrics.OutcomeClientError, "413").Inc()
}

// retryAfterSeconds renders a Retry-After value: whole seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) string {
	s := int64(math.Ceil(d.Seconds()))
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10)
}

func statusFor(c *config.StatusCodes, r admission.Reason) int {
	switch r {
	case admission.ReasonRateLimited:
		return c.RateLimited
	case admission.ReasonQueueFull:
		return c.QueueFull
	case admission.ReasonQueueTimeout:
		return c.QueueTimeout
	case admission.ReasonConcurrencyLimit:
		return c.ConcurrencyLimit
	case admission.ReasonDraining:
		return c.Draining
	case admission.ReasonDeadline:
		return c.Deadline
	case admission.ReasonClientLimited:
		return c.ClientLimited
	case admission.ReasonDenied:
		return c.Denied
	}
	return http.StatusServiceUnavailable
}

// newReverseProxy builds the forwarding half. Rewrite (not Director) pins every request to the
// configured upstream whatever its URL or Host says; hop-by-hop headers are removed by
// httputil; forwarding headers are replaced unless the configuration trusts them.
func (h *handler) newReverseProxy(transport http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			st := h.state.Load()
			if st.cfg.TrustForwardedHeaders {
				// Keep what a trusted ingress said, then append this hop.
				if v := pr.In.Header.Values("X-Forwarded-For"); len(v) > 0 {
					pr.Out.Header["X-Forwarded-For"] = append([]string(nil), v...)
				}
			}
			pr.SetURL(st.upstream)
			pr.SetXForwarded()
			if st.cfg.TrustForwardedHeaders {
				if v := pr.In.Header.Get("X-Forwarded-Proto"); v != "" {
					pr.Out.Header.Set("X-Forwarded-Proto", v)
				}
				if v := pr.In.Header.Get("X-Forwarded-Host"); v != "" {
					pr.Out.Header.Set("X-Forwarded-Host", v)
				}
			}
			if st.cfg.PreserveHost {
				pr.Out.Host = pr.In.Host
			}
			if ex, ok := pr.In.Context().Value(ctxKey{}).(*exchange); ok {
				ex.upstreamStart = time.Now()
				if !ex.deadline.IsZero() {
					// Forward the remaining deadline, so the upstream can give up in time too.
					left := max(ex.deadline.Sub(ex.upstreamStart), time.Millisecond).Truncate(time.Millisecond)
					if name := st.spec.timeoutHeader; name != "" {
						pr.Out.Header.Set(name, left.String())
					}
					if ex.grpc {
						pr.Out.Header.Set("Grpc-Timeout", strconv.FormatInt(left.Milliseconds(), 10)+"m")
					}
				}
			}
		},
		Transport: transport,
		ModifyResponse: func(res *http.Response) error {
			ex, ok := res.Request.Context().Value(ctxKey{}).(*exchange)
			if !ok {
				return nil
			}
			ex.headersAt = time.Now()
			ex.status = res.StatusCode
			switch {
			case res.StatusCode >= 500:
				ex.outcome = metrics.OutcomeUpstreamError
			case res.StatusCode >= 400:
				ex.outcome = metrics.OutcomeClientError
			}
			ex.stream = res.StatusCode == http.StatusSwitchingProtocols || isStream(res.Header.Get("Content-Type"))
			lat := ex.headersAt.Sub(ex.upstreamStart)
			if res.StatusCode < 400 && !ex.stream {
				ex.policy.latency.observe(lat)
			}
			h.metrics.UpstreamLatency.WithLabelValues(ex.policy.route).Observe(lat.Seconds())
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			ex, _ := r.Context().Value(ctxKey{}).(*exchange)
			if ex == nil {
				ex = &exchange{}
			}
			if r.Context().Err() != nil && !errors.Is(r.Context().Err(), context.DeadlineExceeded) {
				// The client went away, or its body stopped at server.readTimeout (net/http cancels
				// the context on a read error). A departed client never sees this answer; a slow
				// one must not get the empty 200 net/http would send if nothing were written.
				ex.outcome = metrics.OutcomeCanceled
				w.Header().Set("Connection", "close")
				w.WriteHeader(http.StatusRequestTimeout)
				return
			}
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				// A streamed (chunked) body outgrew server.maxBodyBytes: the client's fault.
				ex.status, ex.outcome = http.StatusRequestEntityTooLarge, metrics.OutcomeClientError
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
			ex.status, ex.outcome = code, outcome
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
