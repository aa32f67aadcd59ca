package gate

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/pkg/admission"
	"github.com/loadshed/loadshed/pkg/admission/admissiontest"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// headers is a plain header map (canonical names), as a door would adapt its own.
type headers map[string]string

func (h headers) Get(name string) string { return h[name] }

// newGate builds a gate on a fake clock from the YAML of a whole config file.
func newGate(t *testing.T, yaml string) (*Gate, *admissiontest.Clock, *prometheus.Registry) {
	t.Helper()
	return newGateWithSelf(t, yaml, nil)
}

// newGateWithSelf is newGate with the sidecar's own load (nil: none).
func newGateWithSelf(t *testing.T, yaml string, self SelfLoad) (*Gate, *admissiontest.Clock, *prometheus.Registry) {
	t.Helper()
	cfg, err := config.Parse([]byte("upstream: http://127.0.0.1:1\n" + yaml))
	if err != nil {
		t.Fatal(err)
	}
	clk := admissiontest.NewClock(t0)
	reg := prometheus.NewRegistry()
	g, err := New(cfg, Options{Registerer: reg, Clock: clk, Self: self})
	if err != nil {
		t.Fatal(err)
	}
	return g, clk, reg
}

func request(h headers) *Request {
	if h == nil {
		h = headers{}
	}
	return &Request{Door: DoorHTTP, Method: "GET", Path: "/", Header: h, Peer: "192.0.2.7:4321", ContentLength: -1}
}

func admit(t *testing.T, g *Gate, r *Request) *Pass {
	t.Helper()
	p, err := g.Admit(context.Background(), r, nil)
	if err != nil {
		t.Fatalf("want admitted, got %v", err)
	}
	return p
}

// admitBehind asks, in a goroutine, for a permit for another request with ctx, which must wait
// behind the permits held; queued receives its place in the queue and done what Admit returned.
func admitBehind(ctx context.Context, g *Gate) (queued <-chan admission.Queued, done <-chan error) {
	q := make(chan admission.Queued, 1)
	d := make(chan error, 1)
	go func() {
		_, err := g.Admit(ctx, request(nil), func(x admission.Queued) { q <- x })
		d <- err
	}()
	return q, d
}

func refusal(t *testing.T, err error) *Refusal {
	t.Helper()
	var rej *Refusal
	if !errors.As(err, &rej) {
		t.Fatalf("want a *Refusal, got %v", err)
	}
	return rej
}

// requests sums loadshed_requests_total over the series that carry the given label pairs.
func requests(reg *prometheus.Registry, labels ...string) float64 {
	return counterSum(reg, "loadshed_requests_total", labels...)
}

// shed sums loadshed_shed_total over the series that carry the given label pairs.
func shed(reg *prometheus.Registry, labels ...string) float64 {
	return counterSum(reg, "loadshed_shed_total", labels...)
}

