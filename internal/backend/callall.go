package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http/httpguts"
)

// Frontend mode defaults and bounds.
const (
	// DefaultCallTimeout bounds each leg of a user request.
	DefaultCallTimeout = 2 * time.Second
	// DefaultUserHeader is the user id header passed on to every leg.
	DefaultUserHeader = "X-User-ID"
	// DefaultCallConns is the default bound on connections to each leg's host.
	DefaultCallConns = 512
	// MaxLegs bounds the URLs of CallAll.
	MaxLegs = 64
	// MaxCallConns bounds CallAll.Conns.
	MaxCallConns = 10000
	// maxLegBody is how much of a leg's answer is read; the rest closes its connection.
	maxLegBody = 1 << 20
)

// Leg results, the values of the result label of backend_frontend_legs_total.
const (
	LegOK      = "ok"      // 2xx, and the user request succeeded
	LegWasted  = "wasted"  // 2xx, but another leg failed the user request: wasted work
	LegRefused = "refused" // 429 or 503: refused (shed) by the service
	LegFailed  = "failed"  // any other status, a transport error or the call timeout
)

// User request results, the values of the result label of backend_frontend_requests_total.
const (
	UserOK     = "ok"
	UserFailed = "failed"
)

// propagated are the request headers every leg gets from the user request, besides the user
// id header: the W3C trace context and baggage.
var propagated = []string{"Traceparent", "Tracestate", "Baggage"}

// CallAll configures the frontend mode: every request on the data port is answered by calling
// every URL at once (GET). The answer is 200 when every leg answered 2xx, else 503 with a
// Retry-After when a leg was refused (429 or 503), else 502. No leg is cancelled because another
// failed: the legs that answered 2xx for a failed user request are the wasted work this mode
// measures. The legs of a request whose client went away are cancelled.
type CallAll struct {
	// URLs are the legs, http or https, at most MaxLegs, no duplicates.
	URLs []string
	// Timeout bounds each leg (and so the user request); 0 means DefaultCallTimeout.
	Timeout time.Duration
	// UserHeader names the user id header passed on to every leg with traceparent, tracestate
	// and baggage; "" means DefaultUserHeader.
	UserHeader string
	// Conns bounds the connections to each leg's host (kept alive and reused); a leg that finds
	// them all busy waits for one within its Timeout. 0 means DefaultCallConns.
	Conns int
}

func (c CallAll) withDefaults() CallAll {
	if c.Timeout == 0 {
		c.Timeout = DefaultCallTimeout
	}
	if c.UserHeader == "" {
		c.UserHeader = DefaultUserHeader
	}
	if c.Conns == 0 {
		c.Conns = DefaultCallConns
	}
	return c
}

// Validate reports every problem as *FieldError values (fields callAll, callTimeout,
// userHeader, callConns) joined with errors.Join, or nil. Zero fields with defaults are valid.
func (c CallAll) Validate() error {
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, &FieldError{field, fmt.Sprintf(format, a...)})
	}
	switch {
	case len(c.URLs) == 0:
		bad("callAll", "at least one URL is required")
	case len(c.URLs) > MaxLegs:
		bad("callAll", "at most %d URLs, got %d", MaxLegs, len(c.URLs))
	}
	seen := map[string]bool{}
	for i, raw := range c.URLs {
		if seen[raw] {
			bad("callAll", "URL %d (%q) is listed twice", i+1, raw)
			continue
		}
		seen[raw] = true
		u, err := url.Parse(raw)
		switch {
		case raw == "":
			bad("callAll", "URL %d is empty", i+1)
		case err != nil:
			bad("callAll", "URL %d (%q) does not parse: %v", i+1, raw, err)
		case u.Scheme != "http" && u.Scheme != "https":
			bad("callAll", "URL %d (%q): scheme must be http or https", i+1, raw)
		case u.Host == "":
			bad("callAll", "URL %d (%q) has no host", i+1, raw)
		}
	}
	if c.Timeout < 0 {
		bad("callTimeout", "must be > 0, got %s", c.Timeout)
	}
	if c.UserHeader != "" && !httpguts.ValidHeaderFieldName(c.UserHeader) {
		bad("userHeader", "not a valid header name: %q", c.UserHeader)
	}
	if c.Conns < 0 || c.Conns > MaxCallConns {
		bad("callConns", "must be in [1, %d], got %d", MaxCallConns, c.Conns)
	}
	return errors.Join(errs...)
}

// ParseURLList splits a comma-separated list of URLs, trimming spaces; empty items are kept
// (as "") so that Validate names them.
func ParseURLList(s string) []string {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	parts := strings.Split(s, ",")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
	}
	return parts
}

// frontend answers user requests by calling every leg at once.
type frontend struct {
	cfg    CallAll
	client *http.Client
	tr     *http.Transport
	// base ends when the Server closes: every leg still running is then cancelled.
	base   context.Context
	cancel context.CancelFunc

	requests *prometheus.CounterVec // result
	legs     *prometheus.CounterVec // leg, result
}

