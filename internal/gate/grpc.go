package gate

import (
	"strconv"
	"strings"
)

// gRPC status codes the doors answer with themselves (a refusal's code is configured:
// grpc.statusCodes).
const (
	GRPCOK                = 0
	GRPCCanceled          = 1
	GRPCInvalidArgument   = 3
	GRPCDeadlineExceeded  = 4
	GRPCResourceExhausted = 8
	GRPCInternal          = 13
	GRPCUnavailable       = 14
)

// IsGRPC reports a gRPC content type: application/grpc or application/grpc+<codec>, with any
// parameters. gRPC-Web (application/grpc-web...) carries its trailers in the body over HTTP/1.1
// and is plain HTTP to every door.
func IsGRPC(contentType string) bool {
	ct, _, _ := strings.Cut(contentType, ";")
	ct = strings.TrimSpace(ct)
	if len(ct) < 16 || !strings.EqualFold(ct[:16], "application/grpc") {
		return false
	}
	return len(ct) == 16 || ct[16] == '+'
}

// IsEventStream reports an event stream (text/event-stream): a long-lived response whose
// duration is not a latency sample. (A gRPC call is a sample unless its route is streaming or it
// outlives grpc.streamAfter.)
func IsEventStream(contentType string) bool {
	ct, _, _ := strings.Cut(contentType, ";")
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

// GRPCStatus reads a grpc-status value; a missing or malformed one is INTERNAL (the upstream
// broke the protocol).
func GRPCStatus(v string) int {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 || n > 16 {
		return GRPCInternal
	}
	return n
}

// GRPCMessage is the grpc-message of a refused call, naming the reason (before the
// percent-encoding the wire needs).
func (r *Refusal) GRPCMessage() string { return "loadshed: " + string(r.Reason) }

// GRPCCode is the grpc-status a gRPC call gets for the client's mistake: INVALID_ARGUMENT for a
// malformed header, RESOURCE_EXHAUSTED for a body over the limit, DEADLINE_EXCEEDED for a body
// not sent in time (408).
func (e *ClientError) GRPCCode() int { return ClientGRPCCode(e.Status) }

// ClientGRPCCode maps the HTTP status of a client's mistake to the grpc-status a gRPC call gets.
func ClientGRPCCode(status int) int {
	switch status {
	case 408:
		return GRPCDeadlineExceeded
	case 413:
		return GRPCResourceExhausted
	}
	return GRPCInvalidArgument
}
