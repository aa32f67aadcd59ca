package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"testing"
)

// recorder is an upstream that remembers the last request it was sent.
type recorder struct {
	mu   sync.Mutex
	last *http.Request
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec.mu.Lock()
	rec.last = r
	rec.mu.Unlock()
	io.WriteString(w, "ok\n")
}

func (rec *recorder) request() *http.Request {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.last
}

// TestInformationalAnswersArePassedOn: a 103 Early Hints from the upstream reaches the client
// with its headers, and the final answer does not repeat them.
func TestInformationalAnswersArePassedOn(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</app.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		io.WriteString(w, "ok\n")
	}))
	defer up.Close()
	h := frontProxy(t, proxyYAML(up.URL, "  strategy: none"))

	var mu sync.Mutex
	var codes []int
	var links []string
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, hdr textproto.MIMEHeader) error {
		mu.Lock()
		defer mu.Unlock()
		codes = append(codes, code)
		links = append(links, hdr.Get("Link"))
		return nil
	}}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), "GET", h.front.URL+"/", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(codes) != 1 || codes[0] != http.StatusEarlyHints || links[0] != "</app.css>; rel=preload" {
		t.Fatalf("informational answers %v with Link %q, want one 103 with the upstream's Link", codes, links)
	}
	if res.StatusCode != 200 || res.Header.Get("Link") != "" {
		t.Fatalf("final answer %d with Link %q, want 200 without it", res.StatusCode, res.Header.Get("Link"))
	}
}

// TestTrailersArePassedOn: announced trailers arrive as trailers, and so do ones the upstream
// adds without announcing them.
func TestTrailersArePassedOn(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		io.WriteString(w, "body\n")
		w.Header().Set("X-Sum", "42")
		w.Header().Set(http.TrailerPrefix+"X-Late", "yes")
	}))
	defer up.Close()
	h := frontProxy(t, proxyYAML(up.URL, "  strategy: none"))
	res, body := get(t, h.front.URL+"/")
	if body != "body\n" {
		t.Fatalf("body %q", body)
	}
	if got := res.Trailer.Get("X-Sum"); got != "42" {
		t.Errorf("announced trailer X-Sum = %q, want 42 (trailers %v)", got, res.Trailer)
	}
	if got := res.Trailer.Get("X-Late"); got != "yes" {
		t.Errorf("unannounced trailer X-Late = %q, want yes (trailers %v)", got, res.Trailer)
	}
}

// TestUpstreamURLAndQuery: the upstream's base path comes first; a query another
// server could split differently (semicolons, bad escapes) is re-encoded, a plain one passes
// byte for byte; an escaped path keeps its escapes.
func TestUpstreamURLAndQuery(t *testing.T) {
	rec := &recorder{}
	up := httptest.NewServer(rec)
	defer up.Close()
	cases := []struct {
		upstream, path   string
		wantPath, wantRQ string
	}{
		{up.URL, "/a/b?z=1&a=2", "/a/b", "z=1&a=2"},
		{up.URL + "/base", "/x?y=1", "/base/x", "y=1"},
		{up.URL + "/base/", "/x/?y=1", "/base/x/", "y=1"},
		{up.URL, "/p?a=1;b=2&c=3", "/p", "c=3"},
		{up.URL, "/p?a=%zz&c=3", "/p", "c=3"},
		{up.URL, "/a%2Fb", "/a%2Fb", ""},
	}
	for _, c := range cases {
		h := frontProxy(t, proxyYAML(c.upstream, "  strategy: none"))
		if res, _ := get(t, h.front.URL+c.path); res.StatusCode != 200 {
			t.Fatalf("%s via %s: status %d", c.path, c.upstream, res.StatusCode)
		}
		r := rec.request()
		if r.URL.EscapedPath() != c.wantPath || r.URL.RawQuery != c.wantRQ {
			t.Errorf("%s via %s: upstream saw %s?%s, want %s?%s", c.path, c.upstream, r.URL.EscapedPath(), r.URL.RawQuery, c.wantPath, c.wantRQ)
		}
	}
}

// TestNoUserAgentIsInvented: a request without User-Agent reaches the upstream without one
// (not with the Go client's); one with it keeps it.
func TestNoUserAgentIsInvented(t *testing.T) {
	rec := &recorder{}
	up := httptest.NewServer(rec)
	defer up.Close()
	h := frontProxy(t, proxyYAML(up.URL, "  strategy: none"))
	addr := strings.TrimPrefix(h.front.URL, "http://")
	if res, _ := rawRequest(t, addr, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	if ua, ok := rec.request().Header["User-Agent"]; ok {
		t.Errorf("upstream got User-Agent %q, want none", ua)
	}
	if res, _ := get(t, h.front.URL+"/", "User-Agent", "curl/8"); res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	if ua := rec.request().Header.Get("User-Agent"); ua != "curl/8" {
		t.Errorf("upstream got User-Agent %q, want curl/8", ua)
	}
}

// TestPooledBuffersNeverMixBodies: many clients at once send bodies of every size class (read
// before admission, pooled; streamed past the buffer) and get them echoed (responses buffered
// from a pool too): every client gets back exactly its own bytes.
func TestPooledBuffersNeverMixBodies(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.Write(b)
	}))
	defer up.Close()
	h := frontProxy(t, proxyYAML(up.URL, "  strategy: inflight\n  inflight: {limit: 64}"))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer client.CloseIdleConnections()
	sizes := []int{1, 100, 4 << 10, 4<<10 + 1, 30 << 10, 64 << 10, 64<<10 + 1, 100 << 10}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for c := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 16 {
				n := sizes[(c+i)%len(sizes)]
				want := bytes.Repeat([]byte{byte('a' + (c*31+i)%26)}, n)
				res, err := client.Post(h.front.URL+"/", "application/octet-stream", bytes.NewReader(want))
				if err != nil {
					errs <- err
					return
				}
				got, err := io.ReadAll(res.Body)
				res.Body.Close()
				if err != nil || res.StatusCode != 200 || !bytes.Equal(got, want) {
					errs <- fmt.Errorf("client %d request %d (%d bytes): status %d, %d bytes back, same: %v, err %v", c, i, n, res.StatusCode, len(got), bytes.Equal(got, want), err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
