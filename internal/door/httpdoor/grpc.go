package httpdoor

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/loadshed/loadshed/internal/gate"
)

// writeGRPCStatus answers a gRPC call with a trailers-only response: HTTP 200, content-type
// application/grpc, grpc-status and a percent-encoded grpc-message in one HEADERS frame that
// ends the stream, and no content-length. pushback, when set, is grpc-retry-pushback-ms.
func writeGRPCStatus(w http.ResponseWriter, code int, msg, pushback, reason string) {
	h := w.Header()
	h.Set("Content-Type", "application/grpc")
	h.Set("Grpc-Status", strconv.Itoa(code))
	if msg != "" {
		h.Set("Grpc-Message", encodeGRPCMessage(msg))
	}
	if pushback != "" {
		h.Set("Grpc-Retry-Pushback-Ms", pushback)
	}
	if reason != "" {
		h.Set("X-Loadshed-Reason", reason)
	}
	h["Content-Length"] = nil // net/http would add "0"; a trailers-only response has none
	w.WriteHeader(http.StatusOK)
}

// encodeGRPCMessage percent-encodes a grpc-message value: every byte outside printable ASCII
// (0x20-0x7E), and '%' itself, becomes %XX, as the gRPC over HTTP/2 specification asks.
func encodeGRPCMessage(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '%' {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '%' {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// grpcBody watches a gRPC response body: when it ends, the call's final grpc-status is in the
// trailers, and the call ends there (its permit goes back, its outcome is that status).
type grpcBody struct {
	io.ReadCloser
	res   *http.Response
	x     *exchange
	ended bool
}

func (b *grpcBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.ended {
		b.ended = true
		b.x.pass.CallEnded(b.res.Trailer.Get("Grpc-Status"), b.res.Trailer.Get("Grpc-Message"), b.x.d.clock.Now())
	}
	return n, err
}

// grpcRequestBody follows the framing of a gRPC call's request messages as they are forwarded
// (gate.GRPCFraming): a prefix its client got wrong (a declared length over grpc.maxMessageBytes,
// a compressed message without grpc-encoding) is never passed on, and a stream that ends
// half-way through a message does not end cleanly upstream (where a server would answer
// INTERNAL, taken for the upstream's failure). The read fails with the *gate.MalformedCall
// instead: idleBody reports it on the pass, the transport resets the upstream stream, and
// answerMalformed answers the client.
type grpcRequestBody struct {
	io.ReadCloser
	framing gate.GRPCFraming
	err     error
}

// newGRPCRequestBody follows the request body of r, a gRPC call, with messages of at most max
// bytes (0: no cap).
func newGRPCRequestBody(r *http.Request, max int64) *grpcRequestBody {
	return &grpcRequestBody{ReadCloser: r.Body, framing: gate.NewGRPCFraming(r.Header.Get("Grpc-Encoding"), max)}
}

func (b *grpcRequestBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.ReadCloser.Read(p)
	bad := b.framing.Check(p[:n])
	if bad == nil && err == io.EOF {
		bad = b.framing.End()
	}
	if bad != nil {
		b.err = bad
		return 0, bad // (what came with it is not forwarded: the call is broken)
	}
	return n, err
}

// answerMalformed answers a gRPC call whose client broke its framing (bodyErr is a
// *gate.MalformedCall) as a gRPC server would: a trailers-only INTERNAL, or RESOURCE_EXHAUSTED
// for a message over the cap; counted as the client's error (fail), never the upstream's. It
// reports whether bodyErr was one.
func answerMalformed(w http.ResponseWriter, bodyErr error, pass *gate.Pass) bool {
	var bad *gate.MalformedCall
	if !errors.As(bodyErr, &bad) {
		return false
	}
	pass.Failed(gate.OutcomeClientError, bad.Status)
	writeGRPCStatus(w, bad.Code, bad.Error(), "", "")
	return true
}
