package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/loadshed/loadshed/internal/backend/backendpb"
)

// GRPC makes a run one of gRPC calls instead of HTTP requests: every request is a unary call of
// WorkMethod (the synthetic backend's loadshed.backend.v1.Backend/Work) on Config.Target, over
// cleartext HTTP/2 with prior knowledge (h2c), with grpc-go as the client, retries off.
//
// A call's deadline is its scheduled time plus Config.Timeout, sent as grpc-timeout. Its outcome
// is its final grpc-status: OK counts as success (goodput within the SLO); a refusal is a status
// of UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED or PERMISSION_DENIED that carries the
// x-loadshed-reason metadata (the proxy's gRPC answer to a shed call; see IsGRPCShed); any other
// status the server sent is an admitted call that failed (the upstream's own error, for example
// UNAVAILABLE without x-loadshed-reason). A call whose own deadline passed is a timeout; a call
// that got no gRPC answer at all (refused connection, a non-gRPC reply) is a transport error.
//
// Prepare may set Request.Header (sent as metadata, names lowercased) and Request.Tag; Method,
// Path and Body do not apply to gRPC calls and are build errors when set.
type GRPC struct {
	// Work is the request message of every call; nil sends an empty WorkRequest, which the
	// backend answers after a sampled service time. Run does not modify it.
	Work *backendpb.WorkRequest
	// Conns is how many HTTP/2 connections the calls are spread over, round robin. Zero means one
	// per GRPCStreamsPerConn of MaxInFlight, at least 1 and at most MaxGRPCConns.
	Conns int
}

const (
	// WorkMethod is the method every call of a gRPC run invokes.
	WorkMethod = backendpb.Backend_Work_FullMethodName
	// MaxGRPCConns caps GRPC.Conns.
	MaxGRPCConns = 64
	// GRPCStreamsPerConn is how many calls in flight GRPC.Conns plans for each connection: well
	// under the 100 to 250 concurrent streams HTTP/2 servers commonly allow per connection, so
	// calls do not wait inside the client for a stream (time the run would count as the
	// server's latency).
	GRPCStreamsPerConn = 100
	// ReasonMetadata is the metadata key that marks a gRPC refusal by loadshed.
	ReasonMetadata = "x-loadshed-reason"
	// PushbackMetadata is the trailer of a refusal that tells clients when to retry (gRFC A6).
	PushbackMetadata = "grpc-retry-pushback-ms"
)

// IsGRPCShed reports whether a gRPC answer with status code and (or without) the
// x-loadshed-reason metadata is a refusal: one of UNAVAILABLE, RESOURCE_EXHAUSTED,
// DEADLINE_EXCEEDED or PERMISSION_DENIED, with the metadata. The same codes without it are
// the upstream's own errors, never sheds.
func IsGRPCShed(code codes.Code, reason bool) bool {
	if !reason {
		return false
	}
	switch code {
	case codes.Unavailable, codes.ResourceExhausted, codes.DeadlineExceeded, codes.PermissionDenied:
		return true
	}
	return false
}

// ParsePushback parses a grpc-retry-pushback-ms value: a non-negative decimal int32 of
// milliseconds. ok is false for anything else (gRFC A6: a negative or unparsable value means
// "do not retry", which no refusal of loadshed says).
func ParsePushback(v string) (d time.Duration, ok bool) {
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 0 || v[0] < '0' || v[0] > '9' {
		return 0, false
	}
	return time.Duration(n) * time.Millisecond, true
}

// GRPCCodeName returns the canonical name of a gRPC status code ("UNAVAILABLE"), or its
// number for codes beyond the 17 defined ones.
func GRPCCodeName(c int) string {
	if c >= 0 && c < len(grpcCodeNames) {
		return grpcCodeNames[c]
	}
	return strconv.Itoa(c)
}

var grpcCodeNames = [...]string{
	"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
	"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
	"OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
}

// parseGRPCTarget returns the address a gRPC run dials. Target is "host:port" or
// "http://host[:port][/]" (port 80 by default); calls are cleartext (h2c), so https is refused.
func parseGRPCTarget(target string) (string, error) {
	if target == "" {
		return "", errors.New("Target: required")
	}
	hostport := target
	if strings.Contains(target, "://") {
		u, err := url.Parse(target)
		if err != nil {
			return "", fmt.Errorf("Target: %w", err)
		}
		if u.Scheme != "http" {
			return "", fmt.Errorf("Target: a gRPC run speaks cleartext HTTP/2 (h2c): want host:port or http://host:port, got scheme %q", u.Scheme)
		}
		if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			return "", fmt.Errorf("Target: want http://host:port with no user, path or query (the method is %s), got %q", WorkMethod, target)
		}
		hostport = u.Host
		if u.Port() == "" && !strings.HasSuffix(hostport, ":") {
			hostport = net.JoinHostPort(u.Hostname(), "80")
		}
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", fmt.Errorf("Target: want host:port or http://host:port, got %q (%v)", target, err)
	}
	if host == "" || strings.ContainsAny(host, " /?#@%") {
		return "", fmt.Errorf("Target: no valid host in %q", target)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("Target: port must be in [1, 65535], got %q", port)
	}
	return net.JoinHostPort(host, port), nil
}

