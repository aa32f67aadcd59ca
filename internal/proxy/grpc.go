package proxy

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

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

// endCall ends a gRPC call with the grpc-status and grpc-message of h: the trailers, or the
// headers of a trailers-only answer.
func endCall(pass *gate.Pass, h http.Header, at time.Time) {
	pass.CallEnded(gate.GRPCStatus(h.Get("Grpc-Status")), h.Get("Grpc-Message"), at)
}

// grpcBody watches a gRPC response body: when it ends, the call's final grpc-status is in the
// trailers, and the call ends there (its permit goes back, its outcome is that status).
type grpcBody struct {
	io.ReadCloser
	res   *http.Response
	pass  *gate.Pass
	ended bool
}

func (b *grpcBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.ended {
		b.ended = true
		endCall(b.pass, b.res.Trailer, time.Now())
	}
	return n, err
}
