package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/metrics"
	"github.com/loadshed/loadshed/pkg/admission"
	"github.com/loadshed/loadshed/pkg/admission/limit"
)

// Gate is the admission pipeline. It is safe for concurrent use; Update swaps the configuration
// atomically while requests go on.
type Gate struct {
	state   atomic.Pointer[state]
	metrics *metrics.Proxy
	clock   admission.Clock
	self    SelfLoad

	// The quota store's collaborators, and what serialises opening and closing stores.
	quotaMetrics *metrics.Quota
	log          *slog.Logger
	replicaID    string
	mu           sync.Mutex // held by Update and Close
	closed       bool
}

// SelfLoad is the sidecar's watch on its own CPU (internal/selfload).
type SelfLoad interface {
	// Delay is the sidecar's own delay per forwarded request: taken off each upstream latency
	// sample, so the adaptive limit does not shrink when the sidecar is the bottleneck.
	Delay() time.Duration
	// Shed is the share of new requests to refuse at once because the sidecar itself is
	// overloaded (critical_plus requests are never refused by it).
	Shed() float64
}

// Options are a Gate's collaborators.
type Options struct {
	// Registerer receives the metrics (default: a new registry).
	Registerer prometheus.Registerer
	// Clock drives the strategies and times requests (default: the system clock).
	Clock admission.Clock
	// Self reports the sidecar's own load (default: none).
	Self SelfLoad
	// Logger receives the quota store's transitions (default: discarded).
	Logger *slog.Logger
	// ReplicaID names this replica among those sharing a quota store (the pod's name; default:
	// the host name and a random suffix).
	ReplicaID string
}

// New builds the gate for a valid configuration.
func New(cfg *config.Config, opts Options) (*Gate, error) {
	g := &Gate{clock: opts.Clock, self: opts.Self}
	if g.clock == nil {
		g.clock = admission.SystemClock{}
	}
	reg := opts.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	g.metrics = metrics.New(reg, g.StageStates)
	g.quotaMetrics = metrics.NewQuota(reg, g.QuotaState)
	g.log, g.replicaID = opts.Logger, opts.ReplicaID
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	st, err := buildState(cfg, nil, g.metrics, g.clock)
	if err != nil {
		return nil, err
	}
	if _, err := g.buildQuotas(st, nil); err != nil {
		return nil, err
	}
	g.state.Store(st)
	return g, nil
}

// Metrics returns the gate's metrics (the server counts reloads and its drain on them).
func (g *Gate) Metrics() *metrics.Proxy { return g.metrics }

// Clock is the gate's clock: a door times the exchanges it reports on the Pass with it.
func (g *Gate) Clock() admission.Clock { return g.clock }

// Config returns the configuration in force.
func (g *Gate) Config() *config.Config { return g.state.Load().cfg }

// Update puts a new valid configuration in force for new requests. Policies whose route and
// admission configuration are unchanged keep their state; replaced ones finish what they hold.
// The quota store is kept while its configuration is unchanged; a replaced one is closed.
func (g *Gate) Update(cfg *config.Config) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return errors.New("gate closed")
	}
	prev := g.state.Load()
	st, err := buildState(cfg, prev, g.metrics, g.clock)
	if err != nil {
		return err
	}
	retired, err := g.buildQuotas(st, prev)
	if err != nil {
		return err
	}
	g.state.Store(st)
	if retired != nil {
		_ = retired.Close()
	}
	return nil
}

// Policies lists the policies in force, the default one first. A policy whose route and
// admission configuration a reload left unchanged is the same *Policy before and after.
func (g *Gate) Policies() []*Policy { return g.state.Load().policies() }

// StageStates reports every strategy stage's current state (what the gauges show).
func (g *Gate) StageStates() []metrics.StageState {
	st := g.state.Load()
	if st == nil {
		return nil
	}
	var out []metrics.StageState
	for _, p := range st.policies() {
		out = append(out, p.state()...)
	}
	return out
}

// Drain refuses whatever waits in a queue now, and every later request, with ReasonDraining.
// Admitted requests keep their permits.
func (g *Gate) Drain() {
	for _, p := range g.state.Load().policies() {
		p.limiter.Drain()
	}
}