// checkGRPCRequest says why req cannot be a gRPC call, or nil.
func checkGRPCRequest(req Request) error {
	switch {
	case req.Method != "":
		return fmt.Errorf("Request.Method: not used by gRPC calls (every call is %s), got %q", WorkMethod, req.Method)
	case req.Path != "":
		return fmt.Errorf("Request.Path: not used by gRPC calls (every call is %s), got %q", WorkMethod, req.Path)
	case len(req.Body) > 0:
		return errors.New("Request.Body: not used by gRPC calls (GRPC.Work is the request message)")
	}
	for name, values := range req.Header {
		key := strings.ToLower(name)
		if !validMetadataKey(key) {
			return fmt.Errorf("Request.Header: %q is not a valid gRPC metadata name (lowercase letters, digits, '-', '_', '.'; not grpc-*)", name)
		}
		if strings.HasSuffix(key, "-bin") {
			continue // binary values are base64-encoded on the wire
		}
		for _, v := range values {
			for i := 0; i < len(v); i++ {
				if v[i] < 0x20 || v[i] > 0x7e {
					return fmt.Errorf("Request.Header: %s: value %q holds a byte gRPC metadata cannot carry", name, v)
				}
			}
		}
	}
	return nil
}

// validMetadataKey reports whether key (lowercased) may be sent as custom gRPC metadata.
func validMetadataKey(key string) bool {
	if key == "" || strings.HasPrefix(key, "grpc-") {
		return false
	}
	switch key {
	case "content-type", "te", "user-agent", "host", "connection":
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// toMetadata converts a checked header to outgoing metadata.
func toMetadata(h http.Header) metadata.MD {
	if len(h) == 0 {
		return nil
	}
	md := make(metadata.MD, len(h))
	for name, values := range h {
		key := strings.ToLower(name)
		md[key] = append(md[key], values...)
	}
	return md
}

// grpcCaller sends the calls of a gRPC run.
type grpcCaller struct {
	conns []*grpc.ClientConn
	next  atomic.Uint32
	work  *backendpb.WorkRequest
}

// grpcConns is how many connections a run with maxInFlight calls in flight uses.
func grpcConns(c GRPC, maxInFlight int) int {
	if c.Conns > 0 {
		return c.Conns
	}
	n := int(math.Ceil(float64(maxInFlight) / GRPCStreamsPerConn))
	return max(1, min(n, MaxGRPCConns))
}

// newGRPCCaller opens the run's connections and waits, up to timeout, until they are ready, so
// that connecting does not count against the first calls. A target that cannot be reached is
// not an error here: its calls fail and are counted as transport errors.
func newGRPCCaller(ctx context.Context, addr string, c GRPC, maxInFlight int, timeout time.Duration) (*grpcCaller, error) {
	gc := &grpcCaller{work: c.Work}
	if gc.work == nil {
		gc.work = &backendpb.WorkRequest{}
	}
	for range grpcConns(c, maxInFlight) {
		conn, err := grpc.NewClient("passthrough:///"+addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDisableRetry(), // one attempt per call: the run measures, it does not retry
			grpc.WithNoProxy(),      // measure the target, not whatever a proxy variable points at
			grpc.WithUserAgent("loadshed-loadgen"),
		)
		if err != nil {
			gc.close()
			return nil, fmt.Errorf("Target: %w", err)
		}
		gc.conns = append(gc.conns, conn)
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, conn := range gc.conns {
		conn.Connect()
		for s := conn.GetState(); s != connectivity.Ready && s != connectivity.TransientFailure; s = conn.GetState() {
			if !conn.WaitForStateChange(wctx, s) {
				break
			}
		}
	}
	return gc, nil
}

func (gc *grpcCaller) close() {
	for _, c := range gc.conns {
		c.Close()
	}
}

// send performs one call and records it in its sample.
func (gc *grpcCaller) send(runCtx context.Context, g *generator, j job) {
	s := j.s
	deadline := j.due.Add(g.c.Timeout)
	ctx, cancel := context.WithDeadline(runCtx, deadline)
	defer cancel()
	if md := toMetadata(j.req.Header); md != nil {
		ctx = metadata.NewOutgoingContext(ctx, md)
	}
	conn := gc.conns[int(gc.next.Add(1))%len(gc.conns)]
	var header, trailer metadata.MD
	sent := time.Now()
	s.lateness = sent.Sub(j.due)
	err := conn.Invoke(ctx, WorkMethod, gc.work, new(backendpb.WorkReply), grpc.Header(&header), grpc.Trailer(&trailer))
	end := time.Now()
	code := status.Code(err)
	reason := len(trailer.Get(ReasonMetadata)) > 0 || len(header.Get(ReasonMetadata)) > 0
	// The server answered when it sent headers, or trailers: a trailers-only answer holds at
	// least its content-type. A failed connection or a non-gRPC reply leaves both empty.
	answered := err == nil || header != nil || len(trailer) > 0
	switch {
	case err == nil, IsGRPCShed(code, reason):
		// an answer: success or refusal
	case runCtx.Err() != nil:
		s.outcome = outcomeCanceled
		return
	case ctx.Err() != nil || !end.Before(deadline):
		// The call's own deadline passed: grpc-go's DEADLINE_EXCEEDED, or an answer too late
		// (on a busy machine the context's timer may fire after the answer came).
		s.outcome = outcomeTimeout
		return
	case !answered:
		s.outcome = outcomeError
		g.noteError(err)
		return
	}
	s.outcome = outcomeAnswered
	s.code = int32(code)
	s.latency = end.Sub(j.due)
	s.reason = reason
	// A trailers-only answer has no headers; grpc-go then leaves header nil.
	s.trailersOnly = header == nil
	if v := trailer.Get(PushbackMetadata); len(v) > 0 {
		_, s.retryAfter = ParsePushback(v[0])
	}
}
