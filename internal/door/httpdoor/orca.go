package httpdoor

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	orcasvc "github.com/cncf/xds/go/xds/service/orca/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	orcav3 "github.com/cncf/xds/go/xds/data/orca/v3"

	"github.com/loadshed/loadshed/internal/gate"
)

// orcaPath is the out-of-band load report stream's method: the data port serves it itself when
// loadReports.orca is on (it is never forwarded then), so gRPC clients balancing with
// weighted_round_robin (and Envoy) can watch the replica's load without sending it requests.
const orcaPath = "/xds.service.orca.v3.OpenRcaService/StreamCoreMetrics"

// maxReportStreams bounds the report streams open at once: a balancer holds one per replica, a
// few hundred clients at most; a client that opens more gets RESOURCE_EXHAUSTED, so streams
// cannot pile up goroutines and timers.
const maxReportStreams = 256

// orcaService serves xds.service.orca.v3.OpenRcaService from the gate's load report, through
// grpc-go's server on net/http's HTTP/2 (grpc.Server.ServeHTTP). grpc-go's own orca package
// would hold every client to at least 30 s between reports; this one allows
// loadReports.minInterval (1 s by default).
type orcaService struct {
	orcasvc.UnimplementedOpenRcaServiceServer
	gate *gate.Gate
	srv  *grpc.Server

	open    atomic.Int64 // report streams open now
	max     int64        // maxReportStreams
	mu      sync.Mutex
	stop    chan struct{} // closed by stopStreams
	stopped bool
}

func newORCAService(g *gate.Gate) *orcaService {
	o := &orcaService{gate: g, srv: grpc.NewServer(), stop: make(chan struct{}), max: maxReportStreams}
	orcasvc.RegisterOpenRcaServiceServer(o.srv, o)
	return o
}

// serves reports whether r is the report stream, and the configuration has the data port serve
// it (a gRPC call over HTTP/2 with reports on).
func (o *orcaService) serves(r *http.Request) bool {
	return r.URL.Path == orcaPath && r.ProtoMajor == 2 && gate.IsGRPC(r.Header.Get("Content-Type")) &&
		o.gate.Config().LoadReports.ORCA
}

// ServeHTTP serves the stream, or refuses a caller the reports are not for (PERMISSION_DENIED,
// trailers-only).
func (o *orcaService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !o.gate.ReportsTo(r.Header, r.RemoteAddr) {
		writeGRPCStatus(w, gate.GRPCPermissionDenied, "loadshed: load reports are for trusted callers only (loadReports.trustedOnly)", "", "")
		return
	}
	if o.open.Add(1) > o.max {
		o.open.Add(-1)
		writeGRPCStatus(w, gate.GRPCResourceExhausted, fmt.Sprintf("loadshed: %d load report streams are open, the most this replica serves", o.max), "", "")
		return
	}
	defer o.open.Add(-1)
	o.srv.ServeHTTP(w, r)
}

// StreamCoreMetrics sends the replica's load report at once and then every interval the client
// asked for (never more often than loadReports.minInterval), until the client goes away or the
// server shuts down.
func (o *orcaService) StreamCoreMetrics(req *orcasvc.OrcaLoadReportRequest, stream grpc.ServerStreamingServer[orcav3.OrcaLoadReport]) error {
	ctx := stream.Context()
	every := max(req.GetReportInterval().AsDuration(), o.gate.Config().LoadReports.MinInterval.D(), time.Second)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		if err := stream.Send(o.gate.Load().Proto()); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-o.stop:
			return status.Error(codes.Unavailable, "loadshed: shutting down")
		case <-tick.C:
		}
	}
}

// stopStreams ends every report stream (the server is shutting down: a stream would hold its
// drain until the hard deadline).
func (o *orcaService) stopStreams() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.stopped {
		o.stopped = true
		close(o.stop)
	}
}
