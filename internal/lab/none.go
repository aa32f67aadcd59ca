package lab

import (
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

// passThrough is the absence of a strategy ("none"): every request is admitted at once. It only
// counts what is in flight so that Stats.Buffered shows the load the backend is handed.
type passThrough struct {
	inFlight int64
	draining bool
}

// NewPassThrough returns the core of strategy "none": it admits everything.
func NewPassThrough() admission.Core { return &passThrough{} }

func (p *passThrough) Name() string { return "none" }

func (p *passThrough) Offer(now time.Time, t *admission.Ticket, _ *admission.Events) admission.Verdict {
	if p.draining {
		t.Err = &admission.Rejection{Reason: admission.ReasonDraining, RetryAfter: time.Second, Stage: p.Name()}
		return admission.Refused
	}
	p.inFlight++
	t.Granted = now
	return admission.Admitted
}

func (p *passThrough) Release(time.Time, *admission.Ticket, admission.Outcome, *admission.Events) {
	p.inFlight--
}

func (p *passThrough) Cancel(time.Time, *admission.Ticket, *admission.Events) {}
func (p *passThrough) Advance(time.Time, *admission.Events)                   {}
func (p *passThrough) Wake() time.Time                                        { return time.Time{} }
func (p *passThrough) Drain(time.Time, *admission.Events)                     { p.draining = true }

func (p *passThrough) Stats(time.Time) admission.Stats {
	return admission.Stats{InFlight: p.inFlight, Buffered: p.inFlight, Tokens: -1}
}
