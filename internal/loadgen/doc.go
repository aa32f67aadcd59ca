// Package loadgen is an open-model HTTP (and gRPC) load generator for measuring overload
// behaviour.
//
// Request i is sent at the time its Schedule gives it, whether or not earlier requests have
// finished, and its latency is measured from that scheduled time: if the generator itself starts
// a request late, the delay counts against the system under test instead of hiding it. Requests
// that start more than Config.LateTolerance after their scheduled time, or cannot start at all
// because the in-flight cap is reached, are late starts; a run with more late starts than
// Config.LateStartBudget allows is marked invalid (Result.Valid false, with a reason), so callers
// report it instead of trusting its figures.
//
// Every run is bounded: each request has a deadline of its scheduled time plus Config.Timeout,
// so a run ends at most one timeout after its schedule, and the number of requests in flight is
// capped (Config.MaxInFlight, itself capped by HardMaxInFlight).
//
// Result is a plain, JSON-serialisable summary: counts by outcome and status code, goodput (2xx
// answered within the SLO), refusals (429, 503 and 403 answers) and Retry-After coverage,
// nearest-rank latency percentiles of admitted answers, a per-second series by scheduled time and
// a per-tag breakdown. WriteTable prints several results side by side.
//
// With Config.GRPC the requests are gRPC calls of the synthetic backend's
// loadshed.backend.v1.Backend/Work over h2c, on the same schedule, timing and result: status
// codes are then grpc-status values, refusals are loadshed's trailers-only answers marked with
// x-loadshed-reason (counted by grpc-status), and grpc-retry-pushback-ms takes the place of
// Retry-After. See GRPC.
package loadgen