// Request is what a front door knows about a request, in plain values.
type Request struct {
	// Door is the front door, the "door" label (metrics.DoorHTTP, DoorGRPC, DoorExtProc).
	Door string
	// Method and Path select the route.
	Method, Path string
	// Header reads the admission headers (priority, cost, timeouts, client key).
	Header Header
	// Peer is the address of the connection, "host:port" or a bare host: the client key when no
	// header names one.
	Peer string
	// ContentLength is the announced size of the body; -1 when unknown.
	ContentLength int64
	// GRPC marks a gRPC call (IsGRPC of its content type): its outcome is its final grpc-status
	// (CallEnded), its latency sample the whole call. Calls through DoorGRPC always are.
	GRPC bool
}

// ErrAnswerDue is the cause a door gives (context.WithCancelCause) when it cancels the context
// of a request still waiting in a queue because it must answer now: Envoy's ext_proc filter stops
// waiting for the sidecar at its message timeout. Admit then refuses the request as a queue
// timeout, with a Retry-After, instead of counting a client that left.
var ErrAnswerDue = errors.New("gate: the door must answer now")

// Refusal is a shed: the request is refused cheaply, with the status its reason maps to and the
// strategy's estimate of when a retry could succeed.
type Refusal struct {
	Reason admission.Reason
	// Stage names the strategy (or "clients") that refused.
	Stage string
	// Status is the HTTP status configured for the reason (statusCodes).
	Status int
	// RetryAfter is the strategy's hint; zero when it has none. See RetryAfterHeader.
	RetryAfter time.Duration
	// GRPCCode is the grpc-status a refused gRPC call gets (grpc.statusCodes).
	GRPCCode int
}

// Field is one header a door sets.
type Field struct{ Name, Value string }

// Headers are the headers of a refusal's answer through any door: X-Loadshed-Reason naming the
// reason, and Retry-After (to a gRPC call, grpc-retry-pushback-ms) unless the refusal asks for
// no retry (403). An HTTP answer also says it is plain text that no cache keeps. (A gRPC call's
// content-type, grpc-status and grpc-message are the door's to write in its own framing.)
func (r *Refusal) Headers(grpc bool) []Field {
	if grpc {
		if v := r.PushbackMillis(); v != "" {
			return []Field{{"X-Loadshed-Reason", string(r.Reason)}, {"Grpc-Retry-Pushback-Ms", v}}
		}
		return []Field{{"X-Loadshed-Reason", string(r.Reason)}}
	}
	f := []Field{{"Content-Type", "text/plain; charset=utf-8"}, {"X-Content-Type-Options", "nosniff"},
		{"Cache-Control", "no-store"}, {"X-Loadshed-Reason", string(r.Reason)}}
	if v := r.RetryAfterHeader(); v != "" {
		f = append(f, Field{"Retry-After", v})
	}
	return f
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("refused by %s: %s (%d)", r.Stage, r.Reason, r.Status)
}

// RetryAfterHeader renders the Retry-After header: whole seconds, rounded up, at least 1. It is
// empty for 403 (a deny-listed client is not asked to come back).
func (r *Refusal) RetryAfterHeader() string {
	if r.Status == 403 {
		return ""
	}
	return RetryAfterSeconds(r.RetryAfter)
}

// PushbackMillis renders gRPC's grpc-retry-pushback-ms from the refusal's own retry-after: whole
// milliseconds, rounded up, at least 1 (not the whole-second header). It is empty when the
// refusal asks for no retry (403, a deny-listed client).
func (r *Refusal) PushbackMillis() string {
	if r.Status == 403 {
		return ""
	}
	ms := int64(math.Ceil(float64(r.RetryAfter) / float64(time.Millisecond)))
	return strconv.FormatInt(max(ms, 1), 10)
}

// RetryAfterSeconds renders a Retry-After value: whole seconds, rounded up, at least 1.
func RetryAfterSeconds(d time.Duration) string {
	s := int64(math.Ceil(d.Seconds()))
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10)
}

// ClientError is a request the client got wrong before admission: a malformed admission header
// (400, naming it) or a body over the limit (413).
type ClientError struct {
	Status int
	// Header names the malformed header (400).
	Header string
	// Limit is the body limit in bytes (413).
	Limit int64
	msg   string
}

func (e *ClientError) Error() string {
	if e.Status == 413 {
		return fmt.Sprintf("body over %d bytes", e.Limit)
	}
	return e.Header + ": " + e.msg
}

