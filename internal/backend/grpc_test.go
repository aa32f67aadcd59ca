package backend

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/loadshed/loadshed/internal/backend/backendpb"
	"github.com/loadshed/loadshed/internal/testwait"
	"github.com/loadshed/loadshed/pkg/admission/admissiontest"
)

// startGRPC serves the fixture's Server on a loopback gRPC port and returns a client of it.
func (f *fixture) startGRPC() *grpc.ClientConn {
	f.t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.t.Fatal(err)
	}
	g := f.s.newGRPCServer()
	go func() { _ = g.srv.Serve(l) }()
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		f.t.Fatal(err)
	}
	// Cleanups run last first: the connection, then the server (after the fixture's Close has
	// woken the handlers still waiting on the fake clock).
	f.t.Cleanup(g.srv.Stop)
	f.t.Cleanup(func() { conn.Close() })
	return conn
}

// call is what a gRPC client saw of one Work call.
type call struct {
	reply   *backendpb.WorkReply
	err     error
	header  metadata.MD
	trailer metadata.MD
}

func (f *fixture) work(conn *grpc.ClientConn, req *backendpb.WorkRequest) <-chan call {
	ch := make(chan call, 1)
	go func() {
		var c call
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.reply, c.err = backendpb.NewBackendClient(conn).Work(ctx, req, grpc.Header(&c.header), grpc.Trailer(&c.trailer))
		ch <- c
	}()
	return ch
}

func (f *fixture) recvCall(ch <-chan call) call {
	f.t.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(10 * time.Second):
		f.t.Fatalf("no gRPC answer within 10s (stats %+v)", f.s.Stats())
		return call{}
	}
}

func TestGRPCWorkSharesTheHTTPWorkers(t *testing.T) {
	f := newFixture(t, constant(1, 20*ms))
	conn := f.startGRPC()
	first := f.get("/")
	f.waitState(1, 0, 0, 1)
	second := f.work(conn, &backendpb.WorkRequest{})
	f.waitState(1, 1, 0, 1) // the call waits behind the HTTP request for the one worker
	third := f.get("/")
	f.waitState(1, 2, 0, 1)

	f.clock.Advance(20 * ms)
	if r := f.recv(first); r.code != 200 {
		t.Fatalf("first HTTP request: %d", r.code)
	}
	f.waitState(1, 1, 1, 1)
	f.clock.Advance(20 * ms)
	c := f.recvCall(second)
	if c.err != nil {
		t.Fatalf("Work: %v", c.err)
	}
	if c.reply.GetWaitMicros() != 20000 || c.reply.GetServiceMicros() != 20000 || len(c.reply.GetPayload()) != 0 {
		t.Errorf("reply = %v, want wait 20000 us, service 20000 us, no payload", c.reply)
	}
	if got := c.trailer.Get("x-backend-wait"); len(got) != 1 || got[0] != "20ms" {
		t.Errorf("x-backend-wait trailer = %q, want 20ms", got)
	}
	if got := c.trailer.Get("x-backend-service"); len(got) != 1 || got[0] != "20ms" {
		t.Errorf("x-backend-service trailer = %q, want 20ms", got)
	}
	f.waitState(1, 0, 2, 1)
	f.clock.Advance(20 * ms)
	if r := f.recv(third); r.code != 200 || r.wait != "40ms" {
		t.Fatalf("third HTTP request: %d, wait %q (want 200 after 40ms)", r.code, r.wait)
	}
	f.waitState(0, 0, 3, 0)

	const counts = `
# HELP backend_grpc_requests_total gRPC calls answered by the backend's gRPC port, by gRPC status code.
# TYPE backend_grpc_requests_total counter
backend_grpc_requests_total{grpc_code="OK"} 1
# HELP backend_requests_total Requests answered by the backend, by HTTP status code.
# TYPE backend_requests_total counter
backend_requests_total{code="200"} 2
`
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(counts), "backend_requests_total", "backend_grpc_requests_total"); err != nil {
		t.Fatal(err)
	}
	// Three services of 20ms, waits of 0, 20 and 40ms, whatever the protocol.
	checkHistogram(t, f.reg, "backend_service_seconds", 3, 0.060)
	checkHistogram(t, f.reg, "backend_wait_seconds", 3, 0.060)
}

