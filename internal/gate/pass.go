package gate

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
	"github.com/loadshed/loadshed/pkg/admission/limit"
)

// Pass is an admitted request: the exchange contract between a door and the gate. The door
//
//  1. forwards the request, changing its headers as Forward says;
//  2. reports the answer's headers with Answered, which says what to do with the rest (pass a
//     body on, a stream, wait for a gRPC call's trailers and report them with CallEnded);
//  3. reports what went wrong on the way instead (Failed, BodyFailed, Abort), or that it holds
//     the whole answer before the client has read it (Complete);
//  4. ends the exchange with Finish, exactly once, normally deferred right after Admit.
//
// Every rule about what an answer means (its outcome, whether it is a latency sample, when the
// permit goes back, when a gRPC call is taken for a stream) is the gate's. Times a door passes in
// come from the gate's clock (Gate.Clock). A Pass is not a context: the door keeps the request's
// own.
type Pass struct {
	p     *Policy
	spec  *requestSpec
	gate  *Gate
	start time.Time // when the gate saw the request

	permit   admission.Permit
	bodyErr  atomic.Pointer[error] // the first error reading the client's body
	deadline time.Duration         // after start; 0: none
	fwd, hdr time.Duration         // after start: forwarded, response headers (0: not yet)
	end      time.Duration         // after start: a gRPC call's end (0: not yet)
	status   int32
	door     DoorKind
	outcome  Outcome
	held     bool
	stream   bool
	grpc     bool   // the client sent grpc-timeout
	call     bool   // a gRPC call (Request.GRPC)
	quiet    bool   // the call's status is a failure that says nothing about load (CallEnded)
	reports  bool   // the caller gets load reports (loadReports)
	level    bool   // the caller gets the cohort level (a trusted caller, cohorts on)
	baggage  string // the baggage to forward with the rank's member; empty: as it came
	fwdSet   [3]Field

	streaming bool // a streaming route
	// The watch armed at Forward: a gRPC call still open after grpc.streamAfter is taken for a
	// stream (its permit goes back, no sample); behind a door that cannot bound the upstream
	// (Request.UnboundedUpstream), the permit goes back at upstreamTimeout as a failure.
	watchFor     time.Duration
	watchOutcome admission.Outcome
	watchMu      sync.Mutex
	watch        admission.Timer
	watched      atomic.Bool // the watch fired
}

// Streaming reports a request of a streaming route: its permit goes back at the response
// headers, and no read or upstream timeout may cut it.
func (ps *Pass) Streaming() bool { return ps.streaming }

// Deadline is when the client stops waiting (zero: it set no deadline). The door gives up on the
// upstream then; Forward passes the time left on.
func (ps *Pass) Deadline() time.Time {
	if ps.deadline == 0 {
		return time.Time{}
	}
	return ps.start.Add(ps.deadline)
}

// Forward marks the moment the request leaves for the upstream (upstream latency counts from
// here) and returns how its headers change on the way: the admission headers to remove (the
// priority and cost headers, unless trust.forwardAdmissionHeaders keeps them) and the headers to
// set, the remaining deadline in the timeout header and, when the client sent grpc-timeout, in
// grpc-timeout too, so the upstream can give up in time, and with cohorts the baggage carrying
// the request's rank (docs/cohorts.md). The slices are the Pass's own. The
// first Forward also arms the gate's watch on the exchange (grpc.streamAfter for a gRPC call).
func (ps *Pass) Forward(at time.Time) (remove []string, set []Field) {
	ps.fwd = max(at.Sub(ps.start), 1)
	if ps.watchFor > 0 && ps.held {
		ps.watchMu.Lock()
		if ps.watch == nil {
			ps.watch = ps.gate.clock.AfterFunc(ps.watchFor, ps.fire)
		}
		ps.watchMu.Unlock()
	}
	n := 0
	if ps.baggage != "" {
		ps.fwdSet[n] = Field{"Baggage", ps.baggage}
		n++
	}
	if dl := ps.Deadline(); !dl.IsZero() {
		left := max(dl.Sub(at), time.Millisecond).Truncate(time.Millisecond)
		if name := ps.spec.timeoutHeader; name != "" {
			ps.fwdSet[n] = Field{name, left.String()}
			n++
		}
		if ps.grpc {
			ps.fwdSet[n] = Field{"Grpc-Timeout", strconv.FormatInt(left.Milliseconds(), 10) + "m"}
			n++
		}
	}
	if n == 0 {
		return ps.spec.strip, nil
	}
	return ps.spec.strip, ps.fwdSet[:n]
}

// fire is the watch's end: the permit goes back with the watch's outcome, from the timer's
// goroutine.
func (ps *Pass) fire() {
	ps.watched.Store(true)
	ps.release(ps.watchOutcome)
}

