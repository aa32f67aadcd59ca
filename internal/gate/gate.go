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

	loads loadSampler // the load reports' source (loadReports.orca)
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
	metrics.NewCohorts(reg, g.CohortStates)
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
	g.startLoads(cfg)
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
	g.startLoads(cfg)
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

// CohortStates reports the cohort admission level of every policy with cohorts (what the
// gauges show).
func (g *Gate) CohortStates() []metrics.CohortState {
	st := g.state.Load()
	if st == nil {
		return nil
	}
	var out []metrics.CohortState
	for _, p := range st.policies() {
		if l, ok := p.CohortLevel(); ok {
			out = append(out, metrics.CohortState{Route: p.route, Level: levelValue(l, p.ranker.count),
				Priority: l.Priority.String(), Rank: float64(l.Rank)})
		}
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
	// Door is the front door (the "door" label).
	Door DoorKind
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
	// UnboundedUpstream says the door cannot bound the upstream's answer in time itself (Envoy's
	// route may have no timeout): the gate gives the permit back as an upstream failure once
	// upstreamTimeout has passed since Forward without an answer.
	UnboundedUpstream bool
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

	load  *loadSnap // the load report for the caller, if any (Headers adds it)
	level string    // the cohort level for a trusted caller, if any (Headers adds it)
}

// Field is one header a door sets.
type Field struct{ Name, Value string }

// Headers are the headers of a refusal's answer through any door: X-Loadshed-Reason naming the
// reason, and Retry-After (to a gRPC call, grpc-retry-pushback-ms) unless the refusal asks for
// no retry (403); to a trusted caller of a route with cohorts, X-Loadshed-Level. An HTTP answer
// also says it is plain text that no cache keeps. (A gRPC call's content-type, grpc-status and
// grpc-message are the door's to write in its own framing.)
func (r *Refusal) Headers(grpc bool) []Field {
	var f []Field
	if grpc {
		f = []Field{{"X-Loadshed-Reason", string(r.Reason)}}
		if v := r.PushbackMillis(); v != "" {
			f = append(f, Field{"Grpc-Retry-Pushback-Ms", v})
		}
	} else {
		f = []Field{{"Content-Type", "text/plain; charset=utf-8"}, {"X-Content-Type-Options", "nosniff"},
			{"Cache-Control", "no-store"}, {"X-Loadshed-Reason", string(r.Reason)}}
		if v := r.RetryAfterHeader(); v != "" {
			f = append(f, Field{"Retry-After", v})
		}
	}
	if r.level != "" {
		f = append(f, Field{LevelHeader, r.level})
	}
	return append(f, r.load.fields(grpc)...)
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

// Admit runs r through the pipeline: it returns a *Pass, or a *Refusal, a *ClientError, or the
// context's error when the client left while its request waited (counted as canceled, 499).
// When the strategy queues the request, queued (if not nil) learns the expected wait and its
// bound before Admit blocks.
func (g *Gate) Admit(ctx context.Context, r *Request, queued func(admission.Queued)) (*Pass, error) {
	st := g.state.Load()
	p, routeCost, streaming, clients := st.match(r.Method, r.Path)
	door := r.Door
	now := g.clock.Now()
	check := trustCheck{rules: st.spec.trust, h: r.Header, peer: r.Peer}
	lr := st.cfg.LoadReports
	to := caller{reports: lr.ORCA && (!lr.TrustedOnly || check.trusted())}
	req, herr := st.spec.parse(r.Header, now, routeCost, &check)
	if herr != nil {
		// A malformed admission header is the client's mistake: 400 naming the header.
		p.m.count(door, OutcomeClientError, 400)
		return nil, &ClientError{Status: 400, Header: herr.header, msg: herr.msg}
	}
	if max := st.cfg.Server.MaxBodyBytes; max > 0 && r.ContentLength > max {
		p.m.count(door, OutcomeClientError, 413)
		return nil, &ClientError{Status: 413, Limit: max}
	}
	var cohort cohortRank
	if p.ranker != nil {
		to.level = p.cohorts != nil && check.trusted()
		cohort = p.ranker.assign(r.Header, now, check.trusted())
		req.Rank, to.rank = cohort.rank, cohort.rank
	}
	if g.self != nil && req.Priority > admission.CriticalPlus {
		// The sidecar's own CPU is the bottleneck: a share of new requests is answered at once,
		// before anything else is spent on them.
		if share := g.self.Shed(); share > 0 && rand.Float64() < share {
			rej := &admission.Rejection{Reason: admission.ReasonSidecarOverload, Stage: "sidecar", RetryAfter: time.Second}
			if !g.dryRun(p, door, req, rej) {
				return nil, g.refuse(st, p, door, req, to, rej)
			}
		}
	}
	if clients != nil {
		// Bounded by the quota store's timeout; a store that fails is decided locally.
		if rej := clients.Check(ctx, now, req.Key, req.Cost); rej != nil && !g.dryRun(p, door, req, rej) {
			return nil, g.refuse(st, p, door, req, to, rej)
		}
	}
	if !req.Deadline.IsZero() {
		// Work whose client will have given up is not started: refuse a request whose remaining
		// time is shorter than the route's typical upstream latency (queueing strategies also
		// add their expected wait, in the strategy).
		if exp := p.latency.value(); !req.Deadline.After(now) || exp > 0 && req.Deadline.Sub(now) < exp {
			rej := &admission.Rejection{Reason: admission.ReasonDeadline, Stage: p.strategy}
			if !g.dryRun(p, door, req, rej) {
				return nil, g.refuse(st, p, door, req, to, rej)
			}
		}
	}
	pass := &Pass{p: p, spec: &st.spec, gate: g, door: door, start: now, streaming: streaming, reports: to.reports,
		level: to.level, baggage: cohort.baggage,
		grpc: st.spec.grpcTimeout && r.Header.Get("Grpc-Timeout") != "", call: r.GRPC || r.Door == DoorGRPC}
	switch {
	case streaming:
	case pass.call:
		pass.watchFor, pass.watchOutcome = st.cfg.GRPC.StreamAfter.D(), admission.Ignore
	case r.UnboundedUpstream:
		pass.watchFor, pass.watchOutcome = st.cfg.UpstreamTimeout.D(), admission.Dropped
	}
	if !req.Deadline.IsZero() {
		// A deadline at the start itself (already late) was refused above; an admitted one lies after.
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
		p.m.admittedN.Add(1)
		return pass, nil
	}
	pass.permit, err = p.limiter.AdmitNotify(ctx, req, queued)
	if err != nil {
		var rej *admission.Rejection
		if errors.As(err, &rej) {
			return nil, g.refuse(st, p, door, req, to, rej)
		}
		if errors.Is(context.Cause(ctx), ErrAnswerDue) {
			// The door cannot hold the request longer: a queue timeout, whose retry hint is the
			// wait it has had.
			waited := max(g.clock.Now().Sub(now), time.Millisecond)
			return nil, g.refuse(st, p, door, req, to, &admission.Rejection{Reason: admission.ReasonQueueTimeout, RetryAfter: waited, Stage: p.strategy})
		}
		// The client went away while it waited: no answer, no upstream call.
		p.m.count(door, OutcomeCanceled, 499)
		return nil, err
	}
	pass.held = true
	p.m.admittedN.Add(1)
	p.m.queueWait.Observe(pass.permit.Waited.Seconds())
	return pass, nil
}

// dryRun counts a would-be refusal of a dry-run policy and reports whether the request goes on.
func (g *Gate) dryRun(p *Policy, door DoorKind, req admission.Request, rej *admission.Rejection) bool {
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

// caller is what the gate tells the sender of a request beyond the answer itself.
type caller struct {
	reports bool // load reports (loadReports)
	level   bool // X-Loadshed-Level: a trusted sender, cohorts on
	rank    int  // its cohort rank (cohorts on)
}

// refuse counts a shed and returns its Refusal.
func (g *Gate) refuse(st *state, p *Policy, door DoorKind, req admission.Request, to caller, rej *admission.Rejection) *Refusal {
	code, grpcCode := 503, 14
	if i := reasonIndex(rej.Reason); i >= 0 {
		code, grpcCode = st.status[i], st.grpc[i]
	}
	stage := stageOf(p, rej)
	p.m.refused(door, stage, rej.Reason, req.Priority, false)
	p.m.count(door, OutcomeShed, code)
	ref := &Refusal{Reason: rej.Reason, Stage: stage, Status: code, RetryAfter: rej.RetryAfter, GRPCCode: grpcCode}
	if to.reports {
		ref.load = g.loads.snap.Load()
	}
	if p.cohorts != nil {
		p.m.cohortRefused(band(to.rank, p.ranker.count), rej.Reason)
		if to.level {
			ref.level = p.cohorts.Level().String()
		}
	}
	return ref
}

// Streaming reports whether a request of this method and path is on a streaming route.
func (g *Gate) Streaming(method, path string) bool {
	_, _, streaming, _ := g.state.Load().match(method, path)
	return streaming
}

// Count counts a request a door refused on its own before admission (a CONNECT, say): the
// route's labels, the door, the outcome and the status.
func (g *Gate) Count(door DoorKind, method, path string, o Outcome, status int) {
	p, _, _, _ := g.state.Load().match(method, path)
	p.m.count(door, o, status)
}
