package proxy

// What an adversarial probe found, each as a raw-socket test on the default configuration: a
// raw TCP upstream that misbehaves on purpose (a HEAD answered with a body, bytes past
// Content-Length, a space before a colon, 1xx answers with hop-by-hop fields, 204 and 304),
// clients that half-close or spell a target oddly, and a burst past the connection cap. Each
// asserts what the client receives, and that no client ever receives bytes meant for another.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/loadshed/loadshed/internal/testwait"
)

// rawUpstream is an upstream on a bare TCP listener: it reads each request's head and answers
// with the bytes its script writes, in as many writes as the script makes.
type rawUpstream struct {
	ln     net.Listener
	script func(c net.Conn, target, method string)
	// closed counts connections the proxy closed (a read that ended before a request).
	closed atomic.Int64
	// requests counts request heads read.
	requests atomic.Int64
	wg       sync.WaitGroup

	mu      sync.Mutex
	targets []string // the request targets read, as their request lines carried them
}

// received returns the request targets read since the last call, and forgets them.
func (u *rawUpstream) received() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	got := u.targets
	u.targets = nil
	return got
}

func newRawUpstream(t testing.TB, script func(c net.Conn, target, method string)) *rawUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{ln: ln, script: script}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.wg.Add(1)
			go func() {
				defer u.wg.Done()
				u.serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		u.wg.Wait()
	})
	return u
}

func (u *rawUpstream) url() string { return "http://" + u.ln.Addr().String() }

// serve reads request heads (these tests send no request bodies) and runs the script on each,
// until the proxy closes the connection or the script does.
func (u *rawUpstream) serve(c net.Conn) {
	defer c.Close()
	tp := textproto.NewReader(bufio.NewReader(c))
	for {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second)) // bounded: the test ends anyway
		line, err := tp.ReadLine()
		if err != nil {
			u.closed.Add(1)
			return
		}
		if _, err := tp.ReadMIMEHeader(); err != nil {
			u.closed.Add(1)
			return
		}
		u.requests.Add(1)
		method, rest, _ := strings.Cut(line, " ")
		target, _, _ := strings.Cut(rest, " ")
		u.mu.Lock()
		u.targets = append(u.targets, target)
		u.mu.Unlock()
		u.script(c, target, method)
	}
}

// probeProxy serves a proxy for upstream with the given admission block and extra top-level
// YAML, on its own listeners, as the sidecar runs (server settings at their defaults).
func probeProxy(t *testing.T, upstream, admission string, extra ...string) *running {
	t.Helper()
	return serveProxy(t, proxyYAML(upstream, admission, append([]string{"shutdown: {drainDelay: 0s, gracePeriod: 1s}"}, extra...)...), Options{})
}

// poison is an answer an upstream sends where none was asked for: a client that received it
// would get another client's cookie.
const poison = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\nSet-Cookie: session=victim\r\n\r\npoison"

// whoAnswers answers GET /who?id=N with "for N", so each client can tell its own answer.
func whoAnswer(c net.Conn, target string) {
	id := strings.TrimPrefix(target, "/who?id=")
	body := "for " + id
	fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// askWho sends n clients one after the other, each on a new connection, and fails if any gets
// an answer other than its own (a 502 for an upstream the proxy gave up on is allowed).
func askWho(t *testing.T, data string, n int) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("client%d", i)
		res, body := rawRequest(t, data, "GET /who?id="+id+" HTTP/1.1\r\nHost: x\r\n\r\n")
		if res.StatusCode == http.StatusBadGateway {
			continue
		}
		if res.StatusCode != 200 || body != "for "+id || res.Header.Get("Set-Cookie") != "" {
			t.Fatalf("%s received %d %q Set-Cookie %q: bytes meant for another client", id, res.StatusCode, body, res.Header.Get("Set-Cookie"))
		}
	}
}