// Pass is an admitted request. The door reports on it how the exchange went and ends it with
// Finish, exactly once, normally with defer right after Admit.
//
// A Pass is also the request's context: the context Admit was given, which carries the Pass
// (PassFrom finds it again, also through contexts derived from it). A door hands it on as the
// context of the forwarded request, so its hooks find the Pass without another allocation.
type Pass struct {
	context.Context

	p    *Policy
	spec *requestSpec
	// Start is when the gate saw the request.
	Start time.Time

	permit   admission.Permit
	bodyErr  atomic.Pointer[error] // the first error reading the client's body
	deadline time.Duration         // after Start; 0: none
	fwd, hdr time.Duration         // after Start: forwarded, response headers (0: not yet)
	end      time.Duration         // after Start: a gRPC call's end (0: not yet)
	gate     *Gate
	status   int32
	door     uint8
	outcome  uint8 // index in outcomes
	held     bool
	stream   bool
	grpc     bool // the client sent grpc-timeout
	call     bool // a gRPC call (Request.GRPC)
	quiet    bool // the call's status is a failure that says nothing about load (CallEnded)
	fwdSet   [2]Field

	streaming   bool          // a streaming route
	streamAfter time.Duration // grpc.streamAfter
	streamed    atomic.Bool   // taken for a stream after streamAfter
}

type passKey struct{}

// Value returns the Pass for its own key and defers to the request's context for the rest.
func (ps *Pass) Value(key any) any {
	if key == (passKey{}) {
		return ps
	}
	return ps.Context.Value(key)
}

// PassFrom returns the Pass a context carries, or nil.
func PassFrom(ctx context.Context) *Pass {
	ps, _ := ctx.Value(passKey{}).(*Pass)
	return ps
}

// ClientDeadline is when the client stops waiting (zero: it set no deadline). The door forwards
// the time left and gives up on the upstream then.
func (ps *Pass) ClientDeadline() time.Time {
	if ps.deadline == 0 {
		return time.Time{}
	}
	return ps.Start.Add(ps.deadline)
}

// Waited is how long the request queued before admission.
func (ps *Pass) Waited() time.Duration { return ps.permit.Waited }

// TimeoutHeader is the header the remaining deadline is forwarded in ("" for none).
func (ps *Pass) TimeoutHeader() string { return ps.spec.timeoutHeader }

// StripHeaders are the admission headers the door removes before the upstream (the priority
// and cost headers, unless trust.forwardAdmissionHeaders keeps them).
func (ps *Pass) StripHeaders() []string { return ps.spec.strip }

// GRPCTimeout reports that the client sent grpc-timeout: the remaining deadline is forwarded in
// it too.
func (ps *Pass) GRPCTimeout() bool { return ps.grpc }

