package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// valve is an upstream whose requests block until released, so tests control concurrency
// without timing guesses.
type valve struct {
	hits    atomic.Int64
	waiting atomic.Int64
	release chan struct{}
	last    atomic.Pointer[http.Request]
	delay   atomic.Int64 // service time of every request, nanoseconds
}

func newValve() *valve { return &valve{release: make(chan struct{})} }

func (g *valve) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.hits.Add(1)
	g.last.Store(r.Clone(context.Background()))
	if d := g.delay.Load(); d > 0 {
		time.Sleep(time.Duration(d)) // the upstream's own service time, not a test wait
	}
	if r.URL.Query().Get("wait") != "" {
		g.waiting.Add(1)
		select {
		case <-g.release:
		case <-r.Context().Done():
		}
		g.waiting.Add(-1)
	}
	if s := r.URL.Query().Get("status"); s != "" {
		code, _ := strconv.Atoi(s)
		w.WriteHeader(code)
	}
	io.WriteString(w, "hello from upstream\n")
}

func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func newUpstream(t *testing.T, h http.Handler) string {
	up := httptest.NewServer(h)
	t.Cleanup(up.Close)
	return up.URL
}

func newFront(t *testing.T, s *Server) string {
	front := httptest.NewServer(s.Handler())
	t.Cleanup(front.Close)
	return front.URL
}

// harness is a proxy in front of an httptest upstream.
type harness struct {
	*running
	upstream *httptest.Server
}

// start serves upstream and a proxy with the given admission block (and extra top-level YAML)
// in front of it.
func start(t *testing.T, upstream http.Handler, admissionYAML string, extra ...string) *harness {
	t.Helper()
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	return &harness{running: frontProxy(t, proxyYAML(up.URL, admissionYAML, extra...)), upstream: up}
}

// proxyYAML is a configuration file for upstream with an admission block and extra top-level
// keys, listening on loopback.
func proxyYAML(upstream, admissionYAML string, extra ...string) string {
	return fmt.Sprintf("upstream: %s\nlisten: 127.0.0.1:0\nadminListen: 127.0.0.1:0\n%s\nadmission:\n%s\n", upstream, strings.Join(extra, "\n"), admissionYAML)
}

func get(t *testing.T, url string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, string(b)
}

func TestInflightShedsWith503AndRetryAfter(t *testing.T) {
	g := newValve()
	h := start(t, g, "  strategy: inflight\n  inflight: {limit: 1}")
	done := make(chan int)
	go func() {
		res, _ := get(t, h.front.URL+"/?wait=1")
		done <- res.StatusCode
	}()
	until(t, "the first request to reach the upstream", func() bool { return g.waiting.Load() == 1 })
	res, body := get(t, h.front.URL+"/")
	if res.StatusCode != 503 || res.Header.Get("Retry-After") == "" || !strings.Contains(body, "concurrency_limit") {
		t.Fatalf("got %d Retry-After=%q body %q, want 503 with Retry-After naming concurrency_limit", res.StatusCode, res.Header.Get("Retry-After"), body)
	}
	if n, err := strconv.Atoi(res.Header.Get("Retry-After")); err != nil || n < 1 {
		t.Fatalf("Retry-After %q must be whole seconds >= 1", res.Header.Get("Retry-After"))
	}
	close(g.release)
	if code := <-done; code != 200 {
		t.Fatalf("admitted request got %d", code)
	}
	if g.hits.Load() != 1 {
		t.Fatalf("upstream saw %d requests; the shed one must not reach it", g.hits.Load())
	}
	until(t, "in-flight to return to zero", func() bool { return h.srv.StageStates()[0].InFlight == 0 })
	if got := testutil.ToFloat64(h.srv.gate.Metrics().Shed.WithLabelValues("default", "inflight", "concurrency_limit", "critical", "http")); got != 1 {
		t.Fatalf("shed metric = %v, want 1", got)
	}
	if got := testutil.ToFloat64(h.srv.gate.Metrics().Requests.WithLabelValues("default", "inflight", "http", "success", "200")); got != 1 {
		t.Fatalf("success metric = %v, want 1", got)
	}
}

