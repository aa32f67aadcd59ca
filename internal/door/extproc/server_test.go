package extproc_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/door/extproc"
	"github.com/loadshed/loadshed/internal/gate"
	"github.com/loadshed/loadshed/internal/proxy"
)

func headersMsg(kv ...string) *extprocv3.ProcessingRequest {
	h := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Headers = append(h.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	attrs, _ := structpb.NewStruct(map[string]any{"source.address": "192.0.2.7:4321"})
	return &extprocv3.ProcessingRequest{
		Request:    &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: h, EndOfStream: true}},
		Attributes: map[string]*structpb.Struct{"envoy.filters.http.ext_proc": attrs},
	}
}

func responseMsg(code string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(code)}}}}}}
}

func client(tb testing.TB, addr string) extprocv3.ExternalProcessorClient {
	tb.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return extprocv3.NewExternalProcessorClient(conn)
}

// open starts a request's stream and returns the door's answer to its headers.
func open(t *testing.T, c extprocv3.ExternalProcessorClient, path string) (extprocv3.ExternalProcessor_ProcessClient, *extprocv3.ProcessingResponse) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	st, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(headersMsg(":method", "GET", ":path", path)); err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv()
	if err != nil {
		t.Fatalf("answer to the request headers: %v", err)
	}
	return st, m
}

// TestSidecarServesExtProcOnly: a sidecar with no data port serves ext_proc over gRPC beside its
// admin port; a reload reaches the door through the gate; at shutdown it stops taking streams
// and lets the admitted one finish.
func TestSidecarServesExtProcOnly(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	write := func(limit string) {
		y := "listen: \"\"\nadminListen: 127.0.0.1:0\nextProc: {listen: 127.0.0.1:0}\nreload: {watch: false}\n" +
			"shutdown: {drainDelay: 0s, gracePeriod: 5s}\nadmission: {strategy: inflight, inflight: {limit: " + limit + "}}\n"
		if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("1")
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.New(cfg, proxy.Options{ConfigPath: path, Doors: []gate.OpenDoor{extproc.Open}})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	if data, _ := srv.Addrs(); data != "" || len(srv.Doors()) != 1 {
		t.Fatalf("data %q, doors %d: want no data port and one door", data, len(srv.Doors()))
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	c := client(t, srv.Doors()[0].Addr().String())

	first, m := open(t, c, "/a")
	if m.GetRequestHeaders() == nil {
		t.Fatalf("want CONTINUE, got %v", m)
	}
	if _, m := open(t, c, "/b"); m.GetImmediateResponse().GetStatus().GetCode() != 503 {
		t.Fatalf("limit 1: want the second refused, got %v", m)
	}
	write("2")
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	second, m := open(t, c, "/c")
	if m.GetRequestHeaders() == nil {
		t.Fatalf("after the reload to limit 2: want CONTINUE, got %v", m)
	}
	if err := second.Send(responseMsg("200")); err != nil {
		t.Fatal(err)
	}
	if _, err := second.Recv(); err != nil {
		t.Fatal(err)
	}

	stop()
	select {
	case err := <-served:
		t.Fatalf("Serve returned (%v) with an admitted request in flight", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := first.Send(responseMsg("200")); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Recv(); err != nil {
		t.Fatalf("the admitted request's answer during the drain: %v", err)
	}
	first.CloseSend()
	second.CloseSend()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after the last stream ended")
	}
}
