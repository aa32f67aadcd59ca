package backend

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/slowtail"
)

func TestNewValidates(t *testing.T) {
	c := DefaultConfig()
	c.Workers = 0
	c.Service.TailProb = 2
	_, err := New(c)
	if err == nil {
		t.Fatal("New accepted workers 0 and tailProb 2")
	}
	got := Problems(err)
	want := []string{"workers: must be in [1, 100000], got 0", "tailProb: must be in [0, 1], got 2"}
	if !slices.Equal(got, want) {
		t.Fatalf("Problems = %q, want %q", got, want)
	}
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "workers" {
		t.Fatalf("errors.As FieldError = %v", fe)
	}
	if _, err := New(DefaultConfig(), WithClock(nil)); err == nil {
		t.Fatal("New accepted a nil clock")
	}
}

// With N workers and a constant service time S, N+k concurrent requests: N start at once, k wait
// exactly S, in FIFO order.
func TestCapacity(t *testing.T) {
	const n, k = 3, 2
	f := newFixture(t, constant(n, 20*ms))
	var chans []<-chan result
	for i := range n + k {
		chans = append(chans, f.get("/r"))
		// Let each arrive before the next so that the FIFO order is known.
		f.waitState(min(i+1, n), max(i+1-n, 0), 0, min(i+1, n))
	}
	if st := f.s.Stats(); st.Workers != n {
		t.Fatalf("Workers = %d, want %d", st.Workers, n)
	}

	f.clock.Advance(20 * ms)
	f.waitState(k, 0, n, k) // the first N done, the k extra now in service
	var got []result
	for _, ch := range chans[:n] {
		got = append(got, f.recv(ch))
	}
	f.clock.Advance(20 * ms)
	for _, ch := range chans[n:] {
		got = append(got, f.recv(ch))
	}
	for i, r := range got {
		wantWait := "0s"
		if i >= n {
			wantWait = "20ms"
		}
		if r.code != http.StatusOK || r.body != "ok\n" || r.wait != wantWait || r.service != "20ms" {
			t.Errorf("request %d: %d %q wait %s service %s, want 200 \"ok\\n\" wait %s service 20ms",
				i, r.code, r.body, r.wait, r.service, wantWait)
		}
	}
	f.waitState(0, 0, n+k, 0)
}

func TestFIFOWithOneWorker(t *testing.T) {
	f := newFixture(t, constant(1, 10*ms))
	a := f.get("/a")
	f.waitState(1, 0, 0, 1)
	b := f.get("/b")
	f.waitState(1, 1, 0, 1)
	c := f.get("/c")
	f.waitState(1, 2, 0, 1)
	f.clock.Advance(10 * ms)
	f.waitState(1, 1, 1, 1)
	f.clock.Advance(10 * ms)
	f.waitState(1, 0, 2, 1)
	f.clock.Advance(10 * ms)
	for _, tc := range []struct {
		ch   <-chan result
		wait string
	}{{a, "0s"}, {b, "10ms"}, {c, "20ms"}} {
		if r := f.recv(tc.ch); r.wait != tc.wait {
			t.Errorf("%s waited %s, want %s", r.path, r.wait, tc.wait)
		}
	}
}

// A client that gives up does not free its place: the naive service does the work anyway.
func TestWorkContinuesWithoutClient(t *testing.T) {
	f := newFixture(t, constant(1, 10*ms))
	a := f.get("/a")
	f.waitState(1, 0, 0, 1)

	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.ts.URL+"/gone", nil)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		resp, err := f.ts.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	f.waitState(1, 1, 0, 1)
	cancel() // the client gives up and closes its connection
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("abandoned request got an answer")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("canceled request did not return")
	}

	f.clock.Advance(10 * ms)
	f.recv(a)
	f.waitState(1, 0, 1, 1) // the abandoned request still takes the worker for its service time
	f.clock.Advance(10 * ms)
	f.waitState(0, 0, 2, 0)
}

