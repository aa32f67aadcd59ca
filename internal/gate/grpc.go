package gate

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
)

// gRPC status codes the doors answer with themselves (a refusal's code is configured:
// grpc.statusCodes).
const (
	GRPCOK                = 0
	GRPCCanceled          = 1
	GRPCUnknown           = 2
	GRPCInvalidArgument   = 3
	GRPCDeadlineExceeded  = 4
	GRPCPermissionDenied  = 7
	GRPCResourceExhausted = 8
	GRPCInternal          = 13
	GRPCUnavailable       = 14
	GRPCDataLoss          = 15
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

// callOutcome classifies a gRPC call's final status, for every door: the outcome it is counted
// as, and whether it is a sign of the upstream's overload, the only kind of failure that may
// shrink a limit. message is the call's grpc-message (as sent; it may be percent-encoded).
//
//   - OK is a success (its duration is the latency sample); CANCELLED is the client leaving.
//   - UNAVAILABLE and DEADLINE_EXCEEDED are the upstream's overload: it could not serve, or not
//     within the deadline (the backend's own, or the client's, forwarded in grpc-timeout; a
//     client deadline shorter than the route's typical latency is refused at admission).
//   - RESOURCE_EXHAUSTED is overload unless the client caused it: gRPC servers answer it to a
//     message over their receive limit, and say so in grpc-message (grpc-go and gRPC core:
//     "received message larger than max", grpc-java: "message exceeds maximum size"). Such a call
//     is the client's error; any other RESOURCE_EXHAUSTED (a full queue, a server-side quota)
//     is the upstream's.
//   - INTERNAL, UNKNOWN and DATA_LOSS are the upstream's failures, but not overload: they are
//     what a server answers to a message it cannot parse (a client can send any number of those
//     at no cost), or a bug. They are counted as upstream errors and teach the strategy nothing.
//   - Every other code (INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, UNIMPLEMENTED, ...) is
//     the client's error, as a 4xx is.
func callOutcome(code int, message string) (outcome Outcome, overload bool) {
	switch code {
	case GRPCOK:
		return OutcomeSuccess, false
	case GRPCCanceled:
		return OutcomeCanceled, false
	case GRPCDeadlineExceeded:
		return OutcomeUpstreamTimeout, true
	case GRPCUnavailable:
		return OutcomeUpstreamError, true
	case GRPCResourceExhausted:
		if overSizeLimit(message) {
			return OutcomeClientError, false
		}
		return OutcomeUpstreamError, true
	case GRPCInternal, GRPCUnknown, GRPCDataLoss:
		return OutcomeUpstreamError, false
	}
	return OutcomeClientError, false
}

// overSizeLimit reports a grpc-message that says a received message was over a size limit: how
// gRPC servers word RESOURCE_EXHAUSTED for a message larger than they accept.
func overSizeLimit(message string) bool {
	m := strings.ToLower(message)
	return strings.Contains(m, "larger than max") || strings.Contains(m, "exceeds maximum size")
}

// MalformedCall is a gRPC call whose client broke the framing of its own request messages, as
// a door that reads them can tell (GRPCFraming): a message cut short by the end of the request
// stream, a declared length above grpc.maxMessageBytes, a compressed message without a
// grpc-encoding, an unknown flag. It is the client's error whatever the upstream answers: a door
// reports it with BodyFailed, and the call is counted as a client error and never shrinks a
// limit. The door answers the client with Code, a trailers-only grpc-status.
type MalformedCall struct {
	// Code is the grpc-status the client gets: INTERNAL for broken framing and RESOURCE_EXHAUSTED
	// for a message over the cap, what a grpc-go server itself answers to each.
	Code int
	// Status is the HTTP status the call is counted with: 413 for a message over the cap, 400
	// for the rest.
	Status int
	msg    string
}

func (e *MalformedCall) Error() string { return e.msg }

// GRPCFraming follows the length-prefixed messages of a gRPC request stream as it is forwarded
// (each message: a one-byte compressed flag, a four-byte big-endian length, the message) and
// reports the first violation as a *MalformedCall. It only counts bytes: it never decodes a
// message. The zero value accepts any length and no compressed message.
type GRPCFraming struct {
	// MaxMessage is the largest declared message length accepted (grpc.maxMessageBytes); 0: no cap.
	MaxMessage int64
	// Compressed says the call names a grpc-encoding other than identity: messages may be
	// compressed.
	Compressed bool

	prefix   [5]byte
	inPrefix int   // bytes of the current prefix seen
	left     int64 // bytes of the current message still to come
	declared int64 // the current message's declared length
}

// NewGRPCFraming follows a call whose grpc-encoding header is encoding, accepting messages of
// at most max bytes (0: no cap).
func NewGRPCFraming(encoding string, max int64) GRPCFraming {
	encoding = strings.TrimSpace(encoding)
	return GRPCFraming{MaxMessage: max, Compressed: encoding != "" && !strings.EqualFold(encoding, "identity")}
}

// Check follows the next bytes of the stream; it returns the first violation, and the same one
// on every later call.
func (f *GRPCFraming) Check(p []byte) error {
	for len(p) > 0 {
		if f.left > 0 {
			n := min(int64(len(p)), f.left)
			f.left -= n
			p = p[n:]
			continue
		}
		if f.inPrefix < 0 {
			return f.violation()
		}
		n := copy(f.prefix[f.inPrefix:], p)
		f.inPrefix += n
		p = p[n:]
		if f.inPrefix < len(f.prefix) {
			return nil
		}
		f.inPrefix = 0
		f.declared = int64(binary.BigEndian.Uint32(f.prefix[1:]))
		if f.prefix[0] > 1 || f.prefix[0] == 1 && !f.Compressed || f.MaxMessage > 0 && f.declared > f.MaxMessage {
			f.inPrefix = -1 // broken: every later call reports it again
			return f.violation()
		}
		f.left = f.declared
	}
	return nil
}

// End says the request stream ended; it returns a violation if a message was cut short.
func (f *GRPCFraming) End() error {
	switch {
	case f.inPrefix < 0:
		return f.violation()
	case f.inPrefix > 0:
		return &MalformedCall{Code: GRPCInternal, Status: 400,
			msg: fmt.Sprintf("grpc: request stream ended %d bytes into a 5-byte message prefix", f.inPrefix)}
	case f.left > 0:
		return &MalformedCall{Code: GRPCInternal, Status: 400,
			msg: fmt.Sprintf("grpc: message cut short: its prefix declared %d bytes, the request stream ended after %d", f.declared, f.declared-f.left)}
	}
	return nil
}

// violation describes the prefix that broke the framing.
func (f *GRPCFraming) violation() error {
	switch flag := f.prefix[0]; {
	case flag > 1:
		return &MalformedCall{Code: GRPCInternal, Status: 400, msg: fmt.Sprintf("grpc: message with unknown flag %d", flag)}
	case flag == 1 && !f.Compressed:
		return &MalformedCall{Code: GRPCInternal, Status: 400, msg: "grpc: compressed message without grpc-encoding"}
	}
	return &MalformedCall{Code: GRPCResourceExhausted, Status: 413,
		msg: fmt.Sprintf("grpc: message of %d bytes is larger than max (grpc.maxMessageBytes %d)", f.declared, f.MaxMessage)}
}
