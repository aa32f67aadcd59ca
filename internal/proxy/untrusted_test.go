package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/loadshed/loadshed/internal/testwait"
)

// Attacks of issue "Untrusted clients", each reproduced against the proxy: they failed on the
// code before the fix and pass after it.

// TestUntrustedPriorityCannotJumpTheQueue (finding 1): a client that claims critical_plus is
// queued as the default priority unless it is trusted, so it cannot displace an honest waiter;
// its admission headers never reach the application.
func TestUntrustedPriorityCannotJumpTheQueue(t *testing.T) {
	for _, c := range []struct {
		name    string
		extra   string
		honest  int // what the honest waiter gets
		spoofer int
	}{
		{"untrusted", "", 200, 503},
		{"trusted source", "trust: {sources: [127.0.0.1, '::1']}", 503, 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := newValve()
			h := start(t, g, "  strategy: bounded-queue\n  boundedQueue: {concurrency: 1, depth: 1, maxWait: 1m}", c.extra)
			codes := make(chan [2]int, 2)
			send := func(who int, hdr ...string) {
				res, _ := get(t, h.front.URL+"/?wait=1", hdr...)
				codes <- [2]int{who, res.StatusCode}
			}
			go send(0) // holds the one slot
			testwait.Until(t, 5*time.Second, "the first request upstream", func() bool { return g.waiting.Load() == 1 })
			go send(1) // the honest waiter, default priority
			testwait.Until(t, 5*time.Second, "the honest waiter queued", func() bool { return h.srv.StageStates()[0].QueueDepth == 1 })
			go send(2, "X-Loadshed-Priority", "critical_plus", "X-Loadshed-Cost", "1")
			got := map[int]int{}
			first := <-codes // the spoofer or the displaced waiter is answered at once
			got[first[0]] = first[1]
			close(g.release)
			for range 2 {
				r := <-codes
				got[r[0]] = r[1]
			}
			if got[1] != c.honest || got[2] != c.spoofer {
				t.Fatalf("honest waiter %d, spoofer %d; want %d and %d", got[1], got[2], c.honest, c.spoofer)
			}
			if last := g.last.Load(); last.Header.Get("X-Loadshed-Priority") != "" || last.Header.Get("X-Loadshed-Cost") != "" {
				t.Fatalf("admission headers reached the application: %v", last.Header)
			}
		})
	}
}

// TestUntrustedCostCannotGoBelowTheRoute (finding 1): on a route of cost 5, X-Loadshed-Cost: 1
// from an untrusted client still costs 5.
func TestUntrustedCostCannotGoBelowTheRoute(t *testing.T) {
	g := newValve()
	h := start(t, g, "  strategy: inflight\n  inflight: {limit: 5}", "routes: [{name: export, pathPrefix: /export, cost: 5}]")
	done := make(chan int, 1)
	go func() {
		res, _ := get(t, h.front.URL+"/export?wait=1", "X-Loadshed-Cost", "1")
		done <- res.StatusCode
	}()
	testwait.Until(t, 5*time.Second, "the export upstream", func() bool { return g.waiting.Load() == 1 })
	if got := h.srv.StageStates()[0].InFlight; got != 5 {
		t.Fatalf("in flight %v, want the route's cost 5 whatever the client claims", got)
	}
	if res, _ := get(t, h.front.URL+"/export", "X-Loadshed-Cost", "1"); res.StatusCode != 503 {
		t.Fatalf("a second export: %d, want 503 (the limit is used up)", res.StatusCode)
	}
	close(g.release)
	<-done
}

