package extproc

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/gate"
	"github.com/loadshed/loadshed/pkg/admission"
)

// exchange is one request's stream: its admission, then the answer it waits for.
type exchange struct {
	s      *Server
	stream extprocv3.ExternalProcessor_ProcessServer
	pass   *gate.Pass
	// call: a gRPC call.
	call bool
	// answered: the answer has been seen (response headers, or a call's trailers) and the permit
	// is back.
	answered bool
	// headersAt is when a call's response headers came, while it waits for its trailers.
	headersAt time.Time
	// report is the load report a call's trailers get (loadReports).
	report []gate.Field
}

// callMode is the processing mode a gRPC call asks for once admitted: its response headers and
// its trailers, which carry the call's final grpc-status; no bodies.
var callMode = &filterv3.ProcessingMode{
	RequestHeaderMode:   filterv3.ProcessingMode_SEND,
	ResponseHeaderMode:  filterv3.ProcessingMode_SEND,
	RequestTrailerMode:  filterv3.ProcessingMode_SKIP,
	ResponseTrailerMode: filterv3.ProcessingMode_SEND,
}

// serve admits the request whose headers came first, answers, and follows the exchange to its
// end.
func (x *exchange) serve(first *extprocv3.ProcessingRequest, hdrs *extprocv3.HttpHeaders) {
	clock := x.s.clock
	start := clock.Now()
	h := headerList(hdrs.GetHeaders().GetHeaders())
	req := &gate.Request{
		Door: gate.DoorExtProc, Method: h.Get(":method"), Path: requestPath(h.Get(":path")), Header: h,
		Peer: x.peer(first), ContentLength: contentLength(h, hdrs.GetEndOfStream()), GRPC: gate.IsGRPC(h.Get("content-type")),
		// Envoy answers a hung upstream at its route timeout (and sends that 504 here); a route
		// may have none, so the gate gives the permit back at upstreamTimeout.
		UnboundedUpstream: true,
	}
	x.call = req.GRPC
	ctx, cancel := context.WithCancelCause(x.stream.Context())
	defer cancel(nil)
	cfg := x.s.gate.Config()
	var due admission.Timer
	pass, err := x.s.gate.Admit(ctx, req, func(q admission.Queued) {
		due = x.hold(q, start, cfg.ExtProc, func() { cancel(gate.ErrAnswerDue) })
	})
	if due != nil {
		due.Stop()
	}
	if err != nil {
		if errors.Is(context.Cause(ctx), gate.ErrAnswerDue) {
			x.s.m.due.Inc()
		}
		if x.refuse(err) {
			x.s.m.answer.Observe(clock.Now().Sub(start).Seconds())
		}
		return
	}
	x.pass = pass
	defer pass.Finish()
	if !x.forward(h) {
		pass.Failed(gate.OutcomeCanceled, 0)
		return
	}
	x.s.m.answer.Observe(clock.Now().Sub(start).Seconds())
	x.follow()
}

// hold arms the deadline of a request the strategy queued. Envoy stops waiting at its message
// timeout, counted from about start, when it sent the headers. When the queue may hold the
// request past that (its bound, or no bound known), Envoy is asked once for as much more time as
// the bound needs, within extProc.maxMessageTimeout. A request still waiting AnswerMargin before
// Envoy's timer is refused as a queue timeout (due cancels its wait).
func (x *exchange) hold(q admission.Queued, start time.Time, ep config.ExtProc, due func()) admission.Timer {
	now := x.s.clock.Now()
	answerBy := start.Add(ep.MessageTimeout.D() - config.AnswerMargin(ep.MessageTimeout.D()))
	if q.Bound == 0 || now.Add(q.Bound).After(answerBy) {
		if ext := extension(q.Bound, ep); ext > 0 && now.Add(ext-config.AnswerMargin(ext)).After(answerBy) {
			if x.send(&extprocv3.ProcessingResponse{OverrideMessageTimeout: durationpb.New(ext)}) {
				x.s.m.overrides.Inc()
				answerBy = now.Add(ext - config.AnswerMargin(ext))
			}
		}
	}
	return x.s.clock.AfterFunc(max(answerBy.Sub(now), 0), due)
}

// extension is the override_message_timeout asked for a wait of at most bound (0: unknown):
// enough to answer in time, in whole milliseconds, within extProc.maxMessageTimeout; 0 when
// Envoy allows no extension.
func extension(bound time.Duration, ep config.ExtProc) time.Duration {
	limit := ep.MaxMessageTimeout.D().Truncate(time.Millisecond)
	if limit < time.Millisecond {
		return 0
	}
	if bound == 0 {
		return limit
	}
	// A little more than the bound needs, so that the queue's own expiry, not this deadline,
	// normally ends the wait.
	d := config.HoldFor(bound) + 10*time.Millisecond
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return min(d, limit)
}