func newFrontend(c CallAll, r prometheus.Registerer) (*frontend, error) {
	c = c.withDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	tr := &http.Transport{
		Proxy: nil, // call the legs, not whatever HTTP_PROXY points at
		DialContext: (&net.Dialer{
			Timeout:   c.Timeout,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:          c.Conns * len(c.URLs),
		MaxIdleConnsPerHost:   c.Conns,
		MaxConnsPerHost:       c.Conns,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   c.Timeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}
	f := &frontend{
		cfg: c,
		tr:  tr,
		client: &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "backend_frontend_requests_total",
			Help: "User requests the frontend (--call-all) answered, by result: ok (every leg answered 2xx) or failed.",
		}, []string{"result"}),
		legs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "backend_frontend_legs_total",
			Help: "Legs the frontend (--call-all) called, by leg URL and result: ok, wasted (2xx for a user request another leg failed), refused (429/503) or failed.",
		}, []string{"leg", "result"}),
	}
	f.base, f.cancel = context.WithCancel(context.Background())
	for _, res := range []string{UserOK, UserFailed} {
		f.requests.WithLabelValues(res)
	}
	for _, u := range c.URLs {
		for _, res := range []string{LegOK, LegWasted, LegRefused, LegFailed} {
			f.legs.WithLabelValues(u, res)
		}
	}
	for _, col := range []prometheus.Collector{f.requests, f.legs} {
		if err := r.Register(col); err != nil {
			f.cancel()
			return nil, err
		}
	}
	return f, nil
}

// close cancels every running leg and closes idle connections.
func (f *frontend) close() {
	f.cancel()
	f.tr.CloseIdleConnections()
}

// legAnswer is what one leg got.
type legAnswer struct {
	status     int // 0 on a transport error or timeout
	retryAfter string
	err        error
}

func (a legAnswer) result() string {
	switch {
	case a.status >= 200 && a.status < 300:
		return LegOK
	case a.status == http.StatusTooManyRequests || a.status == http.StatusServiceUnavailable:
		return LegRefused
	default:
		return LegFailed
	}
}

func (f *frontend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Like the workers' mode, read the request before calling out; the error does not matter.
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, MaxRequestBody))

	// The legs end with the call timeout, when the client goes away, or when the Server closes;
	// never because another leg failed.
	ctx, cancel := context.WithTimeout(r.Context(), f.cfg.Timeout)
	defer cancel()
	stop := context.AfterFunc(f.base, cancel)
	defer stop()

	hdr := make(http.Header, len(propagated)+1)
	for _, name := range append(propagated, f.cfg.UserHeader) {
		if vs := r.Header.Values(name); len(vs) > 0 {
			hdr[http.CanonicalHeaderKey(name)] = vs
		}
	}
	answers := make([]legAnswer, len(f.cfg.URLs))
	var wg sync.WaitGroup
	for i, u := range f.cfg.URLs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = f.call(ctx, u, hdr)
		}()
	}
	wg.Wait()

	ok, refused := true, false
	retryAfter := 0
	for _, a := range answers {
		switch a.result() {
		case LegOK:
		case LegRefused:
			ok, refused = false, true
			if n, err := strconv.Atoi(strings.TrimSpace(a.retryAfter)); err == nil && n > retryAfter {
				retryAfter = n
			}
		default:
			ok = false
		}
	}
	var b strings.Builder
	for i, a := range answers {
		res := a.result()
		if res == LegOK && !ok {
			res = LegWasted
		}
		f.legs.WithLabelValues(f.cfg.URLs[i], res).Inc()
		if !ok {
			if a.err != nil {
				fmt.Fprintf(&b, "leg %s: %s: %v\n", f.cfg.URLs[i], res, a.err)
			} else {
				fmt.Fprintf(&b, "leg %s: %s: status %d\n", f.cfg.URLs[i], res, a.status)
			}
		}
	}
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	switch {
	case ok:
		f.requests.WithLabelValues(UserOK).Inc()
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "ok\n")
		return
	case refused:
		h.Set("Retry-After", strconv.Itoa(max(retryAfter, 1)))
		w.WriteHeader(http.StatusServiceUnavailable)
	default:
		w.WriteHeader(http.StatusBadGateway)
	}
	f.requests.WithLabelValues(UserFailed).Inc()
	_, _ = io.WriteString(w, b.String())
}

// call GETs one leg with the propagated headers and reads its answer.
func (f *frontend) call(ctx context.Context, u string, hdr http.Header) legAnswer {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return legAnswer{err: err}
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return legAnswer{err: err}
	}
	defer resp.Body.Close()
	// Read the answer so the connection is reused; an answer cut short fails the leg.
	if _, err := io.Copy(io.Discard, io.LimitReader(resp.Body, maxLegBody)); err != nil {
		return legAnswer{err: fmt.Errorf("reading the answer (status %d): %w", resp.StatusCode, err)}
	}
	return legAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
}
