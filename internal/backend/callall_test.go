package backend

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/loadshed/loadshed/internal/testwait"
)

// leg is a service a frontend calls: an httptest server on 127.0.0.1 answering with handle.
type leg struct {
	ts  *httptest.Server
	mu  sync.Mutex
	hdr []http.Header // the headers of every request it got
}

func newLeg(t *testing.T, handle func(w http.ResponseWriter, r *http.Request)) *leg {
	t.Helper()
	l := &leg{}
	l.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		l.hdr = append(l.hdr, r.Header.Clone())
		l.mu.Unlock()
		handle(w, r)
	}))
	t.Cleanup(l.ts.Close)
	return l
}

func answerWith(code int, retryAfter string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(code)
		_, _ = io.WriteString(w, "answer\n")
	}
}

// newFrontendServer is a Server in frontend mode calling legs, behind an httptest server.
func newFrontendServer(t *testing.T, c CallAll, legs ...*leg) (*Server, *httptest.Server, *prometheus.Registry) {
	t.Helper()
	for _, l := range legs {
		c.URLs = append(c.URLs, l.ts.URL+"/work")
	}
	reg := prometheus.NewRegistry()
	s, err := New(constant(1, time.Millisecond), WithRegistry(reg), WithCallAll(c))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ts.Close()
		s.Close()
	})
	return s, ts, reg
}

type answer struct {
	code       int
	retryAfter string
	body       string
}

func send(t *testing.T, ctx context.Context, url string, hdr http.Header) (answer, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if hdr != nil {
		req.Header = hdr
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header.Get("Retry-After"), string(b)}, err
}

func mustSend(t *testing.T, url string, hdr http.Header) answer {
	t.Helper()
	a, err := send(t, context.Background(), url, hdr)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return a
}

func legCount(reg *prometheus.Registry, l *leg, result string) float64 {
	return counterValue(reg, "backend_frontend_legs_total", map[string]string{"leg": l.ts.URL + "/work", "result": result})
}

func userCount(reg *prometheus.Registry, result string) float64 {
	return counterValue(reg, "backend_frontend_requests_total", map[string]string{"result": result})
}

