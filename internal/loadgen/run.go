package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// stopGrace is how long past the schedule plus Timeout a run may take before its own context
// cancels whatever is left; per-request deadlines normally end it well before.
const stopGrace = time.Second

// ErrFellBehind is returned, with a partial result, when a run stops at its own bound (schedule
// plus Timeout plus a second) because the generator could not keep up with its schedule.
var ErrFellBehind = errors.New("loadgen: the generator fell behind its schedule by more than the timeout")

// maxErrorSamples bounds Result.ErrorSamples.
const maxErrorSamples = 5

// Run sends the requests of c.Schedule to c.Target and summarises what happened. It returns
// when every request has been answered, has failed or has timed out, which is at most c.Timeout
// after the end of the schedule. An error means the configuration is invalid (nothing was sent,
// the result is nil), or ctx ended the run early, or the generator fell so far behind its
// schedule that the run hit its own bound (ErrFellBehind); in the latter two cases the partial
// result is returned with the error, marked invalid.
func Run(ctx context.Context, c Config) (*Result, error) {
	c = c.withDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	offsets, err := c.Schedule.Offsets()
	if err != nil {
		return nil, err
	}
	g := &generator{
		c:       c,
		urls:    map[string]*url.URL{},
		samples: make([]sample, len(offsets)),
		jobs:    make(chan job),
	}
	if c.GRPC != nil {
		addr, err := parseGRPCTarget(c.Target)
		if err != nil {
			return nil, err
		}
		if g.grpc, err = newGRPCCaller(ctx, addr, *c.GRPC, c.MaxInFlight, c.Timeout); err != nil {
			return nil, err
		}
		defer g.grpc.close()
	} else if g.target, err = parseTarget(c.Target); err != nil {
		return nil, err
	}
	client := c.Client
	if client == nil && g.grpc == nil {
		tr := newTransport(c.MaxInFlight, c.Timeout)
		defer tr.CloseIdleConnections()
		client = &http.Client{
			Transport: tr,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		}
	}
	g.client = client
	runCtx, cancel := context.WithTimeout(ctx, c.Schedule.Duration()+c.Timeout+stopGrace)
	defer cancel()
	start := time.Now()
	reached, peak := g.dispatch(runCtx, start, offsets)
	close(g.jobs)
	g.wg.Wait()
	elapsed := time.Since(start)

	measured, samples := offsets[:reached], g.samples[:reached]
	if c.Warmup > 0 {
		k := sort.Search(len(measured), func(i int) bool { return measured[i] >= c.Warmup })
		shifted := make([]time.Duration, len(measured)-k)
		for i, o := range measured[k:] {
			shifted[i] = o - c.Warmup
		}
		measured, samples = shifted, samples[k:]
	}
	r := summarize(c, measured, samples)
	r.Elapsed = elapsed
	r.PeakInFlight = peak
	r.ErrorSamples = g.errSamples
	var runErr error
	if reached < len(offsets) || r.Canceled > 0 || ctx.Err() != nil {
		var reason string
		if runErr = ctx.Err(); runErr != nil {
			reason = fmt.Sprintf("run canceled (%v) after %d of %d requests were offered", runErr, reached, len(offsets))
		} else {
			runErr = ErrFellBehind
			reason = fmt.Sprintf("%v: stopped after %d of %d requests were offered", runErr, reached, len(offsets))
		}
		if r.InvalidReason != "" {
			reason += "; " + r.InvalidReason
		}
		r.Valid, r.InvalidReason = false, reason
	}
	return r, runErr
}

// newTransport returns an HTTP/1.1 transport that keeps up to maxConns idle connections to the
// target, so that a busy run reuses connections instead of opening new ones.
func newTransport(maxConns int, timeout time.Duration) *http.Transport {
	return &http.Transport{
		Proxy: nil, // measure the target, not whatever HTTP_PROXY points at
		DialContext: (&net.Dialer{
			Timeout:   timeout,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:          maxConns,
		MaxIdleConnsPerHost:   maxConns,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   timeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
	}
}

// maxCachedURLs bounds the dispatcher's cache of parsed request URLs.
const maxCachedURLs = 1024

// generator holds the state shared by the dispatcher and its workers. Each request is handed to
// an idle worker, or to a new one while there are fewer than MaxInFlight; workers live until
// the run ends, so their stacks and connections are reused. Each worker writes only the sample
// of the request it holds.
type generator struct {
	c        Config
	client   *http.Client
	target   *url.URL
	grpc     *grpcCaller         // set in a gRPC run, which has no client and no target URL
	urls     map[string]*url.URL // request path -> URL, used by the dispatcher only
	samples  []sample
	jobs     chan job // unbuffered: a send succeeds only when a worker is idle
	workers  int
	inFlight atomic.Int64
	wg       sync.WaitGroup

	errMu      sync.Mutex
	errSamples []string
}

// job is one request handed to a worker.
type job struct {
	due time.Time
	url *url.URL
	req Request
	s   *sample
}

// dispatch hands each request to a worker at its scheduled time and returns how many requests
// it reached (all of them unless ctx ended first) and the peak number in flight.
func (g *generator) dispatch(ctx context.Context, start time.Time, offsets []time.Duration) (reached, peak int) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for i, off := range offsets {
		due := start.Add(off)
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return i, peak
			}
		} else if ctx.Err() != nil {
			return i, peak
		}
		var req Request
		if g.c.Prepare != nil {
			req = g.c.Prepare(i)
		}
		s := &g.samples[i]
		s.tag = req.Tag
		u, err := g.resolve(req)
		if err != nil {
			s.outcome = outcomeBuild
			g.noteError(err)
			continue
		}
		j := job{due: due, url: u, req: req, s: s}
		n := int(g.inFlight.Add(1))
		select {
		case g.jobs <- j:
		default:
			if g.workers == g.c.MaxInFlight {
				g.inFlight.Add(-1)
				s.outcome = outcomeDropped
				continue
			}
			g.workers++
			g.wg.Add(1)
			go g.work(ctx, j)
		}
		peak = max(peak, n)
	}
	return len(offsets), peak
}

