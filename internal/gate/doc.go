// Package gate is the admission pipeline every front door of the sidecar shares: the HTTP reverse
// proxy (HTTP/1.1 and HTTP/2, gRPC on the same port) and Envoy's external processor.
//
// A door turns its protocol into a Request of plain values (method, path, a header getter, the
// peer's address, the announced body size) and calls Admit, which runs, in order:
//
//	route match -> request spec (priority, cost, deadline, client key) -> body size ->
//	client limits -> deadline check -> strategy (admit, queue or refuse) -> permit
//
// and answers with a *Pass (admitted) or an error: a *Refusal (shed: the door answers with its
// Status, Headers and Body in its own protocol), a *ClientError (a malformed admission header or
// an oversized body), or the context's error (the client left while it waited).
//
// A Pass is the whole exchange contract, and it is narrow: the door forwards the request with
// the header changes Forward gives, reports the answer's headers with Answered (which says what
// to do with the rest: a body, a stream, a gRPC call's trailers for CallEnded), reports failures
// (Failed, BodyFailed, Abort), and ends it with Finish, which releases the permit with the outcome
// the strategy learns from (success, ignore, dropped) and counts the request. What an answer
// means, the refusal text, when a gRPC call is taken for a stream and when a permit nobody
// answers for goes back are decided here, once, for every door; the doors (internal/door/...)
// translate their protocol and nothing more. Every metric of the pipeline is recorded here,
// labelled with the door (DoorKind) and the outcome (Outcome).
//
// The gate knows nothing of http.ResponseWriter: it imports no transport, and its unit tests run
// on a fake clock without a server.
package gate