// TestMalformedBodyIsTheClientsError (finding 2): a chunked body whose chunk size is not a
// number, overflows or is negative gets 400, is counted as a client error, never reaches the
// upstream and never shrinks the adaptive limit; the same after a large prefix that was
// admitted and streamed.
func TestMalformedBodyIsTheClientsError(t *testing.T) {
	var hits sync.Map
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Store(r.URL.Path, true)
		io.Copy(io.Discard, r.Body)
	}))
	p := serveProxy(t, "upstream: "+up+"\nlisten: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nshutdown: {drainDelay: 0s, gracePeriod: 1s}\n"+
		"admission: {strategy: adaptive, adaptive: {initialLimit: 4, minLimit: 1, maxLimit: 4, slowStart: 0s, window: 1ms}}\n", Options{})
	before := p.srv.StageStates()[0].Limit
	big := strings.Repeat("b", 100<<10) // over the 64 KiB read before admission
	for i, chunk := range []string{"zz", "ffffffffffffffffffffff", "-5", fmt.Sprintf("%x\r\n%s\r\nzz", len(big), big)} {
		for range 10 {
			res, body := rawRequest(t, p.data, fmt.Sprintf("POST /case%d HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%s\r\n", i, chunk))
			if res.StatusCode != 400 {
				t.Fatalf("chunk %.20q: %d %q, want 400", chunk, res.StatusCode, body)
			}
		}
		if _, reached := hits.Load(fmt.Sprintf("/case%d", i)); reached && i < 3 {
			t.Errorf("chunk %q reached the upstream", chunk)
		}
	}
	if after := p.srv.StageStates()[0].Limit; after < before {
		t.Fatalf("limit %v -> %v: a client's malformed body must not shrink it", before, after)
	}
	m := p.srv.gate.Metrics().Requests
	if got := testutil.ToFloat64(m.WithLabelValues("default", "adaptive", "http", "client_error", "400")); got != 40 {
		t.Fatalf("400 counted %v times as client errors, want 40", got)
	}
	if got := testutil.ToFloat64(m.WithLabelValues("default", "adaptive", "http", "upstream_error", "502")); got != 0 {
		t.Fatalf("%v malformed bodies counted as upstream errors", got)
	}
	if got := p.srv.StageStates()[0].InFlight; got != 0 {
		t.Fatalf("in flight %v afterwards", got)
	}
}

// TestSlowSendersHoldNoPermit (finding 3a): clients that announce a small body and never send it
// wait without a permit: with a limit of 1, eight of them leave an honest client served, and
// each gets 408 at server.requestBodyTimeout.
func TestSlowSendersHoldNoPermit(t *testing.T) {
	g := newValve()
	up := newUpstream(t, g)
	p := serveProxy(t, "upstream: "+up+"\nlisten: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nshutdown: {drainDelay: 0s, gracePeriod: 1s}\n"+
		"server: {requestBodyTimeout: 500ms}\nadmission: {strategy: inflight, inflight: {limit: 1}}\n", Options{})
	answers := make(chan int, 8)
	for range 8 {
		go func() {
			c, err := net.Dial("tcp", p.data)
			if err != nil {
				answers <- -1
				return
			}
			defer c.Close()
			io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n") // and nothing more
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				answers <- -2
				return
			}
			res.Body.Close()
			answers <- res.StatusCode
		}()
	}
	for range 5 {
		if res, body := rawRequest(t, p.data, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok"); res.StatusCode != 200 {
			t.Fatalf("honest client while 8 attackers stall: %d %q", res.StatusCode, body)
		}
	}
	for range 8 {
		if code := <-answers; code != 408 {
			t.Fatalf("a stalled sender got %d, want 408", code)
		}
	}
	if got := testutil.ToFloat64(p.srv.gate.Metrics().Requests.WithLabelValues("default", "inflight", "http", "client_error", "408")); got != 8 {
		t.Fatalf("408 counted %v times as client errors, want 8", got)
	}
}

