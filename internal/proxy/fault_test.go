package proxy

// Fault injection on loopback: an upstream that refuses connections, resets, hangs, slows down
// or restarts; clients that leave while queued, while the upstream works and mid-body; oversized
// requests. Each test asserts what the client sees and what the proxy keeps (permits, queues,
// the adaptive limit, metrics). Nothing here depends on how fast the machine is: tests wait on
// conditions with a bounded deadline and compare with configured values, not wall-clock guesses.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/loadshed/loadshed/internal/testwait"
)

// Upstream behaviours a flakyUpstream can be switched to.
const (
	upOK        int32 = iota // answer 200 after the configured delay
	upReset                  // close the connection before any response
	upResetBody              // send headers and part of the body, then close the connection
	upHang                   // never answer; return when the proxy gives up on the request
)

// flakyUpstream is an upstream on a fixed loopback address whose behaviour a test switches at
// run time, and which can go away (connection refused) and come back on the same address.
type flakyUpstream struct {
	t     *testing.T
	addr  string
	mode  atomic.Int32
	delay atomic.Int64 // service time in upOK, nanoseconds
	hits  atomic.Int64
	// aborted counts requests the upstream saw cancelled by the proxy before it answered.
	aborted atomic.Int64

	mu  sync.Mutex
	srv *http.Server
}

func newFlakyUpstream(t *testing.T) *flakyUpstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &flakyUpstream{t: t, addr: ln.Addr().String()}
	u.serve(ln)
	t.Cleanup(u.stop)
	return u
}

func (u *flakyUpstream) url() string { return "http://" + u.addr }

func (u *flakyUpstream) serve(ln net.Listener) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.srv = &http.Server{Handler: http.HandlerFunc(u.handle), ReadHeaderTimeout: 10 * time.Second}
	go u.srv.Serve(ln)
}

// stop closes the listener and every connection: requests in progress are cut off and new
// connections are refused.
func (u *flakyUpstream) stop() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.srv != nil {
		u.srv.Close()
		u.srv = nil
	}
}

func (u *flakyUpstream) handle(w http.ResponseWriter, r *http.Request) {
	u.hits.Add(1)
	switch u.mode.Load() {
	case upReset:
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			c.Close()
		}
	case upResetBody:
		w.Header().Set("Content-Length", "100000")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "partial")
		http.NewResponseController(w).Flush()
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			c.Close()
		}
	case upHang:
		<-r.Context().Done()
		u.aborted.Add(1)
	default:
		select {
		case <-time.After(time.Duration(u.delay.Load())): // the upstream's own service time
			io.WriteString(w, "ok\n")
		case <-r.Context().Done():
			u.aborted.Add(1)
		}
	}
}

// faultProxy builds a proxy for upstream with the given admission block and extra top-level
// YAML, serving its data handler on an httptest server.
func faultProxy(t *testing.T, upstream, admissionYAML string, extra ...string) (*Server, string, *prometheus.Registry) {
	t.Helper()
	p := frontProxy(t, proxyYAML(upstream, admissionYAML, extra...))
	return p.srv, p.front.URL, p.reg
}

// answer is what one client request got.
type answer struct {
	code       int
	reason     string // X-Loadshed-Reason: set on sheds only
	retryAfter string
	err        error // transport error, including a truncated body
	latency    time.Duration
}

// tally collects answers from concurrent clients.
type tally struct {
	mu      sync.Mutex
	answers []answer
}

func (ta *tally) add(a answer) {
	ta.mu.Lock()
	ta.answers = append(ta.answers, a)
	ta.mu.Unlock()
}

func (ta *tally) take() []answer {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	out := ta.answers
	ta.answers = nil
	return out
}

