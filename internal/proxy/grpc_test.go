package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/loadshed/loadshed/internal/testwait"
)

// grpcUpstream is a gRPC server on loopback (h2c, as grpc-go serves without TLS) answering any
// method by its name:
//
//	/t.S/Ok      an empty answer, with a trailer "x-upstream: yes"
//	/t.S/Hold    waits for release (or the call's end)
//	/t.S/Fail    UNAVAILABLE
//	/t.S/OwnReport  an empty answer with an endpoint-load-metrics-bin trailer of its own
//	/t.S/Watch   a server stream: one message every 10 ms until the client leaves
type grpcUpstream struct {
	addr    string
	release chan struct{}
	holding atomic.Int64
	calls   atomic.Int64
}

func newGRPCUpstream(t *testing.T) *grpcUpstream {
	t.Helper()
	u := &grpcUpstream{release: make(chan struct{})}
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		u.calls.Add(1)
		method, _ := grpc.MethodFromServerStream(stream)
		var in emptypb.Empty
		if err := stream.RecvMsg(&in); err != nil {
			return err
		}
		switch method {
		case "/t.S/Hold":
			u.holding.Add(1)
			defer u.holding.Add(-1)
			select {
			case <-u.release:
			case <-stream.Context().Done():
				return stream.Context().Err()
			}
		case "/t.S/OwnReport":
			// An application that reports its own load: the sidecar's report replaces it.
			stream.SetTrailer(metadata.Pairs("endpoint-load-metrics-bin", "not a report"))
		case "/t.S/Fail":
			return status.Error(codes.Unavailable, "upstream overloaded")
		case "/t.S/Watch":
			u.holding.Add(1)
			defer u.holding.Add(-1)
			for {
				if err := stream.SendMsg(&emptypb.Empty{}); err != nil {
					return err
				}
				select {
				case <-stream.Context().Done():
					return nil
				case <-time.After(10 * time.Millisecond): // the stream's own pace
				}
			}
		}
		stream.SetTrailer(metadata.Pairs("x-upstream", "yes"))
		return stream.SendMsg(&emptypb.Empty{})
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	u.addr = ln.Addr().String()
	return u
}

// grpcProxy starts a proxy in front of u with the given admission block and extra YAML, and a
// grpc-go client connected to it.
func grpcProxy(t *testing.T, u *grpcUpstream, admission string, extra ...string) (*running, *grpc.ClientConn) {
	t.Helper()
	p := serveProxy(t, proxyYAML("http://"+u.addr, admission, append([]string{"shutdown: {drainDelay: 0s, gracePeriod: 1s}"}, extra...)...), Options{})
	conn, err := grpc.NewClient(p.data, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return p, conn
}

func call(ctx context.Context, conn *grpc.ClientConn, method string, opts ...grpc.CallOption) error {
	return conn.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{}, opts...)
}

// TestGRPCThroughTheProxy: a gRPC call goes through over h2c both ways, its trailers reach the
// client, and it is counted on the grpc door as a success once its grpc-status is OK.
func TestGRPCThroughTheProxy(t *testing.T) {
	u := newGRPCUpstream(t)
	p, conn := grpcProxy(t, u, "  strategy: inflight\n  inflight: {limit: 4}")
	var trailer metadata.MD
	if err := call(context.Background(), conn, "/t.S/Ok", grpc.Trailer(&trailer)); err != nil {
		t.Fatal(err)
	}
	if got := trailer.Get("x-upstream"); len(got) != 1 || got[0] != "yes" {
		t.Fatalf("trailers %v: the upstream's trailer did not arrive", trailer)
	}
	testwait.Until(t, 5*time.Second, "the call counted", func() bool {
		return testutil.ToFloat64(p.srv.gate.Metrics().Requests.WithLabelValues("default", "inflight", "grpc", "success", "200")) == 1
	})
	if st := p.srv.StageStates()[0]; st.InFlight != 0 {
		t.Fatalf("in flight %v after the call", st.InFlight)
	}
}

