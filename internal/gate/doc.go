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
// Status and RetryAfter in its own protocol), a *ClientError (a malformed admission header or an
// oversized body), or the context's error (the client left while it waited). The door forwards
// an admitted request, reports how the exchange went on the Pass (Forwarding, Responded,
// Failed), and ends it with Finish, which releases the permit with the outcome the strategy learns
// from (success, ignore, dropped) and counts the request. Every metric of the pipeline is
// recorded here, labelled with the door, so a behaviour never has to be written twice.
//
// The gate knows nothing of http.ResponseWriter: it imports no transport, and its unit tests run
// on a fake clock without a server.
package gate