func TestTokenBucketSheds429(t *testing.T) {
	h := start(t, newValve(), "  strategy: token-bucket\n  tokenBucket: {rate: 0.001, burst: 2}")
	for i := range 2 {
		if res, _ := get(t, h.front.URL+"/"); res.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, res.StatusCode)
		}
	}
	res, body := get(t, h.front.URL+"/")
	if res.StatusCode != 429 || !strings.Contains(body, "rate_limited") {
		t.Fatalf("got %d %q, want 429 rate_limited", res.StatusCode, body)
	}
	// One token takes 1000 s at 0.001/s.
	if ra := res.Header.Get("Retry-After"); ra != "1000" {
		t.Fatalf("Retry-After = %q, want 1000", ra)
	}
}

func TestUpstreamFailuresAre502And504NotSheds(t *testing.T) {
	// A port with nothing listening: connection refused -> 502.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close()
	front := frontProxy(t, "upstream: "+dead+"\nadmission: {strategy: inflight, inflight: {limit: 4}}\nupstreamTimeout: 200ms\n").front
	res, _ := get(t, front.URL+"/")
	if res.StatusCode != 502 || res.Header.Get("Retry-After") != "" {
		t.Fatalf("refused upstream: %d (Retry-After %q), want 502 without Retry-After", res.StatusCode, res.Header.Get("Retry-After"))
	}
	// An upstream that never answers: 504 after upstreamTimeout.
	g := newValve()
	defer close(g.release)
	h := start(t, g, "  strategy: inflight\n  inflight: {limit: 4}", "upstreamTimeout: 200ms")
	res, _ = get(t, h.front.URL+"/?wait=1")
	if res.StatusCode != 504 {
		t.Fatalf("hung upstream: %d, want 504", res.StatusCode)
	}
	until(t, "permit release after 504", func() bool { return h.srv.StageStates()[0].InFlight == 0 })
	if got := testutil.ToFloat64(h.srv.gate.Metrics().Requests.WithLabelValues("default", "inflight", "http", "upstream_timeout", "504")); got != 1 {
		t.Fatalf("upstream_timeout metric = %v", got)
	}
}

func TestForwardsOnlyToUpstreamWithDeliberateHeaders(t *testing.T) {
	g := newValve()
	h := start(t, g, "  strategy: none")
	// An absolute URL naming another host, a spoofed X-Forwarded-For, a hop-by-hop header.
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "GET http://evil.example/steal HTTP/1.1\r\nHost: evil.example\r\nX-Forwarded-For: 6.6.6.6\r\nConnection: close, X-Secret\r\nX-Secret: hop\r\n\r\n")
	b, _ := io.ReadAll(conn)
	if !strings.HasPrefix(string(b), "HTTP/1.1 200") {
		t.Fatalf("response %q", b)
	}
	r := g.last.Load()
	if r == nil || r.URL.Path != "/steal" {
		t.Fatalf("upstream did not get the request: %+v", r)
	}
	if got := r.Header.Get("X-Forwarded-For"); got != "127.0.0.1" {
		t.Fatalf("X-Forwarded-For = %q: an untrusted client's value must be replaced", got)
	}
	if r.Header.Get("X-Secret") != "" {
		t.Fatal("a header named in Connection is hop-by-hop and must not be forwarded")
	}
	if r.Host != "evil.example" {
		t.Fatalf("Host = %q; preserveHost forwards the client's Host to the one upstream", r.Host)
	}
}

func TestTrustedForwardedHeadersAppend(t *testing.T) {
	g := newValve()
	h := start(t, g, "  strategy: none", "trustForwardedHeaders: true")
	get(t, h.front.URL+"/", "X-Forwarded-For", "10.0.0.1", "X-Forwarded-Proto", "https")
	r := g.last.Load()
	if got := r.Header.Get("X-Forwarded-For"); got != "10.0.0.1, 127.0.0.1" {
		t.Fatalf("X-Forwarded-For = %q", got)
	}
	if got := r.Header.Get("X-Forwarded-Proto"); got != "https" {
		t.Fatalf("X-Forwarded-Proto = %q", got)
	}
}

