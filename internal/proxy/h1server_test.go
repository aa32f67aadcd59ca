package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// fastAndStd serves h twice: behind the fast path (which hands what it does not serve to
// net/http) and on net/http's server alone. It returns both addresses and a count of the
// requests the fast path answered itself.
func fastAndStd(t *testing.T, h http.Handler, tune func(*http.Server)) (fast, std string, served *atomic.Int64) {
	t.Helper()
	served = new(atomic.Int64)
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := w.(*h1Response); ok {
			served.Add(1)
		}
		h.ServeHTTP(w, r)
	})
	plain := httptest.NewUnstartedServer(h)
	if tune != nil {
		tune(plain.Config)
	}
	plain.Start()
	t.Cleanup(plain.Close)
	front := fastFront(t, counted, tune)
	return front.Listener.Addr().String(), plain.Listener.Addr().String(), served
}

// exchangeRaw writes raw on a new connection to addr and reads the answers to n requests.
func exchangeRaw(t *testing.T, addr, raw string, method string, n int) []*http.Response {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var out []*http.Response
	for range n {
		res, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		body, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatalf("%q: body: %v", raw, err)
		}
		res.Body = io.NopCloser(strings.NewReader(string(body)))
		out = append(out, res)
	}
	return out
}

// sameAnswer reports how two answers differ in what a client sees (Date aside).
func sameAnswer(t *testing.T, what string, fast, std *http.Response) {
	t.Helper()
	fb, _ := io.ReadAll(fast.Body)
	sb, _ := io.ReadAll(std.Body)
	fh, sh := fast.Header.Clone(), std.Header.Clone()
	delete(fh, "Date")
	delete(sh, "Date")
	switch {
	case fast.StatusCode != std.StatusCode:
		t.Errorf("%s: status %d, net/http %d", what, fast.StatusCode, std.StatusCode)
	case !maps.EqualFunc(fh, sh, slices.Equal):
		t.Errorf("%s: header %v, net/http %v", what, fh, sh)
	case string(fb) != string(sb):
		t.Errorf("%s: body %q, net/http %q", what, fb, sb)
	case fast.ContentLength != std.ContentLength || !slices.Equal(fast.TransferEncoding, std.TransferEncoding):
		t.Errorf("%s: framing %d %v, net/http %d %v", what, fast.ContentLength, fast.TransferEncoding, std.ContentLength, std.TransferEncoding)
	case !maps.EqualFunc(fast.Trailer, std.Trailer, slices.Equal):
		t.Errorf("%s: trailer %v, net/http %v", what, fast.Trailer, std.Trailer)
	case fast.Close != std.Close:
		t.Errorf("%s: close %v, net/http %v", what, fast.Close, std.Close)
	case fast.Header.Get("Date") == "" && std.Header.Get("Date") != "":
		t.Errorf("%s: no Date", what)
	}
}

// TestH1ServerAnswersAsNetHTTP: for each way a handler answers, the fast path's answer is what
// net/http's server sends, header for header, in framing, body and trailers.
func TestH1ServerAnswersAsNetHTTP(t *testing.T) {
	handlers := map[string]http.HandlerFunc{
		"small body, no length": func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "<html>hi</html>") },
		"declared length": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "5")
			w.Header().Set("Content-Type", "application/x-test")
			io.WriteString(w, "hello")
		},
		"large body": func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, strings.Repeat("z", 10000))
		},
		"flushed": func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "one ")
			w.(http.Flusher).Flush()
			io.WriteString(w, "two")
		},
		"announced trailers": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Sum, X-Other")
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, "body")
			w.Header().Set("X-Sum", "42")
			w.Header().Set("X-Other", "b")
		},
		"prefixed trailer": func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "body")
			w.(http.Flusher).Flush()
			w.Header().Set(http.TrailerPrefix+"X-Late", "7")
		},
		"no content": func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) },
		"not modified": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Etag", `"x"`)
			w.WriteHeader(http.StatusNotModified)
		},
		"refusal": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, "429 Too Many Requests: shed\n")
		},
		"closes": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "close")
			io.WriteString(w, "bye")
		},
		"empty":           func(w http.ResponseWriter, r *http.Request) {},
		"odd status":      func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(599) },
		"header newlines": func(w http.ResponseWriter, r *http.Request) { w.Header().Set("X-A", "a\r\nb") },
		"early hints": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Link", "</a.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			io.WriteString(w, "final")
		},
		"request echo": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Host", r.Host)
			w.Header().Set("X-Uri", r.RequestURI)
			w.Header().Set("X-Close", map[bool]string{true: "yes", false: "no"}[r.Close])
			w.Header()["X-Hdr"] = r.Header["X-Multi"]
		},
	}
	requests := []struct{ method, raw string }{
		{"GET", "GET /a?b=c HTTP/1.1\r\nHost: example.test\r\nX-Multi: 1\r\nX-Multi: 2\r\n\r\n"},
		{"HEAD", "HEAD /a HTTP/1.1\r\nHost: example.test\r\n\r\n"},
		{"GET", "GET / HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n"},
	}
	for name, h := range handlers {
		fast, std, served := fastAndStd(t, h, nil)
		for _, req := range requests {
			what := name + ": " + strings.Fields(req.raw)[0] + " " + strings.TrimSpace(strings.SplitN(req.raw, "\r\n", 4)[2])
			sameAnswer(t, what, exchangeRaw(t, fast, req.raw, req.method, 1)[0], exchangeRaw(t, std, req.raw, req.method, 1)[0])
		}
		if got := served.Load(); got != int64(len(requests)) {
			t.Errorf("%s: the fast path answered %d of %d requests", name, got, len(requests))
		}
	}
}

