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
	"net/url"
	"strconv"
	"strings"
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

// runtimeState is everything a reload may replace, swapped atomically.
type runtimeState struct {
	cfg      *config.Config
	upstream *url.URL
	policy   *policy
}

type ctxKey struct{}

// exchange carries per-request facts from the handler into the reverse proxy's hooks.
type exchange struct {
	upstreamStart time.Time
	headersAt     time.Time
	outcome       string
	status        int
	stream        bool
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	st := h.state.Load()
	p := st.policy
	if max := st.cfg.Server.MaxBodyBytes; max > 0 {
		if r.ContentLength > max {
			h.refuseTooLarge(w, r, p, max)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, max)
	}
	req := admission.Request{Priority: admission.Critical, Cost: 1}
	start := time.Now()

	var permit admission.Permit
	if p.limiter != nil {
		var err error
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
		h.metrics.QueueWait.WithLabelValues(p.route, p.strategy).Observe(permit.Waited.Seconds())
	}

	ex := &exchange{outcome: metrics.OutcomeSuccess}
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
		if p.limiter != nil {
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
	h.proxy.ServeHTTP(w, r.WithContext(ctx))
	if !ex.headersAt.IsZero() {
		h.metrics.RequestDuration.WithLabelValues(p.route).Observe(ex.headersAt.Sub(start).Seconds())
	}
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

func (h *handler) refuseTooLarge(w http.ResponseWriter, r *http.Request, p *policy, max int64) {
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
			st := h.state.Load()
			h.metrics.UpstreamLatency.WithLabelValues(st.policy.route).Observe(ex.headersAt.Sub(ex.upstreamStart).Seconds())
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			ex, _ := r.Context().Value(ctxKey{}).(*exchange)
			if ex == nil {
				ex = &exchange{}
			}
			if r.Context().Err() != nil && !errors.Is(r.Context().Err(), context.DeadlineExceeded) {
				ex.outcome = metrics.OutcomeCanceled
				return // the client is gone; nothing to answer
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
		ErrorLog: slog.NewLogLogger(h.log.Handler(), slog.LevelDebug),
	}
}

// isStream reports a long-lived response whose duration is not a latency sample.
func isStream(contentType string) bool {
	ct, _, _ := strings.Cut(contentType, ";")
	ct = strings.TrimSpace(strings.ToLower(ct))
	return ct == "text/event-stream" || ct == "application/grpc" || strings.HasPrefix(ct, "application/grpc+")
}

// newTransport returns an upstream transport sized for the admission limit: enough idle
// connections per host that every admitted request can reuse one (the default keeps 2).
func newTransport(cfg *config.Config) *http.Transport {
	conns := max(64, 2*concurrencyHint(&cfg.Admission))
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

// concurrencyHint estimates how many requests the strategy lets through at once.
func concurrencyHint(a *config.Admission) int {
	hint := 0
	add := func(tb *config.TokenBucket, lb *config.LeakyBucket, bq *config.BoundedQueue, in *config.Inflight) {
		switch {
		case in != nil:
			hint = max(hint, int(in.Limit))
		case bq != nil:
			hint = max(hint, int(bq.Concurrency))
		case tb != nil:
			hint = max(hint, tb.Burst)
		case lb != nil:
			hint = max(hint, int(lb.Depth))
		}
	}
	switch a.Strategy {
	case config.StrategyChain:
		for _, s := range a.Chain {
			add(s.TokenBucket, s.LeakyBucket, s.BoundedQueue, s.Inflight)
		}
	case config.StrategyInflight:
		add(nil, nil, nil, a.Inflight)
	case config.StrategyBoundedQ:
		add(nil, nil, a.BoundedQueue, nil)
	case config.StrategyTokenBucket:
		add(a.TokenBucket, nil, nil, nil)
	case config.StrategyLeakyBucket:
		add(nil, a.LeakyBucket, nil, nil)
	default:
		hint = 128
	}
	return min(hint, 4096)
}
