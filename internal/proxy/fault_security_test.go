package proxy

// Hostile requests: the proxy forwards only to its configured upstream, opens no tunnels,
// handles hop-by-hop and forwarding headers deliberately, and keeps its admin endpoints off the
// data port.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/loadshed/loadshed/internal/config"
)

// rawRequest writes req on a new connection to addr and reads one response (as the answer to
// req's method: no body for HEAD), with its whole body; bounded in time.
func rawRequest(t *testing.T, addr, req string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	method, _, _ := strings.Cut(req, " ")
	res, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("no response to %q: %v", req, err)
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatalf("response to %q cut short: %v", req, err)
	}
	return res, string(b)
}

// TestSecurityConnectIsRefused: CONNECT would ask the proxy for a tunnel; a sidecar forwards
// requests to its one upstream and opens none. Before the fix it forwarded the CONNECT upstream.
func TestSecurityConnectIsRefused(t *testing.T) {
	g := newValve()
	h := start(t, g, "  strategy: none")
	addr := strings.TrimPrefix(h.front.URL, "http://")
	for _, target := range []string{"evil.example:443", "127.0.0.1:22", strings.TrimPrefix(h.upstream.URL, "http://")} {
		res, body := rawRequest(t, addr, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n")
		if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") == "" || strings.Contains(res.Header.Get("Allow"), "CONNECT") {
			t.Fatalf("CONNECT %s: %d Allow %q %q, want 405 with an Allow header without CONNECT", target, res.StatusCode, res.Header.Get("Allow"), body)
		}
	}
	if g.hits.Load() != 0 {
		t.Fatalf("the upstream saw %d CONNECT requests", g.hits.Load())
	}
	if got := testutil.ToFloat64(h.srv.gate.Metrics().Requests.WithLabelValues("default", "none", "http", "client_error", "405")); got != 3 {
		t.Fatalf("405 counted %v times", got)
	}
}

// TestSecurityNoOpenProxy: whatever host an absolute URL or a Host header names, including the
// proxy's own admin port and a link-local metadata address, the request goes to the configured
// upstream and nowhere else.
func TestSecurityNoOpenProxy(t *testing.T) {
	var decoyHits atomic.Int64
	decoy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { decoyHits.Add(1) }))
	defer decoy.Close()
	for _, preserve := range []bool{true, false} {
		g := newValve()
		h := start(t, g, "  strategy: none", fmt.Sprintf("preserveHost: %v", preserve))
		addr := strings.TrimPrefix(h.front.URL, "http://")
		decoyAddr := strings.TrimPrefix(decoy.URL, "http://")
		upstreamHost := strings.TrimPrefix(h.upstream.URL, "http://")
		for _, req := range []string{
			"GET " + decoy.URL + "/x HTTP/1.1\r\nHost: " + decoyAddr + "\r\n\r\n",
			"GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n",
			"GET /x HTTP/1.1\r\nHost: " + decoyAddr + "\r\n\r\n",
			"GET https://" + decoyAddr + "/x HTTP/1.1\r\nHost: " + decoyAddr + "\r\n\r\n",
			"GET //" + decoyAddr + "/x HTTP/1.1\r\nHost: x\r\n\r\n",
		} {
			before := g.hits.Load()
			res, body := rawRequest(t, addr, req)
			if res.StatusCode != 200 || body != "hello from upstream\n" || g.hits.Load() != before+1 {
				t.Fatalf("%q: %d %q, want the upstream's answer", req, res.StatusCode, body)
			}
			if r := g.last.Load(); !preserve && r.Host != upstreamHost {
				t.Fatalf("preserveHost false: upstream saw Host %q, want %q", r.Host, upstreamHost)
			}
		}
	}
	// net/http answers "OPTIONS *" itself: it reaches neither the upstream nor anyone else.
	g := newValve()
	h := start(t, g, "  strategy: none")
	res, _ := rawRequest(t, strings.TrimPrefix(h.front.URL, "http://"), "OPTIONS * HTTP/1.1\r\nHost: "+strings.TrimPrefix(decoy.URL, "http://")+"\r\n\r\n")
	if res.StatusCode != 200 || g.hits.Load() != 0 {
		t.Fatalf("OPTIONS *: %d, upstream hits %d", res.StatusCode, g.hits.Load())
	}
	if decoyHits.Load() != 0 {
		t.Fatalf("another host was reached %d times", decoyHits.Load())
	}
}