// forward answers an admitted request's headers: CONTINUE, with the admission headers it
// carries removed and the remaining deadline forwarded; a gRPC call also asks for its response
// trailers.
func (x *exchange) forward(h headerList) bool {
	remove, set := x.pass.Forward(x.s.clock.Now())
	var present []string
	for _, name := range remove {
		if h.Get(name) != "" {
			present = append(present, strings.ToLower(name))
		}
	}
	hr := &extprocv3.HeadersResponse{}
	if len(present)+len(set) > 0 {
		hr.Response = &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: options(set), RemoveHeaders: present}}
	}
	resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: hr}}
	if x.call && !x.pass.Streaming() {
		resp.ModeOverride = callMode
	}
	return x.send(resp)
}

// follow answers the rest of the stream and reports the answer on the Pass, until the stream
// ends.
func (x *exchange) follow() {
	for {
		msg, err := x.stream.Recv()
		if err != nil {
			x.ended()
			return
		}
		now := x.s.clock.Now()
		resp := &extprocv3.ProcessingResponse{}
		switch m := msg.Request.(type) {
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			set := x.responseHeaders(headerList(m.ResponseHeaders.GetHeaders().GetHeaders()), now)
			resp.Response = &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: mutation(set)}}
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			set := x.responseTrailers(headerList(m.ResponseTrailers.GetTrailers().GetHeaders()), now)
			var tr *extprocv3.HeaderMutation
			if len(set) > 0 {
				tr = &extprocv3.HeaderMutation{SetHeaders: options(set)}
			}
			resp.Response = &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{HeaderMutation: tr}}
		// Phases loadshed does not need, when the filter sends them anyway: let them through.
		case *extprocv3.ProcessingRequest_RequestBody:
			resp.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}
		case *extprocv3.ProcessingRequest_ResponseBody:
			resp.Response = &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}
		case *extprocv3.ProcessingRequest_RequestTrailers:
			resp.Response = &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}
		default:
			continue
		}
		if !x.send(resp) {
			x.ended()
			return
		}
	}
}

// responseHeaders reports the answer to the gate. A gRPC call ends at its grpc-status: in these
// headers (a trailers-only answer, as Envoy's own local replies to gRPC are), else in its
// trailers. The processor never sees a body: the permit goes back at the headers otherwise. It
// returns the fields the answer's headers get (the load report).
func (x *exchange) responseHeaders(h headerList, now time.Time) []gate.Field {
	if x.answered {
		return nil
	}
	code, err := strconv.Atoi(h.Get(":status"))
	if err != nil || code < 100 || code > 599 {
		code = http.StatusBadGateway
	}
	next, report := x.pass.Answered(gate.Answer{Status: code, ContentType: h.Get("content-type"),
		GRPCStatus: h.Get("grpc-status"), GRPCMessage: h.Get("grpc-message"), At: now})
	switch next {
	case gate.NextTrailers:
		x.headersAt, x.report = now, report
		return nil
	case gate.NextBody:
		x.pass.Complete()
	}
	x.answered = true
	return report
}

// responseTrailers ends a gRPC call with its final grpc-status; it returns the fields the
// trailers get (the load report).
func (x *exchange) responseTrailers(h headerList, now time.Time) []gate.Field {
	if x.answered || !x.call || x.headersAt.IsZero() {
		return nil
	}
	x.pass.CallEnded(h.Get("grpc-status"), h.Get("grpc-message"), now)
	x.answered = true
	return x.report
}

// mutation is a CommonResponse that sets fs (nil when there is nothing to set).
func mutation(fs []gate.Field) *extprocv3.CommonResponse {
	if len(fs) == 0 {
		return nil
	}
	return &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: options(fs)}}
}

// ended settles a stream that ended before its answer was complete. Envoy sends its own local
// replies to the processor, so a stream that ends with no answer is a request nobody waits for
// any more: the client left, or Envoy reset the stream. A call whose headers came but whose
// trailers did not is read at its headers: Envoy sends the trailers only when its filter lets
// the processor change the mode (allow_mode_override).
func (x *exchange) ended() {
	switch {
	case x.answered:
	case !x.headersAt.IsZero():
		x.pass.CallEnded("0", "", x.headersAt)
	default:
		x.pass.Failed(gate.OutcomeCanceled, 0)
	}
}

