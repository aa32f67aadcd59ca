// Package admission decides, at the door, which requests are served now, which wait a bounded
// time and which are refused cheaply.
//
// Every strategy is written once, as a Core: a small state machine whose decisions are functions
// of its state and the time passed in. A Core never blocks, never reads a clock and never locks;
// it admits a Ticket at once, refuses it with a *Rejection, or queues it until a later Release,
// Cancel or Advance resolves it. Two drivers run the same cores:
//
//   - Limiter (this package) serves concurrent callers in real time: Admit blocks while a ticket
//     is queued and honours the caller's context; a single timer wakes the core when something
//     queued falls due. The proxy uses it.
//   - The lab (internal/lab) calls a Core directly from one event loop under a virtual clock.
//
// An admitted request holds a Permit that is released exactly once, with an Outcome that adaptive
// strategies learn from. Refusals are *Rejection errors carrying a Reason and a Retry-After
// duration; use errors.Is with the Err* sentinels or errors.As with *Rejection.
//
// The package imports no net/http: the request attributes strategies need (priority, cost,
// deadline, client key) are plain fields of Request.
package admission
