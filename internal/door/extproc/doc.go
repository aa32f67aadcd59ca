// Package extproc is the sidecar's Envoy door: a server of Envoy's external processing protocol
// (ext_proc) over the same gate as the HTTP data port. An Envoy already in the pod (Istio's
// sidecar, Envoy Gateway, a hand-run Envoy) calls it for every request, on one gRPC stream per
// request, and forwards what it admits itself: there is no second proxy hop.
//
// One stream, one request:
//
//   - request headers: the gate admits, queues or refuses. Admitted: CONTINUE (with the
//     admission headers removed and the remaining deadline forwarded). Refused: an
//     ImmediateResponse with the refusal's status, Retry-After and X-Loadshed-Reason (set in
//     raw_value, which Envoy reads), a short body, and for a gRPC call its grpc-status and
//     grpc-retry-pushback-ms. Queued: the answer waits, but never past Envoy's message timeout
//     (extProc.messageTimeout): a request whose queue may hold it longer asks Envoy for more
//     time once (override_message_timeout, at most extProc.maxMessageTimeout), and one still
//     waiting shortly before the timer is refused as a queue timeout, so Envoy never answers 504
//     itself or, with failure_mode_allow, lets it through unadmitted.
//   - response headers: the permit goes back, with the outcome of :status and the latency from
//     the CONTINUE to the response headers as the sample. Envoy sends its own local replies here
//     too (503 when the upstream cannot be reached, 504 at the route timeout), so a dead or hung
//     upstream shrinks an adaptive limit. A gRPC call asks for the response trailers
//     (mode_override) and ends there, with the outcome of its grpc-status.
//   - the stream's end: a request whose stream ends before its answer (the client left, Envoy
//     reset the stream) gives its permit back as canceled, which teaches the strategy nothing.
//
// The client is the request's source.address attribute (request_attributes in the filter), not
// the connection, which is Envoy's.
package extproc