// closedWithin waits, bounded, until the proxy has closed n upstream connections; it reports
// whether it did (the caller goes on either way and checks what clients get).
func closedWithin(u *rawUpstream, n int64, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for u.closed.Load() < n {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// TestProbeHeadWithBodyDoesNotCross: an upstream that answers HEAD as it answers GET (head, then
// the body in a second write; Python's do_HEAD = do_GET) must not hand that body to the next
// client as its answer. A HEAD is forwarded on a connection of its own, closed after it, so
// nothing a HEAD's answer brings can reach another exchange.
func TestProbeHeadWithBodyDoesNotCross(t *testing.T) {
	up := newRawUpstream(t, func(c net.Conn, target, method string) {
		if method == http.MethodHead {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Type: text/plain\r\n\r\n", len(poison))
			time.Sleep(5 * time.Millisecond) // the upstream's own pace: the body comes in a second write
			io.WriteString(c, poison)
			return
		}
		whoAnswer(c, target)
	})
	p := probeProxy(t, up.url(), "  strategy: none")
	for range 3 {
		res, body := rawRequest(t, p.data, "HEAD /page HTTP/1.1\r\nHost: x\r\n\r\n")
		if res.StatusCode != 200 || body != "" || res.ContentLength != int64(len(poison)) {
			t.Fatalf("HEAD: %d body %q Content-Length %d, want 200 with no body and the GET's length", res.StatusCode, body, res.ContentLength)
		}
		askWho(t, p.data, 3)
	}
}

// TestProbeBytesPastContentLengthDoNotCross: bytes an upstream sends past its Content-Length
// are never the next client's answer: the connection they arrive on is closed, not reused.
func TestProbeBytesPastContentLengthDoNotCross(t *testing.T) {
	for _, split := range []bool{false, true} {
		t.Run(fmt.Sprintf("second write %v", split), func(t *testing.T) {
			up := newRawUpstream(t, func(c net.Conn, target, method string) {
				if strings.HasPrefix(target, "/long") {
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlong")
					if split {
						time.Sleep(5 * time.Millisecond)
					}
					io.WriteString(c, poison)
					return
				}
				whoAnswer(c, target)
			})
			p := probeProxy(t, up.url(), "  strategy: none")
			for i := range 3 {
				res, body := rawRequest(t, p.data, "GET /long HTTP/1.1\r\nHost: x\r\n\r\n")
				if res.StatusCode != 200 || body != "long" {
					t.Fatalf("GET /long: %d %q, want 200 %q", res.StatusCode, body, "long")
				}
				// net/http's Transport closes a pooled connection on which bytes arrive unasked
				// ("unsolicited response"). Bytes that would arrive after the connection was handed
				// to the next request are read as its answer by any HTTP/1.1 client: that race is
				// the upstream's, so the test waits (bounded) for the close before the next client.
				closedWithin(up, int64(i+1), 5*time.Second)
				askWho(t, p.data, 3)
			}
		})
	}
}

// TestProbeNoContentAndNotModified: a GET answered 204 or 304 (ETag revalidation) reaches the
// client as the upstream sent it, with no body, and the connection serves the next request.
func TestProbeNoContentAndNotModified(t *testing.T) {
	up := newRawUpstream(t, func(c net.Conn, target, method string) {
		switch {
		case strings.HasPrefix(target, "/304"):
			io.WriteString(c, "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nCache-Control: max-age=60\r\n\r\n")
		case strings.HasPrefix(target, "/204"):
			io.WriteString(c, "HTTP/1.1 204 No Content\r\nX-Done: yes\r\nContent-Length: 0\r\n\r\n")
		default:
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	p := probeProxy(t, up.url(), "  strategy: none")
	for _, method := range []string{"GET", "HEAD"} {
		c, err := net.Dial("tcp", p.data)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		for _, path := range []string{"/304", "/204", "/304", "/ok"} {
			fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nIf-None-Match: \"v1\"\r\n\r\n", method, path)
			req, _ := http.NewRequest(method, path, nil)
			res, err := http.ReadResponse(br, req)
			if err != nil {
				t.Fatalf("%s %s: no answer: %v", method, path, err)
			}
			body, err := io.ReadAll(res.Body)
			res.Body.Close()
			if err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			switch path {
			case "/304":
				if res.StatusCode != 304 || res.Header.Get("Etag") != `"v1"` || res.Header.Get("Cache-Control") != "max-age=60" || len(body) != 0 {
					t.Fatalf("%s %s: %d %v %q, want 304 with the ETag and no body", method, path, res.StatusCode, res.Header, body)
				}
			case "/204":
				if res.StatusCode != 204 || res.Header.Get("X-Done") != "yes" || len(body) != 0 || len(res.Header.Values("Content-Length")) != 0 || res.Header.Get("Content-Type") != "" {
					t.Fatalf("%s %s: %d %v %q, want 204 with X-Done, no body, no Content-Length or Content-Type", method, path, res.StatusCode, res.Header, body)
				}
			default:
				want := "ok"
				if method == "HEAD" {
					want = ""
				}
				if res.StatusCode != 200 || string(body) != want {
					t.Fatalf("%s %s after 204 and 304: %d %q", method, path, res.StatusCode, body)
				}
			}
		}
		c.Close()
	}
}

// TestProbeInvalidFieldNameIs502: an upstream answer with a field name net/http's server would
// not write (a space before the colon, as in "Transfer-Encoding : chunked") is refused with 502
// and counted as the upstream's error: passed on, it would be dropped after the answer was
// framed by another field, and a repaired name could frame it differently.
func TestProbeInvalidFieldNameIs502(t *testing.T) {
	up := newRawUpstream(t, func(c net.Conn, target, method string) {
		if strings.HasPrefix(target, "/bad") {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 14\r\nTransfer-Encoding : chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
			return
		}
		whoAnswer(c, target)
	})
	p := probeProxy(t, up.url(), "  strategy: none")
	res, body := rawRequest(t, p.data, "GET /bad HTTP/1.1\r\nHost: x\r\n\r\n")
	if res.StatusCode != http.StatusBadGateway || strings.Contains(body, "hello") {
		t.Fatalf("GET /bad: %d %q, want 502 and none of the upstream's body", res.StatusCode, body)
	}
	for k := range res.Header {
		if strings.ContainsAny(k, " \t") {
			t.Fatalf("the invalid field reached the client: %q", k)
		}
	}
	if got := testutil.ToFloat64(p.srv.gate.Metrics().Requests.WithLabelValues("default", "none", "http", "upstream_error", "502")); got != 1 {
		t.Fatalf("upstream errors counted: %v, want 1", got)
	}
	askWho(t, p.data, 2)
}

// TestProbeInformationalWithoutHopByHop: a 1xx answer is passed on without its hop-by-hop
// fields (Connection and the fields it names, Keep-Alive, Upgrade, Proxy-Authenticate) and
// without Content-Length, over HTTP/1.1 and HTTP/2 alike.
func TestProbeInformationalWithoutHopByHop(t *testing.T) {
	up := newRawUpstream(t, func(c net.Conn, target, method string) {
		io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\nConnection: X-Hop\r\nX-Hop: secret\r\n"+
			"Keep-Alive: timeout=5\r\nUpgrade: h2c\r\nProxy-Authenticate: Basic realm=\"up\"\r\nContent-Length: 0\r\n\r\n")
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok")
	})
	p := probeProxy(t, up.url(), "  strategy: none")
	for _, h2 := range []bool{false, true} {
		var protos http.Protocols
		if h2 {
			protos.SetUnencryptedHTTP2(true)
		} else {
			protos.SetHTTP1(true)
		}
		client := &http.Client{Transport: &http.Transport{Protocols: &protos}, Timeout: 10 * time.Second}
		var hints []textproto.MIMEHeader
		var codes []int
		trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			codes = append(codes, code)
			hints = append(hints, h)
			return nil
		}}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", "http://"+p.data+"/page", nil)
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("h2 %v: %v", h2, err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || string(body) != "ok" {
			t.Fatalf("h2 %v: %d %q", h2, res.StatusCode, body)
		}
		if len(codes) != 1 || codes[0] != 103 {
			t.Fatalf("h2 %v: informational answers %v, want one 103", h2, codes)
		}
		h := hints[0]
		if h.Get("Link") != "</style.css>; rel=preload" {
			t.Fatalf("h2 %v: 103 lost its Link: %v", h2, h)
		}
		for _, name := range []string{"Connection", "X-Hop", "Keep-Alive", "Upgrade", "Proxy-Authenticate", "Content-Length"} {
			if v := h.Values(name); len(v) > 0 {
				t.Fatalf("h2 %v: 103 carries %s: %q", h2, name, v)
			}
		}
		client.CloseIdleConnections()
	}
}

// TestProbeNoSniffedContentType: an answer without a Content-Type is passed on without one;
// the proxy adds no type of its own (not to a gzip-encoded body, not to HTML-looking bytes).
func TestProbeNoSniffedContentType(t *testing.T) {
	up := newRawUpstream(t, func(c net.Conn, target, method string) {
		switch {
		case strings.HasPrefix(target, "/gzip"):
			body := "\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00"
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		default:
			body := "<html><body>hi</body></html>"
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		}
	})
	p := probeProxy(t, up.url(), "  strategy: none")
	for _, path := range []string{"/gzip", "/html"} {
		res, _ := rawRequest(t, p.data, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
		if res.StatusCode != 200 || len(res.Header.Values("Content-Type")) != 0 {
			t.Fatalf("GET %s: %d Content-Type %q, want 200 and none", path, res.StatusCode, res.Header.Values("Content-Type"))
		}
	}
}

// TestProbeHalfCloseBeforeAdmission: a client that sends its request and half-closes while it
// waits in the queue has left: it gets 408 with Connection: close (never an empty 200), and the
// request is counted as canceled.
func TestProbeHalfCloseBeforeAdmission(t *testing.T) {
	g := newValve()
	up := httptest.NewServer(g)
	t.Cleanup(up.Close)
	p := probeProxy(t, up.URL, "  strategy: bounded-queue\n  boundedQueue: {concurrency: 1, depth: 4, maxWait: 10s}")
	held := make(chan int, 1)
	go func() {
		res, err := http.Get("http://" + p.data + "/?wait=1")
		if err != nil {
			held <- 0
			return
		}
		res.Body.Close()
		held <- res.StatusCode
	}()
	testwait.Until(t, 5*time.Second, "the first request to hold the one permit", func() bool { return g.waiting.Load() == 1 })
	c, err := net.Dial("tcp", p.data)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET /second HTTP/1.1\r\nHost: x\r\n\r\n")
	testwait.Until(t, 5*time.Second, "the second request to queue", func() bool {
		st := p.srv.StageStates()
		return len(st) == 1 && st[0].QueueDepth == 1
	})
	c.(*net.TCPConn).CloseWrite()
	raw, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(raw))), nil)
	if err != nil {
		t.Fatalf("half-closed client: %q: %v", raw, err)
	}
	if res.StatusCode != http.StatusRequestTimeout || !res.Close {
		t.Fatalf("half-closed client got %q, want 408 with Connection: close", raw)
	}
	close(g.release)
	if code := <-held; code != 200 {
		t.Fatalf("the held request: %d", code)
	}
	if g.hits.Load() != 1 {
		t.Fatalf("the upstream saw %d requests, want only the held one", g.hits.Load())
	}
	testwait.Until(t, 5*time.Second, "the canceled request counted", func() bool {
		return testutil.ToFloat64(p.srv.gate.Metrics().Requests.WithLabelValues("default", "bounded-queue", "http", "canceled", "499")) == 1
	})
}