// counterValue reads one counter of reg by name and labels; -1 when absent.
func counterValue(reg *prometheus.Registry, name string, labels map[string]string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return -1
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

func TestFrontendAnswers200WhenEveryLegDidAndPassesTheTraceOn(t *testing.T) {
	a, b, c := newLeg(t, answerWith(200, "")), newLeg(t, answerWith(204, "")), newLeg(t, answerWith(200, ""))
	_, ts, reg := newFrontendServer(t, CallAll{}, a, b, c)
	hdr := http.Header{
		"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		"Tracestate":  {"vendor=x"},
		"Baggage":     {"loadshed-rank=7.abcdef0123456789,other=1"},
		"X-User-Id":   {"user-42"},
		"X-Secret":    {"not for the legs"},
	}
	got := mustSend(t, ts.URL+"/", hdr)
	if got.code != http.StatusOK || got.body != "ok\n" {
		t.Fatalf("answer %d %q, want 200 ok", got.code, got.body)
	}
	for i, l := range []*leg{a, b, c} {
		if len(l.hdr) != 1 {
			t.Fatalf("leg %d got %d requests, want 1", i, len(l.hdr))
		}
		h := l.hdr[0]
		for _, name := range []string{"Traceparent", "Tracestate", "Baggage", "X-User-Id"} {
			if h.Get(name) != hdr.Get(name) {
				t.Errorf("leg %d: %s = %q, want %q", i, name, h.Get(name), hdr.Get(name))
			}
		}
		if h.Get("X-Secret") != "" {
			t.Errorf("leg %d got X-Secret, which is not passed on", i)
		}
		if v := legCount(reg, l, LegOK); v != 1 {
			t.Errorf("leg %d: ok legs %v, want 1", i, v)
		}
	}
	if v := userCount(reg, UserOK); v != 1 {
		t.Errorf("ok user requests %v, want 1", v)
	}
}

func TestFrontendUserHeaderIsConfigurable(t *testing.T) {
	a := newLeg(t, answerWith(200, ""))
	_, ts, _ := newFrontendServer(t, CallAll{UserHeader: "X-Account"}, a)
	mustSend(t, ts.URL+"/", http.Header{"X-Account": {"acct-1"}, "X-User-Id": {"u"}})
	if got := a.hdr[0].Get("X-Account"); got != "acct-1" {
		t.Errorf("X-Account = %q, want acct-1", got)
	}
	if got := a.hdr[0].Get("X-User-Id"); got != "" {
		t.Errorf("X-User-Id passed on as %q although the user header is X-Account", got)
	}
}

func TestFrontendRefusedLegMakes503WithTheLongestRetryAfter(t *testing.T) {
	ok1, ok2 := newLeg(t, answerWith(200, "")), newLeg(t, answerWith(200, ""))
	shed1, shed2 := newLeg(t, answerWith(503, "3")), newLeg(t, answerWith(429, "1"))
	broken := newLeg(t, answerWith(500, ""))
	_, ts, reg := newFrontendServer(t, CallAll{}, ok1, shed1, ok2, shed2, broken)
	got := mustSend(t, ts.URL+"/", nil)
	if got.code != http.StatusServiceUnavailable || got.retryAfter != "3" {
		t.Fatalf("answer %d Retry-After %q, want 503 with 3", got.code, got.retryAfter)
	}
	for _, w := range []struct {
		l      *leg
		result string
	}{{ok1, LegWasted}, {ok2, LegWasted}, {shed1, LegRefused}, {shed2, LegRefused}, {broken, LegFailed}} {
		if v := legCount(reg, w.l, w.result); v != 1 {
			t.Errorf("leg %s: %s = %v, want 1", w.l.ts.URL, w.result, v)
		}
		if v := legCount(reg, w.l, LegOK); v != 0 {
			t.Errorf("leg %s: ok = %v, want 0", w.l.ts.URL, v)
		}
	}
	if u, f := userCount(reg, UserOK), userCount(reg, UserFailed); u != 0 || f != 1 {
		t.Errorf("user requests ok %v failed %v, want 0 and 1", u, f)
	}
}

func TestFrontendRefusalWithoutRetryAfterStillCarriesOne(t *testing.T) {
	_, ts, _ := newFrontendServer(t, CallAll{}, newLeg(t, answerWith(429, "")))
	got := mustSend(t, ts.URL+"/", nil)
	if got.code != http.StatusServiceUnavailable || got.retryAfter != "1" {
		t.Fatalf("answer %d Retry-After %q, want 503 with 1", got.code, got.retryAfter)
	}
}

func TestFrontendFailedLegMakes502(t *testing.T) {
	ok := newLeg(t, answerWith(200, ""))
	broken := newLeg(t, answerWith(500, ""))
	_, ts, reg := newFrontendServer(t, CallAll{}, ok, broken)
	got := mustSend(t, ts.URL+"/", nil)
	if got.code != http.StatusBadGateway || got.retryAfter != "" {
		t.Fatalf("answer %d Retry-After %q, want 502 without one", got.code, got.retryAfter)
	}
	if !strings.Contains(got.body, broken.ts.URL+"/work: failed: status 500") {
		t.Errorf("body %q does not name the failed leg", got.body)
	}
	if legCount(reg, ok, LegWasted) != 1 || legCount(reg, broken, LegFailed) != 1 {
		t.Errorf("legs: wasted %v failed %v, want 1 and 1", legCount(reg, ok, LegWasted), legCount(reg, broken, LegFailed))
	}
}

func TestFrontendUnreachableLegFails(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String() + "/"
	l.Close()
	reg := prometheus.NewRegistry()
	s, err := New(constant(1, time.Millisecond), WithRegistry(reg), WithCallAll(CallAll{URLs: []string{dead}}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	if got := mustSend(t, ts.URL, nil); got.code != http.StatusBadGateway {
		t.Fatalf("answer %d, want 502", got.code)
	}
	if v := counterValue(reg, "backend_frontend_legs_total", map[string]string{"leg": dead, "result": LegFailed}); v != 1 {
		t.Errorf("failed legs %v, want 1", v)
	}
}

// A leg still running when another fails runs to its end: its work is what the frontend
// wastes, and it is counted so.
func TestFrontendDoesNotCancelALegWhenAnotherFails(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	var canceled atomic.Bool
	slow := newLeg(t, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		select {
		case <-release:
		case <-r.Context().Done():
			canceled.Store(true)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	fastDone := make(chan struct{})
	fast := newLeg(t, func(w http.ResponseWriter, _ *http.Request) {
		defer close(fastDone)
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	_, ts, reg := newFrontendServer(t, CallAll{}, slow, fast)
	res := make(chan answer, 1)
	go func() {
		a, _ := send(t, context.Background(), ts.URL, nil)
		res <- a
	}()
	<-arrived
	<-fastDone
	close(release)
	got := <-res
	if got.code != http.StatusServiceUnavailable {
		t.Fatalf("answer %d, want 503", got.code)
	}
	if canceled.Load() {
		t.Fatal("the slow leg was cancelled when the other was refused")
	}
	if v := legCount(reg, slow, LegWasted); v != 1 {
		t.Errorf("wasted legs %v, want 1", v)
	}
}

// A client that goes away cancels its request's legs.
func TestFrontendCancelsTheLegsWhenTheClientLeaves(t *testing.T) {
	var arrivals sync.WaitGroup
	arrivals.Add(2)
	canceled := make(chan struct{}, 2)
	hold := func(w http.ResponseWriter, r *http.Request) {
		arrivals.Done()
		<-r.Context().Done() // the test never releases it otherwise
		canceled <- struct{}{}
	}
	a, b := newLeg(t, hold), newLeg(t, hold)
	_, ts, reg := newFrontendServer(t, CallAll{Timeout: time.Minute}, a, b)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := send(t, ctx, ts.URL, nil)
		errc <- err
	}()
	arrivals.Wait()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client error %v, want context.Canceled", err)
	}
	for range 2 {
		select {
		case <-canceled:
		case <-time.After(10 * time.Second):
			t.Fatal("a leg was not cancelled within 10s after its client left")
		}
	}
	testwait.Until(t, 5*time.Second, "both legs counted failed", func() bool {
		return legCount(reg, a, LegFailed) == 1 && legCount(reg, b, LegFailed) == 1 && userCount(reg, UserFailed) == 1
	})
}

func TestFrontendLegsEndAtTheCallTimeout(t *testing.T) {
	hung := newLeg(t, func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	ok := newLeg(t, answerWith(200, ""))
	_, ts, reg := newFrontendServer(t, CallAll{Timeout: 50 * time.Millisecond}, hung, ok)
	if got := mustSend(t, ts.URL, nil); got.code != http.StatusBadGateway {
		t.Fatalf("answer %d, want 502", got.code)
	}
	if legCount(reg, hung, LegFailed) != 1 || legCount(reg, ok, LegWasted) != 1 {
		t.Errorf("legs: failed %v wasted %v, want 1 and 1", legCount(reg, hung, LegFailed), legCount(reg, ok, LegWasted))
	}
}

// The legs share one transport whose connections per host are bounded and reused.
func TestFrontendBoundsAndReusesConnections(t *testing.T) {
	var open, peak, total atomic.Int64
	release := make(chan struct{})
	var busy atomic.Int64
	l := &leg{}
	l.ts = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		busy.Add(1)
		<-release
		w.WriteHeader(http.StatusOK)
	}))
	l.ts.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			total.Add(1)
			n := open.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	l.ts.Start()
	t.Cleanup(l.ts.Close)
	_, ts, reg := newFrontendServer(t, CallAll{Conns: 2, Timeout: time.Minute}, l)

	const users = 8
	var wg sync.WaitGroup
	codes := make(chan int, 2*users)
	round := func() {
		for range users {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a, err := send(t, context.Background(), ts.URL, nil)
				if err != nil {
					codes <- -1
					return
				}
				codes <- a.code
			}()
		}
	}
	round()
	testwait.Until(t, 10*time.Second, "two legs at the leg, the rest waiting for a connection", func() bool {
		return busy.Load() == 2
	})
	close(release)
	wg.Wait()
	round() // a second round reuses the kept-alive connections
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Fatalf("a user request got %d, want 200", c)
		}
	}
	if p := peak.Load(); p > 2 {
		t.Errorf("peak connections to the leg %d, want at most 2", p)
	}
	if n := total.Load(); n > 2 {
		t.Errorf("%d connections opened for %d legs, want at most 2 (kept alive)", n, 2*users)
	}
	if v := legCount(reg, l, LegOK); v != 2*users {
		t.Errorf("ok legs %v, want %d", v, 2*users)
	}
}