// TestFaultHungUpstreamDoesNotBuildAQueue: behind a bounded queue, an upstream that never answers
// holds only the admitted requests (504 after upstreamTimeout); waiters leave at maxWait (503
// queue_timeout) and the rest are refused at once (503 queue_full): nothing waits longer than its
// bound, and the proxy keeps nothing afterwards.
func TestFaultHungUpstreamDoesNotBuildAQueue(t *testing.T) {
	u := newFlakyUpstream(t)
	u.mode.Store(upHang)
	s, front, reg := faultProxy(t, u.url(), "  strategy: bounded-queue\n  boundedQueue: {concurrency: 2, depth: 4, maxWait: 100ms}", "upstreamTimeout: 1s")
	var ta tally
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			res, err := http.Get(front + "/")
			a := answer{err: err, latency: time.Since(start)}
			if err == nil {
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				a.code, a.reason, a.retryAfter = res.StatusCode, res.Header.Get("X-Loadshed-Reason"), res.Header.Get("Retry-After")
			}
			ta.add(a)
		}()
	}
	wg.Wait()
	count := map[string]int{}
	for _, a := range ta.take() {
		if a.err != nil {
			t.Fatalf("transport error: %v", a.err)
		}
		key := fmt.Sprintf("%d %s", a.code, a.reason)
		count[key]++
		switch {
		case a.code == 504:
			if a.retryAfter != "" {
				t.Fatal("504 with Retry-After")
			}
		case a.code == 503 && (a.reason == "queue_timeout" || a.reason == "queue_full"):
			if a.retryAfter == "" {
				t.Fatalf("%s without Retry-After", a.reason)
			}
			if a.latency >= time.Second {
				t.Fatalf("a %s shed took %s: it waited as long as the upstream timeout", a.reason, a.latency)
			}
		default:
			t.Fatalf("unexpected answer %+v", a)
		}
	}
	// The first two in are admitted, the next four queue, the rest find the queue full (one that
	// arrived late, after the waiters timed out, may queue and time out instead).
	if count["504 "] != 2 || count["503 queue_timeout"] < 4 || count["503 queue_timeout"]+count["503 queue_full"] != 8 {
		t.Fatalf("answers %v: want 2 x 504 (admitted), at least 4 x queue_timeout (queued), the rest queue_full", count)
	}
	testwait.Until(t, 5*time.Second, "the upstream to see both admitted requests abandoned", func() bool { return u.aborted.Load() == 2 })
	st := s.StageStates()[0]
	if st.InFlight != 0 || st.QueueDepth != 0 {
		t.Fatalf("after the storm: %+v", st)
	}
	if got := testutil.ToFloat64(s.gate.Metrics().Requests.WithLabelValues("default", "bounded-queue", "http", "upstream_timeout", "504")); got != 2 {
		t.Fatalf("upstream_timeout 504 counted %v times, want 2", got)
	}
	if n, err := testutil.GatherAndCount(reg, "loadshed_shed_total"); err != nil || n != 2 {
		t.Fatalf("shed series %d (%v), want queue_timeout and queue_full", n, err)
	}
}

// getEach sends n GETs of url with ctx, each from a goroutine of its own; errs receives each
// client's error (nil for an answer, whose body it closes).
func getEach(ctx context.Context, url string, n int) (errs <-chan error) {
	c := make(chan error, n)
	for range n {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
			res, err := http.DefaultClient.Do(req)
			if err == nil {
				res.Body.Close()
			}
			c <- err
		}()
	}
	return c
}

// TestFaultClientsLeaveTheQueue: six clients give up while queued. They leave the queue at once,
// cost no upstream call, count as canceled, and the permit of the one admitted request is still
// released exactly once.
func TestFaultClientsLeaveTheQueue(t *testing.T) {
	g := newValve()
	h := start(t, g, "  strategy: bounded-queue\n  boundedQueue: {concurrency: 1, depth: 8, maxWait: 1m}")
	first := holdOne(t, h, g)
	ctx, cancel := context.WithCancel(context.Background())
	errs := getEach(ctx, h.front.URL+"/", 6)
	testwait.Until(t, 5*time.Second, "six requests to queue", func() bool { return h.srv.StageStates()[0].QueueDepth == 6 })
	cancel()
	for range 6 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("client: %v", err)
		}
	}
	testwait.Until(t, 5*time.Second, "the queue to empty", func() bool { return h.srv.StageStates()[0].QueueDepth == 0 })
	testwait.Until(t, 5*time.Second, "the proxy to count the six as canceled", func() bool {
		return testutil.ToFloat64(h.srv.gate.Metrics().Requests.WithLabelValues("default", "bounded-queue", "http", "canceled", "499")) == 6
	})
	if st := h.srv.StageStates()[0]; st.InFlight != 1 {
		t.Fatalf("in flight %v while the first request runs, want 1", st.InFlight)
	}
	close(g.release)
	if code := <-first; code != 200 {
		t.Fatalf("admitted request: %d", code)
	}
	testwait.Until(t, 5*time.Second, "in-flight to return to zero", func() bool { return h.srv.StageStates()[0].InFlight == 0 })
	if g.hits.Load() != 1 {
		t.Fatalf("upstream calls %d, want 1: abandoned requests must not be forwarded", g.hits.Load())
	}
}

