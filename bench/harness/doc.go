// Package harness runs loadshed side by side with the proxies people would otherwise use
// (nginx limit_conn and limit_req, HAProxy maxconn + maxqueue, a plain httputil reverse proxy)
// and with no proxy at all, in front of the same synthetic backend, under the k6 scripts in
// loadtest/k6, and reports the figures of shared/reference/benchmarks.md side by side.
//
// Method: every point starts a fresh backend and a fresh target (so no backlog carries over),
// checks that a request passes end to end, then runs one k6 script (open model) against it.
// Targets are interleaved within each repeat, their order rotated between repeats, and each
// figure is the median of the valid repeats. A point where k6 could not keep its schedule
// (dropped iterations, late starts) is INVALID and not used. Servers (backend and target) are
// pinned to one CPU and k6 to the other when the machine has two; when run as root, servers
// run as an unprivileged user (65534). Everything listens on 127.0.0.1.
//
// Limits for every target come from one backend capacity C = W/S and one SLO by Little's law:
// in-flight L = C*S and queue Q = C*(SLO-S), waiting at most SLO-S.
package harness