// TestH1ServerHandsOffWhatItDoesNotServe: requests the fast path does not vouch for reach
// net/http's server as they were sent, and get its answer: bodies, HTTP/1.0, malformed or
// repeated Host, invalid header names, bare LF, upgrades, heads larger than its buffer.
func TestH1ServerHandsOffWhatItDoesNotServe(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Proto", r.Proto)
		w.Header().Set("X-Upgrade", r.Header.Get("Upgrade"))
		io.WriteString(w, r.Method+" "+string(body))
	})
	fast, std, served := fastAndStd(t, h, nil)
	big := strings.Repeat("v", 5000)
	for _, req := range []struct{ what, raw string }{
		{"a body", "POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"},
		{"a chunked body", "PUT /p HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
		{"a zero length", "GET /p HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"},
		{"HTTP/1.0", "GET /p HTTP/1.0\r\nHost: h\r\n\r\n"},
		{"no Host", "GET /p HTTP/1.1\r\n\r\n"},
		{"two Hosts", "GET /p HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"},
		{"a bad Host", "GET /p HTTP/1.1\r\nHost: a b\r\n\r\n"},
		{"a bad header name", "GET /p HTTP/1.1\r\nHost: h\r\nX(y): 1\r\n\r\n"},
		{"bare LF", "GET /p HTTP/1.1\nHost: h\n\n"},
		{"an upgrade", "GET /p HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"},
		{"Expect", "GET /p HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n\r\n"},
		{"an absolute URI", "GET http://h/p HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"a large head", "GET /p HTTP/1.1\r\nHost: h\r\nX-Big: " + big + "\r\n\r\n"},
		{"HTTP/2 prior knowledge", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"},
		{"a bad request line", "GET /p HTTP/1.1 x\r\nHost: h\r\n\r\n"},
	} {
		if strings.HasPrefix(req.raw, "PRI") {
			continue // (net/http's own tests cover it; both would wait for frames)
		}
		sameAnswer(t, req.what, exchangeRaw(t, fast, req.raw, "GET", 1)[0], exchangeRaw(t, std, req.raw, "GET", 1)[0])
	}
	if got := served.Load(); got != 0 {
		t.Errorf("the fast path answered %d requests that were net/http's", got)
	}
	// After a hand-off the connection stays with net/http, pipelined requests included.
	res := exchangeRaw(t, fast, "POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\nxGET /q HTTP/1.1\r\nHost: h\r\n\r\n", "GET", 2)
	if b, _ := io.ReadAll(res[1].Body); string(b) != "GET " || served.Load() != 0 {
		t.Errorf("the request after a hand-off: %q, fast path answers %d", b, served.Load())
	}
}

// TestH1ServerPipelinesInOrder: requests sent together are answered in order, each once.
func TestH1ServerPipelinesInOrder(t *testing.T) {
	fast, _, served := fastAndStd(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.URL.Path)
	}), nil)
	raw := ""
	for _, p := range []string{"/1", "/2", "/3"} {
		raw += "GET " + p + " HTTP/1.1\r\nHost: h\r\n\r\n"
	}
	for i, res := range exchangeRaw(t, fast, raw, "GET", 3) {
		if b, _ := io.ReadAll(res.Body); string(b) != []string{"/1", "/2", "/3"}[i] {
			t.Errorf("answer %d: %q", i, b)
		}
	}
	if served.Load() != 3 {
		t.Errorf("fast path answered %d of 3", served.Load())
	}
}

// TestH1ServerClientLeavingCancelsTheRequest: a client that closes its connection while its
// request is in progress ends the request's context.
func TestH1ServerClientLeavingCancelsTheRequest(t *testing.T) {
	started, ended := make(chan struct{}), make(chan error, 1)
	fast, _, _ := fastAndStd(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		select {
		case <-r.Context().Done():
			ended <- r.Context().Err()
		case <-time.After(10 * time.Second):
			ended <- errors.New("not canceled within 10s")
		}
	}), nil)
	c, err := net.Dial("tcp", fast)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	<-started
	c.Close()
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Errorf("the request's context: %v", err)
	}
}

