package extproc

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/gate"
	"github.com/loadshed/loadshed/internal/testwait"
	"github.com/loadshed/loadshed/pkg/admission/admissiontest"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// env is a door on a fake clock, served to fake Envoy streams.
type env struct {
	t   *testing.T
	g   *gate.Gate
	s   *Server
	clk *admissiontest.Clock
	reg *prometheus.Registry
}

// newEnv builds the door from the YAML of a config file, as an ext_proc-only sidecar. The
// configuration is validated as a plain one, then given the ext_proc listener: a test can reach
// states the validation of a whole file would refuse.
func newEnv(t *testing.T, yaml string) *env {
	t.Helper()
	cfg, err := config.Parse([]byte("upstream: http://127.0.0.1:1\n" + yaml))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen = ""
	if cfg.ExtProc.Listen == "" {
		cfg.ExtProc.Listen = "127.0.0.1:9002"
	}
	clk := admissiontest.NewClock(t0)
	reg := prometheus.NewRegistry()
	g, err := gate.New(cfg, gate.Options{Registerer: reg, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, g: g, s: newServer(g, Options{Registerer: reg}), clk: clk, reg: reg}
}

// fakeStream is Envoy's side of one processor stream.
type fakeStream struct {
	grpc.ServerStream // not used by the door
	ctx               context.Context
	cancel            context.CancelFunc
	in                chan *extprocv3.ProcessingRequest
	out               chan *extprocv3.ProcessingResponse
	done              chan error
	closeOnce         sync.Once
}

func (f *fakeStream) Context() context.Context { return f.ctx }

func (f *fakeStream) Recv() (*extprocv3.ProcessingRequest, error) {
	select {
	case m, ok := <-f.in:
		if !ok {
			return nil, io.EOF
		}
		return m, nil
	case <-f.ctx.Done():
		return nil, status.FromContextError(f.ctx.Err()).Err()
	}
}

func (f *fakeStream) Send(m *extprocv3.ProcessingResponse) error {
	select {
	case f.out <- m:
		return nil
	case <-f.ctx.Done():
		return f.ctx.Err()
	}
}

// open starts a stream served by the door.
func (e *env) open() *fakeStream {
	ctx, cancel := context.WithCancel(context.Background())
	f := &fakeStream{ctx: ctx, cancel: cancel, in: make(chan *extprocv3.ProcessingRequest, 4),
		out: make(chan *extprocv3.ProcessingResponse, 4), done: make(chan error, 1)}
	go func() { f.done <- (&service{s: e.s}).Process(f) }()
	e.t.Cleanup(func() { f.cancel(); <-f.done })
	return f
}

// send sends Envoy's next message.
func (f *fakeStream) send(m *extprocv3.ProcessingRequest) { f.in <- m }

// next is the door's next message (a test fails after 5 s without one).
func (f *fakeStream) next(t *testing.T) *extprocv3.ProcessingResponse {
	t.Helper()
	select {
	case m := <-f.out:
		return m
	case err := <-f.done:
		f.done <- err // for end and Cleanup, which wait for it too
		// A door that sends its last message and ends makes both cases ready, and select
		// picks either: what it sent before it ended is in out by now.
		select {
		case m := <-f.out:
			return m
		default:
		}
		t.Fatalf("stream ended (%v) where a message was expected", err)
	case <-time.After(5 * time.Second):
		t.Fatal("no message from the door within 5 s")
	}
	return nil
}

// end closes Envoy's side (EOF) and waits for the door to finish the stream.
func (f *fakeStream) end(t *testing.T) error {
	t.Helper()
	f.closeOnce.Do(func() { close(f.in) })
	select {
	case err := <-f.done:
		f.done <- err // for Cleanup
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("the door did not end the stream within 5 s")
	}
	return nil
}

// reset is Envoy resetting the stream (the client left), and waits for the door to finish it.
func (f *fakeStream) reset(t *testing.T) {
	t.Helper()
	f.cancel()
	select {
	case err := <-f.done:
		f.done <- err
	case <-time.After(5 * time.Second):
		t.Fatal("the door did not end a reset stream within 5 s")
	}
}

func hv(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

// requestHeaders is Envoy's first message for a request from source (empty: no attribute),
// with the given headers after :method GET and :path /.
func requestHeaders(source string, kv ...string) *extprocv3.ProcessingRequest {
	h := hv(append([]string{":method", "GET", ":path", "/", ":scheme", "http", ":authority", "svc"}, kv...)...)
	m := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: h, EndOfStream: true}}}
	if source != "" {
		attrs, _ := structpb.NewStruct(map[string]any{"source.address": source})
		m.Attributes = map[string]*structpb.Struct{"envoy.filters.http.ext_proc": attrs}
	}
	return m
}