// TestProbeTargetsThatAreNotPaths: a target whose path does not begin with "/" (http:normal is
// parsed as an opaque URL with an empty path) is refused with 400 before admission, and none
// reaches the upstream; a route's prefix cannot be reached by any spelling the gate would judge
// as another path.
func TestProbeTargetsThatAreNotPaths(t *testing.T) {
	up := newRawUpstream(t, func(c net.Conn, target, method string) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nreached")
	})
	// The admin route admits one request in a long while: the first takes it, and every later
	// request the gate judges as /admin gets 429. One that reached the upstream as /admin
	// unjudged would get 200.
	routes := ("routes:\n  - name: admin\n    pathPrefix: /admin\n    admission:\n      strategy: token-bucket\n      tokenBucket: {rate: 0.001, burst: 1}")
	p := probeProxy(t, up.url(), "  strategy: none", routes)
	if res, _ := rawRequest(t, p.data, "GET /admin HTTP/1.1\r\nHost: x\r\n\r\n"); res.StatusCode != 200 {
		t.Fatalf("the first /admin: %d", res.StatusCode)
	}
	for _, target := range []string{"http:normal", "http:admin", "admin", "normal?x=1"} {
		res, body := rawRequest(t, p.data, "GET "+target+" HTTP/1.1\r\nHost: x\r\n\r\n")
		if res.StatusCode != http.StatusBadRequest {
			t.Fatalf("GET %s: %d %q, want 400", target, res.StatusCode, body)
		}
	}
	for _, target := range []string{"/admin", "/%61dmin", "/admin/x", "/x/../admin", "/./admin", "/x/%2e%2e/admin", "/x\\..\\admin",
		"http://x/admin", "http://x/%61dmin/y", "/admin?x=1"} {
		res, body := rawRequest(t, p.data, "GET "+target+" HTTP/1.1\r\nHost: x\r\n\r\n")
		if res.StatusCode != http.StatusTooManyRequests && res.StatusCode != http.StatusBadRequest {
			t.Fatalf("GET %s: %d %q, want the admin route's 429 or 400", target, res.StatusCode, body)
		}
	}
	if seen := up.received(); len(seen) != 1 || seen[0] != "/admin" {
		t.Fatalf("the upstream received %q, want only the first /admin", seen)
	}
	if got := testutil.ToFloat64(p.srv.gate.Metrics().Requests.WithLabelValues("default", "none", "http", "client_error", "400")); got < 2 {
		t.Fatalf("400s counted as client errors: %v", got)
	}
}