// TestH1ServerAbortAndShortBody: a handler that aborts (http.ErrAbortHandler) or writes less
// than its Content-Length leaves the client with a broken answer and a closed connection,
// never a whole-looking one.
func TestH1ServerAbortAndShortBody(t *testing.T) {
	fast, _, _ := fastAndStd(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "10")
		io.WriteString(w, "12345")
		if r.URL.Path == "/abort" {
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
	}), nil)
	for _, path := range []string{"/abort", "/short"} {
		c, err := net.Dial("tcp", fast)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: h\r\n\r\n")
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if _, err := io.ReadAll(res.Body); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%s: reading the body: %v, want unexpected EOF", path, err)
		}
		c.Close()
	}
}

// TestH1ServerTimeouts: a head that does not arrive whole within the header timeout, and a
// connection idle for longer than the idle timeout, are closed.
func TestH1ServerTimeouts(t *testing.T) {
	fast, _, _ := fastAndStd(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), func(s *http.Server) {
		s.ReadHeaderTimeout = 200 * time.Millisecond
		s.IdleTimeout = 200 * time.Millisecond
	})
	for _, what := range []string{"partial head", "idle"} {
		c, err := net.Dial("tcp", fast)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		if what == "idle" {
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
			if _, err := http.ReadResponse(br, nil); err != nil {
				t.Fatal(err)
			}
		} else {
			io.WriteString(c, "GET / HTTP/1.1\r\nHo")
		}
		start := time.Now()
		if _, err := br.ReadByte(); err != io.EOF {
			t.Errorf("%s: read %v, want the connection closed", what, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s: closed after %v", what, d)
		}
		c.Close()
	}
}

// TestH1ServerShutdown: shutting down closes idle connections, lets the answer in progress
// finish with Connection: close, and accepts nothing new.
func TestH1ServerShutdown(t *testing.T) {
	release := make(chan struct{})
	inHandler := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			inHandler <- struct{}{}
			<-release
		}
		io.WriteString(w, "done")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	std := &http.Server{Handler: h}
	s := newH1Server(h, std, newConnTracker(1<<20, 1<<20), slog.New(slog.DiscardHandler), ln.Addr(), 10*time.Second)
	go std.Serve(s.handoff)
	served := make(chan error, 1)
	go func() { served <- s.serve(ln) }()
	defer std.Close()

	idle, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	idle.SetDeadline(time.Now().Add(10 * time.Second))
	ibr := bufio.NewReader(idle)
	io.WriteString(idle, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	if res, err := http.ReadResponse(ibr, nil); err != nil {
		t.Fatal(err)
	} else {
		io.ReadAll(res.Body)
	}
	busy, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	busy.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(busy, "GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
	<-inHandler

	down := make(chan error, 1)
	go func() { down <- s.shutdown(context.Background()) }()
	if _, err := ibr.ReadByte(); err != io.EOF {
		t.Errorf("idle connection: read %v, want it closed", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("serve: %v", err)
	}
	if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Error("a new connection was accepted after the shutdown began")
	}
	close(release)
	res, err := http.ReadResponse(bufio.NewReader(busy), nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(res.Body); string(b) != "done" || !res.Close {
		t.Errorf("the answer in progress: %q, close %v", b, res.Close)
	}
	if err := <-down; err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// TestAcceptRetry: the accept errors the fast path waits out are the ones net/http's server
// waits out; any other ends serve.
func TestAcceptRetry(t *testing.T) {
	for err, want := range map[error]bool{
		&net.OpError{Op: "accept", Err: os.NewSyscallError("accept4", syscall.EMFILE)}:       true,
		&net.OpError{Op: "accept", Err: os.NewSyscallError("accept4", syscall.ECONNABORTED)}: true,
		os.ErrDeadlineExceeded: true,
		net.ErrClosed:          false,
		errors.New("other"):    false,
	} {
		if got := acceptRetry(err); got != want {
			t.Errorf("%v: retry %v, want %v", err, got, want)
		}
	}
}

// TestNextDeadline: a deadline moves only when less than its bound is left, and then to nine
// eighths of the bound from now.
func TestNextDeadline(t *testing.T) {
	now := time.Unix(1000, 0)
	d := 8 * time.Second
	for _, c := range []struct {
		cur  time.Time
		want time.Time
		move bool
	}{
		{time.Time{}, now.Add(9 * time.Second), true},
		{now.Add(8 * time.Second), now.Add(8 * time.Second), false},
		{now.Add(9 * time.Second), now.Add(9 * time.Second), false},
		{now.Add(7 * time.Second), now.Add(9 * time.Second), true},
		{now.Add(-time.Second), now.Add(9 * time.Second), true},
	} {
		if got, move := nextDeadline(c.cur, now, d); !got.Equal(c.want) || move != c.move {
			t.Errorf("from %v: %v, %v; want %v, %v", c.cur.Sub(now), got.Sub(now), move, c.want.Sub(now), c.move)
		}
	}
}