func TestClientLeavingTheQueueCostsNoUpstreamCall(t *testing.T) {
	g := newValve()
	h := start(t, g, "  strategy: bounded-queue\n  boundedQueue: {concurrency: 1, depth: 4, maxWait: 1m}")
	first := make(chan int)
	go func() {
		res, _ := get(t, h.front.URL+"/?wait=1")
		first <- res.StatusCode
	}()
	until(t, "the first request upstream", func() bool { return g.waiting.Load() == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "GET", h.front.URL+"/", nil)
		_, err := http.DefaultClient.Do(req)
		errc <- err
	}()
	until(t, "the second request to queue", func() bool { return h.srv.StageStates()[0].QueueDepth == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client error %v", err)
	}
	until(t, "the queue to empty", func() bool { return h.srv.StageStates()[0].QueueDepth == 0 })
	close(g.release)
	<-first
	until(t, "in-flight to return to zero", func() bool { return h.srv.StageStates()[0].InFlight == 0 })
	if g.hits.Load() != 1 {
		t.Fatalf("upstream calls = %d, want 1: the abandoned request must not be forwarded", g.hits.Load())
	}
}

func TestAbortedUpstreamBodyReleasesPermit(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(200)
		io.WriteString(w, "partial")
		w.(http.Flusher).Flush()
		conn, _, _ := http.NewResponseController(w).Hijack()
		conn.Close() // reset mid-body
	})
	h := start(t, up, "  strategy: inflight\n  inflight: {limit: 2}")
	res, err := http.Get(h.front.URL + "/")
	if err == nil {
		_, err = io.ReadAll(res.Body)
		res.Body.Close()
	}
	if err == nil {
		t.Fatal("the client must see the truncated response as an error")
	}
	until(t, "in-flight to return to zero", func() bool { return h.srv.StageStates()[0].InFlight == 0 })
	if got := testutil.ToFloat64(h.srv.gate.Metrics().Requests.WithLabelValues("default", "inflight", "http", "upstream_error", "200")); got != 1 {
		t.Fatalf("upstream_error metric = %v, want 1", got)
	}
}

func TestBodyLimit(t *testing.T) {
	h := start(t, newValve(), "  strategy: none", "server: {maxBodyBytes: 10}")
	res, err := http.Post(h.front.URL+"/", "text/plain", strings.NewReader(strings.Repeat("x", 100)))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 413 {
		t.Fatalf("status %d, want 413", res.StatusCode)
	}
}