// Admit runs r through the pipeline: it returns a *Pass, or a *Refusal, a *ClientError, or the
// context's error when the client left while its request waited (counted as canceled, 499).
// When the strategy queues the request, queued (if not nil) learns the expected wait and its
// bound before Admit blocks.
func (g *Gate) Admit(ctx context.Context, r *Request, queued func(admission.Queued)) (*Pass, error) {
	st := g.state.Load()
	p, routeCost, streaming, clients := st.match(r.Method, r.Path)
	door := doorIndex(r.Door)
	now := g.clock.Now()
	req, herr := st.spec.parseRequest(r.Header, r.Peer, now, routeCost)
	if herr != nil {
		// A malformed admission header is the client's mistake: 400 naming the header.
		p.m.count(door, outcomeClientError, 400)
		return nil, &ClientError{Status: 400, Header: herr.header, msg: herr.msg}
	}
	if max := st.cfg.Server.MaxBodyBytes; max > 0 && r.ContentLength > max {
		p.m.count(door, outcomeClientError, 413)
		return nil, &ClientError{Status: 413, Limit: max}
	}
	if g.self != nil && req.Priority > admission.CriticalPlus {
		// The sidecar's own CPU is the bottleneck: a share of new requests is answered at once,
		// before anything else is spent on them.
		if share := g.self.Shed(); share > 0 && rand.Float64() < share {
			rej := &admission.Rejection{Reason: admission.ReasonSidecarOverload, Stage: "sidecar", RetryAfter: time.Second}
			if !g.dryRun(p, door, req, rej) {
				return nil, g.refuse(st, p, door, req, rej)
			}
		}
	}
	if clients != nil {
		// Bounded by the quota store's timeout; a store that fails is decided locally.
		if rej := clients.Check(ctx, now, req.Key, req.Cost); rej != nil && !g.dryRun(p, door, req, rej) {
			return nil, g.refuse(st, p, door, req, rej)
		}
	}
	if !req.Deadline.IsZero() {
		// Work whose client will have given up is not started: refuse a request whose remaining
		// time is shorter than the route's typical upstream latency (queueing strategies also
		// add their expected wait, in the strategy).
		if exp := p.latency.value(); !req.Deadline.After(now) || exp > 0 && req.Deadline.Sub(now) < exp {
			rej := &admission.Rejection{Reason: admission.ReasonDeadline, Stage: p.strategy}
			if !g.dryRun(p, door, req, rej) {
				return nil, g.refuse(st, p, door, req, rej)
			}
		}
	}
	pass := &Pass{Context: ctx, p: p, spec: &st.spec, gate: g, door: uint8(door), Start: now, streaming: streaming,
		streamAfter: st.cfg.GRPC.StreamAfter.D(), grpc: st.spec.grpcTimeout && r.Header.Get("Grpc-Timeout") != "",
		call: r.GRPC || r.Door == metrics.DoorGRPC}
	if !req.Deadline.IsZero() {
		// A deadline at Start itself (already late) was refused above; an admitted one lies after.
		pass.deadline = req.Deadline.Sub(now)
	}
	var err error
	if p.dryRun {
		// Shadow mode: learn what the strategy would do, never delay or refuse.
		pass.permit, err = p.limiter.TryAdmit(req)
		var rej *admission.Rejection
		if errors.As(err, &rej) {
			g.dryRun(p, door, req, rej)
		}
		pass.held = err == nil
		return pass, nil
	}
	pass.permit, err = p.limiter.AdmitNotify(ctx, req, queued)
	if err != nil {
		var rej *admission.Rejection
		if errors.As(err, &rej) {
			return nil, g.refuse(st, p, door, req, rej)
		}
		if errors.Is(context.Cause(ctx), ErrAnswerDue) {
			// The door cannot hold the request longer: a queue timeout, whose retry hint is the
			// wait it has had.
			waited := max(g.clock.Now().Sub(now), time.Millisecond)
			return nil, g.refuse(st, p, door, req, &admission.Rejection{Reason: admission.ReasonQueueTimeout, RetryAfter: waited, Stage: p.strategy})
		}
		// The client went away while it waited: no answer, no upstream call.
		p.m.count(door, outcomeCanceled, 499)
		return nil, err
	}
	pass.held = true
	p.m.queueWait.Observe(pass.permit.Waited.Seconds())
	return pass, nil
}

func doorIndex(door string) int {
	if i := indexOf(doors, door); i >= 0 {
		return i
	}
	return 0
}

// dryRun counts a would-be refusal of a dry-run policy and reports whether the request goes on.
func (g *Gate) dryRun(p *Policy, door int, req admission.Request, rej *admission.Rejection) bool {
	if !p.dryRun {
		return false
	}
	p.m.refused(door, stageOf(p, rej), rej.Reason, req.Priority, true)
	return true
}

func stageOf(p *Policy, rej *admission.Rejection) string {
	if rej.Stage == "" {
		return p.strategy
	}
	return rej.Stage
}

// refuse counts a shed and returns its Refusal.
func (g *Gate) refuse(st *state, p *Policy, door int, req admission.Request, rej *admission.Rejection) *Refusal {
	code, grpcCode := 503, 14
	if i := reasonIndex(rej.Reason); i >= 0 {
		code, grpcCode = st.status[i], st.grpc[i]
	}
	stage := stageOf(p, rej)
	p.m.refused(door, stage, rej.Reason, req.Priority, false)
	p.m.count(door, outcomeShed, code)
	return &Refusal{Reason: rej.Reason, Stage: stage, Status: code, RetryAfter: rej.RetryAfter, GRPCCode: grpcCode}
}

// Route is the name of the route the request matched ("default" when none did).
func (ps *Pass) Route() string { return ps.p.route }

