package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// rawUpstream answers every request on every connection with answer(n), n counting requests
// from 1, written as is; it counts connections and requests, and which connections it saw end.
type rawUpstream struct {
	ln       net.Listener
	answer   func(n int64) string
	conns    atomic.Int64
	requests atomic.Int64
	ended    atomic.Int64
	mu       sync.Mutex
	open     []net.Conn
}

func newRawUpstream(t *testing.T, answer func(n int64) string) *rawUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{ln: ln, answer: answer}
	t.Cleanup(func() {
		ln.Close()
		u.mu.Lock()
		defer u.mu.Unlock()
		for _, c := range u.open {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.conns.Add(1)
			u.mu.Lock()
			u.open = append(u.open, c)
			u.mu.Unlock()
			go func() {
				defer u.ended.Add(1)
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					a := u.answer(u.requests.Add(1))
					if a == "" {
						continue // hang: no answer
					}
					if _, err := io.WriteString(c, a); err != nil {
						return
					}
				}
			}()
		}
	}()
	return u
}

// closeAll closes every connection the upstream holds, as an upstream's idle timeout does.
func (u *rawUpstream) closeAll() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, c := range u.open {
		c.Close()
	}
	u.open = nil
}

func (u *rawUpstream) url() string { return "http://" + u.ln.Addr().String() + "/" }

const okAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n"

func testH1Client() *h1Client {
	return newH1Client((&net.Dialer{}).DialContext, 4, time.Minute, 5*time.Second)
}

// h1Get sends GET url on cl and reads the answer's body whole; it returns the body.
func h1Get(t *testing.T, cl *h1Client, ctx context.Context, url string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := cl.RoundTrip(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatalf("GET %s: body: %v", url, err)
	}
	return res, string(b)
}

// TestH1ClientReusesAndRetriesAStaleConnection: exchanges one after the other share one
// connection; when the upstream has closed it while idle, the next request goes out again on a
// new one, and the upstream sees it once.
func TestH1ClientReusesAndRetriesAStaleConnection(t *testing.T) {
	u := newRawUpstream(t, func(int64) string { return okAnswer })
	cl := testH1Client()
	t.Cleanup(cl.CloseIdleConnections)
	for range 3 {
		if res, body := h1Get(t, cl, t.Context(), u.url()); res.StatusCode != 200 || body != "ok\n" {
			t.Fatalf("%d %q", res.StatusCode, body)
		}
	}
	if n := u.conns.Load(); n != 1 {
		t.Fatalf("%d connections for 3 exchanges, want 1", n)
	}
	u.closeAll()
	until(t, "the upstream's side closed", func() bool { return u.ended.Load() == 1 })
	if res, body := h1Get(t, cl, t.Context(), u.url()); res.StatusCode != 200 || body != "ok\n" {
		t.Fatalf("after the upstream closed the idle connection: %d %q", res.StatusCode, body)
	}
	if c, r := u.conns.Load(), u.requests.Load(); c != 2 || r != 4 {
		t.Fatalf("%d connections and %d requests, want 2 and 4", c, r)
	}
}

// TestH1ClientReusesOnlySettledConnections: a connection goes back to the pool only when its
// answer was read to the end, nothing came after it, and neither side asked to close.
func TestH1ClientReusesOnlySettledConnections(t *testing.T) {
	for _, tc := range []struct {
		name, answer string
		readAll      bool
		reused       bool
	}{
		{"whole", okAnswer, true, true},
		{"no body (204)", "HTTP/1.1 204 No Content\r\n\r\n", true, true},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nok\n\r\n0\r\n\r\n", true, true},
		{"closed before its end", "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nok\nok\n", false, false},
		{"Connection: close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nok\n", true, false},
		{"HTTP/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nok\n", true, false},
		{"bytes after the answer", okAnswer + "HTTP/1.1 200 OK\r\n", true, false},
		{"switched protocols unasked", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newRawUpstream(t, func(int64) string { return tc.answer })
			cl := testH1Client()
			t.Cleanup(cl.CloseIdleConnections)
			for range 2 {
				req, _ := http.NewRequest("GET", u.url(), nil)
				res, err := cl.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				if tc.readAll {
					io.ReadAll(res.Body)
				} else {
					res.Body.Read(make([]byte, 1))
				}
				res.Body.Close()
			}
			want := int64(2)
			if tc.reused {
				want = 1
			}
			if n := u.conns.Load(); n != want {
				t.Fatalf("%d connections for 2 exchanges, want %d", n, want)
			}
		})
	}
}

