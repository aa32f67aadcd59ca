package proxy

import (
	"bytes"
	"context"
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
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/loadshed/loadshed/internal/testwait"
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

// holdOne sends a request that g holds upstream until g.release is closed, and returns once the
// upstream has it; the channel receives its status when it ends.
func holdOne(t *testing.T, h *harness, g *valve) <-chan int {
	t.Helper()
	done := make(chan int, 1)
	go func() {
		res, _ := get(t, h.front.URL+"/?wait=1")
		done <- res.StatusCode
	}()
	testwait.Until(t, 5*time.Second, "the first request to reach the upstream", func() bool { return g.waiting.Load() == 1 })
	return done
}

func TestInflightShedsWith503AndRetryAfter(t *testing.T) {
	g := newValve()
	h := start(t, g, "  strategy: inflight\n  inflight: {limit: 1}")
	done := holdOne(t, h, g)
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
	testwait.Until(t, 5*time.Second, "in-flight to return to zero", func() bool { return h.srv.StageStates()[0].InFlight == 0 })
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
	testwait.Until(t, 5*time.Second, "permit release after 504", func() bool { return h.srv.StageStates()[0].InFlight == 0 })
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
	testwait.Until(t, 5*time.Second, "in-flight to return to zero", func() bool { return h.srv.StageStates()[0].InFlight == 0 })
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
	testwait.Until(t, 5*time.Second, "readiness", func() bool {
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
	testwait.Until(t, 5*time.Second, "the request upstream", func() bool { return g.waiting.Load() == 1 })
	p.shutdown()
	testwait.Until(t, 5*time.Second, "readiness off", func() bool {
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
	p := serveProxy(t, proxyYAML(up, "  strategy: none"), Options{DrainToken: testDrainToken})
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
	testwait.Until(t, 5*time.Second, "the idle keep-alive connection closed", func() bool { held, _, _ := p.srv.conns.counts(); return held == 0 })
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
	if res, body := get(t, "http://"+p.admin+"/drain?delay=0s", drainAuth...); res.StatusCode != 200 || body != "drained\n" {
		t.Fatalf("delay=0s: %d %q", res.StatusCode, body)
	}
	for _, q := range []string{"", "?delay=soon", "?delay=-1s", "?delay=1h"} {
		if res, body := get(t, "http://"+p.admin+"/drain"+q, drainAuth...); res.StatusCode != 400 || !strings.HasPrefix(body, "delay: ") {
			t.Errorf("/drain%s: %d %q, want 400 naming delay", q, res.StatusCode, body)
		}
	}
}

// TestDrainWindowHTTP2: in a drain window an HTTP/2 client (a gRPC channel works the same way)
// is told to move by GOAWAY after each answer, rather than keeping its connection until the
// listener closes after the application has exited; outside the window it keeps one.
func TestDrainWindowHTTP2(t *testing.T) {
	up := newUpstream(t, newValve())
	p := serveProxy(t, proxyYAML(up, "  strategy: none"), Options{DrainToken: testDrainToken})
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
	testwait.Until(t, 5*time.Second, "the told connections closed", func() bool { held, _, _ := p.srv.conns.counts(); return held <= 1 })
	endWindow()
	before = dials.Load()
	for range 3 {
		call()
	}
	if n := dials.Load() - before; n > 1 {
		t.Errorf("%d new connections for 3 calls after the window, want at most 1 (kept alive again)", n)
	}
}

// TestDrainLeavesIdleHTTP2ToGoaway: while draining, idle HTTP/1 keep-alive connections are
// closed once quiet, but an idle HTTP/2 connection is not cut without a word: its client could
// be sending a stream on it at that moment and could not tell whether it was served. It stays
// usable, and the shutdown that follows the drain delay tells its client with GOAWAY.
func TestDrainLeavesIdleHTTP2ToGoaway(t *testing.T) {
	up := newUpstream(t, newValve())
	p := serveProxy(t, proxyYAML(up, "  strategy: none", "shutdown: {drainDelay: 300ms, gracePeriod: 1s}"), Options{})

	// What one drain tick does, on one idle connection of each protocol.
	h1 := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	t.Cleanup(h1.CloseIdleConnections)
	var h2dials atomic.Int32
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		h2dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	t.Cleanup(tr.CloseIdleConnections)
	h2 := &http.Client{Transport: tr}
	getOK(t, h1, "http://"+p.data+"/")
	getOK(t, h2, "http://"+p.data+"/")
	idle := func() (h1n, h2n int) {
		p.srv.conns.mu.Lock()
		defer p.srv.conns.mu.Unlock()
		for c := range p.srv.conns.conns {
			switch {
			case c.idleSince.IsZero():
			case c.h2.Load():
				h2n++
			default:
				h1n++
			}
		}
		return h1n, h2n
	}
	testwait.Until(t, 5*time.Second, "both connections idle", func() bool { a, b := idle(); return a == 1 && b == 1 })
	p.srv.conns.closeIdle(0)
	testwait.Until(t, 5*time.Second, "the idle HTTP/1 connection closed", func() bool { held, _, _ := p.srv.conns.counts(); return held <= 1 })
	if a, b := idle(); a != 0 || b != 1 {
		t.Fatalf("after a drain tick: %d idle HTTP/1 and %d idle HTTP/2 connections, want 0 and 1", a, b)
	}
	getOK(t, h2, "http://"+p.data+"/")
	if n := h2dials.Load(); n != 1 {
		t.Fatalf("the HTTP/2 client dialled %d times, want 1: its idle connection was closed", n)
	}
	tr.CloseIdleConnections()

	// The whole shutdown, seen from a raw HTTP/2 connection left idle through the drain delay:
	// its first word from the proxy after the answer is GOAWAY, not the connection's end.
	c := dialH2(t, p.data)
	c.get(t, 1)
	testwait.Until(t, 5*time.Second, "the raw connection idle", func() bool { _, b := idle(); return b == 1 })
	p.shutdown()
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatalf("the connection ended (%v) without GOAWAY", err)
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			if g.ErrCode != http2.ErrCodeNo || g.LastStreamID != 1 {
				t.Fatalf("GOAWAY %v, last stream %d; want NO_ERROR after stream 1", g.ErrCode, g.LastStreamID)
			}
			break
		}
	}
	if err := p.wait(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// rawH2 is an HTTP/2 client connection spoken frame by frame (h2c with prior knowledge).
type rawH2 struct {
	conn net.Conn
	fr   *http2.Framer
}

func dialH2(t *testing.T, addr string) *rawH2 {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(30 * time.Second)) // a hung read fails the test, not the run
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return &rawH2{conn: conn, fr: fr}
}

// get sends GET / on stream id and reads frames until its answer has ended with status 200.
func (c *rawH2) get(t *testing.T, id uint32) {
	t.Helper()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range []hpack.HeaderField{{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "http"},
		{Name: ":authority", Value: "proxy"}, {Name: ":path", Value: "/"}} {
		enc.WriteField(f)
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	dec := hpack.NewDecoder(4096, nil)
	status := ""
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatalf("stream %d: %v", id, err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.fr.WriteSettingsAck()
			}
		case *http2.HeadersFrame:
			if f.StreamID == id {
				fields, err := dec.DecodeFull(f.HeaderBlockFragment())
				if err != nil {
					t.Fatal(err)
				}
				for _, hf := range fields {
					if hf.Name == ":status" {
						status = hf.Value
					}
				}
			}
		case *http2.GoAwayFrame:
			t.Fatalf("stream %d: GOAWAY %v", id, f.ErrCode)
		}
		if f.Header().StreamID == id && f.Header().Flags.Has(http2.FlagDataEndStream) {
			break
		}
	}
	if status != "200" {
		t.Fatalf("stream %d: status %q, want 200", id, status)
	}
}

// openDrainWindow calls GET /drain?delay=4m on p's admin port with testDrainToken, as a native
// sidecar's preStop hook does, and waits until the window is open. The returned func ends the window by leaving
// the call (the hook's caller going away) and waits until it has ended.
func openDrainWindow(t *testing.T, p *running) (end func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+p.admin+"/drain?delay=4m", nil)
		req.Header.Set(drainAuth[0], drainAuth[1])
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
	}()
	testwait.Until(t, 5*time.Second, "the drain window", func() bool { return p.srv.windows.Load() == 1 })
	return func() {
		t.Helper()
		cancel()
		<-done
		testwait.Until(t, 5*time.Second, "the window to end", func() bool { return p.srv.windows.Load() == 0 })
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