// BodyFailed records that reading the client's request body failed (a malformed chunk, a
// stall, a client that left): a forward that fails then is the client's doing. The first error
// is kept; it is safe to call from the goroutine that forwards the body.
func (ps *Pass) BodyFailed(err error) { ps.bodyErr.CompareAndSwap(nil, &err) }

// BodyError is the first error reading the client's body, or nil.
func (ps *Pass) BodyError() error {
	if e := ps.bodyErr.Load(); e != nil {
		return *e
	}
	return nil
}

// isCall reports a gRPC call: its outcome is its final grpc-status, its sample its duration.
func (ps *Pass) isCall() bool { return ps.call }

// Streaming reports a request of a streaming route: its permit goes back at the response
// headers, and no read or upstream timeout cuts it.
func (ps *Pass) Streaming() bool { return ps.streaming }

// StreamAfter is how long a gRPC call may stay open before it is taken for a stream
// (grpc.streamAfter): the door calls MarkStream then.
func (ps *Pass) StreamAfter() time.Duration { return ps.streamAfter }

// MarkStream takes a call still open for a stream: its latency says nothing about load, so its
// permit goes back now, without a sample. Safe from another goroutine.
func (ps *Pass) MarkStream() {
	ps.streamed.Store(true)
	ps.Release(admission.Ignore)
}

// Streamed reports that MarkStream has taken the call for a stream.
func (ps *Pass) Streamed() bool { return ps.streamed.Load() }