func TestGRPCWorkAnswersAsAsked(t *testing.T) {
	f := newFixture(t, constant(2, 20*ms))
	conn := f.startGRPC()
	sleep := int64(5000)

	ok := f.work(conn, &backendpb.WorkRequest{SleepMicros: &sleep, ReplyBytes: 100_000, Payload: bytes.Repeat([]byte("x"), 1000)})
	failing := f.work(conn, &backendpb.WorkRequest{Code: int32(codes.Unavailable)})
	f.waitState(2, 0, 0, 2)
	f.clock.Advance(5 * ms)
	c := f.recvCall(ok)
	if c.err != nil || c.reply.GetServiceMicros() != 5000 {
		t.Fatalf("sleep 5ms: %v, %v", c.reply.GetServiceMicros(), c.err)
	}
	if p := c.reply.GetPayload(); len(p) != 100_000 || !bytes.Equal(p[:64], filler[:64]) || !bytes.Equal(p[32<<10:32<<10+64], filler[:64]) {
		t.Errorf("payload: %d bytes, want 100000 of the filler pattern", len(p))
	}
	select {
	case c := <-failing:
		t.Fatalf("the UNAVAILABLE call answered before its service time: %v", c.err)
	default:
	}
	f.clock.Advance(15 * ms)
	c = f.recvCall(failing)
	if status.Code(c.err) != codes.Unavailable || !strings.Contains(c.err.Error(), "as asked") {
		t.Fatalf("code 14: %v, want UNAVAILABLE after the service time", c.err)
	}
	// A failing call is a trailers-only answer (no headers before the status), as grpc-go
	// servers send it, and still carries the times.
	if c.header != nil {
		t.Errorf("failing call had response headers %v, want a trailers-only answer", c.header)
	}
	if got := c.trailer.Get("x-backend-service"); len(got) != 1 || got[0] != "20ms" {
		t.Errorf("x-backend-service trailer = %q, want 20ms", got)
	}
	f.waitState(0, 0, 2, 0)
	const counts = `
# HELP backend_grpc_requests_total gRPC calls answered by the backend's gRPC port, by gRPC status code.
# TYPE backend_grpc_requests_total counter
backend_grpc_requests_total{grpc_code="OK"} 1
backend_grpc_requests_total{grpc_code="Unavailable"} 1
`
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(counts), "backend_grpc_requests_total"); err != nil {
		t.Fatal(err)
	}
}

func TestGRPCWorkRefusesInvalidFieldsWithoutAWorker(t *testing.T) {
	f := newFixture(t, constant(1, 20*ms))
	conn := f.startGRPC()
	neg, long := int64(-1), int64(3600_000_001)
	tests := []struct {
		req   *backendpb.WorkRequest
		field string
	}{
		{&backendpb.WorkRequest{SleepMicros: &neg}, "WorkRequest.sleep_micros: must be in [0, 3600000000]"},
		{&backendpb.WorkRequest{SleepMicros: &long}, "WorkRequest.sleep_micros"},
		{&backendpb.WorkRequest{Code: -1}, "WorkRequest.code: must be a gRPC status code in [0, 16], got -1"},
		{&backendpb.WorkRequest{Code: 17}, "WorkRequest.code"},
		{&backendpb.WorkRequest{ReplyBytes: MaxReplyBytes + 1}, "WorkRequest.reply_bytes: must be in [0, 1048576]"},
		{&backendpb.WorkRequest{ReplyBytes: -5}, "WorkRequest.reply_bytes"},
		{&backendpb.WorkRequest{Payload: make([]byte, MaxRequestBody+1)}, "WorkRequest.payload: must be at most 1048576 bytes"},
	}
	for _, tt := range tests {
		c := f.recvCall(f.work(conn, tt.req))
		if status.Code(c.err) != codes.InvalidArgument || !strings.Contains(status.Convert(c.err).Message(), tt.field) {
			t.Errorf("%v: %v, want INVALID_ARGUMENT naming %q", tt.req, c.err, tt.field)
		}
	}
	if st := f.s.Stats(); st.Busy != 0 || st.Waiting != 0 || st.Served != 0 || f.clock.Pending() != 0 {
		t.Fatalf("invalid calls touched the pool: %+v", st)
	}
	if got := testutil.ToFloat64(f.s.m.grpcCalls.WithLabelValues("InvalidArgument")); got != float64(len(tests)) {
		t.Errorf("InvalidArgument count = %v, want %d", got, len(tests))
	}
}

func TestGRPCHealthAndReflection(t *testing.T) {
	f := newFixture(t, constant(1, 20*ms))
	conn := f.startGRPC()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, svc := range []string{"", "loadshed.backend.v1.Backend"} {
		res, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v %v, want SERVING", svc, res.GetStatus(), err)
		}
	}
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatal(err)
	}
	res, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range res.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{"loadshed.backend.v1.Backend", "grpc.health.v1.Health"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("reflection lists %v, want %s among them", names, want)
		}
	}
	// The whole file is there for tools that need no .proto (grpcurl, ghz, k6).
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "loadshed.backend.v1.Backend"},
	}); err != nil {
		t.Fatal(err)
	}
	if res, err = stream.Recv(); err != nil || len(res.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Fatalf("file containing Backend: %v %v", res, err)
	}
	_ = stream.CloseSend()
}