func TestFrontendMetricsLint(t *testing.T) {
	_, _, reg := newFrontendServer(t, CallAll{}, newLeg(t, answerWith(200, "")))
	problems, err := testutil.GatherAndLint(reg, "backend_frontend_requests_total", "backend_frontend_legs_total")
	if err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", err, problems)
	}
	// Every leg and result is there from the start, at 0, so a scrape before the load has them.
	if v := userCount(reg, UserFailed); v != 0 {
		t.Errorf("failed user requests before any %v, want 0", v)
	}
}

func TestCallAllValidateNamesTheField(t *testing.T) {
	many := make([]string, MaxLegs+1)
	for i := range many {
		many[i] = "http://127.0.0.1:1/" + strings.Repeat("x", i)
	}
	tests := []struct {
		c    CallAll
		want []string
	}{
		{CallAll{}, []string{"callAll: at least one URL is required"}},
		{CallAll{URLs: many}, []string{"callAll: at most 64 URLs"}},
		{CallAll{URLs: []string{"http://a/", "http://a/"}}, []string{`callAll: URL 2 ("http://a/") is listed twice`}},
		{CallAll{URLs: []string{"ftp://a/", ""}}, []string{"callAll: URL 1", "scheme must be http or https", "callAll: URL 2 is empty"}},
		{CallAll{URLs: []string{"http:///x"}}, []string{"has no host"}},
		{CallAll{URLs: []string{"http://a/"}, Timeout: -time.Second}, []string{"callTimeout: must be > 0"}},
		{CallAll{URLs: []string{"http://a/"}, UserHeader: "X User"}, []string{`userHeader: not a valid header name: "X User"`}},
		{CallAll{URLs: []string{"http://a/"}, Conns: -1}, []string{"callConns: must be in [1, 10000], got -1"}},
	}
	for _, tt := range tests {
		err := tt.c.Validate()
		if err == nil {
			t.Errorf("%+v: valid, want %q", tt.c, tt.want)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: error %q does not contain %q", tt.c, err, w)
			}
		}
	}
	if err := (CallAll{URLs: []string{"http://127.0.0.1:1/a", "https://b.example/"}}).Validate(); err != nil {
		t.Errorf("valid config: %v", err)
	}
	if _, err := New(constant(1, time.Millisecond), WithCallAll(CallAll{})); err == nil {
		t.Error("New accepted a frontend with no URLs")
	}
}

func TestParseURLList(t *testing.T) {
	got := ParseURLList(" http://a/ ,http://b/,, ")
	want := []string{"http://a/", "http://b/", "", ""}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("ParseURLList = %q, want %q", got, want)
	}
	if ParseURLList("  ") != nil {
		t.Error("ParseURLList of blanks is not empty")
	}
}