// TestProbeBurstPastTheConnectionCap: at server.maxConnections, a connection that turns idle
// wakes the accept that waits for room (it is closed for the newcomer), so a burst of keep-alive
// clients larger than the cap is served as fast as the upstream drains it, even though no
// client closes its connection.
func TestProbeBurstPastTheConnectionCap(t *testing.T) {
	g := newValve()
	g.delay.Store(int64(2 * time.Millisecond))
	up := httptest.NewServer(g)
	t.Cleanup(up.Close)
	p := probeProxy(t, up.URL, "  strategy: none", "server:\n  maxConnections: 8")
	const clients = 40
	var wg sync.WaitGroup
	var served atomic.Int64
	errs := make(chan error, clients)
	transports := make([]*http.Transport, clients)
	for i := range clients {
		// Each client keeps its connection open after its answer, as a keep-alive client does.
		transports[i] = &http.Transport{MaxConnsPerHost: 1}
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Transport: transports[i], Timeout: 10 * time.Second}
			res, err := client.Get("http://" + p.data + "/")
			if err != nil {
				errs <- err
				return
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode == 200 {
				served.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for _, tr := range transports {
		tr.CloseIdleConnections()
	}
	for err := range errs {
		t.Errorf("a client of the burst: %v", err)
	}
	if served.Load() != clients {
		t.Fatalf("served %d of %d clients past a cap of 8", served.Load(), clients)
	}
}