// startServeGRPC runs Serve with a data and a gRPC port on a fake clock and returns a client of
// the gRPC port.
func startServeGRPC(t *testing.T, cfg Config, shutdown time.Duration) (*serveFixture, *grpc.ClientConn) {
	t.Helper()
	clock := admissiontest.NewClock(time.Unix(0, 0))
	s, err := New(cfg, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	dl, gl := listen(), listen()
	ctx, cancel := context.WithCancel(context.Background())
	sf := &serveFixture{s: s, clock: clock, data: dl.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { sf.done <- s.Serve(ctx, ServeConfig{Data: dl, GRPC: gl, ShutdownTimeout: shutdown}) }()
	conn, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		s.Close()
		select {
		case <-sf.done:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return")
		}
	})
	return sf, conn
}

func TestServeGRPCGracefulShutdown(t *testing.T) {
	sf, conn := startServeGRPC(t, constant(1, 20*ms), time.Minute)
	f := &fixture{t: t, s: sf.s, clock: sf.clock}
	running := f.work(conn, &backendpb.WorkRequest{})
	testwait.Until(t, 10*time.Second, "call in service", func() bool { return sf.s.Stats().Busy == 1 && sf.clock.Pending() == 1 })
	queued := f.work(conn, &backendpb.WorkRequest{})
	testwait.Until(t, 10*time.Second, "call waiting", func() bool { return sf.s.Stats().Waiting == 1 })

	sf.cancel()
	// Once shutdown has begun the health service stops serving, then the port refuses new
	// calls (asked with health checks: a Work call that slipped in would wait for the worker).
	testwait.Until(t, 10*time.Second, "the port to refuse new calls", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return status.Code(err) == codes.Unavailable
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := backendpb.NewBackendClient(conn).Work(ctx, &backendpb.WorkRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("Work during shutdown: %v, want UNAVAILABLE", err)
	}
	select {
	case err := <-sf.done:
		t.Fatalf("Serve returned (%v) with calls in flight", err)
	default:
	}
	sf.clock.Advance(20 * ms)
	testwait.Until(t, 10*time.Second, "queued call in service", func() bool { return sf.s.Stats().Busy == 1 && sf.clock.Pending() == 1 })
	sf.clock.Advance(20 * ms)
	for _, ch := range []<-chan call{running, queued} {
		if c := f.recvCall(ch); c.err != nil {
			t.Errorf("call during shutdown: %v, want OK", c.err)
		}
	}
	if err := sf.waitServeReturn(t); err != nil {
		t.Fatalf("Serve = %v, want nil", err)
	}
}

func TestServeGRPCShutdownIsBounded(t *testing.T) {
	// The fake clock never moves, so the call would never finish on its own.
	sf, conn := startServeGRPC(t, constant(1, 20*ms), 50*time.Millisecond)
	f := &fixture{t: t, s: sf.s, clock: sf.clock}
	stuck := f.work(conn, &backendpb.WorkRequest{})
	testwait.Until(t, 10*time.Second, "in service", func() bool { return sf.s.Stats().Busy == 1 && sf.clock.Pending() == 1 })
	sf.cancel()
	if err := sf.waitServeReturn(t); err != nil {
		t.Fatalf("Serve = %v, want nil", err)
	}
	if c := f.recvCall(stuck); status.Code(c.err) != codes.Unavailable {
		t.Fatalf("aborted call: %v, want UNAVAILABLE", c.err)
	}
	testwait.Until(t, 10*time.Second, "worker freed", func() bool { return sf.s.Stats().Busy == 0 })
}

func FuzzWorkRequest(f *testing.F) {
	sleep := int64(20000)
	for _, m := range []*backendpb.WorkRequest{
		{}, {SleepMicros: &sleep, Code: 14, ReplyBytes: 10}, {Code: 99}, {ReplyBytes: -1}, {Payload: []byte("abc")},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req backendpb.WorkRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		w, err := parseWork(&req)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "WorkRequest.") {
				t.Fatalf("error %q does not name a field", err)
			}
			return
		}
		if w.sleep < 0 || w.sleep > time.Hour || w.code > codes.Unauthenticated || w.reply < 0 || w.reply > MaxReplyBytes ||
			w.hasSleep != (req.SleepMicros != nil) || len(req.GetPayload()) > MaxRequestBody {
			t.Fatalf("accepted %v as %+v", &req, w)
		}
	})
}