// resolve returns the URL of req, checking what Prepare returned. In a gRPC run the URL is
// nil.
func (g *generator) resolve(req Request) (*url.URL, error) {
	if g.grpc != nil {
		return nil, checkGRPCRequest(req)
	}
	if req.Method != "" && !validMethod(req.Method) {
		return nil, fmt.Errorf("Request.Method: invalid method %q", req.Method)
	}
	if req.Path == "" {
		return g.target, nil
	}
	if u := g.urls[req.Path]; u != nil {
		return u, nil
	}
	if !strings.HasPrefix(req.Path, "/") {
		return nil, fmt.Errorf("Request.Path: must start with \"/\", got %q", req.Path)
	}
	ref, err := url.ParseRequestURI(req.Path)
	if err != nil {
		return nil, fmt.Errorf("Request.Path: %w", err)
	}
	u := *g.target
	u.Path, u.RawPath, u.RawQuery, u.Fragment, u.RawFragment = ref.Path, ref.RawPath, ref.RawQuery, "", ""
	if len(g.urls) < maxCachedURLs {
		g.urls[req.Path] = &u
	}
	return &u, nil
}

// validMethod reports whether m is an HTTP token.
func validMethod(m string) bool {
	for _, c := range []byte(m) {
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// work sends j and then every job it receives until the dispatcher closes the channel.
func (g *generator) work(ctx context.Context, j job) {
	defer g.wg.Done()
	for {
		if g.grpc != nil {
			g.grpc.send(ctx, g, j)
		} else {
			g.send(ctx, j)
		}
		g.inFlight.Add(-1)
		var ok bool
		if j, ok = <-g.jobs; !ok {
			return
		}
	}
}

// send performs one request and records it in its sample.
func (g *generator) send(runCtx context.Context, j job) {
	s := j.s
	ctx, cancel := context.WithDeadline(runCtx, j.due.Add(g.c.Timeout))
	defer cancel()
	method := j.req.Method
	if method == "" {
		method = http.MethodGet
	}
	header := j.req.Header
	if header == nil {
		header = http.Header{}
	}
	hreq := (&http.Request{
		Method:     method,
		URL:        j.url,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     header,
		Host:       j.url.Host,
	}).WithContext(ctx)
	if host := header.Get("Host"); host != "" {
		hreq.Host = host // net/http ignores a Host header field on client requests
	}
	if body := j.req.Body; len(body) > 0 {
		hreq.ContentLength = int64(len(body))
		hreq.Body = io.NopCloser(bytes.NewReader(body))
		hreq.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	sent := time.Now()
	s.lateness = sent.Sub(j.due)
	resp, err := g.client.Do(hreq)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	end := time.Now()
	if err != nil {
		switch {
		case runCtx.Err() != nil:
			s.outcome = outcomeCanceled
		case ctx.Err() != nil || isTimeout(err):
			s.outcome = outcomeTimeout
		default:
			s.outcome = outcomeError
			g.noteError(err)
		}
		return
	}
	s.outcome = outcomeAnswered
	s.code = int32(resp.StatusCode)
	s.latency = end.Sub(j.due)
	s.retryAfter = len(resp.Header.Values("Retry-After")) > 0
}

// isTimeout reports whether err is a timeout of the client's own (http.Client.Timeout, dial).
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// noteError keeps the first few distinct error messages.
func (g *generator) noteError(err error) {
	msg := err.Error()
	g.errMu.Lock()
	defer g.errMu.Unlock()
	if len(g.errSamples) >= maxErrorSamples {
		return
	}
	for _, m := range g.errSamples {
		if m == msg {
			return
		}
	}
	g.errSamples = append(g.errSamples, msg)
}