// TestFaultClientsLeaveWhileTheUpstreamWorks: clients that give up while the upstream works on
// their requests cancel the upstream requests too, release their permits, count as canceled and
// do not shrink the adaptive limit (a client leaving says nothing about the upstream).
func TestFaultClientsLeaveWhileTheUpstreamWorks(t *testing.T) {
	g := newValve()
	defer close(g.release)
	h := start(t, g, "  strategy: adaptive\n  adaptive: {initialLimit: 8, minLimit: 1, maxLimit: 8, slowStart: 0s, window: 1ms}")
	before := h.srv.StageStates()[0].Limit
	for round := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		errs := getEach(ctx, h.front.URL+"/?wait=1", 5)
		testwait.Until(t, 5*time.Second, "five requests at the upstream", func() bool { return g.waiting.Load() == 5 })
		cancel()
		for range 5 {
			if err := <-errs; !errors.Is(err, context.Canceled) {
				t.Fatalf("client: %v", err)
			}
		}
		testwait.Until(t, 5*time.Second, "the upstream to see the requests cancelled", func() bool { return g.waiting.Load() == 0 })
		testwait.Until(t, 5*time.Second, "in-flight to return to zero", func() bool { return h.srv.StageStates()[0].InFlight == 0 })
		want := float64(5 * (round + 1))
		testwait.Until(t, 5*time.Second, "the proxy to count the cancellations", func() bool {
			return testutil.ToFloat64(h.srv.gate.Metrics().Requests.WithLabelValues("default", "adaptive", "http", "canceled", "499")) == want
		})
	}
	if after := h.srv.StageStates()[0].Limit; after < before {
		t.Fatalf("limit %v -> %v: client cancellations must not shrink it", before, after)
	}
}

// TestFaultClientLeavesMidRequestBody: a client that announces a body and goes away half-way
// releases its permit, counts as canceled and does not shrink the adaptive limit.
func TestFaultClientLeavesMidRequestBody(t *testing.T) {
	var got atomic.Int64
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 512)
		for {
			n, err := r.Body.Read(buf)
			got.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
	h := start(t, up, "  strategy: adaptive\n  adaptive: {initialLimit: 4, minLimit: 1, maxLimit: 4, slowStart: 0s, window: 1ms}")
	addr := strings.TrimPrefix(h.front.URL, "http://")
	before := h.srv.StageStates()[0].Limit
	for i := range 20 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n%s", strings.Repeat("x", 1000))
		testwait.Until(t, 5*time.Second, "the body to start flowing upstream", func() bool { return got.Load() >= int64(1000*(i+1)) })
		c.Close()
		testwait.Until(t, 5*time.Second, "in-flight to return to zero", func() bool { return h.srv.StageStates()[0].InFlight == 0 })
	}
	testwait.Until(t, 5*time.Second, "twenty canceled requests", func() bool {
		return testutil.ToFloat64(h.srv.gate.Metrics().Requests.WithLabelValues("default", "adaptive", "http", "canceled", "499")) == 20
	})
	if after := h.srv.StageStates()[0].Limit; after < before {
		t.Fatalf("limit %v -> %v: a client leaving mid-body must not shrink it", before, after)
	}
}

// TestFaultClientLeavesMidResponseBody: a client that stops reading a long response and closes
// its connection makes the proxy cancel the upstream request and release the permit.
func TestFaultClientLeavesMidResponseBody(t *testing.T) {
	var aborted, started atomic.Int64
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started.Add(1)
		chunk := []byte(strings.Repeat("y", 32<<10))
		for range 10000 {
			if _, err := w.Write(chunk); err != nil {
				aborted.Add(1)
				return
			}
			http.NewResponseController(w).Flush()
			if r.Context().Err() != nil {
				aborted.Add(1)
				return
			}
		}
	})
	h := start(t, up, "  strategy: inflight\n  inflight: {limit: 4}")
	addr := strings.TrimPrefix(h.front.URL, "http://")
	for range 5 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.CopyN(io.Discard, res.Body, 64<<10); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	testwait.Until(t, 5*time.Second, "the upstream to see all five abandoned", func() bool { return aborted.Load() == 5 })
	testwait.Until(t, 5*time.Second, "in-flight to return to zero", func() bool { return h.srv.StageStates()[0].InFlight == 0 })
	testwait.Until(t, 5*time.Second, "five canceled requests", func() bool {
		return testutil.ToFloat64(h.srv.gate.Metrics().Requests.WithLabelValues("default", "inflight", "http", "canceled", "200")) == 5
	})
}

