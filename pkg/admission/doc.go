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
//     queued falls due. The proxy uses it (through internal/gate).
//   - The lab (internal/lab) calls a Core directly from one event loop under a virtual clock.
//
// An admitted request holds a Permit that is released exactly once, with an Outcome that adaptive
// strategies learn from. Refusals are *Rejection errors carrying a Reason and a Retry-After
// duration; use errors.Is with the Err* sentinels or errors.As with *Rejection. Configurations
// are plain structs whose Validate reports every problem as a *ConfigError (package field),
// each naming its field.
//
// The package imports no net/http: the request attributes strategies need (priority, cost,
// deadline, client key) are plain fields of Request.
//
// # Adding a strategy
//
// A strategy is one file here and one entry in the proxy's strategy registry; everything else
// that lists strategies reads that registry or is generated from it. The files a new strategy
// "x" touches:
//
//  1. pkg/admission/x.go: XConfig with Validate (problems named by field), NewX returning a
//     Core, and the core itself, including maxQueueWait (and the waitEstimator if it queues);
//     with a test on the fake clock (admissiontest) and a case in FuzzCore.
//  2. internal/config: the settings block type (validate delegating to XConfig.Validate, build,
//     concurrencyHint) in blocks.go, and its entry in the registry table (registry.go): name,
//     block key, docs line, defaults, how it is sized for a known backend.
//  3. deploy/helm/loadshed: its block in values.yaml and its definition in values.schema.json;
//     ci/x-values.yaml.
//  4. docs/strategies.md: its paragraph under "Choosing a strategy".
//
// Generated from the registry (go generate in deploy/): the schema's strategy enum and chain
// stage, the chart's strategy helpers and its values table. The lab, the live tests, the demo
// and the bench take every strategy from the registry. Two tests walk the registry and fail
// until each piece exists (deploy's TestEveryStrategyIsCoveredEverywhere, the lab's
// TestEveryStrategyRunsInTheLab).
package admission