// TestSlowReadersHoldNoPermit (finding 3b): a client that asks for an answer and does not read
// it holds no permit once the upstream is done with a small answer (read in full, released at
// once), and holds a large answer's permit only until server.writeIdleTimeout cuts it off.
func TestSlowReadersHoldNoPermit(t *testing.T) {
	small := strings.Repeat("s", 8<<10)
	large := strings.Repeat("L", 20<<20)
	var hits atomic.Int64
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer hits.Add(1)
		body := small
		if r.URL.Path == "/large" {
			body = large
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		io.WriteString(w, body)
	}))
	p := serveProxy(t, "upstream: "+up+"\nlisten: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nshutdown: {drainDelay: 0s, gracePeriod: 1s}\n"+
		"server: {writeIdleTimeout: 300ms}\nadmission: {strategy: inflight, inflight: {limit: 1}}\n", Options{})
	stall := func(path string) net.Conn {
		c, err := net.Dial("tcp", p.data)
		if err != nil {
			t.Fatal(err)
		}
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetReadBuffer(4 << 10) // a reader that takes nothing
		}
		io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
		t.Cleanup(func() { c.Close() })
		return c
	}
	stall("/small")
	testwait.Until(t, 5*time.Second, "the small answer's permit back", func() bool { return hits.Load() == 1 && p.srv.StageStates()[0].InFlight == 0 })
	if res, _ := rawRequest(t, p.data, "GET /small HTTP/1.1\r\nHost: x\r\n\r\n"); res.StatusCode != 200 {
		t.Fatalf("behind a stalled reader of a small answer: %d", res.StatusCode)
	}
	stall("/large")
	testwait.Until(t, 5*time.Second, "the large answer to start", func() bool { return p.srv.StageStates()[0].InFlight == 1 })
	// The writer blocks on the full socket; the idle write timeout ends it.
	testwait.Until(t, 5*time.Second, "the stalled large answer cut off", func() bool { return p.srv.StageStates()[0].InFlight == 0 })
	if res, _ := rawRequest(t, p.data, "GET /small HTTP/1.1\r\nHost: x\r\n\r\n"); res.StatusCode != 200 {
		t.Fatalf("after a stalled reader of a large answer was cut off: %d", res.StatusCode)
	}
}

// TestConnectionCaps (finding 5): at server.maxConnections the longest-idle keep-alive connection
// is closed to make room for a new client; a source over server.maxConnectionsPerSource has its
// new connection closed at once; requests on open connections are unaffected.
func TestConnectionCaps(t *testing.T) {
	up := newUpstream(t, newValve())
	p := serveProxy(t, "upstream: "+up+"\nlisten: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nshutdown: {drainDelay: 0s, gracePeriod: 1s}\n"+
		"server: {maxConnections: 4}\nadmission: {strategy: none}\n", Options{})
	open := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", p.data)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	ask := func(c net.Conn, r *bufio.Reader) error {
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return err
		}
		res, err := http.ReadResponse(r, nil)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, res.Body)
		return res.Body.Close()
	}
	type conn struct {
		c net.Conn
		r *bufio.Reader
	}
	var idle []conn
	for range 4 { // four keep-alive connections, idle after one request each
		c, r := open()
		if err := ask(c, r); err != nil {
			t.Fatal(err)
		}
		idle = append(idle, conn{c, r})
	}
	testwait.Until(t, 5*time.Second, "four connections held", func() bool { held, _, _ := p.srv.conns.counts(); return held == 4 })
	// A fifth client is served: the longest-idle connection made room.
	c5, r5 := open()
	if err := ask(c5, r5); err != nil {
		t.Fatalf("a new client at the cap: %v", err)
	}
	if held, _, evicted := p.srv.conns.counts(); held > 4 || evicted != 1 {
		t.Fatalf("held %d, evicted %d; want at most 4 held after one eviction", held, evicted)
	}
	// The newest of the idle four still carries requests.
	if err := ask(idle[3].c, idle[3].r); err != nil {
		t.Fatalf("a request on a connection that stayed open: %v", err)
	}
}