func TestSetWorkersShrinkAndGrow(t *testing.T) {
	f := newFixture(t, constant(4, 20*ms))
	var chans []<-chan result
	for i, sleep := range []string{"10ms", "10ms", "30ms", "30ms"} {
		chans = append(chans, f.get("/?sleep="+sleep))
		f.waitState(i+1, 0, 0, i+1)
	}
	chans = append(chans, f.get("/w1"))
	f.waitState(4, 1, 0, 4)
	chans = append(chans, f.get("/w2"))
	f.waitState(4, 2, 0, 4)

	if err := f.s.SetWorkers(2); err != nil {
		t.Fatal(err)
	}
	f.waitState(4, 2, 0, 4) // running work goes on
	f.clock.Advance(10 * ms)
	// Two finished, but busy (2) is not below the new count (2): nobody starts.
	f.waitState(2, 2, 2, 2)
	f.clock.Advance(20 * ms)
	f.waitState(2, 0, 4, 2)

	if err := f.s.SetWorkers(0); err == nil {
		t.Fatal("SetWorkers(0) accepted")
	}
	// Grow with a backlog: waiters start at once.
	if err := f.s.SetWorkers(1); err != nil {
		t.Fatal(err)
	}
	chans = append(chans, f.get("/w3"), f.get("/w4"))
	f.waitState(2, 2, 4, 2)
	if err := f.s.SetWorkers(5); err != nil {
		t.Fatal(err)
	}
	f.waitState(4, 0, 4, 4)
	f.clock.Advance(20 * ms)
	for _, ch := range chans {
		if r := f.recv(ch); r.code != http.StatusOK {
			t.Errorf("%s: %d", r.path, r.code)
		}
	}
	f.waitState(0, 0, 8, 0)
	if got := f.s.Config().Workers; got != 5 {
		t.Fatalf("Config().Workers = %d, want 5", got)
	}
}

func TestQueryParameters(t *testing.T) {
	f := newFixture(t, constant(2, 20*ms))

	// ?status after the service time.
	ch := f.get("/x?status=503")
	f.waitState(1, 0, 0, 1)
	f.clock.Advance(19 * ms)
	f.waitState(1, 0, 0, 1) // not before its time
	f.clock.Advance(ms)
	if r := f.recv(ch); r.code != 503 || r.service != "20ms" {
		t.Errorf("status=503: got %d after %s", r.code, r.service)
	}

	// ?sleep replaces the sample.
	ch = f.get("/x?sleep=50ms")
	f.waitState(1, 0, 1, 1)
	f.clock.Advance(49 * ms)
	f.waitState(1, 0, 1, 1)
	f.clock.Advance(ms)
	if r := f.recv(ch); r.code != 200 || r.service != "50ms" {
		t.Errorf("sleep=50ms: got %d after %s", r.code, r.service)
	}
	// sleep=0 answers at once.
	if r := f.recv(f.get("/x?sleep=0s&status=201")); r.code != 201 || r.service != "0s" {
		t.Errorf("sleep=0s&status=201: got %d after %s", r.code, r.service)
	}

	// ?bytes sets the body size.
	if r := f.recv(f.get("/x?sleep=0s&bytes=100000")); r.code != 200 || len(r.body) != 100000 {
		t.Errorf("bytes=100000: got %d with %d bytes", r.code, len(r.body))
	}
	if r := f.recv(f.get("/x?sleep=0s&bytes=0")); r.code != 200 || r.body != "" {
		t.Errorf("bytes=0: got %d with %q", r.code, r.body)
	}
	f.waitState(0, 0, 5, 0)

	for _, tc := range []struct{ query, param string }{
		{"status=abc", "status"},
		{"status=99", "status"},
		{"status=600", "status"},
		{"status=", "status"},
		{"sleep=-1s", "sleep"},
		{"sleep=soon", "sleep"},
		{"sleep=2h", "sleep"},
		{"bytes=-1", "bytes"},
		{"bytes=1e3", "bytes"},
		{"bytes=999999999999", "bytes"},
		{"events=0", "events"},
		{"interval=fast", "interval"},
		{"a=%zz", "query"},
	} {
		r := f.recv(f.get("/x?" + tc.query))
		if r.code != http.StatusBadRequest || !strings.Contains(r.body, "query parameter "+tc.param+":") {
			t.Errorf("?%s: got %d %q, want 400 naming %s", tc.query, r.code, r.body, tc.param)
		}
	}
	// A 400 takes no worker and is not "served".
	f.waitState(0, 0, 5, 0)
}

