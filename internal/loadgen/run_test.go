package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// generous is a late-start tolerance wide enough for a loaded test machine running -race, for
// tests that check counting rather than the generator's punctuality.
const generous = 500 * time.Millisecond

// statusServer answers by path: /ok 200 (400 without the X-Test header, or a POST without the
// body "hello"), /ra429 429 with Retry-After, /shed503 503 without it, /deny 403, /fail 500 and
// anything else 404. It counts the requests it sees.
func statusServer(t *testing.T, seen *atomic.Int64) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/ok":
			if r.Header.Get("X-Test") != "yes" || (r.Method == http.MethodPost) != (string(body) == "hello") {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			io.WriteString(w, strings.Repeat("x", 4096)) // a body to read fully
		case "/ra429":
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		case "/shed503":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/deny":
			w.WriteHeader(http.StatusForbidden)
		case "/fail":
			w.WriteHeader(http.StatusInternalServerError)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestRunCountsEverything(t *testing.T) {
	var seen atomic.Int64
	srv := statusServer(t, &seen)
	okHeader := http.Header{"X-Test": {"yes"}}
	prepare := func(i int) Request {
		switch i % 10 {
		case 4:
			return Request{Path: "/ra429", Tag: "shed"}
		case 5:
			return Request{Path: "/shed503", Tag: "shed"}
		case 6:
			return Request{Path: "/deny", Tag: "shed"}
		case 7:
			return Request{Path: "/fail"}
		case 8:
			return Request{Path: "/missing"}
		case 9:
			return Request{Method: http.MethodPost, Path: "/ok", Header: okHeader, Body: []byte("hello"), Tag: "ok"}
		default:
			return Request{Path: "/ok", Header: okHeader, Tag: "ok"}
		}
	}
	r, err := Run(context.Background(), Config{
		Target:        srv.URL,
		Schedule:      ConstantRate(200, 500*time.Millisecond),
		Timeout:       time.Second,
		Prepare:       prepare,
		LateTolerance: generous,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Valid {
		t.Fatalf("run invalid: %s", r.InvalidReason)
	}
	if got := seen.Load(); got != 100 {
		t.Errorf("server saw %d requests, want 100", got)
	}
	counts := []struct {
		name      string
		got, want int
	}{
		{"Offered", r.Offered, 100},
		{"Sent", r.Sent, 100},
		{"Completed", r.Completed, 100},
		{"Codes[200]", r.Codes[200], 50},
		{"Codes[429]", r.Codes[429], 10},
		{"Codes[503]", r.Codes[503], 10},
		{"Codes[403]", r.Codes[403], 10},
		{"Codes[500]", r.Codes[500], 10},
		{"Codes[404]", r.Codes[404], 10},
		{"Success", r.Success, 50},
		{"Goodput", r.Goodput, 50}, // SLO defaults to the 1 s timeout
		{"Shed", r.Shed, 30},
		{"Admitted", r.Admitted, 70},
		{"RetryAfterEligible", r.RetryAfterEligible, 20},
		{"RetryAfterPresent", r.RetryAfterPresent, 10},
		{"Timeouts", r.Timeouts, 0},
		{"TransportErrors", r.TransportErrors, 0},
		{"Dropped", r.Dropped, 0},
		{"Tags[ok].Success", r.Tags["ok"].Success, 50},
		{"Tags[shed].Shed", r.Tags["shed"].Shed, 30},
		{"Tags[shed].Offered", r.Tags["shed"].Offered, 30},
	}
	for _, c := range counts {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if len(r.Codes) != 6 {
		t.Errorf("Codes = %v, want six codes", r.Codes)
	}
	if r.RetryAfterCoverage != 0.5 || r.ShedShare != 0.3 {
		t.Errorf("RetryAfterCoverage %v ShedShare %v, want 0.5 and 0.3", r.RetryAfterCoverage, r.ShedShare)
	}
	if r.GoodputRPS != 100 || r.OfferedRPS != 200 {
		t.Errorf("GoodputRPS %v OfferedRPS %v, want 100 and 200", r.GoodputRPS, r.OfferedRPS)
	}
	if len(r.Seconds) != 1 || r.Seconds[0].Offered != 100 || r.Seconds[0].Goodput != 50 {
		t.Errorf("Seconds = %+v", r.Seconds)
	}
	if r.PeakInFlight < 1 || r.PeakInFlight > r.MaxInFlight {
		t.Errorf("PeakInFlight %d outside [1, %d]", r.PeakInFlight, r.MaxInFlight)
	}
	if _, err := json.Marshal(r); err != nil {
		t.Errorf("result does not marshal: %v", err)
	}
}

// blockingServer holds every request until the client gives up (or the test ends) and counts
// the requests it sees.
func blockingServer(t *testing.T, seen *atomic.Int64) *httptest.Server {
	t.Helper()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs before srv.Close
	return srv
}

func TestRunCountsTimeouts(t *testing.T) {
	var seen atomic.Int64
	srv := blockingServer(t, &seen)
	r, err := Run(context.Background(), Config{
		Target:        srv.URL,
		Schedule:      ConstantRate(20, 250*time.Millisecond), // 5 requests
		Timeout:       100 * time.Millisecond,
		LateTolerance: generous,
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Offered != 5 || r.Sent != 5 || r.Timeouts != 5 {
		t.Fatalf("offered %d sent %d timeouts %d, want 5 each", r.Offered, r.Sent, r.Timeouts)
	}
	if r.Completed != 0 || r.Goodput != 0 || r.Canceled != 0 || r.TransportErrors != 0 {
		t.Fatalf("completed %d goodput %d canceled %d errors %d, want 0", r.Completed, r.Goodput, r.Canceled, r.TransportErrors)
	}
	if r.Seconds[0].Timeouts != 5 {
		t.Fatalf("Seconds[0] = %+v", r.Seconds[0])
	}
	if !r.Valid {
		t.Fatalf("run invalid: %s", r.InvalidReason)
	}
}

func TestRunDetectsLateStartsAtTheCap(t *testing.T) {
	var seen atomic.Int64
	srv := blockingServer(t, &seen)
	// The first request holds the only slot for the whole 1 s timeout; the other nine are due
	// within 200 ms and find the cap reached.
	r, err := Run(context.Background(), Config{
		Target:      srv.URL,
		Schedule:    ConstantRate(50, 200*time.Millisecond),
		Timeout:     time.Second,
		MaxInFlight: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Offered != 10 || r.Sent != 1 || r.Dropped != 9 || r.Timeouts != 1 {
		t.Fatalf("offered %d sent %d dropped %d timeouts %d, want 10 1 9 1", r.Offered, r.Sent, r.Dropped, r.Timeouts)
	}
	if got := seen.Load(); got != 1 {
		t.Fatalf("server saw %d requests, want 1", got)
	}
	if r.LateStarts < 9 {
		t.Fatalf("LateStarts = %d, want >= 9", r.LateStarts)
	}
	if r.Valid || !strings.Contains(r.InvalidReason, "late starts") {
		t.Fatalf("Valid %v (%q), want invalid for late starts", r.Valid, r.InvalidReason)
	}
	if r.PeakInFlight != 1 {
		t.Fatalf("PeakInFlight = %d, want 1", r.PeakInFlight)
	}
}

func TestRunCountsLatenessAgainstTheSystem(t *testing.T) {
	var seen atomic.Int64
	srv := statusServer(t, &seen)
	const stall = 60 * time.Millisecond
	// Preparing request 5 (due at 50 ms) stalls the dispatcher, so requests 5 to 8 (due at 50 to
	// 80 ms) start at least 20 ms late, although the server answers at once.
	r, err := Run(context.Background(), Config{
		Target:   srv.URL,
		Schedule: ConstantRate(100, 200*time.Millisecond),
		Timeout:  time.Second,
		Prepare: func(i int) Request {
			if i == 5 {
				time.Sleep(stall)
			}
			return Request{Path: "/ok", Header: http.Header{"X-Test": {"yes"}}}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Sent != 20 || r.Codes[200] != 20 || r.Dropped != 0 {
		t.Fatalf("sent %d 200s %d dropped %d, want 20 20 0", r.Sent, r.Codes[200], r.Dropped)
	}
	if r.LateStarts < 4 {
		t.Errorf("LateStarts = %d, want >= 4", r.LateStarts)
	}
	if r.MaxLateness < stall {
		t.Errorf("MaxLateness = %s, want >= %s", r.MaxLateness, stall)
	}
	if r.AdmittedLatency.Max < stall {
		t.Errorf("max latency %s hides the %s late start", r.AdmittedLatency.Max, stall)
	}
	if r.Valid {
		t.Error("run with 4 late starts of 20 marked valid")
	}
}

func TestRunCountsTransportErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connections are refused
	r, err := Run(context.Background(), Config{
		Target:        "http://" + addr,
		Schedule:      ConstantRate(20, 250*time.Millisecond),
		Timeout:       500 * time.Millisecond,
		LateTolerance: generous,
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.TransportErrors != 5 || r.Completed != 0 || r.Timeouts != 0 {
		t.Fatalf("errors %d completed %d timeouts %d, want 5 0 0", r.TransportErrors, r.Completed, r.Timeouts)
	}
	if len(r.ErrorSamples) == 0 || len(r.ErrorSamples) > maxErrorSamples {
		t.Fatalf("ErrorSamples = %q", r.ErrorSamples)
	}
	if r.Seconds[0].Errors != 5 {
		t.Fatalf("Seconds[0] = %+v", r.Seconds[0])
	}
}

func TestRunStopsWhenCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seen atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen.Add(1) == 5 {
			cancel()
		}
	}))
	defer srv.Close()
	r, err := Run(ctx, Config{
		Target:        srv.URL,
		Schedule:      ConstantRate(100, 2*time.Second),
		LateTolerance: generous,
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if r == nil {
		t.Fatal("no partial result")
	}
	if r.Offered < 5 || r.Offered >= 200 {
		t.Fatalf("Offered = %d, want between 5 and 199", r.Offered)
	}
	if r.Valid || !strings.Contains(r.InvalidReason, "canceled") {
		t.Fatalf("Valid %v (%q), want invalid", r.Valid, r.InvalidReason)
	}
}

func TestRunRefusesBadConfig(t *testing.T) {
	cases := []struct {
		name string
		c    Config
		want []string
	}{
		{"empty", Config{}, []string{"Target: required", "Schedule.Phases"}},
		{"scheme", Config{Target: "ftp://x", Schedule: ConstantRate(1, time.Second)}, []string{"Target: scheme"}},
		{"no host", Config{Target: "http://", Schedule: ConstantRate(1, time.Second)}, []string{"Target: no host"}},
		{"slo", Config{Target: "http://127.0.0.1:1", Schedule: ConstantRate(1, time.Second), Timeout: time.Second, SLO: 2 * time.Second}, []string{"SLO"}},
		{"negative timeout", Config{Target: "http://127.0.0.1:1", Schedule: ConstantRate(1, time.Second), Timeout: -1}, []string{"Timeout"}},
		{"cap", Config{Target: "http://127.0.0.1:1", Schedule: ConstantRate(1, time.Second), MaxInFlight: HardMaxInFlight + 1}, []string{"MaxInFlight"}},
		{"budget", Config{Target: "http://127.0.0.1:1", Schedule: ConstantRate(1, time.Second), LateStartBudget: 2}, []string{"LateStartBudget"}},
		{"tolerance", Config{Target: "http://127.0.0.1:1", Schedule: ConstantRate(1, time.Second), LateTolerance: -1}, []string{"LateTolerance"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Run(context.Background(), tc.c)
			if err == nil || r != nil {
				t.Fatalf("Run accepted a bad config: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestRunReportsUnbuildableRequests(t *testing.T) {
	var seen atomic.Int64
	srv := statusServer(t, &seen)
	r, err := Run(context.Background(), Config{
		Target:        srv.URL,
		Schedule:      ConstantRate(20, 200*time.Millisecond),
		Prepare:       func(int) Request { return Request{Path: "no-slash"} },
		LateTolerance: generous,
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.BuildErrors != 4 || r.Sent != 0 || seen.Load() != 0 {
		t.Fatalf("build errors %d sent %d seen %d, want 4 0 0", r.BuildErrors, r.Sent, seen.Load())
	}
	if r.Valid || !strings.Contains(r.InvalidReason, "could not be built") {
		t.Fatalf("Valid %v (%q)", r.Valid, r.InvalidReason)
	}
	if len(r.ErrorSamples) != 1 || !strings.Contains(r.ErrorSamples[0], "Request.Path") {
		t.Fatalf("ErrorSamples = %q", r.ErrorSamples)
	}
}

func TestDefaultMaxInFlight(t *testing.T) {
	if got := defaultMaxInFlight(2000, time.Second); got != 2564 {
		t.Errorf("defaultMaxInFlight(2000/s, 1s) = %d, want 2564", got)
	}
	if got := defaultMaxInFlight(1, 100*time.Millisecond); got != 65 {
		t.Errorf("defaultMaxInFlight(1/s, 100ms) = %d, want 65", got)
	}
	if got := defaultMaxInFlight(1e6, 10*time.Second); got != HardMaxInFlight {
		t.Errorf("defaultMaxInFlight(1e6/s, 10s) = %d, want the hard cap", got)
	}
	c := Config{Schedule: Spike(10, 400, time.Second, time.Second, time.Second)}.withDefaults()
	if c.MaxInFlight != 564 || c.Timeout != DefaultTimeout || c.SLO != DefaultTimeout ||
		c.LateTolerance != DefaultLateTolerance || c.LateStartBudget != DefaultLateStartBudget {
		t.Errorf("defaults = %+v", c)
	}
}

func TestRunBuildsURLsAndHost(t *testing.T) {
	type seenReq struct{ uri, host string }
	got := make(chan seenReq, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seenReq{r.URL.RequestURI(), r.Host}
	}))
	defer srv.Close()
	r, err := Run(context.Background(), Config{
		Target:   srv.URL + "/base?x=1",
		Schedule: ConstantRate(20, 200*time.Millisecond), // 4 requests
		Prepare: func(i int) Request {
			switch i {
			case 1:
				return Request{Path: "/p?q=2"}
			case 2:
				return Request{Path: "/p?q=2", Header: http.Header{"Host": {"example.test"}}}
			case 3:
				return Request{Path: "/a%2Fb"}
			}
			return Request{}
		},
		LateTolerance: generous,
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Completed != 4 {
		t.Fatalf("completed %d, want 4", r.Completed)
	}
	close(got)
	seen := map[seenReq]int{}
	for s := range got {
		seen[s]++
	}
	host := strings.TrimPrefix(srv.URL, "http://")
	for _, want := range []seenReq{{"/base?x=1", host}, {"/p?q=2", host}, {"/p?q=2", "example.test"}, {"/a%2Fb", host}} {
		if seen[want] != 1 {
			t.Errorf("server did not see %+v once; saw %v", want, seen)
		}
	}
}

func TestWarmupIsSentButNotCounted(t *testing.T) {
	var seen atomic.Int64
	srv := statusServer(t, &seen)
	// 20 requests over 1 s; the first 400 ms (8 requests, to /fail) are warm-up.
	prepare := func(i int) Request {
		if i < 8 {
			return Request{Path: "/fail"}
		}
		return Request{Path: "/ok", Header: http.Header{"X-Test": {"yes"}}}
	}
	res, err := Run(context.Background(), Config{Target: srv.URL, Schedule: ConstantRate(20, time.Second), Prepare: prepare,
		Warmup: 400 * time.Millisecond, LateTolerance: generous})
	if err != nil {
		t.Fatal(err)
	}
	if seen.Load() != 20 {
		t.Fatalf("server saw %d requests, want all 20 (warm-up requests are sent)", seen.Load())
	}
	if res.Offered != 12 || res.Codes[500] != 0 || res.Codes[200] != 12 || res.Duration != 600*time.Millisecond {
		t.Fatalf("offered %d codes %v duration %s: want the 12 measured requests over 600 ms", res.Offered, res.Codes, res.Duration)
	}
	if _, err := Run(context.Background(), Config{Target: srv.URL, Schedule: ConstantRate(20, time.Second), Warmup: time.Second}); err == nil {
		t.Fatal("a warm-up as long as the schedule must be refused")
	}
}
