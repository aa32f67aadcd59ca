package backend

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/loadshed/loadshed/internal/backend/backendpb"
	"github.com/loadshed/loadshed/internal/slowtail"
)

// Limits on what a gRPC call may ask for.
const (
	// MaxReplyBytes is the largest WorkRequest.reply_bytes, well under the 4 MiB that gRPC
	// clients accept by default.
	MaxReplyBytes = 1 << 20
	// maxRecvMsg bounds a request message: a payload of MaxRequestBody and the other fields.
	maxRecvMsg = MaxRequestBody + 1<<10
)

// workService implements loadshed.backend.v1.Backend on a Server.
type workService struct {
	backendpb.UnimplementedBackendServer
	s *Server
}

// work is a validated WorkRequest.
type work struct {
	sleep    time.Duration
	hasSleep bool
	code     codes.Code
	reply    int
}

// fieldError names the WorkRequest field at fault.
type fieldError struct{ field, problem string }

func (e *fieldError) Error() string { return "WorkRequest." + e.field + ": " + e.problem }

// parseWork checks req's fields against their ranges.
func parseWork(req *backendpb.WorkRequest) (work, error) {
	w := work{code: codes.OK}
	if req.SleepMicros != nil {
		us := req.GetSleepMicros()
		if us < 0 || us > slowtail.MaxDuration.Microseconds() {
			return w, &fieldError{"sleep_micros", fmt.Sprintf("must be in [0, %d] (one hour), got %d", slowtail.MaxDuration.Microseconds(), us)}
		}
		w.sleep, w.hasSleep = time.Duration(us)*time.Microsecond, true
	}
	if c := req.GetCode(); c < 0 || c > int32(codes.Unauthenticated) {
		return w, &fieldError{"code", fmt.Sprintf("must be a gRPC status code in [0, %d], got %d", codes.Unauthenticated, c)}
	}
	w.code = codes.Code(req.GetCode())
	if n := req.GetReplyBytes(); n < 0 || n > MaxReplyBytes {
		return w, &fieldError{"reply_bytes", fmt.Sprintf("must be in [0, %d], got %d", MaxReplyBytes, n)}
	}
	w.reply = int(req.GetReplyBytes())
	if n := len(req.GetPayload()); n > MaxRequestBody {
		return w, &fieldError{"payload", fmt.Sprintf("must be at most %d bytes, got %d", MaxRequestBody, n)}
	}
	return w, nil
}

// Work takes a worker for one service time, like a request on the HTTP data port. Like that
// port it ignores the client going away (the call's context): the naive service finishes
// what it started. The trailers x-backend-wait and x-backend-service (Go durations) mirror the
// HTTP port's headers; the reply carries the same figures in microseconds.
func (g workService) Work(ctx context.Context, req *backendpb.WorkRequest) (*backendpb.WorkReply, error) {
	s := g.s
	w, err := parseWork(req)
	if err != nil {
		return nil, s.grpcStatus(codes.InvalidArgument, err.Error())
	}
	started, wait, ok := s.takeWorker()
	if !ok {
		return nil, s.grpcStatus(codes.Unavailable, "backend closed")
	}
	served := false
	defer func() { s.pool.release(served) }()
	service, ok := s.serve(started, w.sleep, w.hasSleep)
	if !ok {
		return nil, s.grpcStatus(codes.Unavailable, "backend closed")
	}
	// The trailers go out with the status whatever it is, and a failing call stays a
	// trailers-only response (no headers sent before the status), as grpc-go servers answer.
	_ = grpc.SetTrailer(ctx, metadata.Pairs("x-backend-wait", wait.String(), "x-backend-service", service.String()))
	served = true
	if w.code != codes.OK {
		return nil, s.grpcStatus(w.code, "backend: answered "+w.code.String()+" as asked")
	}
	s.countGRPC(codes.OK)
	return &backendpb.WorkReply{
		WaitMicros:    wait.Microseconds(),
		ServiceMicros: service.Microseconds(),
		Payload:       fill(w.reply),
	}, nil
}

// grpcStatus counts an answer of code and returns it as an error.
func (s *Server) grpcStatus(code codes.Code, msg string) error {
	s.countGRPC(code)
	return status.Error(code, msg)
}

func (s *Server) countGRPC(code codes.Code) {
	s.m.grpcCalls.WithLabelValues(grpcCodeLabel(code)).Inc()
}

// grpcCodeLabel is the grpc_code label value of a code: its name ("OK", "Unavailable").
func grpcCodeLabel(c codes.Code) string {
	if c <= codes.Unauthenticated {
		return c.String()
	}
	return strconv.Itoa(int(c))
}

// fill returns n bytes of the filler pattern.
func fill(n int) []byte {
	if n == 0 {
		return nil
	}
	b := make([]byte, n)
	for i := 0; i < n; {
		i += copy(b[i:], filler)
	}
	return b
}

// grpcServer is the gRPC port: Backend, the standard health service and server reflection
// (so grpcurl and ghz need no .proto), over cleartext HTTP/2 with prior knowledge (h2c).
type grpcServer struct {
	srv    *grpc.Server
	health *health.Server
}

// newGRPCServer builds the gRPC port's server. Its health service answers SERVING for ""
// and for loadshed.backend.v1.Backend until shutdown begins.
func (s *Server) newGRPCServer() *grpcServer {
	g := &grpcServer{
		srv:    grpc.NewServer(grpc.MaxRecvMsgSize(maxRecvMsg)),
		health: health.NewServer(),
	}
	backendpb.RegisterBackendServer(g.srv, workService{s: s})
	healthpb.RegisterHealthServer(g.srv, g.health)
	reflection.Register(g.srv)
	g.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	g.health.SetServingStatus(backendpb.Backend_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return g
}