// Answer is the upstream's response headers, as a door reports them.
type Answer struct {
	// Status is the HTTP status.
	Status int
	// ContentType is the answer's content type.
	ContentType string
	// GRPCStatus and GRPCMessage are the grpc-status and grpc-message fields of the headers
	// (a gRPC call answered trailers-only); empty when they are not there.
	GRPCStatus, GRPCMessage string
	// At is when the headers came, on the gate's clock.
	At time.Time
}

// Next is what a door does with the rest of an answer.
type Next uint8

const (
	// NextBody: a body follows. The permit is held until the door has it all (Complete) or the
	// exchange ends (Finish).
	NextBody Next = iota
	// NextStream: a long-lived answer (a streaming route, a protocol upgrade, an event stream):
	// the permit is back and the duration is no latency sample. Pass it on as it comes.
	NextStream
	// NextTrailers: a gRPC call whose final status comes in its trailers; the door reports them
	// with CallEnded.
	NextTrailers
	// NextEnded: a gRPC call that ended in these headers (trailers-only); the permit is back.
	NextEnded
)

// Answered records the upstream's response headers and says what the door does with the rest,
// and which fields it adds to the answer: the load report (loadReports.orca) and the cohort level
// to a trusted caller (X-Loadshed-Level), in the headers of
// an HTTP answer and of a gRPC call that ends in them (NextEnded), in the trailers of one that
// ends there (NextTrailers). The fields are shared: the door copies them, never changes them.
// The status decides the outcome (5xx an upstream error, 4xx the client's); the time since
// Forward is the latency sample unless the answer is a stream, or a gRPC call (whose sample is
// its whole duration, taken at CallEnded).
func (ps *Pass) Answered(a Answer) (Next, []Field) {
	next := ps.answered(a)
	return next, ps.fields(ps.call && a.Status == 200)
}

// fields are the fields the gate adds to an answer: the load report (loadReports) and, to a
// trusted caller of a route with cohorts, X-Loadshed-Level.
func (ps *Pass) fields(grpc bool) []Field {
	var load []Field
	if ps.reports {
		load = ps.gate.loads.snap.Load().fields(grpc)
	}
	if !ps.level {
		return load
	}
	// A slice of its own each time: a door may still hold the fields of an earlier answer.
	f := make([]Field, 0, len(load)+1)
	return append(append(f, load...), Field{LevelHeader, ps.p.cohorts.Level().String()})
}

func (ps *Pass) answered(a Answer) Next {
	if ps.call && a.Status == 200 {
		ps.responded(a.Status, a.At, ps.streaming)
		switch {
		case a.GRPCStatus != "":
			ps.CallEnded(a.GRPCStatus, a.GRPCMessage, a.At)
			return NextEnded
		case ps.streaming:
			ps.Complete()
			return NextStream
		}
		return NextTrailers
	}
	// Upgrades (WebSocket) and event streams are streams: their permit goes back as they start,
	// and their duration is no sample.
	stream := ps.streaming || a.Status == 101 || IsEventStream(a.ContentType)
	ps.responded(a.Status, a.At, stream)
	if stream {
		ps.Complete()
		return NextStream
	}
	return NextBody
}

func (ps *Pass) responded(status int, at time.Time, stream bool) {
	ps.hdr, ps.status, ps.stream = max(at.Sub(ps.start), 1), int32(status), stream
	switch {
	case status >= 500:
		ps.outcome = OutcomeUpstreamError
	case status >= 400:
		ps.outcome = OutcomeClientError
	}
	lat := ps.hdr - ps.fwd
	if status < 400 && !stream && !ps.call {
		ps.p.latency.observe(lat) // a gRPC call's sample is taken when it ends (CallEnded)
	}
	ps.p.m.upstream.Observe(lat.Seconds())
}

// CallEnded records a gRPC call's final grpc-status and grpc-message (as sent: the message may
// be percent-encoded), read at at from its trailers. callOutcome classifies it for every door:
// OK is a success whose duration is the latency sample; only what says the upstream is
// overloaded (UNAVAILABLE, DEADLINE_EXCEEDED, a RESOURCE_EXHAUSTED the client did not cause) may
// shrink the limit; INTERNAL and the like are upstream errors that teach the strategy nothing;
// the client's own errors are its own. A missing or malformed status is INTERNAL. A call its
// client broke (BodyFailed with a *MalformedCall) is the client's error whatever it ended with.
// The permit goes back now.
func (ps *Pass) CallEnded(status, message string, at time.Time) {
	outcome, overload := callOutcome(GRPCStatus(status), message)
	if ps.clientBroke() {
		outcome, overload = OutcomeClientError, false
	}
	ps.outcome, ps.quiet = outcome, !overload && outcome != OutcomeSuccess
	if outcome == OutcomeSuccess {
		ps.end = max(at.Sub(ps.start), 1)
		if !ps.stream && !ps.watched.Load() {
			ps.p.latency.observe(max(ps.end-ps.fwd, 0))
		}
	}
	ps.Complete()
}