// TestFaultOversizedRequests: headers over maxHeaderBytes get 431 and bodies over maxBodyBytes
// get 413, whether announced with Content-Length or streamed chunked; neither counts as an
// upstream failure nor shrinks the adaptive limit, and the proxy goes on serving.
func TestFaultOversizedRequests(t *testing.T) {
	var hits atomic.Int64
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok\n")
	}))
	p := serveProxy(t, "upstream: "+up+"\nlisten: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nshutdown: {drainDelay: 0s, gracePeriod: 1s}\n"+
		"server: {maxHeaderBytes: 4096, maxBodyBytes: 1000}\n"+
		"admission: {strategy: adaptive, adaptive: {initialLimit: 4, minLimit: 1, maxLimit: 4, slowStart: 0s, window: 1ms}}\n", Options{})
	s, data := p.srv, p.data
	defer func() {
		if err := p.stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	before := s.StageStates()[0].Limit
	raw := func(req string) (int, string) {
		t.Helper()
		c, err := net.Dial("tcp", data)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no response: %v", err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res.StatusCode, string(b)
	}
	big := strings.Repeat("a", 2000)
	cases := []struct {
		name, req string
		code      int
		upstream  bool // whether the request may reach the upstream (a chunked body is streamed)
	}{
		{"huge header", "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("h", 64<<10) + "\r\n\r\n", 431, false},
		{"many headers", "GET / HTTP/1.1\r\nHost: x\r\n" + strings.Repeat("X-H: 0123456789012345678901234567890123456789\r\n", 400) + "\r\n", 431, false},
		{"content-length body", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n" + big, 413, false},
		{"chunked body", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(big), big), 413, true},
		{"normal", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789", 200, true},
	}
	for _, c := range cases {
		hitsBefore := hits.Load()
		for range 15 {
			if code, body := raw(c.req); code != c.code {
				t.Fatalf("%s: %d %q, want %d", c.name, code, body, c.code)
			}
		}
		if !c.upstream && hits.Load() != hitsBefore {
			t.Fatalf("%s reached the upstream", c.name)
		}
	}
	if after := s.StageStates()[0].Limit; after < before {
		t.Fatalf("limit %v -> %v: oversized requests are the client's fault and must not shrink it", before, after)
	}
	if got := testutil.ToFloat64(s.gate.Metrics().Requests.WithLabelValues("default", "adaptive", "http", "client_error", "413")); got != 30 {
		t.Fatalf("413 counted %v times as client errors, want 30", got)
	}
	for _, code := range []string{"502", "504"} {
		if got := testutil.ToFloat64(s.gate.Metrics().Requests.WithLabelValues("default", "adaptive", "http", "upstream_error", code)); got != 0 {
			t.Fatalf("%v requests counted as upstream_error %s", got, code)
		}
	}
	if st := s.StageStates()[0]; st.InFlight != 0 {
		t.Fatalf("in flight %v after the run", st.InFlight)
	}
}

// TestFaultSlowBodyIsCutAtReadTimeout: a client that sends its headers and then dribbles its
// body (a slow-POST attack) holds a permit only until server.readTimeout: then it gets 408 (not
// an empty 200: before the fix the proxy wrote nothing and net/http answered 200 OK), its permit
// is released, and it counts as canceled without shrinking the adaptive limit.
func TestFaultSlowBodyIsCutAtReadTimeout(t *testing.T) {
	g := newValve()
	up := newUpstream(t, g)
	p := serveProxy(t, "upstream: "+up+"\nlisten: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nshutdown: {drainDelay: 0s, gracePeriod: 1s}\n"+
		"server: {readTimeout: 300ms}\nadmission: {strategy: adaptive, adaptive: {initialLimit: 4, minLimit: 1, maxLimit: 4, slowStart: 0s, window: 1ms}}\n", Options{})
	s, data := p.srv, p.data
	before := s.StageStates()[0].Limit
	const attackers = 4 // as many as the limit: each holds a permit while it dribbles
	codes := make(chan int, attackers)
	for range attackers {
		go func() {
			c, err := net.Dial("tcp", data)
			if err != nil {
				codes <- -1
				return
			}
			defer c.Close()
			fmt.Fprint(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
			done := make(chan struct{})
			defer close(done)
			go func() {
				for {
					select {
					case <-done:
						return
					case <-time.After(20 * time.Millisecond): // the attack's own pace
						if _, err := c.Write([]byte("x")); err != nil {
							return
						}
					}
				}
			}()
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				codes <- -1
				return
			}
			res.Body.Close()
			codes <- res.StatusCode
		}()
	}
	for range attackers {
		if code := <-codes; code != http.StatusRequestTimeout {
			t.Fatalf("slow body: got %d, want 408", code)
		}
	}
	testwait.Until(t, 5*time.Second, "in-flight to return to zero", func() bool { return s.StageStates()[0].InFlight == 0 })
	if res, _ := get(t, "http://"+data+"/"); res.StatusCode != 200 {
		t.Fatalf("after the attack: %d", res.StatusCode)
	}
	if got := testutil.ToFloat64(s.gate.Metrics().Requests.WithLabelValues("default", "adaptive", "http", "canceled", "499")); got != attackers {
		t.Fatalf("canceled counted %v, want %d", got, attackers)
	}
	if after := s.StageStates()[0].Limit; after < before {
		t.Fatalf("limit %v -> %v: slow clients must not shrink it", before, after)
	}
}