// TestGracefulShutdown: after cancel, /readyz fails at once while serving continues through the
// drain delay; then an in-flight request still completes and Serve returns nil.
func TestGracefulShutdown(t *testing.T) {
	g := newValve()
	up := httptest.NewServer(g)
	defer up.Close()
	p := serveProxy(t, "upstream: "+up.URL+"\nlisten: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nshutdown: {drainDelay: 300ms, gracePeriod: 5s}\nadmission: {strategy: inflight, inflight: {limit: 4}}\n", Options{})
	data, admin := p.data, p.admin
	until(t, "readiness", func() bool {
		res, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == 200
	})
	inflight := make(chan int)
	go func() {
		res, err := http.Get("http://" + data + "/?wait=1")
		if err != nil {
			inflight <- -1
			return
		}
		res.Body.Close()
		inflight <- res.StatusCode
	}()
	until(t, "the request upstream", func() bool { return g.waiting.Load() == 1 })
	p.shutdown()
	until(t, "readiness off", func() bool {
		res, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == 503
	})
	// Still serving during the drain delay.
	var once sync.Once
	res, err := http.Get("http://" + data + "/")
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("during drain delay: %v %v", res, err)
	}
	res.Body.Close()
	once.Do(func() { close(g.release) })
	if code := <-inflight; code != 200 {
		t.Fatalf("in-flight request got %d, want 200", code)
	}
	if err := p.wait(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// TestDrainWindow: GET /drain (a native sidecar's preStop hook, from the application container)
// makes answers close their connections and closes idle keep-alive connections for its delay,
// without touching readiness; the window ends with the call, and keep-alive comes back.
func TestDrainWindow(t *testing.T) {
	up := newUpstream(t, newValve())
	p := serveProxy(t, proxyYAML(up, "  strategy: none"), Options{})
	// One keep-alive connection, idle in the client's pool.
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	t.Cleanup(client.CloseIdleConnections)
	closes := func() bool {
		t.Helper()
		return getOK(t, client, "http://"+p.data+"/").Close // the answer said Connection: close
	}
	if closes() {
		t.Fatal("before the window: Connection: close")
	}
	held, _, _ := p.srv.conns.counts()
	if held != 1 {
		t.Fatalf("%d connections held, want the client's one", held)
	}

	endWindow := openDrainWindow(t, p)
	// The idle connection is closed once quiet, not left for the client to send on.
	until(t, "the idle keep-alive connection closed", func() bool { held, _, _ := p.srv.conns.counts(); return held == 0 })
	if !closes() {
		t.Fatal("in the window: no Connection: close")
	}
	res, _ := get(t, "http://"+p.admin+"/readyz")
	if res.StatusCode != 200 {
		t.Fatalf("readiness %d in the window: a drain window leaves readiness alone", res.StatusCode)
	}
	// The window ends with its call (the hook's caller went away).
	endWindow()
	if closes() {
		t.Fatal("after the window: Connection: close, want keep-alive")
	}

	// A zero delay answers at once; a bad one is refused, naming the parameter.
	if res, body := get(t, "http://"+p.admin+"/drain?delay=0s"); res.StatusCode != 200 || body != "drained\n" {
		t.Fatalf("delay=0s: %d %q", res.StatusCode, body)
	}
	for _, q := range []string{"", "?delay=soon", "?delay=-1s", "?delay=1h"} {
		if res, body := get(t, "http://"+p.admin+"/drain"+q); res.StatusCode != 400 || !strings.HasPrefix(body, "delay: ") {
			t.Errorf("/drain%s: %d %q, want 400 naming delay", q, res.StatusCode, body)
		}
	}
}

// TestDrainWindowHTTP2: in a drain window an HTTP/2 client (a gRPC channel works the same way)
// is told to move by GOAWAY after each answer, rather than keeping its connection until the
// listener closes after the application has exited; outside the window it keeps one.
func TestDrainWindowHTTP2(t *testing.T) {
	up := newUpstream(t, newValve())
	p := serveProxy(t, proxyYAML(up, "  strategy: none"), Options{})
	var dials atomic.Int32
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true) // h2c with prior knowledge, as gRPC clients speak it
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	call := func() {
		t.Helper()
		if res := getOK(t, client, "http://"+p.data+"/"); res.ProtoMajor != 2 {
			t.Fatalf("%s, want HTTP/2", res.Proto)
		}
	}
	for range 3 {
		call()
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d connections for 3 calls before the window, want 1", n)
	}

	endWindow := openDrainWindow(t, p)
	// Every answer sends GOAWAY on its connection. A call the client sends before it has read
	// the GOAWAY is still served there, so a connection carries at most two: six calls need at
	// least three connections (the window's first call still uses the one from before).
	before := dials.Load()
	for range 6 {
		call()
	}
	if n := dials.Load() - before; n < 3 {
		t.Errorf("%d new connections for 6 calls in the window, want at least 3 (GOAWAY after each answer)", n)
	}
	// The connections told to go are closed by the proxy, not left open.
	until(t, "the told connections closed", func() bool { held, _, _ := p.srv.conns.counts(); return held <= 1 })
	endWindow()
	before = dials.Load()
	for range 3 {
		call()
	}
	if n := dials.Load() - before; n > 1 {
		t.Errorf("%d new connections for 3 calls after the window, want at most 1 (kept alive again)", n)
	}
}

// openDrainWindow calls GET /drain?delay=4m on p's admin port, as a native sidecar's preStop
// hook does, and waits until the window is open. The returned func ends the window by leaving
// the call (the hook's caller going away) and waits until it has ended.
func openDrainWindow(t *testing.T, p *running) (end func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+p.admin+"/drain?delay=4m", nil)
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
	}()
	until(t, "the drain window", func() bool { return p.srv.h.windows.Load() == 1 })
	return func() {
		t.Helper()
		cancel()
		<-done
		until(t, "the window to end", func() bool { return p.srv.h.windows.Load() == 0 })
	}
}

// getOK GETs url with client, reads the answer's body to its end, and fails the test unless the
// status is 200.
func getOK(t *testing.T, client *http.Client, url string) *http.Response {
	t.Helper()
	res, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("%s: status %d, want 200", url, res.StatusCode)
	}
	return res
}