// grpcHeaders is a gRPC call's first message.
func grpcHeaders(source string, kv ...string) *extprocv3.ProcessingRequest {
	m := requestHeaders(source, append([]string{"content-type", "application/grpc", "te", "trailers"}, kv...)...)
	h := m.GetRequestHeaders()
	h.EndOfStream = false
	h.Headers.Headers[0].RawValue, h.Headers.Headers[1].RawValue = []byte("POST"), []byte("/pkg.Svc/Call")
	return m
}

func responseHeaders(kv ...string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: hv(kv...)}}}
}

func responseTrailers(kv ...string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
		ResponseTrailers: &extprocv3.HttpTrailers{Trailers: hv(kv...)}}}
}

// continued asserts that m lets the request's headers through.
func continued(t *testing.T, m *extprocv3.ProcessingResponse) *extprocv3.HeadersResponse {
	t.Helper()
	hr := m.GetRequestHeaders()
	if hr == nil {
		t.Fatalf("want CONTINUE for the request headers, got %v", m)
	}
	if s := hr.GetResponse().GetStatus(); s != extprocv3.CommonResponse_CONTINUE {
		t.Fatalf("status %v, want CONTINUE", s)
	}
	return hr
}

// immediate asserts that m refuses the request and returns the local reply.
func immediate(t *testing.T, m *extprocv3.ProcessingResponse) *extprocv3.ImmediateResponse {
	t.Helper()
	ir := m.GetImmediateResponse()
	if ir == nil {
		t.Fatalf("want an ImmediateResponse, got %v", m)
	}
	return ir
}

// header returns a header a local reply or a mutation sets: its raw_value, which Envoy applies
// (a value given only in value is ignored by default).
func header(t *testing.T, mut *extprocv3.HeaderMutation, name string) string {
	t.Helper()
	for _, o := range mut.GetSetHeaders() {
		if o.GetHeader().GetKey() == name {
			if o.GetHeader().GetValue() != "" {
				t.Errorf("%s set in value (%q): Envoy applies raw_value", name, o.GetHeader().GetValue())
			}
			if o.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
				t.Errorf("%s appended (%v), want it replaced", name, o.GetAppendAction())
			}
			return string(o.GetHeader().GetRawValue())
		}
	}
	return ""
}

func (e *env) inFlight() int64 { return e.g.Policies()[0].Stats().InFlight }
func (e *env) queued() int     { return e.g.Policies()[0].Stats().QueuedRequests }

// histogram returns the sample count and sum of a histogram (all series).
func (e *env) histogram(name string) (n uint64, sum float64) {
	mfs, _ := e.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
				sum += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return n, sum
}