// TestSecurityHopByHopHeaders: hop-by-hop headers, standard or named in Connection, are dropped
// in both directions.
func TestSecurityHopByHopHeaders(t *testing.T) {
	var seen atomic.Pointer[http.Header]
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Clone()
		seen.Store(&h)
		w.Header().Set("Connection", "X-Up-Secret")
		w.Header().Set("X-Up-Secret", "hop")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("Proxy-Authenticate", "Basic")
		w.Header().Set("X-End-To-End", "kept")
		io.WriteString(w, "ok")
	})
	h := start(t, up, "  strategy: none")
	res, _ := rawRequest(t, strings.TrimPrefix(h.front.URL, "http://"), "GET / HTTP/1.1\r\nHost: x\r\n"+
		"Connection: keep-alive, X-Client-Secret\r\nX-Client-Secret: hop\r\nKeep-Alive: timeout=5\r\n"+
		"Proxy-Authorization: Basic Zm9vOmJhcg==\r\nProxy-Connection: keep-alive\r\nTE: gzip\r\nTrailer: X-T\r\n"+
		"Upgrade: h2c\r\nX-End-To-End: kept\r\n\r\n")
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	got := *seen.Load()
	for _, name := range []string{"X-Client-Secret", "Keep-Alive", "Proxy-Authorization", "Proxy-Connection", "Te", "Trailer", "Upgrade"} {
		if v := got.Get(name); v != "" {
			t.Errorf("upstream received hop-by-hop %s: %q", name, v)
		}
	}
	if got.Get("X-End-To-End") != "kept" {
		t.Error("an end-to-end header was dropped")
	}
	for _, name := range []string{"X-Up-Secret", "Keep-Alive", "Proxy-Authenticate"} {
		if v := res.Header.Get(name); v != "" {
			t.Errorf("client received hop-by-hop %s: %q", name, v)
		}
	}
	if res.Header.Get("X-End-To-End") != "kept" {
		t.Error("an end-to-end response header was dropped")
	}
}

// TestSecuritySpoofedForwardingHeaders: from an untrusted client, X-Forwarded-For/-Host/-Proto
// and Forwarded are replaced by what the proxy sees (or dropped), and a spoofed X-Forwarded-For
// does not give a client a fresh per-client bucket.
func TestSecuritySpoofedForwardingHeaders(t *testing.T) {
	g := newValve()
	h := start(t, g, "  strategy: none", "clients: {rate: 0.001, burst: 1, maxKeys: 100}")
	hdr := []string{"X-Forwarded-For", "6.6.6.6", "X-Forwarded-Host", "evil.example", "X-Forwarded-Proto", "https", "Forwarded", "for=6.6.6.6;host=evil.example;proto=https"}
	res, _ := get(t, h.front.URL+"/", hdr...)
	if res.StatusCode != 200 {
		t.Fatalf("first request: %d", res.StatusCode)
	}
	r := g.last.Load()
	if got := r.Header.Get("X-Forwarded-For"); got != "127.0.0.1" {
		t.Errorf("X-Forwarded-For %q, want the client's address only", got)
	}
	if got := r.Header.Get("X-Forwarded-Proto"); got != "http" {
		t.Errorf("X-Forwarded-Proto %q, want http (what the proxy saw)", got)
	}
	if got := r.Header.Get("X-Forwarded-Host"); got == "evil.example" {
		t.Errorf("X-Forwarded-Host %q passed through from an untrusted client", got)
	}
	if got := r.Header.Get("Forwarded"); got != "" {
		t.Errorf("Forwarded %q passed through from an untrusted client", got)
	}
	// The client's bucket is keyed by its address, not by what it claims.
	for i, ip := range []string{"1.1.1.1", "2.2.2.2", "3.3.3.3"} {
		res, _ := get(t, h.front.URL+"/", "X-Forwarded-For", ip)
		if res.StatusCode != 429 {
			t.Fatalf("request %d with X-Forwarded-For %s: %d, want 429 (same client)", i+2, ip, res.StatusCode)
		}
	}
}

// TestSecurityAdminIsSeparateFromData: the data port serves none of the proxy's own endpoints
// (they go to the upstream like any path); the admin port forwards nothing, offers nothing that
// changes behaviour at run time, and refuses writes; a config cannot put both on one address.
func TestSecurityAdminIsSeparateFromData(t *testing.T) {
	g := newValve()
	h := start(t, g, "  strategy: inflight\n  inflight: {limit: 4}")
	for _, path := range []string{"/metrics", "/healthz", "/readyz", "/debug/pprof/", "/admin/config"} {
		before := g.hits.Load()
		res, body := get(t, h.front.URL+path)
		if res.StatusCode != 200 || body != "hello from upstream\n" || g.hits.Load() != before+1 {
			t.Fatalf("data port %s: %d %q, want the upstream's answer", path, res.StatusCode, body)
		}
	}
	admin := httptest.NewServer(h.srv.AdminHandler())
	defer admin.Close()
	before := g.hits.Load()
	for _, c := range []struct {
		method, path string
		code         int
	}{
		{"GET", "/metrics", 200}, {"GET", "/healthz", 200}, {"GET", "/readyz", 200},
		{"GET", "/", 200}, {"POST", "/", 405}, {"GET", "/anything", 404}, {"GET", "/debug/pprof/", 404}, {"GET", "/admin/config", 404},
		{"POST", "/admin/config", 404}, {"POST", "/metrics", 405}, {"POST", "/drain?delay=1s", 405}, {"GET", "/drain?delay=forever", 403}, {"PUT", "/readyz", 405}, {"DELETE", "/healthz", 405},
	} {
		req, _ := http.NewRequest(c.method, admin.URL+c.path, strings.NewReader(`{"workers":1}`))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != c.code {
			t.Errorf("admin %s %s: %d, want %d", c.method, c.path, res.StatusCode, c.code)
		}
	}
	if g.hits.Load() != before {
		t.Fatal("the admin port forwarded a request to the upstream")
	}
	_, err := config.Parse([]byte("upstream: http://127.0.0.1:1\nlisten: 127.0.0.1:9000\nadminListen: 127.0.0.1:9000\n"))
	if err == nil || !strings.Contains(err.Error(), "adminListen") {
		t.Fatalf("same data and admin address: %v, want a problem naming adminListen", err)
	}
}