func TestConnectionCapPerSource(t *testing.T) {
	up := newUpstream(t, newValve())
	p := serveProxy(t, "upstream: "+up+"\nlisten: 127.0.0.1:0\nadminListen: 127.0.0.1:0\nshutdown: {drainDelay: 0s, gracePeriod: 1s}\n"+
		"server: {maxConnectionsPerSource: 2}\nadmission: {strategy: none}\n", Options{})
	var conns []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", p.data)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		defer c.Close()
	}
	testwait.Until(t, 5*time.Second, "two connections held", func() bool { held, _, _ := p.srv.conns.counts(); return held == 2 })
	c, err := net.Dial("tcp", p.data)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
		t.Fatal("a third connection from one source was served; want it closed")
	}
	if _, rejected, _ := p.srv.conns.counts(); rejected != 1 {
		t.Fatalf("rejected %d, want 1", rejected)
	}
	// The source's first connections still work.
	io.WriteString(conns[0], "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if res, err := http.ReadResponse(bufio.NewReader(conns[0]), nil); err != nil || res.StatusCode != 200 {
		t.Fatalf("an open connection of that source: %v", err)
	}
}

// TestClientKeysTheClientChooses (finding 7): a fresh key header per request from an untrusted
// client does not escape its bucket (its address is its key), and folded keys share one.
func TestClientKeysTheClientChooses(t *testing.T) {
	h := start(t, newValve(), "  strategy: none", "headers: {clientKey: X-Client}\nclients: {rate: 0.001, burst: 2}")
	for i := range 2 {
		if res, _ := get(t, h.front.URL+"/", "X-Client", fmt.Sprint("fresh-", i)); res.StatusCode != 200 {
			t.Fatalf("within the burst: %d", res.StatusCode)
		}
	}
	if res, _ := get(t, h.front.URL+"/", "X-Client", "fresh-3"); res.StatusCode != 429 {
		t.Fatalf("a fresh key from an untrusted client: %d, want 429 (its address is its key)", res.StatusCode)
	}
	trusted := start(t, newValve(), "  strategy: none", "headers: {clientKey: X-Client, clientKeyFold: true}\nclients: {rate: 0.001, burst: 2}",
		"trust: {sources: [127.0.0.1, '::1']}")
	for _, k := range []string{"Alice", "ALICE "} {
		if res, _ := get(t, trusted.front.URL+"/", "X-Client", k); res.StatusCode != 200 {
			t.Fatalf("%q within alice's burst: %d", k, res.StatusCode)
		}
	}
	if res, _ := get(t, trusted.front.URL+"/", "X-Client", "alice"); res.StatusCode != 429 {
		t.Fatalf("alice, Alice and ALICE share one bucket: %d, want 429", res.StatusCode)
	}
}

// TestOneReloadPerContentChange (finding 4): a SIGHUP and the watcher seeing the same file, or
// two SIGHUPs, reload it once and count it once, valid or not.
func TestOneReloadPerContentChange(t *testing.T) {
	up := newUpstream(t, newValve())
	path := filepath.Join(t.TempDir(), "config.yaml")
	write := func(admission string) {
		t.Helper()
		if err := os.WriteFile(path, []byte("upstream: "+up+"\nreload: {watch: false}\nadmission: "+admission+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("{strategy: inflight, inflight: {limit: 1}}")
	data, _ := os.ReadFile(path)
	s := newProxy(t, string(data), Options{ConfigPath: path}).srv
	reloads := func(result string) float64 {
		return testutil.ToFloat64(s.gate.Metrics().Reloads.WithLabelValues(result))
	}
	for range 3 {
		if err := s.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	if reloads("success") != 0 {
		t.Fatalf("the unchanged file was reloaded %v times", reloads("success"))
	}
	write("{strategy: inflight, inflight: {limit: 2}}")
	for range 3 {
		if err := s.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	write("{strategy: inflight, inflight: {limit: -2}}")
	for range 3 {
		if err := s.Reload(); err == nil {
			t.Fatal("an invalid file was accepted")
		}
	}
	if reloads("success") != 1 || reloads("failure") != 1 {
		t.Fatalf("success %v, failure %v: want one of each, one per content change", reloads("success"), reloads("failure"))
	}
}