// requests sums loadshed_requests_total over the series with the given label pairs.
func (e *env) requests(labels ...string) float64 {
	var sum float64
	mfs, _ := e.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "loadshed_requests_total" {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if got[labels[i]] != labels[i+1] {
					continue series
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// TestAdmittedReleasedAtResponseHeaders: an admitted request gets CONTINUE and holds its permit
// until its response headers, whose status is its outcome; the latency since the CONTINUE is the
// sample.
func TestAdmittedReleasedAtResponseHeaders(t *testing.T) {
	e := newEnv(t, "admission: {strategy: inflight, inflight: {limit: 1}}\n")
	f := e.open()
	f.send(requestHeaders("192.0.2.7:4321"))
	hr := continued(t, f.next(t))
	if m := hr.GetResponse().GetHeaderMutation(); m != nil {
		t.Errorf("nothing to change in the request's headers, got %v", m)
	}
	if e.inFlight() != 1 {
		t.Fatalf("in flight %d after CONTINUE, want 1", e.inFlight())
	}
	e.clk.Advance(30 * time.Millisecond)
	f.send(responseHeaders(":status", "200", "content-type", "text/plain"))
	if f.next(t).GetResponseHeaders() == nil {
		t.Fatal("want the response headers answered")
	}
	if e.inFlight() != 0 {
		t.Fatalf("in flight %d after the response headers, want 0", e.inFlight())
	}
	f.reset(t) // Envoy closes the stream once no phase is left
	if n := e.requests("door", "extproc", "outcome", "success", "code", "200"); n != 1 {
		t.Errorf("success counted %v, want 1", n)
	}
	if n, sum := e.histogram("loadshed_upstream_latency_seconds"); n != 1 || sum < 0.0299 || sum > 0.0301 {
		t.Errorf("upstream latency: %d samples, sum %vs; want one of 30ms (CONTINUE to response headers)", n, sum)
	}
}

// TestRefusalIsALocalReply: a refused request gets Envoy's local reply with the status, the
// Retry-After and the reason (in raw_value) and a short body; a gRPC call its grpc-status, the
// pushback in milliseconds and the reason as its message.
func TestRefusalIsALocalReply(t *testing.T) {
	e := newEnv(t, "admission: {strategy: inflight, inflight: {limit: 1}}\n")
	_, f := e.holdOneSendNext(t, "192.0.2.8:4321")
	ir := immediate(t, f.next(t))
	if ir.GetStatus().GetCode() != 503 || ir.GetGrpcStatus() != nil {
		t.Errorf("status %v grpc %v, want 503 and no grpc-status", ir.GetStatus(), ir.GetGrpcStatus())
	}
	if v := header(t, ir.GetHeaders(), "retry-after"); v != "1" {
		t.Errorf("retry-after %q, want 1", v)
	}
	if v := header(t, ir.GetHeaders(), "x-loadshed-reason"); v != "concurrency_limit" {
		t.Errorf("x-loadshed-reason %q", v)
	}
	if string(ir.GetBody()) != "503 Service Unavailable: concurrency_limit\n" {
		t.Errorf("body %q", ir.GetBody())
	}
	if err := f.end(t); err != nil {
		t.Errorf("a refused stream ends cleanly, got %v", err)
	}

	c := e.open()
	c.send(grpcHeaders("192.0.2.9:4321"))
	ir = immediate(t, c.next(t))
	if ir.GetGrpcStatus().GetStatus() != 14 || string(ir.GetBody()) != "loadshed: concurrency_limit" {
		t.Errorf("grpc-status %v message %q, want 14 and the reason", ir.GetGrpcStatus(), ir.GetBody())
	}
	if v := header(t, ir.GetHeaders(), "grpc-retry-pushback-ms"); v == "" || header(t, ir.GetHeaders(), "retry-after") != "" {
		t.Errorf("a gRPC refusal carries grpc-retry-pushback-ms (%q), not Retry-After", v)
	}
	if n := e.requests("door", "extproc", "outcome", "shed", "code", "503"); n != 2 {
		t.Errorf("sheds counted %v, want 2", n)
	}
}

// queuedTimers are the timers armed once a second request waits behind a first one: the first's
// upstreamTimeout, the queue's expiry and the second's answer deadline.
const queuedTimers = 3

// admitted opens a stream, sends Envoy's first message m and asserts that the door lets the
// request through (CONTINUE): its permit is held until the test goes on.
func (e *env) admitted(t *testing.T, m *extprocv3.ProcessingRequest) *fakeStream {
	t.Helper()
	f := e.open()
	f.send(m)
	continued(t, f.next(t))
	return f
}

// holdOneSendNext admits a first request (from 192.0.2.7) and leaves its stream open, so that it
// holds its permit until the test sends its response headers; then it sends the headers of a
// second request from source on a stream of its own, to queue or be refused behind the first.
func (e *env) holdOneSendNext(t *testing.T, source string) (hold, next *fakeStream) {
	t.Helper()
	hold = e.admitted(t, requestHeaders("192.0.2.7:4321"))
	next = e.open()
	next.send(requestHeaders(source))
	return hold, next
}

// waitQueuedTimers waits until the second request is queued and its timers are armed.
func (e *env) waitQueuedTimers(t *testing.T) {
	t.Helper()
	testwait.Until(t, 5*time.Second, "the queued request's timers", func() bool { return e.queued() == 1 && e.clk.Pending() == queuedTimers })
}

// TestQueuedAnsweredInTime: a request that waits in a queue whose maxWait fits Envoy's message
// timeout holds its answer without asking for more time, and is refused with 503 and
// Retry-After at maxWait, before Envoy's timer.
func TestQueuedAnsweredInTime(t *testing.T) {
	e := newEnv(t, "admission: {strategy: bounded-queue, boundedQueue: {concurrency: 1, depth: 2, maxWait: 150ms}}\n")
	_, f := e.holdOneSendNext(t, "192.0.2.8:4321")
	e.waitQueuedTimers(t)
	e.clk.Advance(149 * time.Millisecond)
	select {
	case m := <-f.out:
		t.Fatalf("answered %v before maxWait", m)
	default:
	}
	e.clk.Advance(time.Millisecond)
	ir := immediate(t, f.next(t))
	if ir.GetStatus().GetCode() != 503 || header(t, ir.GetHeaders(), "x-loadshed-reason") != "queue_timeout" || header(t, ir.GetHeaders(), "retry-after") == "" {
		t.Errorf("at maxWait: %v, want 503 queue_timeout with Retry-After", ir)
	}
	if got := testutil.ToFloat64(e.s.m.overrides); got != 0 {
		t.Errorf("%v overrides for a wait that fits the message timeout", got)
	}
}

// TestQueuedAsksForMoreTime: a queue whose maxWait exceeds the message timeout asks Envoy once
// for enough time (override_message_timeout, within maxMessageTimeout), then admits the request
// when a permit frees.
func TestQueuedAsksForMoreTime(t *testing.T) {
	e := newEnv(t, "extProc: {listen: 127.0.0.1:9002, maxMessageTimeout: 2s}\n"+
		"admission: {strategy: bounded-queue, boundedQueue: {concurrency: 1, depth: 2, maxWait: 1s}}\n")
	hold, f := e.holdOneSendNext(t, "192.0.2.8:4321")
	ov := f.next(t)
	if ov.GetResponse() != nil || ov.GetOverrideMessageTimeout().AsDuration() != 1060*time.Millisecond {
		t.Fatalf("want a lone override of 1.06s (1s wait, its margin, 10ms), got %v", ov)
	}
	e.waitQueuedTimers(t)
	e.clk.Advance(500 * time.Millisecond) // past Envoy's first 200ms: the override holds it
	hold.send(responseHeaders(":status", "200"))
	hold.next(t)
	continued(t, f.next(t))
	if e.inFlight() != 1 {
		t.Errorf("in flight %d, want the waiter admitted", e.inFlight())
	}
	if got := testutil.ToFloat64(e.s.m.overrides); got != 1 {
		t.Errorf("overrides %v, want 1", got)
	}
}

// TestAnswerDueBeforeEnvoysTimer: a wait the door cannot extend (Envoy allows no extension and
// the queue may hold the request longer, which validation refuses in a whole file) is refused
// as a queue timeout AnswerMargin before Envoy's message timeout, never left to Envoy's 504.
func TestAnswerDueBeforeEnvoysTimer(t *testing.T) {
	e := newEnv(t, "admission: {strategy: bounded-queue, boundedQueue: {concurrency: 1, depth: 2, maxWait: 5s}}\n")
	_, f := e.holdOneSendNext(t, "192.0.2.8:4321")
	e.waitQueuedTimers(t)
	due := 200*time.Millisecond - config.AnswerMargin(200*time.Millisecond)
	e.clk.Advance(due - time.Millisecond)
	select {
	case m := <-f.out:
		t.Fatalf("answered %v before the answer was due", m)
	default:
	}
	e.clk.Advance(time.Millisecond)
	ir := immediate(t, f.next(t))
	if ir.GetStatus().GetCode() != 503 || header(t, ir.GetHeaders(), "x-loadshed-reason") != "queue_timeout" || header(t, ir.GetHeaders(), "retry-after") != "1" {
		t.Errorf("answer due: %v, want 503 queue_timeout, Retry-After 1", ir)
	}
	if e.queued() != 0 {
		t.Errorf("%d still queued", e.queued())
	}
	if got := testutil.ToFloat64(e.s.m.due); got != 1 {
		t.Errorf("answers due %v, want 1", got)
	}
	if n := e.requests("outcome", "shed", "code", "503"); n != 1 {
		t.Errorf("counted as shed %v times, want 1 (not a client that left)", n)
	}
}

// TestClientLeavesWhileQueued: Envoy resets the stream of a client that left while it waited:
// its place in the queue is freed, it is counted as canceled, and it never reaches the upstream.
func TestClientLeavesWhileQueued(t *testing.T) {
	e := newEnv(t, "admission: {strategy: bounded-queue, boundedQueue: {concurrency: 1, depth: 2, maxWait: 150ms}}\n")
	_, f := e.holdOneSendNext(t, "192.0.2.8:4321")
	testwait.Until(t, 5*time.Second, "the request queued", func() bool { return e.queued() == 1 })
	f.reset(t)
	if e.queued() != 0 || e.inFlight() != 1 {
		t.Errorf("queued %d, in flight %d: want 0 and the first one only", e.queued(), e.inFlight())
	}
	select {
	case m := <-f.out:
		t.Errorf("answered %v to a client that left", m)
	default:
	}
	if n := e.requests("outcome", "canceled", "code", "499"); n != 1 {
		t.Errorf("canceled counted %v, want 1", n)
	}
}

// TestEarlyCloseReleases: a stream that ends after the CONTINUE but before any answer (the
// client left, Envoy reset the stream) releases the permit as canceled, which teaches the
// strategy nothing; so does a stream whose CONTINUE cannot be sent.
func TestEarlyCloseReleases(t *testing.T) {
	e := newEnv(t, "admission: {strategy: adaptive, adaptive: {initialLimit: 4}}\n")
	for _, how := range []string{"reset", "eof"} {
		f := e.admitted(t, requestHeaders("192.0.2.7:4321"))
		if e.inFlight() != 1 {
			t.Fatalf("%s: in flight %d, want 1", how, e.inFlight())
		}
		if how == "reset" {
			f.reset(t)
		} else {
			f.end(t)
		}
		if e.inFlight() != 0 {
			t.Errorf("%s: in flight %d after the stream ended, want 0", how, e.inFlight())
		}
	}
	if n := e.requests("outcome", "canceled"); n != 2 {
		t.Errorf("canceled counted %v, want 2", n)
	}
	if n := e.requests("outcome", "upstream_error"); n != 0 {
		t.Errorf("an early close counted as an upstream failure (%v)", n)
	}
	if l := e.g.Policies()[0].Stats().Limit; l < 4 {
		t.Errorf("limit %v: early closes shrank it", l)
	}
}

// TestUpstreamFailureIsAnOutcome: Envoy's own local reply to an unreachable or hung upstream
// (503, 504) reaches the door as response headers: an upstream error, which shrinks an adaptive
// limit.
func TestUpstreamFailureIsAnOutcome(t *testing.T) {
	e := newEnv(t, "admission: {strategy: inflight, inflight: {limit: 4}}\n")
	for _, code := range []string{"503", "504"} {
		f := e.admitted(t, requestHeaders("192.0.2.7:4321"))
		f.send(responseHeaders(":status", code, "content-type", "text/plain"))
		f.next(t)
		f.reset(t)
	}
	if n := e.requests("outcome", "upstream_error"); n != 2 {
		t.Errorf("upstream errors counted %v, want 2", n)
	}
	if e.inFlight() != 0 {
		t.Errorf("in flight %d", e.inFlight())
	}
}

// TestHungUpstreamWithoutRouteTimeout: an admitted request with no answer within
// upstreamTimeout gives its permit back as dropped, though its stream goes on.
func TestHungUpstreamWithoutRouteTimeout(t *testing.T) {
	e := newEnv(t, "upstreamTimeout: 2s\nadmission: {strategy: inflight, inflight: {limit: 1}}\n")
	f := e.admitted(t, requestHeaders("192.0.2.7:4321"))
	testwait.Until(t, 5*time.Second, "the upstream timer", func() bool { return e.clk.Pending() == 1 })
	e.clk.Advance(2 * time.Second)
	if e.inFlight() != 0 {
		t.Errorf("in flight %d after upstreamTimeout, want 0", e.inFlight())
	}
	f.send(responseHeaders(":status", "504"))
	f.next(t)
	f.reset(t)
	if n := e.requests("outcome", "upstream_error", "code", "504"); n != 1 {
		t.Errorf("counted %v, want the late 504 once", n)
	}
}

// TestGRPCCallEndsAtTrailers: an admitted gRPC call asks for its response trailers and keeps
// its permit until its grpc-status: UNAVAILABLE from the upstream is its outcome (an upstream
// error), whatever the HTTP 200 said.
func TestGRPCCallEndsAtTrailers(t *testing.T) {
	e := newEnv(t, "admission: {strategy: inflight, inflight: {limit: 4}}\n")
	f := e.open()
	f.send(grpcHeaders("192.0.2.7:4321"))
	m := f.next(t)
	continued(t, m)
	if mo := m.GetModeOverride(); mo.GetResponseTrailerMode() != filterv3.ProcessingMode_SEND || mo.GetResponseHeaderMode() != filterv3.ProcessingMode_SEND {
		t.Fatalf("mode override %v, want response headers and trailers sent", mo)
	}
	e.clk.Advance(20 * time.Millisecond)
	f.send(responseHeaders(":status", "200", "content-type", "application/grpc"))
	f.next(t)
	if e.inFlight() != 1 {
		t.Fatalf("in flight %d at the call's headers, want 1 until its trailers", e.inFlight())
	}
	f.send(responseTrailers("grpc-status", "14", "grpc-message", "down"))
	if f.next(t).GetResponseTrailers() == nil {
		t.Fatal("want the trailers answered")
	}
	if e.inFlight() != 0 {
		t.Errorf("in flight %d after the trailers", e.inFlight())
	}
	f.reset(t)
	if n := e.requests("outcome", "upstream_error", "code", "200"); n != 1 {
		t.Errorf("UNAVAILABLE counted %v as an upstream error, want 1", n)
	}

	// A trailers-only answer (Envoy's local reply to a gRPC call is one) ends at its headers.
	f = e.admitted(t, grpcHeaders("192.0.2.7:4321"))
	f.send(responseHeaders(":status", "200", "content-type", "application/grpc", "grpc-status", "0"))
	f.next(t)
	if e.inFlight() != 0 {
		t.Errorf("in flight %d after a trailers-only answer", e.inFlight())
	}
	f.reset(t)

	// Without trailers (an Envoy that does not allow mode overrides), the call is read at its
	// headers.
	f = e.admitted(t, grpcHeaders("192.0.2.7:4321"))
	f.send(responseHeaders(":status", "200", "content-type", "application/grpc"))
	f.next(t)
	f.reset(t)
	if e.inFlight() != 0 {
		t.Errorf("in flight %d", e.inFlight())
	}
	if n := e.requests("outcome", "success"); n != 2 {
		t.Errorf("successes %v, want 2", n)
	}
}

// TestGRPCStatusClassifiedAsByTheHTTPDoor: through ext_proc a call's grpc-status is classified
// by the gate as it is through the data port: the upstream's INTERNAL (what a server answers to
// a message its client cut short) and a RESOURCE_EXHAUSTED for a message over the server's size
// limit do not shrink an adaptive limit; UNAVAILABLE does. (ext_proc sees no request bodies:
// Envoy forwards the client's messages, and the upstream's answer to them is all the door sees.)
func TestGRPCStatusClassifiedAsByTheHTTPDoor(t *testing.T) {
	e := newEnv(t, "admission: {strategy: adaptive, adaptive: {initialLimit: 20, minLimit: 1, maxLimit: 20, slowStart: 0s, window: 1ms}}\n")
	limit := func() float64 { return e.g.StageStates()[0].Limit }
	end := func(trailersOnly bool, kv ...string) {
		f := e.admitted(t, grpcHeaders("192.0.2.7:4321"))
		e.clk.Advance(2 * time.Millisecond)
		if trailersOnly {
			f.send(responseHeaders(append([]string{":status", "200", "content-type", "application/grpc"}, kv...)...))
			f.next(t)
		} else {
			f.send(responseHeaders(":status", "200", "content-type", "application/grpc"))
			f.next(t)
			f.send(responseTrailers(kv...))
			f.next(t)
		}
		f.reset(t)
	}
	before := limit()
	for range 100 {
		end(false, "grpc-status", "13", "grpc-message", "grpc: failed to unmarshal the received message: unexpected EOF")
		end(true, "grpc-status", "8", "grpc-message", "grpc: received message larger than max (4294967295 vs. 4194304)")
	}
	if after := limit(); after < before {
		t.Fatalf("limit %v -> %v after 100 INTERNAL and 100 oversized-message calls: want it unchanged", before, after)
	}
	if n := e.requests("outcome", "upstream_error"); n != 100 {
		t.Errorf("INTERNAL counted %v times as an upstream error, want 100", n)
	}
	if n := e.requests("outcome", "client_error"); n != 100 {
		t.Errorf("oversized messages counted %v times as the client's error, want 100", n)
	}
	for range 20 {
		end(false, "grpc-status", "14", "grpc-message", "overloaded")
	}
	if after := limit(); after >= before {
		t.Fatalf("limit %v -> %v after 20 UNAVAILABLEs: want it shrunk", before, after)
	}
}

// TestGRPCLongCallTakenForAStream: a call still open after grpc.streamAfter gives its permit
// back.
func TestGRPCLongCallTakenForAStream(t *testing.T) {
	e := newEnv(t, "grpc: {streamAfter: 1s}\nadmission: {strategy: inflight, inflight: {limit: 4}}\n")
	e.admitted(t, grpcHeaders("192.0.2.7:4321")) // the call stays open
	testwait.Until(t, 5*time.Second, "the stream timer", func() bool { return e.clk.Pending() == 1 })
	e.clk.Advance(time.Second)
	if e.inFlight() != 0 {
		t.Errorf("in flight %d after streamAfter", e.inFlight())
	}
}

// TestStreamingRoute: a streaming route's request asks for no trailers and gives its permit back
// at its response headers.
func TestStreamingRoute(t *testing.T) {
	e := newEnv(t, "admission: {strategy: inflight, inflight: {limit: 4}}\nroutes: [{name: watch, pathPrefix: /pkg.Svc/, streaming: true}]\n")
	f := e.open()
	f.send(grpcHeaders("192.0.2.7:4321"))
	m := f.next(t)
	continued(t, m)
	if m.GetModeOverride() != nil {
		t.Errorf("a streaming call asks for no trailers: %v", m.GetModeOverride())
	}
	f.send(responseHeaders(":status", "200", "content-type", "application/grpc"))
	f.next(t)
	if e.inFlight() != 0 {
		t.Errorf("in flight %d after a stream's headers", e.inFlight())
	}
}

// TestClientKeyAndHeaders: the client is Envoy's source.address, not X-Forwarded-For (unless
// trusted); admission headers are removed on the way and the remaining deadline forwarded; a
// malformed admission header is a 400 naming it.
func TestClientKeyAndHeaders(t *testing.T) {
	e := newEnv(t, `admission: {strategy: none}
clients: {rate: 0.001, burst: 1}
headers: {priority: X-Priority, timeout: X-Request-Timeout}
`)
	pass := func(source string, kv ...string) *extprocv3.ProcessingResponse {
		f := e.open()
		f.send(requestHeaders(source, kv...))
		m := f.next(t)
		f.reset(t)
		return m
	}
	hr := continued(t, pass("192.0.2.7:1111", "x-priority", "sheddable", "x-request-timeout", "2s"))
	mut := hr.GetResponse().GetHeaderMutation()
	if strings.Join(mut.GetRemoveHeaders(), ",") != "x-priority" {
		t.Errorf("removed %v, want the priority header (the only admission header sent)", mut.GetRemoveHeaders())
	}
	if v := header(t, mut, "x-request-timeout"); v != "2s" {
		t.Errorf("forwarded timeout %q, want 2s", v)
	}
	// Same address, another port: the same client, over its burst.
	if ir := immediate(t, pass("192.0.2.7:2222", "x-forwarded-for", "203.0.113.9")); ir.GetStatus().GetCode() != 429 {
		t.Errorf("same source address: %v, want 429 client_limited", ir.GetStatus())
	}
	continued(t, pass("192.0.2.8:1111"))
	ir := immediate(t, pass("192.0.2.9:1111", "x-request-timeout", "soon"))
	if ir.GetStatus().GetCode() != 400 || !strings.Contains(string(ir.GetBody()), "X-Request-Timeout") {
		t.Errorf("malformed timeout: %d %q, want 400 naming the header", ir.GetStatus().GetCode(), ir.GetBody())
	}
}

// TestMisconfiguredFilter: a filter that does not send the request headers first, or runs in
// observability mode, cannot admit anything: the stream fails with a message naming the setting.
func TestMisconfiguredFilter(t *testing.T) {
	e := newEnv(t, "admission: {strategy: none}\n")
	f := e.open()
	f.send(responseHeaders(":status", "200"))
	err := f.end(t)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "request_header_mode") {
		t.Errorf("got %v, want FailedPrecondition naming request_header_mode", err)
	}
	f = e.open()
	m := requestHeaders("192.0.2.7:1")
	m.ObservabilityMode = true
	f.send(m)
	if err := f.end(t); !strings.Contains(err.Error(), "observability_mode") {
		t.Errorf("got %v, want the error naming observability_mode", err)
	}
}

// TestUnknownStatusCode: a configured refusal status Envoy's API does not name is answered with
// a standard one.
func TestUnknownStatusCode(t *testing.T) {
	e := newEnv(t, "statusCodes: {concurrencyLimit: 599}\nadmission: {strategy: inflight, inflight: {limit: 1}}\n")
	_, f := e.holdOneSendNext(t, "192.0.2.7:4321")
	if ir := immediate(t, f.next(t)); ir.GetStatus().GetCode() != 503 {
		t.Errorf("status %v, want 503 for 599", ir.GetStatus().GetCode())
	}
}

func TestRequestPath(t *testing.T) {
	for raw, want := range map[string]string{"/a/b?x=1": "/a/b", "/a%2Fb": "/a/b", "/%zz?q": "/%zz", "": "", "/p%20q": "/p q"} {
		if got := requestPath(raw); got != want {
			t.Errorf("%q: %q, want %q", raw, got, want)
		}
	}
}

// TestLoadReportsThroughExtProc: with loadReports.orca every answer Envoy passes on carries the
// report: an HTTP answer's headers and a refusal's local reply endpoint-load-metrics, a gRPC
// call's trailers and a refused call's local reply endpoint-load-metrics-bin.
func TestLoadReportsThroughExtProc(t *testing.T) {
	e := newEnv(t, "admission: {strategy: inflight, inflight: {limit: 1}}\nloadReports: {orca: true}\n")
	e.clk.Advance(100 * time.Millisecond) // a first sample
	f := e.admitted(t, requestHeaders("192.0.2.7:4321"))
	f.send(responseHeaders(":status", "200", "content-type", "text/plain"))
	if v := header(t, f.next(t).GetResponseHeaders().GetResponse().GetHeaderMutation(), "endpoint-load-metrics"); !strings.HasPrefix(v, "TEXT application_utilization=") {
		t.Errorf("an HTTP answer's endpoint-load-metrics %q, want a TEXT report", v)
	}
	f.reset(t)

	_, refused := e.holdOneSendNext(t, "192.0.2.8:4321")
	if v := header(t, immediate(t, refused.next(t)).GetHeaders(), "endpoint-load-metrics"); !strings.HasPrefix(v, "TEXT ") {
		t.Errorf("a refusal's endpoint-load-metrics %q, want a TEXT report", v)
	}
	c := e.open()
	c.send(grpcHeaders("192.0.2.9:4321"))
	if v := header(t, immediate(t, c.next(t)).GetHeaders(), "endpoint-load-metrics-bin"); v == "" {
		t.Error("a refused call's local reply has no endpoint-load-metrics-bin")
	}
}

// TestLoadReportInACallsTrailers: an admitted gRPC call's report is in its trailers (not in
// its headers, which come before the call's outcome).
func TestLoadReportInACallsTrailers(t *testing.T) {
	e := newEnv(t, "admission: {strategy: inflight, inflight: {limit: 4}}\nloadReports: {orca: true}\n")
	e.clk.Advance(100 * time.Millisecond)
	f := e.admitted(t, grpcHeaders("192.0.2.7:4321"))
	f.send(responseHeaders(":status", "200", "content-type", "application/grpc"))
	if m := f.next(t).GetResponseHeaders().GetResponse().GetHeaderMutation(); m != nil {
		t.Errorf("a call's response headers changed: %v", m)
	}
	f.send(responseTrailers("grpc-status", "0"))
	if v := header(t, f.next(t).GetResponseTrailers().GetHeaderMutation(), "endpoint-load-metrics-bin"); v == "" {
		t.Error("a call's trailers have no endpoint-load-metrics-bin")
	}
	f.reset(t)
}
