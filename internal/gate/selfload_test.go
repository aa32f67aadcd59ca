package gate

import (
	"context"
	"testing"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

// fakeSelf is a sidecar load a test sets.
type fakeSelf struct {
	delay time.Duration
	shed  float64
}

func (f *fakeSelf) Delay() time.Duration { return f.delay }
func (f *fakeSelf) Shed() float64        { return f.shed }

// TestSidecarOverloadRefusesAtTheDoor: while the sidecar sheds, requests are refused before the
// strategy with 503, reason sidecar_overload and a Retry-After; critical_plus requests (from a
// trusted source) still pass; a share of 0 refuses nothing.
func TestSidecarOverloadRefusesAtTheDoor(t *testing.T) {
	self := &fakeSelf{shed: 1}
	g, _, reg := newGateWithSelf(t, "trust: {sources: [192.0.2.0/24]}\nadmission: {strategy: inflight, inflight: {limit: 100}}\n", self)
	for range 5 {
		_, err := g.Admit(context.Background(), request(nil), nil)
		rej := refusal(t, err)
		if rej.Reason != admission.ReasonSidecarOverload || rej.Status != 503 || rej.RetryAfterHeader() != "1" {
			t.Fatalf("refusal %+v (Retry-After %q), want 503 sidecar_overload with Retry-After 1", rej, rej.RetryAfterHeader())
		}
	}
	admit(t, g, request(headers{"X-Loadshed-Priority": "critical_plus"})).Finish()
	if got := shed(reg, "reason", "sidecar_overload"); got != 5 {
		t.Fatalf("shed_total{reason=sidecar_overload} = %v, want 5", got)
	}
	self.shed = 0
	admit(t, g, request(nil)).Finish()
}

// TestSidecarDelayIsTakenOffTheLatencySample: the adaptive limit learns the upstream's latency
// (forwarding to response headers) less the sidecar's own delay, never below the shortest
// meaningful latency.
func TestSidecarDelayIsTakenOffTheLatencySample(t *testing.T) {
	for _, c := range []struct {
		name       string
		self, want time.Duration
	}{
		{"no delay", 0, 10 * time.Millisecond},
		{"8ms of it is the sidecar's", 8 * time.Millisecond, 2 * time.Millisecond},
		{"all of it is the sidecar's", 30 * time.Millisecond, 100 * time.Microsecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, clk, _ := newGateWithSelf(t, "admission: {strategy: adaptive, adaptive: {initialLimit: 50, maxLimit: 50}}\n", &fakeSelf{delay: c.self})
			// Two windows of 10 samples (the adaptive window: 100 ms and 10 outcomes).
			for range 2 {
				for range 10 {
					p := admit(t, g, request(nil))
					p.Forward(clk.Now().Add(time.Millisecond))
					p.Answered(Answer{Status: 200, At: clk.Now().Add(11 * time.Millisecond)})
					p.Finish()
				}
				clk.Advance(150 * time.Millisecond)
			}
			if got := g.Policies()[0].Stats().SampleRTT; got != c.want {
				t.Fatalf("sampled %v, want %v", got, c.want)
			}
		})
	}
}