// TestGRPCRefusalIsTrailersOnly: a refused call gets UNAVAILABLE (the configured code) in a
// trailers-only answer naming the reason, with a pushback in milliseconds; on the wire it is an
// HTTP 200 with content-type application/grpc, no content-length and no body.
func TestGRPCRefusalIsTrailersOnly(t *testing.T) {
	u := newGRPCUpstream(t)
	p, conn := grpcProxy(t, u, "  strategy: inflight\n  inflight: {limit: 1}")
	done := make(chan error, 1)
	go func() { done <- call(context.Background(), conn, "/t.S/Hold") }()
	testwait.Until(t, 5*time.Second, "the first call upstream", func() bool { return u.holding.Load() == 1 })

	var trailer metadata.MD
	err := call(context.Background(), conn, "/t.S/Ok", grpc.Trailer(&trailer))
	st, _ := status.FromError(err)
	if st.Code() != codes.Unavailable || st.Message() != "loadshed: concurrency_limit" {
		t.Fatalf("refused call: %v, want UNAVAILABLE naming concurrency_limit", err)
	}
	if pb := trailer.Get("grpc-retry-pushback-ms"); len(pb) != 1 || pb[0] != "1000" {
		t.Errorf("pushback %v, want the refusal's 1 s in milliseconds", pb)
	}
	if r := trailer.Get("x-loadshed-reason"); len(r) != 1 || r[0] != "concurrency_limit" {
		t.Errorf("reason %v", r)
	}

	// The same refusal on the wire, from an HTTP/2 client.
	res := grpcPost(t, p.data, "/t.S/Ok")
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/grpc" || res.Header.Get("Grpc-Status") != "14" ||
		len(body) != 0 || res.ContentLength > 0 || res.Header.Get("Content-Length") != "" {
		t.Fatalf("on the wire: %s %v %q, body %d bytes: want a trailers-only 200", res.Proto, res.StatusCode, res.Header, len(body))
	}
	close(u.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(p.srv.gate.Metrics().Shed.WithLabelValues("default", "inflight", "concurrency_limit", "critical", "grpc")); got != 2 {
		t.Errorf("grpc sheds counted %v, want 2", got)
	}
}

// TestGRPCClientWaitsThePushback: a grpc-go client whose retry policy covers UNAVAILABLE waits
// the pushback the proxy sent before it tries again (the pushback replaces its backoff).
func TestGRPCClientWaitsThePushback(t *testing.T) {
	u := newGRPCUpstream(t)
	p := serveProxy(t, proxyYAML("http://"+u.addr, "  strategy: token-bucket\n  tokenBucket: {rate: 4, burst: 1}",
		"shutdown: {drainDelay: 0s, gracePeriod: 1s}", "grpc: {statusCodes: {rateLimited: 14}}"), Options{})
	policy := `{"methodConfig": [{"name": [{"service": "t.S"}], "retryPolicy": {"maxAttempts": 3,
		"initialBackoff": "0.001s", "maxBackoff": "0.001s", "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`
	conn, err := grpc.NewClient(p.data, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(policy))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := call(context.Background(), conn, "/t.S/Ok"); err != nil { // takes the one token
		t.Fatal(err)
	}
	start := time.Now()
	if err := call(context.Background(), conn, "/t.S/Ok"); err != nil {
		t.Fatalf("the retried call: %v", err)
	}
	// The bucket refills in 250 ms: the pushback says so, and the client waits it (its own
	// backoff would have retried after 1 ms, and failed again).
	if waited := time.Since(start); waited < 200*time.Millisecond {
		t.Fatalf("the client retried after %s: it did not wait the pushback", waited)
	}
	if got := testutil.ToFloat64(p.srv.gate.Metrics().Shed.WithLabelValues("default", "token-bucket", "rate_limited", "critical", "grpc")); got != 1 {
		t.Errorf("refused attempts %v, want 1 (the retry after the pushback got through)", got)
	}
}

// TestGRPCOutcomes: an upstream UNAVAILABLE is the upstream's failure (the adaptive limit
// shrinks); a call the client cancels says nothing about the upstream (the limit holds).
func TestGRPCOutcomes(t *testing.T) {
	u := newGRPCUpstream(t)
	p, conn := grpcProxy(t, u, "  strategy: adaptive\n  adaptive: {initialLimit: 8, minLimit: 1, maxLimit: 8, slowStart: 0s, window: 1ms}")
	before := p.srv.StageStates()[0].Limit
	for range 30 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- call(ctx, conn, "/t.S/Hold") }()
		testwait.Until(t, 5*time.Second, "the call upstream", func() bool { return u.holding.Load() == 1 })
		cancel()
		<-done
		testwait.Until(t, 5*time.Second, "the canceled call to end", func() bool { return p.srv.StageStates()[0].InFlight == 0 })
	}
	if after := p.srv.StageStates()[0].Limit; after < before {
		t.Fatalf("limit %v -> %v after 30 calls the client canceled: want it unchanged", before, after)
	}
	for range 30 {
		if err := call(context.Background(), conn, "/t.S/Fail"); status.Code(err) != codes.Unavailable {
			t.Fatalf("failing upstream: %v", err)
		}
	}
	testwait.Until(t, 5*time.Second, "every failure counted", func() bool {
		return testutil.ToFloat64(p.srv.gate.Metrics().Requests.WithLabelValues("default", "adaptive", "grpc", "upstream_error", "200")) == 30
	})
	if after := p.srv.StageStates()[0].Limit; after >= before {
		t.Fatalf("limit %v -> %v after 30 upstream UNAVAILABLEs: want it shrunk", before, after)
	}
	if got := testutil.ToFloat64(p.srv.gate.Metrics().Requests.WithLabelValues("default", "adaptive", "grpc", "canceled", "499")); got == 0 {
		t.Error("canceled calls not counted as canceled")
	}
}