// Complete says the upstream's answer is complete (the door holds all of it): the permit goes
// back now, with the outcome so far, though the client may take its time to read the answer.
// Finish still ends the request.
func (ps *Pass) Complete() { ps.release(ps.classify()) }

// Failed records that the exchange failed: the outcome and the status the door sent the client
// for it (0: none; the status of the upstream's answer, if any, stays). It returns the fields the
// door's own answer gets, as Answered does (the load report and the cohort level; for a gRPC
// call, in the form of its trailers-only answer).
func (ps *Pass) Failed(o Outcome, status int) []Field {
	if o < numOutcomes {
		ps.outcome = o
	}
	if status != 0 {
		ps.status = int32(status)
	}
	return ps.fields(ps.call)
}

// Abort records that the answer broke off before the client had it all (the door aborts the
// client's connection): the client's leaving if it left, else the upstream's failure, unless a
// failure is already recorded.
func (ps *Pass) Abort(clientLeft bool) {
	switch {
	case clientLeft:
		ps.Failed(OutcomeCanceled, 0)
	case ps.outcome == OutcomeSuccess || ps.outcome == OutcomeClientError:
		ps.Failed(OutcomeUpstreamError, 0)
	}
}

// BodyFailed records that reading the client's request body failed (a malformed chunk, a
// stall, a client that left, a gRPC call whose framing the client broke: *MalformedCall): a
// forward that fails then is the client's doing. The first error is kept; it is safe to call
// from the goroutine that forwards the body.
func (ps *Pass) BodyFailed(err error) { ps.bodyErr.CompareAndSwap(nil, &err) }

// Finish ends the request: it stops the gate's watch, releases the permit (if still held) with
// the outcome classified from what the door reported, counts the request, and observes its
// duration to the response headers when the upstream answered.
func (ps *Pass) Finish() {
	ps.watchMu.Lock()
	if ps.watch != nil {
		ps.watch.Stop()
	}
	ps.watchMu.Unlock()
	ps.release(ps.classify())
	if ps.clientBroke() {
		// Whatever became of the exchange after (a reset stream, a broken answer), the client
		// broke its own call first.
		ps.outcome = OutcomeClientError
	}
	code := int(ps.status)
	if code == 0 {
		code = 499
	}
	ps.p.m.count(ps.door, ps.outcome, code)
	if ps.hdr > 0 {
		ps.p.m.duration.Observe(ps.hdr.Seconds())
	}
}

// clientBroke reports that the door found the client's own request malformed (BodyFailed with
// a *MalformedCall).
func (ps *Pass) clientBroke() bool {
	e := ps.bodyErr.Load()
	if e == nil {
		return false
	}
	var bad *MalformedCall
	return errors.As(*e, &bad)
}

// release gives the permit back now, with the outcome the strategy learns from; Finish then only
// counts the request. It is safe to call more than once and from another goroutine.
func (ps *Pass) release(o admission.Outcome) {
	if !ps.held {
		return
	}
	var rtt time.Duration
	if o == admission.Success {
		// (Only a success is a sample. A watch's release comes from a timer, whose goroutine
		// must not read what the door is still writing.)
		rtt = ps.sample()
	}
	ps.permit.DoneAfter(o, rtt)
}

// sample is the upstream latency the strategy learns from: forwarding to response headers (a
// gRPC call: to its end), less the sidecar's own delay, so that a busy sidecar is not taken for
// a slow upstream. Zero (the permit's hold time is used) when the door did not time it.
func (ps *Pass) sample() time.Duration {
	end := max(ps.hdr, ps.end)
	if ps.fwd <= 0 || end <= ps.fwd {
		return 0
	}
	rtt := end - ps.fwd
	if self := ps.self(); self > 0 {
		// Never below the shortest meaningful latency: the sample still counts.
		rtt = max(rtt-self, min(rtt, limit.MinMeaningfulRTT))
	}
	return rtt
}

// self is the sidecar's own delay, to take off the latency sample.
func (ps *Pass) self() time.Duration {
	if ps.gate == nil || ps.gate.self == nil {
		return 0
	}
	return ps.gate.self.Delay()
}

// classify maps how a request ended to what the admission strategy learns from it: successes
// are latency samples; what the client caused (a 4xx other than 429, leaving, a malformed gRPC
// call), a gRPC status that is no overload signal (CallEnded) and long-lived streams say nothing
// about load; upstream errors, timeouts and 429s are overload signals.
func (ps *Pass) classify() admission.Outcome {
	switch {
	case ps.stream || ps.watched.Load() && ps.watchOutcome == admission.Ignore:
		return admission.Ignore
	case ps.quiet || ps.clientBroke():
		// A call's status that is no overload signal, or a call its client broke.
		return admission.Ignore
	case ps.outcome == OutcomeSuccess:
		return admission.Success
	case ps.outcome == OutcomeClientError && ps.status != 429:
		return admission.Ignore
	case ps.outcome == OutcomeCanceled:
		return admission.Ignore
	}
	return admission.Dropped
}
