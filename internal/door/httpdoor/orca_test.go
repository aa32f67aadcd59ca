package httpdoor

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	orcasvc "github.com/cncf/xds/go/xds/service/orca/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/gate"
	"github.com/loadshed/loadshed/internal/testwait"
)

// TestReportStreamsAreBounded: the report streams a replica holds open at once are capped
// (maxReportStreams): one more is refused with RESOURCE_EXHAUSTED at once, and a stream that
// ends makes room again, so clients cannot pile up goroutines and timers with them.
func TestReportStreamsAreBounded(t *testing.T) {
	cfg, err := config.Parse([]byte("upstream: http://127.0.0.1:1\nloadReports: {orca: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	g, err := gate.New(cfg, gate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	d, err := New(g, gate.DoorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.orca.max = 2
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: d, Protocols: &p}
	go srv.Serve(ln)
	defer srv.Close()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := orcasvc.NewOpenRcaServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	open := func() (context.CancelFunc, error) {
		sctx, scancel := context.WithCancel(ctx)
		s, err := client.StreamCoreMetrics(sctx, &orcasvc.OrcaLoadReportRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		return scancel, err
	}
	first, err := open()
	if err != nil {
		t.Fatalf("the first stream: %v", err)
	}
	if _, err := open(); err != nil {
		t.Fatalf("the second stream: %v", err)
	}
	if _, err := open(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a third stream over a cap of 2: %v, want RESOURCE_EXHAUSTED", err)
	}
	first()
	testwait.Until(t, 5*time.Second, "room for another stream once one ended", func() bool {
		_, err := open()
		return err == nil
	})
}