// CallEnded records a gRPC call's final grpc-status and grpc-message, read at at from its
// trailers (or from a trailers-only answer). callOutcome classifies it for every door: OK is a
// success whose duration is the latency sample; only what says the upstream is overloaded
// (UNAVAILABLE, DEADLINE_EXCEEDED, a RESOURCE_EXHAUSTED the client did not cause) may shrink
// the limit; INTERNAL and the like are upstream errors that teach the strategy nothing; the
// client's own errors are its own. A call its client broke (MalformedCall) is the client's
// error whatever it ended with. The permit goes back now.
func (ps *Pass) CallEnded(code int, message string, at time.Time) {
	outcome, overload := callOutcome(code, message)
	if ps.clientBroke() {
		outcome, overload = outcomeClientError, false
	}
	ps.outcome, ps.quiet = outcome, !overload && outcome != outcomeSuccess
	if outcome == outcomeSuccess {
		ps.end = max(at.Sub(ps.Start), 1)
		if !ps.stream && !ps.streamed.Load() {
			ps.p.latency.observe(max(ps.end-ps.fwd, 0))
		}
	}
	ps.Complete()
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

// self is the sidecar's own delay, to take off the latency sample.
func (ps *Pass) self() time.Duration {
	if ps.gate == nil || ps.gate.self == nil {
		return 0
	}
	return ps.gate.self.Delay()
}

// Outcome is how the exchange has gone so far (a metrics.Outcome* value).
func (ps *Pass) Outcome() string { return outcomes[ps.outcome] }

// Forwarding marks the moment the request leaves for the upstream: upstream latency counts
// from here.
func (ps *Pass) Forwarding(at time.Time) { ps.fwd = max(at.Sub(ps.Start), 1) }

// Forward marks the moment the request leaves for the upstream (Forwarding) and returns how its
// headers change on the way: the admission headers to remove (StripHeaders) and the headers to
// set, the remaining deadline in the timeout header and, when the client sent grpc-timeout, in
// grpc-timeout too, so the upstream can give up in time. The slices are the Pass's own.
func (ps *Pass) Forward(now time.Time) (remove []string, set []Field) {
	ps.Forwarding(now)
	dl := ps.ClientDeadline()
	if dl.IsZero() {
		return ps.spec.strip, nil
	}
	left := max(dl.Sub(now), time.Millisecond).Truncate(time.Millisecond)
	n := 0
	if name := ps.spec.timeoutHeader; name != "" {
		ps.fwdSet[n] = Field{name, left.String()}
		n++
	}
	if ps.grpc {
		ps.fwdSet[n] = Field{"Grpc-Timeout", strconv.FormatInt(left.Milliseconds(), 10) + "m"}
		n++
	}
	return ps.spec.strip, ps.fwdSet[:n]
}

// Responded records the upstream's response headers, arrived at at: the status decides the
// outcome (5xx an upstream error, 4xx the client's), and the latency since Forwarding is
// observed. A stream (a long-lived response) is never a latency sample.
func (ps *Pass) Responded(status int, at time.Time, stream bool) {
	ps.hdr, ps.status, ps.stream = max(at.Sub(ps.Start), 1), int32(status), stream
	switch {
	case status >= 500:
		ps.outcome = outcomeUpstreamError
	case status >= 400:
		ps.outcome = outcomeClientError
	}
	lat := ps.hdr - ps.fwd
	if status < 400 && !stream && !ps.isCall() {
		ps.p.latency.observe(lat) // a gRPC call's sample is taken when it ends (CallEnded)
	}
	ps.p.m.upstream.Observe(lat.Seconds())
}

// Failed records that the exchange failed: the outcome (a metrics.Outcome* value) and the status
// the door sent the client for it (0: none; the status of the upstream's answer, if any, stays).
func (ps *Pass) Failed(outcome string, status int) {
	if o := indexOf(outcomes, outcome); o >= 0 {
		ps.outcome = uint8(o)
	}
	if status != 0 {
		ps.status = int32(status)
	}
}

// Complete says the upstream's answer is complete (read in full, or a stream that has started):
// the permit is released now, with the outcome so far, though the client may take its time to
// read the answer. Finish still ends the request.
func (ps *Pass) Complete() { ps.Release(ps.classify()) }

// Release gives the permit back now, with the outcome the strategy learns from; Finish then only
// counts the request. It is safe to call more than once and from another goroutine.
func (ps *Pass) Release(o admission.Outcome) {
	if !ps.held {
		return
	}
	var rtt time.Duration
	if o == admission.Success {
		// (Only a success is a sample. A stream's release comes from a timer, whose goroutine
		// must not read what the door is still writing.)
		rtt = ps.sample()
	}
	ps.permit.DoneAfter(o, rtt)
}

// sample is the upstream latency the strategy learns from: forwarding to response headers (a
// gRPC call: to its end), less the sidecar's own delay, so that a busy sidecar is not taken for
// a slow upstream. Zero (the permit's hold time is used) when the door did not time it.
func (ps *Pass) sample() time.Duration {
	end := ps.hdr
	if ps.end > end {
		end = ps.end
	}
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

// Finish ends the request: it releases the permit (if still held) with the outcome classified
// from what the door reported, counts the request, and observes its duration to the response
// headers when the upstream answered.
func (ps *Pass) Finish() {
	ps.Release(ps.classify())
	if ps.clientBroke() {
		// Whatever became of the exchange after (a reset stream, a broken answer), the client
		// broke its own call first.
		ps.outcome = outcomeClientError
	}
	code := int(ps.status)
	if code == 0 {
		code = 499
	}
	ps.p.m.count(int(ps.door), ps.outcome, code)
	if ps.hdr > 0 {
		ps.p.m.duration.Observe(ps.hdr.Seconds())
	}
}

// classify maps how a request ended to what the admission strategy learns from it: successes
// are latency samples; what the client caused (a 4xx other than 429, leaving, a malformed gRPC
// call), a gRPC status that is no overload signal (CallEnded) and long-lived streams say nothing
// about load; upstream errors, timeouts and 429s are overload signals.
func (ps *Pass) classify() admission.Outcome {
	switch {
	case ps.stream || ps.streamed.Load():
		return admission.Ignore
	case ps.quiet || ps.clientBroke():
		// A call's status that is no overload signal, or a call its client broke.
		return admission.Ignore
	case ps.outcome == outcomeSuccess:
		return admission.Success
	case ps.outcome == outcomeClientError && ps.status != 429:
		return admission.Ignore
	case ps.outcome == outcomeCanceled:
		return admission.Ignore
	}
	return admission.Dropped
}

// Streaming reports whether a request of this method and path is on a streaming route.
func (g *Gate) Streaming(method, path string) bool {
	_, _, streaming, _ := g.state.Load().match(method, path)
	return streaming
}

// Count counts a request a door refused on its own before admission (a CONNECT, say): the
// route's labels, the door, the outcome and the status.
func (g *Gate) Count(door, method, path, outcome string, status int) {
	p, _, _, _ := g.state.Load().match(method, path)
	if o := indexOf(outcomes, outcome); o >= 0 {
		p.m.count(doorIndex(door), uint8(o), status)
		return
	}
	p.m.requests.WithLabelValues(door, outcome, strconv.Itoa(status)).Inc()
}