// TestH1ClientEndsExchangesInTime: the answer's headers must come within the header timeout
// and fit the header budget; the request's context ends an exchange at any point, and the
// upstream sees its connection close.
func TestH1ClientEndsExchangesInTime(t *testing.T) {
	t.Run("header timeout", func(t *testing.T) {
		u := newRawUpstream(t, func(int64) string { return "" })
		cl := newH1Client((&net.Dialer{}).DialContext, 4, time.Minute, 50*time.Millisecond)
		req, _ := http.NewRequest("GET", u.url(), nil)
		_, err := cl.RoundTrip(req)
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("%v, want a timeout", err)
		}
		until(t, "the upstream connection closed", func() bool { return u.ended.Load() == 1 })
		if r := u.requests.Load(); r != 1 {
			t.Fatalf("the upstream saw %d requests, want 1 (a timeout is not retried)", r)
		}
	})
	t.Run("headers too large", func(t *testing.T) {
		u := newRawUpstream(t, func(int64) string {
			return "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("b", 4<<10) + "\r\nContent-Length: 0\r\n\r\n"
		})
		cl := testH1Client()
		cl.maxHeaderBytes = 1 << 10
		req, _ := http.NewRequest("GET", u.url(), nil)
		if _, err := cl.RoundTrip(req); !errors.Is(err, errHeaderTooLarge) {
			t.Fatalf("%v, want %v", err, errHeaderTooLarge)
		}
	})
	t.Run("context ends while waiting", func(t *testing.T) {
		u := newRawUpstream(t, func(int64) string { return "" })
		cl := testH1Client()
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			until(t, "the request upstream", func() bool { return u.requests.Load() == 1 })
			cancel()
		}()
		req, _ := http.NewRequestWithContext(ctx, "GET", u.url(), nil)
		if _, err := cl.RoundTrip(req); !errors.Is(err, context.Canceled) {
			t.Fatalf("%v, want %v", err, context.Canceled)
		}
		until(t, "the upstream connection closed", func() bool { return u.ended.Load() == 1 })
	})
	t.Run("context ends while reading the body", func(t *testing.T) {
		u := newRawUpstream(t, func(int64) string { return "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nok" })
		cl := testH1Client()
		ctx, cancel := context.WithCancel(t.Context())
		req, _ := http.NewRequestWithContext(ctx, "GET", u.url(), nil)
		res, err := cl.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		read := make(chan error, 1)
		go func() { _, err := io.ReadAll(res.Body); read <- err }()
		select {
		case err := <-read:
			if err == nil {
				t.Fatal("the body ended cleanly after its context ended")
			}
		case <-time.After(10 * time.Second): // a guard against a hang, not a timing
			t.Fatal("the body still reads 10 s after its context ended")
		}
		res.Body.Close()
		until(t, "the upstream connection closed", func() bool { return u.ended.Load() == 1 })
	})
}

// TestH1ClientBoundsItsIdleConnections: at most maxIdle are kept, and each is closed once idle
// for idleTimeout.
func TestH1ClientBoundsItsIdleConnections(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		io.WriteString(w, "ok\n")
	}))
	var opened, closed atomic.Int64
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			opened.Add(1)
		case http.StateClosed:
			closed.Add(1)
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	cl := newH1Client((&net.Dialer{}).DialContext, 2, 200*time.Millisecond, 5*time.Second)
	t.Cleanup(cl.CloseIdleConnections)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { h1Get(t, cl, context.Background(), up.URL+"/") })
	}
	until(t, "four exchanges upstream", func() bool { return opened.Load() == 4 })
	close(release)
	wg.Wait()
	until(t, "the two beyond maxIdle closed", func() bool { return closed.Load() == 2 })
	cl.mu.Lock()
	kept := cl.nIdle
	cl.mu.Unlock()
	if kept != 2 {
		t.Fatalf("%d idle connections kept, want 2", kept)
	}
	until(t, "the idle ones closed after idleTimeout", func() bool { return closed.Load() == 4 })
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.nIdle != 0 || len(cl.idle) != 0 || cl.janitor != nil {
		t.Fatalf("after the sweep: %d idle, %d addresses, janitor armed %v", cl.nIdle, len(cl.idle), cl.janitor != nil)
	}
}