// counterSum sums the counter name over the series that carry the given label pairs.
func counterSum(reg *prometheus.Registry, name string, labels ...string) float64 {
	var sum float64
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, c := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range c.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			ok := true
			for i := 0; i+1 < len(labels); i += 2 {
				if got[labels[i]] != labels[i+1] {
					ok = false
				}
			}
			if ok {
				sum += c.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestEveryRefusalReason: each reason maps to its configured status, with the strategy's
// Retry-After, and is counted as a shed of its stage, priority and door.
func TestEveryRefusalReason(t *testing.T) {
	ctx := context.Background()
	t.Run("rate_limited", func(t *testing.T) {
		g, _, reg := newGate(t, "admission: {strategy: token-bucket, tokenBucket: {rate: 2, burst: 1}}\n")
		admit(t, g, request(nil))
		_, err := g.Admit(ctx, request(nil), nil)
		rej := refusal(t, err)
		if rej.Reason != admission.ReasonRateLimited || rej.Status != 429 || rej.RetryAfter != 500*time.Millisecond || rej.RetryAfterHeader() != "1" {
			t.Errorf("refusal %+v, want 429 rate_limited retry in 500ms", rej)
		}
		want := `
# HELP loadshed_shed_total Requests refused by admission, by route, refusing strategy stage, reason, priority and front door.
# TYPE loadshed_shed_total counter
loadshed_shed_total{door="http",priority="critical",reason="rate_limited",route="default",strategy="token-bucket"} 1
`
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "loadshed_shed_total"); err != nil {
			t.Error(err)
		}
		if n := requests(reg, "outcome", "shed", "code", "429", "door", "http"); n != 1 {
			t.Errorf("shed requests counted %v, want 1", n)
		}
	})
	t.Run("concurrency_limit", func(t *testing.T) {
		g, _, _ := newGate(t, "admission: {strategy: inflight, inflight: {limit: 1}}\nstatusCodes: {concurrencyLimit: 529}\n")
		hold := admit(t, g, request(nil))
		_, err := g.Admit(ctx, request(nil), nil)
		if rej := refusal(t, err); rej.Reason != admission.ReasonConcurrencyLimit || rej.Status != 529 {
			t.Errorf("refusal %+v, want the configured 529", rej)
		}
		hold.Finish()
	})
	t.Run("queue_full and queue_timeout", func(t *testing.T) {
		g, clk, _ := newGate(t, "admission: {strategy: bounded-queue, boundedQueue: {concurrency: 1, depth: 1, maxWait: 80ms}}\n")
		hold := admit(t, g, request(nil))
		queued, waiter := admitBehind(ctx, g)
		if q := <-queued; q.Bound != 80*time.Millisecond {
			t.Errorf("queued notice %+v, want the 80ms bound", q)
		}
		_, err := g.Admit(ctx, request(nil), nil)
		if rej := refusal(t, err); rej.Reason != admission.ReasonQueueFull || rej.Status != 503 {
			t.Errorf("full queue: %+v", rej)
		}
		clk.Advance(80 * time.Millisecond)
		if rej := refusal(t, <-waiter); rej.Reason != admission.ReasonQueueTimeout {
			t.Errorf("waiter: %+v, want queue_timeout", rej)
		}
		hold.Finish()
	})
	t.Run("deadline", func(t *testing.T) {
		g, _, _ := newGate(t, "admission: {strategy: inflight, inflight: {limit: 4}}\n")
		_, err := g.Admit(ctx, request(headers{"Grpc-Timeout": "0n"}), nil)
		if rej := refusal(t, err); rej.Reason != admission.ReasonDeadline || rej.RetryAfterHeader() != "1" {
			t.Errorf("an expired deadline: %+v", rej)
		}
	})
	t.Run("draining", func(t *testing.T) {
		g, _, _ := newGate(t, "admission: {strategy: none}\n")
		g.Drain()
		_, err := g.Admit(ctx, request(nil), nil)
		if rej := refusal(t, err); rej.Reason != admission.ReasonDraining || rej.Status != 503 {
			t.Errorf("while draining: %+v", rej)
		}
	})
	t.Run("client_limited and denied", func(t *testing.T) {
		g, _, _ := newGate(t, "admission: {strategy: none}\nclients: {rate: 1, burst: 1, deny: [abuser]}\nheaders: {clientKey: X-Client}\ntrust: {sources: [192.0.2.0/24]}\n")
		admit(t, g, request(headers{"X-Client": "alice"}))
		_, err := g.Admit(ctx, request(headers{"X-Client": "alice"}), nil)
		if rej := refusal(t, err); rej.Reason != admission.ReasonClientLimited || rej.Status != 429 || rej.Stage != "clients" {
			t.Errorf("second request of alice: %+v", rej)
		}
		admit(t, g, request(headers{"X-Client": "bob"}))
		_, err = g.Admit(ctx, request(headers{"X-Client": "abuser"}), nil)
		if rej := refusal(t, err); rej.Reason != admission.ReasonDenied || rej.Status != 403 || rej.RetryAfterHeader() != "" {
			t.Errorf("deny-listed: %+v, want 403 without Retry-After", rej)
		}
	})
}

// TestClientErrorsAreCountedNotShed: a malformed admission header is a 400 naming it, an
// announced body over the limit a 413; neither reaches the strategy.
func TestClientErrorsAreCountedNotShed(t *testing.T) {
	g, _, reg := newGate(t, "admission: {strategy: inflight, inflight: {limit: 1}}\nserver: {maxBodyBytes: 10}\n")
	_, err := g.Admit(context.Background(), request(headers{"X-Loadshed-Priority": "urgent"}), nil)
	var ce *ClientError
	if !errors.As(err, &ce) || ce.Status != 400 || ce.Header != "X-Loadshed-Priority" {
		t.Fatalf("bad priority: %v", err)
	}
	big := request(nil)
	big.ContentLength = 11
	if _, err := g.Admit(context.Background(), big, nil); !errors.As(err, &ce) || ce.Status != 413 || ce.Limit != 10 {
		t.Fatalf("large body: %v", err)
	}
	if n := requests(reg, "outcome", "client_error"); n != 2 {
		t.Errorf("client errors counted %v, want 2", n)
	}
	if st := g.Policies()[0].Stats(); st.InFlight != 0 {
		t.Errorf("a refused request holds %d permits", st.InFlight)
	}
}

// TestDryRunCountsButAdmits: a dry-run policy admits everything and counts what it would shed.
func TestDryRunCountsButAdmits(t *testing.T) {
	g, _, reg := newGate(t, "admission: {strategy: inflight, dryRun: true, inflight: {limit: 1}}\nclients: {rate: 1, burst: 1}\n")
	var held []*Pass
	for range 3 {
		held = append(held, admit(t, g, request(nil)))
	}
	for _, p := range held {
		p.Answered(Answer{Status: 200, At: t0})
		p.Finish()
	}
	want := `
# HELP loadshed_dry_run_would_shed_total Requests a dry-run strategy would have refused but admitted, by route, strategy, reason, priority and front door.
# TYPE loadshed_dry_run_would_shed_total counter
loadshed_dry_run_would_shed_total{door="http",priority="critical",reason="client_limited",route="default",strategy="clients"} 2
loadshed_dry_run_would_shed_total{door="http",priority="critical",reason="concurrency_limit",route="default",strategy="inflight"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "loadshed_dry_run_would_shed_total"); err != nil {
		t.Error(err)
	}
	if n, _ := testutil.GatherAndCount(reg, "loadshed_shed_total"); n != 0 {
		t.Errorf("a dry run counted %d real sheds", n)
	}
	if st := g.Policies()[0].Stats(); st.InFlight != 0 {
		t.Errorf("in flight %d after every request ended", st.InFlight)
	}
}

// TestDeadlines: the remaining time is carried on the pass; a request whose deadline is shorter
// than the route's typical upstream latency is refused before it queues.
func TestDeadlines(t *testing.T) {
	g, clk, _ := newGate(t, "admission: {strategy: none}\n")
	p := admit(t, g, request(headers{"X-Request-Timeout": "2s", "Grpc-Timeout": "1500m"}))
	_, set := p.Forward(t0)
	if !p.Deadline().Equal(t0.Add(1500*time.Millisecond)) || len(set) != 2 || set[0] != (Field{"X-Request-Timeout", "1.5s"}) || set[1] != (Field{"Grpc-Timeout", "1500m"}) {
		t.Errorf("pass deadline %v, forwarded %v, want the shorter 1.5s in both headers", p.Deadline(), set)
	}
	// Teach the route a latency of 50 ms.
	p.Forward(clk.Now())
	p.Answered(Answer{Status: 200, At: clk.Now().Add(50 * time.Millisecond)})
	p.Finish()
	_, err := g.Admit(context.Background(), request(headers{"X-Request-Timeout": "40ms"}), nil)
	if rej := refusal(t, err); rej.Reason != admission.ReasonDeadline {
		t.Errorf("40ms left for a 50ms route: %+v", rej)
	}
	admit(t, g, request(headers{"X-Request-Timeout": "60ms"}))
}

// TestClientKey: the key is the configured header from a trusted sender (folded when asked),
// or the peer's address, or the first X-Forwarded-For hop only when forwarded headers are
// trusted.
func TestClientKey(t *testing.T) {
	untrusted := &trustCheck{rules: newTrustRules(config.Trust{})}
	s := requestSpec{clientKeyHeader: "X-Client"}
	if k := s.clientKey(headers{"X-Client": "alice"}, "192.0.2.1:9", untrusted); k != "192.0.2.1" {
		t.Errorf("untrusted header key %q, want the peer's address", k)
	}
	trusted := &trustCheck{rules: newTrustRules(config.Trust{Sources: []string{"192.0.2.0/24"}}), peer: "192.0.2.1:9"}
	if k := s.clientKey(headers{"X-Client": "alice"}, "192.0.2.1:9", trusted); k != "alice" {
		t.Errorf("trusted header key %q", k)
	}
	s.foldKey = true
	trusted.done = false
	if k := s.clientKey(headers{"X-Client": " ALICE "}, "192.0.2.1:9", trusted); k != "alice" {
		t.Errorf("folded key %q, want alice", k)
	}
	s = requestSpec{}
	if k := s.clientKey(headers{"X-Forwarded-For": "203.0.113.9"}, "192.0.2.1:9", untrusted); k != "192.0.2.1" {
		t.Errorf("untrusted forwarding: %q, want the peer", k)
	}
	s.trustForwarded = true
	if k := s.clientKey(headers{"X-Forwarded-For": "203.0.113.9, 10.0.0.1"}, "192.0.2.1:9", untrusted); k != "203.0.113.9" {
		t.Errorf("trusted forwarding: %q", k)
	}
}

// TestPermitReleasedOnEveryOutcome: whatever way an exchange ends, the permit comes back once,
// the strategy is told the right outcome, and the request is counted with its outcome and code.
func TestPermitReleasedOnEveryOutcome(t *testing.T) {
	for _, c := range []struct {
		name    string
		end     func(p *Pass)
		learns  admission.Outcome
		outcome string
		code    string
	}{
		{"success", func(p *Pass) { p.Answered(Answer{Status: 200, At: t0}) }, admission.Success, "success", "200"},
		{"redirect", func(p *Pass) { p.Answered(Answer{Status: 302, At: t0}) }, admission.Success, "success", "302"},
		{"client error", func(p *Pass) { p.Answered(Answer{Status: 404, At: t0}) }, admission.Ignore, "client_error", "404"},
		{"upstream 429", func(p *Pass) { p.Answered(Answer{Status: 429, At: t0}) }, admission.Dropped, "client_error", "429"},
		{"upstream 503", func(p *Pass) { p.Answered(Answer{Status: 503, At: t0}) }, admission.Dropped, "upstream_error", "503"},
		{"stream", func(p *Pass) { p.Answered(Answer{Status: 200, ContentType: "text/event-stream", At: t0}) }, admission.Ignore, "success", "200"},
		{"unreachable", func(p *Pass) { p.Failed(OutcomeUpstreamError, 502) }, admission.Dropped, "upstream_error", "502"},
		{"timeout", func(p *Pass) { p.Failed(OutcomeUpstreamTimeout, 504) }, admission.Dropped, "upstream_timeout", "504"},
		{"client left", func(p *Pass) { p.Failed(OutcomeCanceled, 0) }, admission.Ignore, "canceled", "499"},
		{"client left mid-body", func(p *Pass) { p.Answered(Answer{Status: 200, At: t0}); p.Failed(OutcomeCanceled, 0) }, admission.Ignore, "canceled", "200"},
		{"released early", func(p *Pass) { p.Answered(Answer{Status: 200, ContentType: "text/event-stream", At: t0}) }, admission.Ignore, "success", "200"},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, _, reg := newGate(t, "admission: {strategy: inflight, inflight: {limit: 2}}\n")
			p := admit(t, g, request(nil))
			p.Forward(t0)
			c.end(p)
			if got := p.classify(); got != c.learns {
				t.Errorf("the strategy learns %v, want %v", got, c.learns)
			}
			p.Finish()
			p.Finish() // a second end changes nothing but the count
			if st := g.Policies()[0].Stats(); st.InFlight != 0 {
				t.Errorf("in flight %d after the request ended", st.InFlight)
			}
			if n := requests(reg, "outcome", c.outcome, "code", c.code, "door", "http"); n != 2 {
				t.Errorf("requests{outcome=%s,code=%s} = %v, want 2 (one per Finish)", c.outcome, c.code, n)
			}
		})
	}
}

// TestCanceledWhileQueued: a client that leaves while its request waits gets nothing, leaves
// the queue, and is counted as canceled (499).
func TestCanceledWhileQueued(t *testing.T) {
	g, _, reg := newGate(t, "admission: {strategy: bounded-queue, boundedQueue: {concurrency: 1, depth: 4, maxWait: 1s}}\n")
	hold := admit(t, g, request(nil))
	ctx, cancel := context.WithCancel(context.Background())
	queued, done := admitBehind(ctx, g)
	<-queued
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("queued and canceled: %v", err)
	}
	if st := g.Policies()[0].Stats(); st.QueuedRequests != 0 {
		t.Errorf("%d still queued", st.QueuedRequests)
	}
	if n := requests(reg, "outcome", "canceled", "code", "499"); n != 1 {
		t.Errorf("canceled counted %v, want 1", n)
	}
	hold.Finish()
}

// TestRoutesAndDoors: a route with its own policy is matched by path and method; each door is
// its own label value.
func TestRoutesAndDoors(t *testing.T) {
	g, _, reg := newGate(t, `admission: {strategy: none}
routes:
  - {name: export, pathPrefix: /export, methods: [POST], cost: 3, admission: {strategy: inflight, inflight: {limit: 3}}}
`)
	r := request(nil)
	r.Method, r.Path, r.Door = "POST", "/export/all", DoorGRPC
	p := admit(t, g, r)
	if p.p.route != "export" {
		t.Errorf("route %q, want export", p.p.route)
	}
	if _, err := g.Admit(context.Background(), r, nil); refusal(t, err).Reason != admission.ReasonConcurrencyLimit {
		t.Errorf("a second cost-3 request on a limit of 3 must be refused")
	}
	p.Answered(Answer{Status: 200, At: t0})
	p.Finish()
	if n := requests(reg, "route", "export", "door", "grpc", "outcome", "success"); n != 1 {
		t.Errorf("grpc door success on export counted %v", n)
	}
	g.Count(DoorHTTP, "CONNECT", "/", OutcomeClientError, 405)
	if n := requests(reg, "route", "default", "door", "http", "code", "405"); n != 1 {
		t.Errorf("a door's own refusal counted %v", n)
	}
}

// TestAnswerDue: a door that must answer a waiting request now (ErrAnswerDue) gets a queue
// timeout refusal with a retry hint, counted as a shed; the request leaves the queue.
func TestAnswerDue(t *testing.T) {
	g, clk, reg := newGate(t, "admission: {strategy: bounded-queue, boundedQueue: {concurrency: 1, depth: 4, maxWait: 1s}}\n")
	hold := admit(t, g, request(nil))
	ctx, cancel := context.WithCancelCause(context.Background())
	queued, done := admitBehind(ctx, g)
	if q := <-queued; q.Bound != time.Second {
		t.Errorf("bound %v, want maxWait", q.Bound)
	}
	clk.Advance(300 * time.Millisecond)
	cancel(ErrAnswerDue)
	rej := refusal(t, <-done)
	if rej.Reason != admission.ReasonQueueTimeout || rej.Status != 503 || rej.RetryAfter != 300*time.Millisecond {
		t.Errorf("refusal %+v, want queue_timeout, 503, retry after the 300ms waited", rej)
	}
	if st := g.Policies()[0].Stats(); st.QueuedRequests != 0 {
		t.Errorf("%d still queued", st.QueuedRequests)
	}
	if n := requests(reg, "outcome", "shed", "code", "503"); n != 1 {
		t.Errorf("shed counted %v, want 1", n)
	}
	hold.Finish()
}

// TestForward: the headers a door changes as it forwards: the admission headers go, the
// remaining deadline is set in the timeout header and in grpc-timeout.
func TestForward(t *testing.T) {
	g, clk, _ := newGate(t, "admission: {strategy: none}\n")
	p := admit(t, g, request(nil))
	remove, set := p.Forward(clk.Now())
	if strings.Join(remove, ",") != "X-Loadshed-Priority,X-Loadshed-Cost" || len(set) != 0 {
		t.Errorf("without a deadline: remove %v, set %v", remove, set)
	}
	p.Finish()
	p = admit(t, g, request(headers{"X-Request-Timeout": "2s", "Grpc-Timeout": "1500m"}))
	clk.Advance(250 * time.Millisecond)
	_, set = p.Forward(clk.Now())
	want := []Field{{"X-Request-Timeout", "1.25s"}, {"Grpc-Timeout", "1250m"}}
	if len(set) != 2 || set[0] != want[0] || set[1] != want[1] {
		t.Errorf("set %v, want %v", set, want)
	}
	p.Finish()
}
