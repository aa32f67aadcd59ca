package proxy

import (
	"context"
	"testing"
	"time"

	orcasvc "github.com/cncf/xds/go/xds/service/orca/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

const adaptiveAdmission = "  strategy: adaptive\n"

// TestORCAOutOfBandStream: with loadReports.orca the data port serves the out-of-band report
// stream itself: a report at once, then one per interval, never more often than
// loadReports.minInterval however often the client asks, carrying the strategy's limit; the
// stream never reaches the application. Without reports the same call is the application's.
func TestORCAOutOfBandStream(t *testing.T) {
	u := newGRPCUpstream(t)
	_, conn := grpcProxy(t, u, adaptiveAdmission, "loadReports: {orca: true, minInterval: 1s}")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := orcasvc.NewOpenRcaServiceClient(conn).StreamCoreMetrics(ctx,
		&orcasvc.OrcaLoadReportRequest{ReportInterval: durationpb.New(10 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("the first report: %v", err)
	}
	first := time.Now()
	second, err := stream.Recv()
	if err != nil {
		t.Fatalf("the second report: %v", err)
	}
	if gap := time.Since(first); gap < 900*time.Millisecond {
		t.Errorf("reports %v apart though loadReports.minInterval is 1s (the client asked for 10ms)", gap)
	}
	if lim := second.GetNamedMetrics()["limit"]; lim <= 0 {
		t.Errorf("report %v: no adaptive limit in named_metrics", second)
	}
	if n := u.calls.Load(); n != 0 {
		t.Errorf("the report stream reached the application (%d calls)", n)
	}

	t.Run("reports off", func(t *testing.T) {
		u := newGRPCUpstream(t)
		_, conn := grpcProxy(t, u, adaptiveAdmission)
		stream, err := orcasvc.NewOpenRcaServiceClient(conn).StreamCoreMetrics(ctx, &orcasvc.OrcaLoadReportRequest{})
		if err != nil {
			t.Fatal(err)
		}
		// The test upstream answers any method with one empty message.
		if m, err := stream.Recv(); err != nil || len(m.GetNamedMetrics()) != 0 {
			t.Errorf("the application's answer: %v, %v; want its one empty message", m, err)
		}
		if n := u.calls.Load(); n != 1 {
			t.Errorf("the application got %d calls, want the stream forwarded once", n)
		}
	})
}

// TestORCATrustedOnly: with loadReports.trustedOnly a caller outside trust.sources gets no
// report stream (PERMISSION_DENIED) and no in-band report either.
func TestORCATrustedOnly(t *testing.T) {
	u := newGRPCUpstream(t)
	_, conn := grpcProxy(t, u, adaptiveAdmission, "loadReports: {orca: true, trustedOnly: true}", "trust: {sources: [192.0.2.1]}")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := orcasvc.NewOpenRcaServiceClient(conn).StreamCoreMetrics(ctx, &orcasvc.OrcaLoadReportRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("an untrusted caller's report stream: %v, want PERMISSION_DENIED", err)
	}
	if n := u.calls.Load(); n != 0 {
		t.Errorf("the refused stream reached the application (%d calls)", n)
	}
}

// TestORCAStreamsEndAtShutdown: a report stream does not hold the shutdown open: it ends with
// UNAVAILABLE when the data port drains, and Serve returns well before its hard deadline
// (grace period + upstreamTimeout).
func TestORCAStreamsEndAtShutdown(t *testing.T) {
	u := newGRPCUpstream(t)
	p, conn := grpcProxy(t, u, adaptiveAdmission, "loadReports: {orca: true}", "upstreamTimeout: 60s")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := orcasvc.NewOpenRcaServiceClient(conn).StreamCoreMetrics(ctx, &orcasvc.OrcaLoadReportRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- p.stop() }()
	for {
		if _, err = stream.Recv(); err != nil {
			break
		}
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("the stream at shutdown: %v, want UNAVAILABLE", err)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Serve did not return: the report stream held the drain open")
	}
}