// TestGRPCStreams: a call still open after grpc.streamAfter gives its permit back and goes on;
// on a streaming route the permit goes back as the stream starts.
func TestGRPCStreams(t *testing.T) {
	u := newGRPCUpstream(t)
	p, conn := grpcProxy(t, u, "  strategy: inflight\n  inflight: {limit: 1}",
		"grpc: {streamAfter: 300ms}", "routes: [{name: watch, pathPrefix: /t.S/Watch, streaming: true}]")
	watch := func(method string) (func(), error) {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method)
		if err == nil {
			err = s.SendMsg(&emptypb.Empty{})
		}
		if err == nil {
			err = s.CloseSend()
		}
		if err == nil {
			err = s.RecvMsg(&emptypb.Empty{})
		}
		return cancel, err
	}
	stop, err := watch("/t.S/Watch")
	if err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 5*time.Second, "the streaming route's permit back", func() bool { return p.srv.StageStates()[0].InFlight == 0 })
	if err := call(context.Background(), conn, "/t.S/Ok"); err != nil {
		t.Fatalf("a unary call beside an open stream on a streaming route: %v", err)
	}
	stop()
	testwait.Until(t, 5*time.Second, "the stream to end upstream", func() bool { return u.holding.Load() == 0 })

	// An unmarked call that stays open (/t.S/Hold) is taken for a stream after 300 ms.
	done := make(chan error, 1)
	go func() { done <- call(context.Background(), conn, "/t.S/Hold") }()
	testwait.Until(t, 5*time.Second, "the held call upstream", func() bool { return u.holding.Load() == 1 })
	if err := call(context.Background(), conn, "/t.S/Ok"); status.Code(err) != codes.Unavailable {
		t.Fatalf("while the held call holds the permit: %v, want UNAVAILABLE", err)
	}
	testwait.Until(t, 5*time.Second, "the held call taken for a stream", func() bool { return p.srv.StageStates()[0].InFlight == 0 })
	if err := call(context.Background(), conn, "/t.S/Ok"); err != nil {
		t.Fatalf("after the held call was taken for a stream: %v", err)
	}
	close(u.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestOnePortForEveryProtocol: HTTP/1.1, h2c and gRPC on the data port at once; upstreamProtocol
// auto forwards the gRPC calls over h2c and everything else over HTTP/1.1.
func TestOnePortForEveryProtocol(t *testing.T) {
	u := newGRPCUpstream(t)
	var proto atomic.Value
	web := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proto.Store(r.Proto)
		io.WriteString(w, "ok\n")
	}))
	// One upstream address can serve one protocol only here: route the gRPC service to the
	// gRPC upstream by running two proxies would hide the point, so check each half.
	p := serveProxy(t, proxyYAML(web, "  strategy: none", "shutdown: {drainDelay: 0s, gracePeriod: 1s}"), Options{})
	h1 := &http.Client{}
	h2t := &http.Transport{Protocols: new(http.Protocols)}
	h2t.Protocols.SetUnencryptedHTTP2(true)
	defer h2t.CloseIdleConnections()
	for name, c := range map[string]*http.Client{"HTTP/1.1": h1, "HTTP/2.0": {Transport: h2t}} {
		res, err := c.Get("http://" + p.data + "/")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || res.Proto != name {
			t.Fatalf("%s client: %d over %s", name, res.StatusCode, res.Proto)
		}
		if got := proto.Load(); got != "HTTP/1.1" {
			t.Fatalf("%s client: the upstream got %v, want HTTP/1.1 (upstreamProtocol auto)", name, got)
		}
	}
	_, conn := grpcProxy(t, u, "  strategy: none")
	if err := call(context.Background(), conn, "/t.S/Ok"); err != nil {
		t.Fatalf("gRPC: %v", err)
	}
}

// TestGRPCUpstreamFailureIsNotAShed: an unreachable gRPC upstream is UNAVAILABLE without a
// pushback or a reason header, never taken for a refusal.
func TestGRPCUpstreamFailureIsNotAShed(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	p := serveProxy(t, proxyYAML("http://"+dead, "  strategy: none", "shutdown: {drainDelay: 0s, gracePeriod: 1s}"), Options{})
	conn, err := grpc.NewClient(p.data, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var trailer metadata.MD
	err = call(context.Background(), conn, "/t.S/Ok", grpc.Trailer(&trailer))
	if status.Code(err) != codes.Unavailable || len(trailer.Get("grpc-retry-pushback-ms")) != 0 || len(trailer.Get("x-loadshed-reason")) != 0 {
		t.Fatalf("dead upstream: %v, trailer %v: want UNAVAILABLE without pushback or reason", err, trailer)
	}
	if got := testutil.ToFloat64(p.srv.gate.Metrics().Requests.WithLabelValues("default", "none", "grpc", "upstream_error", "502")); got != 1 {
		t.Fatalf("counted %v upstream errors", got)
	}
}

// grpcPost sends an empty gRPC call to method at addr from a plain HTTP/2 client (h2c), so a
// test can see the answer as it is on the wire.
func grpcPost(t *testing.T, addr, method string) *http.Response {
	t.Helper()
	h2 := &http.Transport{Protocols: new(http.Protocols)}
	h2.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(h2.CloseIdleConnections)
	req, _ := http.NewRequest("POST", "http://"+addr+method, nil)
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	res, err := (&http.Client{Transport: h2}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}
