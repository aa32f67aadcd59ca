package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

// ExtProc serves Envoy's external processing protocol (ext_proc): an Envoy in the pod (Istio's
// sidecar, Envoy Gateway, a hand-run Envoy) asks the sidecar to admit each request, with the same
// routes, strategies and metrics as the HTTP data port. The two timeouts mirror what the Envoy
// filter says, because Envoy stops waiting for an answer at its message_timeout: every request
// that waits in a queue is answered (admitted, or refused with 503 and Retry-After) before then.
type ExtProc struct {
	// Listen is the gRPC address Envoy's ext_proc filter calls, e.g. "127.0.0.1:9002"; empty:
	// no ext_proc server. With it, the data port (listen) may be empty: ext_proc only.
	Listen string `yaml:"listen"`
	// MessageTimeout is the filter's message_timeout (Envoy's default 200 ms): how long Envoy
	// waits for the answer to one message before it answers 504 itself, or, with
	// failure_mode_allow, lets the request through unadmitted.
	MessageTimeout Duration `yaml:"messageTimeout"`
	// MaxMessageTimeout is the filter's max_message_timeout (Envoy's default 0: off): how far the
	// sidecar may extend one wait (override_message_timeout) for a request whose queue may hold it
	// longer than messageTimeout.
	MaxMessageTimeout Duration `yaml:"maxMessageTimeout"`
}

// DefaultExtProc is the extProc block's defaults: no server, Envoy's own timeouts.
func DefaultExtProc() ExtProc {
	return ExtProc{MessageTimeout: Duration(200 * time.Millisecond)}
}

// AnswerMargin is how long before Envoy's timer the sidecar answers a request that still waits:
// a fifth of the timeout, from 5 ms to 50 ms, for the message's way to and from Envoy.
func AnswerMargin(timeout time.Duration) time.Duration {
	return min(max(timeout/5, 5*time.Millisecond), 50*time.Millisecond)
}

// HoldFor is the shortest Envoy timeout that lets a request wait for wait and still be answered
// AnswerMargin before Envoy's timer: wait + AnswerMargin(HoldFor(wait)) = HoldFor(wait).
func HoldFor(wait time.Duration) time.Duration {
	switch {
	case wait <= 20*time.Millisecond:
		return wait + 5*time.Millisecond
	case wait <= 200*time.Millisecond:
		return (wait*5 + 3) / 4 // a fifth of the timeout is the margin
	}
	return wait + 50*time.Millisecond
}

// HoldLimit is the longest Envoy lets the sidecar hold one request: the message timeout, or the
// longest extension when Envoy allows one (max_message_timeout of at least 1 ms).
func (e *ExtProc) HoldLimit() time.Duration {
	if e.MaxMessageTimeout.D() >= time.Millisecond {
		return max(e.MessageTimeout.D(), e.MaxMessageTimeout.D())
	}
	return e.MessageTimeout.D()
}

func (e *ExtProc) validate(errs *Problems, c *Config) {
	if e.Listen == "" {
		return
	}
	checkAddr(errs, "extProc.listen", e.Listen)
	for _, other := range []struct{ field, addr string }{{"listen", c.Listen}, {"adminListen", c.AdminListen}} {
		if e.Listen == other.addr && !strings.HasSuffix(e.Listen, ":0") {
			errs.add("extProc.listen", "must differ from %s (%q)", other.field, other.addr)
		}
	}
	if e.MessageTimeout.D() < time.Millisecond {
		errs.add("extProc.messageTimeout", "must be at least 1ms (Envoy's message_timeout; its default is 200ms), got %s", e.MessageTimeout)
	}
	nonNegative(errs, "extProc.maxMessageTimeout", e.MaxMessageTimeout)
}

// validateHolds refuses a policy whose queues may hold a request longer than Envoy waits for
// the answer: such a request would get Envoy's own 504 (or pass unadmitted with
// failure_mode_allow) instead of loadshed's answer. Run it once the admission blocks are valid.
func (e *ExtProc) validateHolds(errs *Problems, c *Config) {
	if e.Listen == "" || e.MessageTimeout.D() < time.Millisecond || e.MaxMessageTimeout < 0 {
		return
	}
	check := func(path string, a *Admission) {
		if a.DryRun {
			return // a dry run never holds a request
		}
		core, err := a.Build()
		if err != nil {
			return // reported by the admission block's own validation
		}
		wait := admission.MaxQueueWait(core)
		limit := e.HoldLimit()
		if wait == 0 || HoldFor(wait) <= limit {
			return
		}
		need := HoldFor(wait)
		if r := need % (10 * time.Millisecond); r != 0 {
			need += 10*time.Millisecond - r // a round figure to write in Envoy's config
		}
		if e.MaxMessageTimeout.D() < time.Millisecond {
			errs.add(path, "a request may wait up to %s in this policy's queues, longer than Envoy waits for loadshed's answer "+
				"(extProc.messageTimeout %s, less %s to answer in time); raise max_message_timeout in Envoy's ext_proc filter "+
				"to at least %s and set extProc.maxMessageTimeout to match, or shorten the wait", wait, e.MessageTimeout, AnswerMargin(limit), need)
			return
		}
		errs.add(path, "a request may wait up to %s in this policy's queues, longer than Envoy lets loadshed extend a wait "+
			"(extProc.maxMessageTimeout %s, less %s to answer in time); raise max_message_timeout in Envoy's ext_proc filter "+
			"to at least %s and set extProc.maxMessageTimeout to match, or shorten the wait", wait, e.MaxMessageTimeout, AnswerMargin(limit), need)
	}
	check("admission", &c.Admission)
	for i := range c.Routes {
		if r := &c.Routes[i]; r.Admission != nil {
			check(fmt.Sprintf("routes[%d].admission", i), r.Admission)
		}
	}
}