// refuse answers a request the gate did not admit with Envoy's local reply: a shed with its
// status, Retry-After (to a gRPC call, its grpc-status and pushback) and reason; the client's
// mistake with 400 or 413. A client that left gets nothing. It reports whether an answer was
// sent.
func (x *exchange) refuse(err error) bool {
	var rej *gate.Refusal
	var bad *gate.ClientError
	var ir *extprocv3.ImmediateResponse
	switch {
	case errors.As(err, &rej):
		ir = &extprocv3.ImmediateResponse{Status: x.httpStatus(rej.Status), Headers: &extprocv3.HeaderMutation{SetHeaders: options(rej.Headers(x.call))},
			Details: "loadshed_" + string(rej.Reason)}
		if x.call {
			ir.GrpcStatus = &extprocv3.GrpcStatus{Status: uint32(rej.GRPCCode)}
			ir.Body = []byte(rej.GRPCMessage())
		} else {
			ir.Body = []byte(rej.Body())
		}
	case errors.As(err, &bad):
		ir = &extprocv3.ImmediateResponse{Status: x.httpStatus(bad.Status), Details: "loadshed_client_error"}
		if x.call {
			ir.GrpcStatus = &extprocv3.GrpcStatus{Status: uint32(bad.GRPCCode())}
			ir.Body = []byte(bad.Error())
		} else {
			ir.Body = []byte(bad.Body())
		}
	default:
		return false
	}
	return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: ir}})
}

// httpStatus is code as Envoy's API spells it. Envoy accepts only the codes its StatusCode enum
// names; another configured code is answered as 503 (4xx: 429), with a warning.
func (x *exchange) httpStatus(code int) *typev3.HttpStatus {
	if _, ok := typev3.StatusCode_name[int32(code)]; !ok {
		x.s.warn("status", "Envoy cannot answer this status code; answering with a standard one instead (check statusCodes)", "code", code)
		if code < 500 {
			code = http.StatusTooManyRequests
		} else {
			code = http.StatusServiceUnavailable
		}
	}
	return &typev3.HttpStatus{Code: typev3.StatusCode(code)}
}

// send sends one message; false when the stream is gone.
func (x *exchange) send(m *extprocv3.ProcessingResponse) bool { return x.stream.Send(m) == nil }

// peer is the client's address: the source.address attribute (request_attributes in the
// filter). Without it, clients cannot be told apart.
func (x *exchange) peer(m *extprocv3.ProcessingRequest) string {
	for _, attrs := range m.GetAttributes() {
		if v, ok := attrs.GetFields()["source.address"]; ok {
			if a := v.GetStringValue(); a != "" {
				return a
			}
		}
	}
	x.s.warn("source", "Envoy sends no source.address attribute: clients cannot be told apart (per-client limits share one key, "+
		"trust.sources matches nobody); add request_attributes: [source.address] to the ext_proc filter")
	return ""
}

// headerList reads Envoy's header list: keys are lower case, values in raw_value (or value).
type headerList []*corev3.HeaderValue

// Get returns the first value of the header called name (any case), "" when absent.
func (h headerList) Get(name string) string {
	for _, v := range h {
		if strings.EqualFold(v.GetKey(), name) {
			if len(v.GetRawValue()) > 0 {
				return string(v.GetRawValue())
			}
			return v.GetValue()
		}
	}
	return ""
}

// requestPath is the path of a :path value as routes match it: without the query, percent
// escapes decoded (as net/http's URL.Path). A path that does not decode is matched as sent.
func requestPath(raw string) string {
	p, _, _ := strings.Cut(raw, "?")
	if strings.Contains(p, "%") {
		if dec, err := url.PathUnescape(p); err == nil {
			return dec
		}
	}
	return p
}

// contentLength is the request's announced body size: 0 when its headers end the stream, -1
// when unknown.
func contentLength(h headerList, endOfStream bool) int64 {
	if endOfStream {
		return 0
	}
	if n, err := strconv.ParseInt(strings.TrimSpace(h.Get("content-length")), 10, 64); err == nil && n >= 0 {
		return n
	}
	return -1
}

// options are header fields as Envoy's mutations set them: lower-case keys, values in
// raw_value, replacing any value already there.
func options(fs []gate.Field) []*corev3.HeaderValueOption {
	if len(fs) == 0 {
		return nil
	}
	out := make([]*corev3.HeaderValueOption, len(fs))
	for i, f := range fs {
		out[i] = &corev3.HeaderValueOption{
			Header:       &corev3.HeaderValue{Key: strings.ToLower(f.Name), RawValue: []byte(f.Value)},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		}
	}
	return out
}