// TestOnlyPlainExchangesTakeTheH1Client: bodies, methods that may not be sent twice, upgrades
// and TLS stay with net/http's Transport.
func TestOnlyPlainExchangesTakeTheH1Client(t *testing.T) {
	for _, tc := range []struct {
		method, url, upgrade string
		body                 io.Reader
		want                 bool
	}{
		{"GET", "http://u/", "", nil, true},
		{"HEAD", "http://u/", "", nil, true},
		{"OPTIONS", "http://u/", "", nil, true},
		{"GET", "https://u/", "", nil, false},
		{"POST", "http://u/", "", nil, false},
		{"DELETE", "http://u/", "", nil, false},
		{"GET", "http://u/", "", strings.NewReader("x"), false},
		{"GET", "http://u/", "websocket", nil, false},
	} {
		req, _ := http.NewRequest(tc.method, tc.url, tc.body)
		if tc.upgrade != "" {
			req.Header.Set("Upgrade", tc.upgrade)
		}
		if got := h1Eligible(req); got != tc.want {
			t.Errorf("%s %s (body %v, upgrade %q): %v, want %v", tc.method, tc.url, tc.body != nil, tc.upgrade, got, tc.want)
		}
	}
}

// TestH1ClientCancelRacingTheExchange: a context that ends the moment the upstream has the
// request always ends the exchange, however the cancellation and the exchange's own deadlines
// interleave (a header deadline set after the cancellation's once undid it: the exchange then
// waited out the header timeout).
func TestH1ClientCancelRacingTheExchange(t *testing.T) {
	got := make(chan struct{}, 1)
	u := newRawUpstream(t, func(int64) string { got <- struct{}{}; return "" })
	cl := newH1Client((&net.Dialer{}).DialContext, 4, time.Minute, time.Minute)
	for i := range 300 {
		ctx, cancel := context.WithCancel(t.Context())
		go func() { <-got; cancel() }()
		req, _ := http.NewRequestWithContext(ctx, "GET", u.url(), nil)
		done := make(chan error, 1)
		go func() { _, err := cl.RoundTrip(req); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("exchange %d: %v, want %v", i, err, context.Canceled)
			}
		case <-time.After(10 * time.Second): // a guard against a hang, not a timing
			t.Fatalf("exchange %d still waiting 10 s after its context ended", i)
		}
	}
}

// TestWriteRequestAsRequestWrite: the head writeRequest writes reads back as the one
// Request.Write writes, for the requests h1Client takes; the same bad hosts and targets fail.
func TestWriteRequestAsRequestWrite(t *testing.T) {
	build := func(method, target, host string, h http.Header, closeIt bool) *http.Request {
		u, err := url.Parse(target)
		if err != nil {
			t.Fatal(err)
		}
		return &http.Request{Method: method, URL: u, Host: host, Header: h, Close: closeIt}
	}
	cases := []*http.Request{
		build("GET", "http://up.test/a/b?c=d&e", "", http.Header{"X-A": {"1", " 2 "}, "User-Agent": {"k6"}}, false),
		build("HEAD", "http://up.test/", "front.test", http.Header{"User-Agent": {""}}, false),
		build("OPTIONS", "http://up.test/o%20p", "", http.Header{}, true),
		build("GET", "http://[fe80::1%25eth0]:80/", "", http.Header{"Accept": {"*/*"}}, false),
		build("GET", "http://up.test/", "bücher.test", http.Header{"Connection": {"close"}}, true),
		build("TRACE", "http://up.test/t", "", http.Header{"Content-Length": {"3"}, "Trailer": {"X"}}, false),
	}
	for _, req := range cases {
		var want, got bytes.Buffer
		if err := req.Write(&want); err != nil {
			t.Fatal(err)
		}
		bw := bufio.NewWriter(&got)
		if err := writeRequest(bw, req); err != nil {
			t.Fatal(err)
		}
		bw.Flush()
		w, err := http.ReadRequest(bufio.NewReader(&want))
		if err != nil {
			t.Fatal(err)
		}
		g, err := http.ReadRequest(bufio.NewReader(&got))
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", req.Method, req.URL, err, got.String())
		}
		if g.Method != w.Method || g.RequestURI != w.RequestURI || g.Host != w.Host || g.Close != w.Close ||
			!maps.EqualFunc(g.Header, w.Header, slices.Equal) {
			t.Errorf("%s %s:\n%s\nRequest.Write:\n%s", req.Method, req.URL, got.String(), want.String())
		}
	}
	for _, req := range []*http.Request{
		build("GET", "http://up.test/", "bad host", http.Header{}, false),
		{Method: "GET", URL: &url.URL{Scheme: "http", Host: "up.test", Path: "/a\x01"}, Header: http.Header{}},
	} {
		if (req.Write(io.Discard) == nil) != (writeRequest(bufio.NewWriter(io.Discard), req) == nil) {
			t.Errorf("%q %q: Request.Write and writeRequest disagree on failing", req.Host, req.URL.Path)
		}
	}
}