func TestSampledServiceTimes(t *testing.T) {
	// With one client at a time the backend draws the sampler's own sequence.
	cfg := DefaultConfig()
	cfg.Workers, cfg.Seed = 1, 99
	f := newFixture(t, cfg)
	want := slowtail.New(cfg.Service, cfg.Seed)
	for i := range 20 {
		d := want.Sample()
		ch := f.get("/")
		f.waitState(1, 0, uint64(i), 1)
		f.clock.Advance(d)
		if r := f.recv(ch); r.service != d.String() {
			t.Fatalf("request %d: service %s, want the sampler's %s", i, r.service, d)
		}
	}
}

func TestStream(t *testing.T) {
	f := newFixture(t, constant(1, 20*ms))
	resp, err := f.ts.Client().Get(f.ts.URL + "/stream?events=3&interval=10ms")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("got %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events := make(chan string, 3)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		var ev []string
		for sc.Scan() {
			if sc.Text() == "" {
				events <- strings.Join(ev, "|")
				ev = nil
				continue
			}
			ev = append(ev, sc.Text())
		}
	}()
	next := func() (string, bool) {
		select {
		case e, ok := <-events:
			return e, ok
		case <-time.After(10 * time.Second):
			t.Fatal("no event within 10s")
			return "", false
		}
	}
	if e, _ := next(); e != "id: 1|data: event 1 of 3" {
		t.Fatalf("first event %q", e)
	}
	// The stream holds the only worker: another request waits.
	other := f.get("/other")
	f.waitState(1, 1, 0, 1)
	f.clock.Advance(10 * ms)
	if e, _ := next(); e != "id: 2|data: event 2 of 3" {
		t.Fatalf("second event %q", e)
	}
	f.waitState(1, 1, 0, 1)
	f.clock.Advance(10 * ms)
	if e, _ := next(); e != "id: 3|data: event 3 of 3" {
		t.Fatalf("third event %q", e)
	}
	if e, ok := next(); ok {
		t.Fatalf("unexpected event %q after the last", e)
	}
	f.waitState(1, 0, 1, 1) // the stream is done; the waiting request runs
	f.clock.Advance(20 * ms)
	if r := f.recv(other); r.wait != "20ms" {
		t.Fatalf("request behind the stream waited %s, want 20ms", r.wait)
	}
}

func TestCloseAbortsWaitingAndRunning(t *testing.T) {
	f := newFixture(t, constant(1, 20*ms))
	a, b := f.get("/a"), (<-chan result)(nil)
	f.waitState(1, 0, 0, 1)
	b = f.get("/b")
	f.waitState(1, 1, 0, 1)
	f.s.Close()
	for _, ch := range []<-chan result{a, b} {
		if r := f.recv(ch); r.code != http.StatusServiceUnavailable {
			t.Errorf("%s after Close: %d, want 503", r.path, r.code)
		}
	}
	if r := f.recv(f.get("/c")); r.code != http.StatusServiceUnavailable {
		t.Errorf("new request after Close: %d, want 503", r.code)
	}
	f.waitState(0, 0, 0, 0)
	if code, _ := f.adminDo(http.MethodGet, "/healthz", ""); code != http.StatusServiceUnavailable {
		t.Errorf("healthz after Close: %d, want 503", code)
	}
}
