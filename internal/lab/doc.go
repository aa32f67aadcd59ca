// Package lab is a deterministic discrete-event simulator that runs the real admission
// strategies (package admission's Cores) under a virtual clock, so an operator can predict what a
// policy does to latency and rejections before deploying it.
//
// # The model
//
// Requests arrive by an arrival process (even, Poisson, ramp, spike or a recorded trace; see
// ParseArrivals) and are offered to the strategy's Core. An admitted request goes to a backend of
// Servers workers (0: unlimited) with service times from internal/slowtail, the sampler the
// synthetic backend uses; beyond Servers busy workers, admitted requests wait in one unbounded
// FIFO inside the backend, which finishes work even for clients that have gone. When the backend
// answers, the permit is released with admission.Success.
//
// A Hop models what a request pays beyond the service-time model on its way through the proxy:
// a path hop (a constant or samples measured by calibration) between admission and the backend,
// which holds the permit but no worker, and a worker overhead added to every service time, which
// lowers the backend's capacity to Servers / (mean + overhead). The zero Hop is none, as in the
// published scenario. Scenario.Speed runs the backend and the hop faster or slower: a prediction
// near capacity is reported as a band, the same run at capacity -5% and +5% (see CompareAll).
//
// Clients may time out: a client that gives up while its request is queued in the strategy
// withdraws it (Core.Cancel); one that gives up after admission counts as a timeout, the proxy
// releases the permit at once (admission.Ignore) and the backend keeps working. The proxy's
// upstream timeout answers 504 and releases the permit as admission.Dropped. Clients may retry
// refusals and timeouts with exponential backoff, so retry storms can be modelled; every request
// is retried at most Retry.Max times, which bounds every run.
//
// The lab never reimplements a strategy: it calls Offer, Release, Cancel and Advance of the
// Core and processes the tickets the core resolves (admission.Events). Time is integer
// nanoseconds from Base. At the same instant events run in this order: completions (Release),
// client and upstream timeouts, the core's due work (Advance, when the virtual clock reaches
// Core.Wake), then arrivals. So a slot or place freed at exactly the instant of an arrival is free
// for that arrival. Events at the same instant and of the same kind run in the order they were
// scheduled, and all randomness comes from PCG generators seeded from Scenario.Seed: the same
// scenario and seed always give the same output, byte for byte.
//
// # What is reported
//
// Per run (Summary, one row of summary.csv): incoming attempts, accepted, rejected, acceptance %,
// p50 and p99 of admitted latency, and max buffered. Admitted latency is measured from an
// attempt's arrival until its client had the answer or gave up (queue wait + backend wait +
// service, or the timeout). Percentiles are by nearest rank: the value at rank ceil(p/100 * n) of
// the sorted latencies. Max buffered is the most requests the strategy held at once
// (admission.Stats.Buffered: in flight under its limit plus waiting; for a leaky bucket the water
// level rounded up; a token bucket holds none). Goodput is the number of requests answered with
// success within the SLO of their first attempt.
//
// Per elapsed second (Second, one row of snapshots.csv): elapsed_s = 1 holds [0 s, 1 s).
// accepted and rejected count attempts in the second they arrive; p50_ms and p99_ms are the
// nearest-rank percentiles of admitted attempts that arrived in that second (empty when none
// did); throughput_rps is the number of successful answers that finished in that second; and
// max_buffered is the most requests the strategy held at once during it. Rows run from the first
// second to the one holding the run's last event, so the drain after the last arrival shows.
//
// # A call graph
//
// RunFanout models a frontend whose user requests fan out to N services at once (issue 32):
// every leg is offered to its service's own core (optionally wrapped in admission.NewCohorts,
// every leg of a user request carrying the same rank) in front of its own backend, modelled as
// above, and the user request succeeds only if every leg answers 2xx within the leg timeout.
// It reports end-to-end success, each leg's share, wasted legs (2xx legs of failed user
// requests) over admitted legs and the p99 of successful user requests; CompareFanout runs
// independent sidecars against cohorts at several loads and judges a live half (FanoutLive).
//
// # The published comparison
//
// BackpressureCases maps the five rows of the project's deterministic comparison (1000 requests
// one every 5 ms, 100 rps target, 10 ms service) onto the strategies; `lab backpressure`
// reproduces the published table exactly, and a test compares a fresh run with the golden CSVs
// under testdata/golden byte for byte.
package lab
