package gate

import (
	"testing"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

func TestIsGRPC(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/grpc": true, "application/grpc+proto": true, "Application/GRPC; charset=utf-8": true,
		"application/grpc-web": false, "application/grpc-web+proto": false, "application/grpcx": false,
		"application/json": false, "": false,
	} {
		if got := IsGRPC(ct); got != want {
			t.Errorf("%q: %v, want %v", ct, got, want)
		}
	}
}

func TestGRPCStatus(t *testing.T) {
	for v, want := range map[string]int{"0": 0, " 14 ": 14, "16": 16, "17": GRPCInternal, "-1": GRPCInternal, "": GRPCInternal, "x": GRPCInternal} {
		if got := GRPCStatus(v); got != want {
			t.Errorf("%q: %d, want %d", v, got, want)
		}
	}
}

// TestRefusalHeaders: every door sends the reason and the retry hint in the same headers: the
// whole-second Retry-After to HTTP, the millisecond pushback to gRPC, neither for a 403.
func TestRefusalHeaders(t *testing.T) {
	r := &Refusal{Reason: admission.ReasonQueueFull, Status: 503, RetryAfter: 1200 * time.Millisecond, GRPCCode: 14}
	get := func(fs []Field, name string) string {
		for _, f := range fs {
			if f.Name == name {
				return f.Value
			}
		}
		return ""
	}
	h := r.Headers(false)
	if get(h, "Retry-After") != "2" || get(h, "X-Loadshed-Reason") != "queue_full" || get(h, "Grpc-Retry-Pushback-Ms") != "" {
		t.Errorf("HTTP refusal headers %v", h)
	}
	g := r.Headers(true)
	if get(g, "Grpc-Retry-Pushback-Ms") != "1200" || get(g, "X-Loadshed-Reason") != "queue_full" || get(g, "Retry-After") != "" {
		t.Errorf("gRPC refusal headers %v", g)
	}
	if r.GRPCMessage() != "loadshed: queue_full" {
		t.Errorf("grpc-message %q", r.GRPCMessage())
	}
	denied := &Refusal{Reason: admission.ReasonDenied, Status: 403, GRPCCode: 7}
	if get(denied.Headers(false), "Retry-After") != "" || get(denied.Headers(true), "Grpc-Retry-Pushback-Ms") != "" {
		t.Errorf("a 403 asks for no retry: %v %v", denied.Headers(false), denied.Headers(true))
	}
}
