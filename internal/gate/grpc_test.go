package gate

import (
	"errors"
	"strconv"
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

// grpcCall is a gRPC call's request as the gRPC door hands it to the gate.
func grpcCall() *Request {
	return &Request{Door: DoorGRPC, Method: "POST", Path: "/t.S/M", Header: headers{}, ContentLength: -1, GRPC: true}
}

// TestCallEndedClassification: every grpc-status a call can end with, as every door reports it
// (CallEnded): only what says the upstream is overloaded (UNAVAILABLE, DEADLINE_EXCEEDED, a
// RESOURCE_EXHAUSTED the client did not cause) teaches the strategy Dropped; INTERNAL, UNKNOWN
// and DATA_LOSS are upstream errors that teach it nothing; the client's own errors are its own.
func TestCallEndedClassification(t *testing.T) {
	const tooBig = "grpc: received message larger than max (104857600 vs. 4194304)"
	for _, c := range []struct {
		code    int
		message string
		learns  admission.Outcome
		outcome string
	}{
		{0, "", admission.Success, "success"},
		{1, "context canceled", admission.Ignore, "canceled"},
		{2, "panic in handler", admission.Ignore, "upstream_error"},
		{3, "", admission.Ignore, "client_error"},
		{4, "", admission.Dropped, "upstream_timeout"},
		{5, "", admission.Ignore, "client_error"},
		{7, "", admission.Ignore, "client_error"},
		{8, "queue full", admission.Dropped, "upstream_error"},
		{8, "", admission.Dropped, "upstream_error"},
		{8, tooBig, admission.Ignore, "client_error"},
		{8, "grpc: received message after decompression larger than max 4194304", admission.Ignore, "client_error"},
		{8, "gRPC message exceeds maximum size 4194304: 5000000", admission.Ignore, "client_error"},
		{12, "unknown method", admission.Ignore, "client_error"},
		{13, "grpc: failed to unmarshal the received message: unexpected EOF", admission.Ignore, "upstream_error"},
		{13, "", admission.Ignore, "upstream_error"},
		{14, "", admission.Dropped, "upstream_error"},
		{15, "", admission.Ignore, "upstream_error"},
		{16, "", admission.Ignore, "client_error"},
	} {
		g, clk, reg := newGate(t, "admission: {strategy: inflight, inflight: {limit: 2}}\n")
		p := admit(t, g, grpcCall())
		p.Forward(t0)
		clk.Advance(10 * time.Millisecond)
		p.Answered(Answer{Status: 200, At: clk.Now()})
		p.CallEnded(strconv.Itoa(c.code), c.message, clk.Now())
		if got := p.classify(); got != c.learns {
			t.Errorf("grpc-status %d %q: the strategy learns %v, want %v", c.code, c.message, got, c.learns)
		}
		if st := g.Policies()[0].Stats(); st.InFlight != 0 {
			t.Errorf("grpc-status %d: in flight %d after the call ended", c.code, st.InFlight)
		}
		p.Finish()
		if n := requests(reg, "door", "grpc", "outcome", c.outcome); n != 1 {
			t.Errorf("grpc-status %d %q: requests{outcome=%s} = %v, want 1", c.code, c.message, c.outcome, n)
		}
	}
}

// TestMalformedCallIsTheClients: a call whose client broke its own framing (BodyFailed with a
// *MalformedCall) is the client's error whatever it ended with, and teaches the strategy
// nothing: neither the upstream's INTERNAL nor a door's upstream error after a reset stream.
func TestMalformedCallIsTheClients(t *testing.T) {
	f := NewGRPCFraming("", 0)
	f.Check([]byte{0, 0, 0, 0, 100, 1, 2, 3})
	bad := f.End()
	for name, end := range map[string]func(p *Pass){
		"upstream INTERNAL":    func(p *Pass) { p.CallEnded("13", "unexpected EOF", t0) },
		"upstream UNAVAILABLE": func(p *Pass) { p.CallEnded("14", "", t0) },
		"stream reset":         func(p *Pass) { p.Failed(OutcomeUpstreamError, 502) },
	} {
		g, _, reg := newGate(t, "admission: {strategy: inflight, inflight: {limit: 2}}\n")
		p := admit(t, g, grpcCall())
		p.Forward(t0)
		p.BodyFailed(bad)
		end(p)
		if got := p.classify(); got != admission.Ignore {
			t.Errorf("%s: the strategy learns %v, want Ignore", name, got)
		}
		p.Finish()
		if n := requests(reg, "door", "grpc", "outcome", "client_error"); n != 1 {
			t.Errorf("%s: requests{outcome=client_error} = %v, want 1", name, n)
		}
	}
}

// TestGRPCFraming: the framing of a request stream, fed whole and one byte at a time: whole
// messages (also several, and empty ones) pass; a message cut short, a compressed flag without
// grpc-encoding, an unknown flag and a declared length over the cap are the client's error,
// with the grpc-status a grpc-go server would answer.
func TestGRPCFraming(t *testing.T) {
	msg := func(flag byte, declared uint32, body int) []byte {
		return append([]byte{flag, byte(declared >> 24), byte(declared >> 16), byte(declared >> 8), byte(declared)}, make([]byte, body)...)
	}
	cat := func(parts ...[]byte) []byte {
		var out []byte
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	for _, c := range []struct {
		name     string
		encoding string
		max      int64
		stream   []byte
		code     int // 0: well-formed
	}{
		{"empty stream", "", 0, nil, 0},
		{"one message", "", 1024, msg(0, 100, 100), 0},
		{"messages and an empty one", "", 1024, cat(msg(0, 3, 3), msg(0, 0, 0), msg(0, 1024, 1024)), 0},
		{"compressed with grpc-encoding", "gzip", 0, msg(1, 10, 10), 0},
		{"cut short", "", 0, msg(0, 100, 3), GRPCInternal},
		{"cut short in the prefix", "", 0, msg(0, 100, 0)[:3], GRPCInternal},
		{"second message cut short", "", 0, cat(msg(0, 2, 2), msg(0, 5, 4)), GRPCInternal},
		{"compressed without grpc-encoding", "", 0, msg(1, 3, 3), GRPCInternal},
		{"compressed with identity", "identity", 0, msg(1, 3, 3), GRPCInternal},
		{"unknown flag", "gzip", 0, msg(2, 3, 3), GRPCInternal},
		{"4 GiB declared", "", 4 << 20, msg(0, 0xffffffff, 3), GRPCResourceExhausted},
		{"one byte over the cap", "", 1024, cat(msg(0, 1, 1), msg(0, 1025, 1025)), GRPCResourceExhausted},
		{"no cap: 4 GiB declared, then cut short", "", 0, msg(0, 0xffffffff, 0), GRPCInternal},
	} {
		for _, split := range []int{0, 1} {
			f := NewGRPCFraming(c.encoding, c.max)
			var err error
			if split == 0 {
				err = f.Check(c.stream)
			} else {
				for i := 0; i < len(c.stream) && err == nil; i++ {
					err = f.Check(c.stream[i : i+1])
				}
			}
			if err == nil {
				err = f.End()
			}
			var bad *MalformedCall
			switch {
			case c.code == 0 && err != nil:
				t.Errorf("%s (split %d): %v, want well-formed", c.name, split, err)
			case c.code != 0 && !errors.As(err, &bad):
				t.Errorf("%s (split %d): %v, want a *MalformedCall", c.name, split, err)
			case c.code != 0 && bad.Code != c.code:
				t.Errorf("%s (split %d): grpc-status %d (%v), want %d", c.name, split, bad.Code, err, c.code)
			}
		}
	}
}

// TestGRPCFramingStaysBroken: after a bad prefix, the stream stays broken: more bytes, or its
// end, report the same violation (a door never forwards the rest of it).
func TestGRPCFramingStaysBroken(t *testing.T) {
	f := NewGRPCFraming("", 16)
	first := f.Check([]byte{0, 0, 0, 1, 0})
	if first == nil {
		t.Fatal("a 256-byte message under a 16-byte cap accepted")
	}
	if err := f.Check([]byte{0, 0, 0, 0, 0}); err == nil || err.Error() != first.Error() {
		t.Errorf("after the violation, Check says %v, want %v", err, first)
	}
	if err := f.End(); err == nil || err.Error() != first.Error() {
		t.Errorf("after the violation, End says %v, want %v", err, first)
	}
}

// TestTheGateWatchesExchanges: the gate, not the door, decides when a gRPC call still open is a
// stream (grpc.streamAfter: the permit goes back without a sample, and the call is no overload
// signal however it ends) and when the permit of an exchange nobody answers for goes back behind
// a door that cannot bound the upstream (Request.UnboundedUpstream: at upstreamTimeout, as an
// overload signal). Both run on the gate's clock from Forward, and Finish stops them.
func TestTheGateWatchesExchanges(t *testing.T) {
	t.Run("a call open past streamAfter", func(t *testing.T) {
		g, clk, reg := newGate(t, "admission: {strategy: inflight, inflight: {limit: 2}}\ngrpc: {streamAfter: 5s}\n")
		p := admit(t, g, grpcCall())
		p.Forward(clk.Now())
		if next, _ := p.Answered(Answer{Status: 200, ContentType: "application/grpc", At: clk.Now()}); next != NextTrailers {
			t.Fatalf("a call without a status in its headers: next %v, want NextTrailers", next)
		}
		clk.Advance(4 * time.Second)
		if st := g.Policies()[0].Stats(); st.InFlight != 1 {
			t.Fatalf("in flight %d before streamAfter, want 1", st.InFlight)
		}
		clk.Advance(2 * time.Second)
		if st := g.Policies()[0].Stats(); st.InFlight != 0 {
			t.Fatalf("in flight %d after streamAfter, want the permit back", st.InFlight)
		}
		p.CallEnded("14", "", clk.Now())
		if got := p.classify(); got != admission.Ignore {
			t.Errorf("a stream's end teaches %v, want Ignore", got)
		}
		p.Finish()
		if n := requests(reg, "door", "grpc", "outcome", "upstream_error"); n != 1 {
			t.Errorf("requests{upstream_error} = %v, want 1 (the outcome is still counted)", n)
		}
	})
	t.Run("a call that ends in time", func(t *testing.T) {
		g, clk, _ := newGate(t, "admission: {strategy: inflight, inflight: {limit: 2}}\ngrpc: {streamAfter: 5s}\n")
		p := admit(t, g, grpcCall())
		p.Forward(clk.Now())
		clk.Advance(time.Second)
		p.CallEnded("0", "", clk.Now())
		p.Finish()
		clk.Advance(time.Minute) // the watch was stopped: nothing fires on a finished exchange
		if got := p.classify(); got != admission.Success {
			t.Errorf("a call that ended before streamAfter teaches %v, want Success", got)
		}
	})
	t.Run("an unbounded upstream", func(t *testing.T) {
		g, clk, _ := newGate(t, "upstreamTimeout: 3s\nadmission: {strategy: inflight, inflight: {limit: 2}}\n")
		r := request(nil)
		r.Door, r.UnboundedUpstream = DoorExtProc, true
		p := admit(t, g, r)
		p.Forward(clk.Now())
		clk.Advance(2999 * time.Millisecond)
		if st := g.Policies()[0].Stats(); st.InFlight != 1 {
			t.Fatalf("in flight %d before upstreamTimeout, want 1", st.InFlight)
		}
		clk.Advance(time.Millisecond)
		if st := g.Policies()[0].Stats(); st.InFlight != 0 {
			t.Fatalf("in flight %d at upstreamTimeout, want the permit back", st.InFlight)
		}
		p.Finish()
	})
	t.Run("a door that bounds the upstream itself", func(t *testing.T) {
		g, clk, _ := newGate(t, "upstreamTimeout: 3s\nadmission: {strategy: inflight, inflight: {limit: 2}}\n")
		p := admit(t, g, request(nil))
		p.Forward(clk.Now())
		clk.Advance(time.Hour)
		if st := g.Policies()[0].Stats(); st.InFlight != 1 {
			t.Errorf("in flight %d: the HTTP door's transport times the upstream out, the gate must not", st.InFlight)
		}
		p.Finish()
	})
}
