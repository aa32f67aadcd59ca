// Package limit holds the adaptive concurrency-limit algorithms and the probe-free min-RTT
// estimator. Everything here is pure: a window of samples in, a new limit out. No locks, no
// clock, no metrics, no goroutines; the enforcing strategy (admission's adaptive strategy)
// gathers the windows, owns the estimator, clamps every result to [minLimit, maxLimit] and
// enforces it: floor(limit) permits always, and one more for the fractional part's share of the
// time.
//
// # Algorithms
//
// aimd, vegas, gradient2 (Netflix concurrency-limits), gradient (Envoy adaptive concurrency)
// and greed (a backlog-driven multiplicative controller after the greed backpressure
// algorithm). New(name, params) builds one; DefaultParams holds the sidecar defaults and
// FieldParams the values of the systems they come from, so the original behaviour stays one
// config block away.
//
// # Why the sidecar departs from the field's defaults
//
// A sidecar sits in front of one pod. A backend of W workers with service time S saturates at
// W requests in flight; with L = W + k in flight the k extra requests wait inside it, so the
// RTT is about S x (1 + k/W). Goodput needs L >= W, latency under 2S needs L < 2W: the whole
// useful range is [W, 2W), and for W = 4 that is 4 to 7 requests. The field's floors (Netflix's
// minimum of 20) exceed such a backend's whole capacity, so every algorithm must work from a
// limit of 1 (the adaptive block's minLimit 1, initialLimit 4, maxLimit 256 replace the field's
// 20/20/200 and Envoy's 3/1000).
//
// A second constraint comes from estimating the no-load latency without probes. MinRTT is a
// low percentile (the 10th) of recent window medians; a controller that keeps a queue standing inside the
// backend for the whole span teaches it that the queued latency is the no-load latency, and
// then climbs again, span after span. So each sidecar default makes the limit return to the
// concurrency the backend actually serves — L x MinRTT/RTT by Little's law — at least once
// per cycle, which empties the backend's queue. The closed-loop model test
// (TestModelEstimatorInLoop, TestModelDrainPreventsRatchet) checks this on 4 to 64 workers.
//
// Departures, field -> sidecar (reasons in each type's documentation):
//
//	algorithm  knob                field (source)       sidecar        why
//	all        minLimit / initial  20 / 20 (Netflix)    1 / 4          a small backend's capacity is below 20
//	aimd       rttTolerance        off (timeout 5 s)    1.1            a 20 ms backend never reaches 5 s; with
//	                                                                   backoff 0.9, 1.1 x 0.9 <= 1 drains
//	vegas      alpha/beta/thresh.  3 / 6 / 1 (x lg)     0.9 / 0.9 / 0  the field keeps 3-6 requests queued
//	vegas      drain               off (L - lg)         on (L - queue) follow a capacity drop in one window
//	vegas      dropBackoff         off (L - lg)         0.9            come down fast when the backend refuses
//	vegas      noiseBand           0                    0.15           a median 15% over MinRTT is noise, not
//	                                                                   a queue (else it drains to the floor)
//	gradient2  baseline            long (EMA)           minRTT         the EMA follows a standing queue, and
//	                                                                   Gradient2 then grows without bound
//	gradient2  rttTolerance        1.5                  1.1            1.5 lets half of W queue
//	gradient2  drain               off (smoothed)       on             only a decrease to L x MinRTT/RTT
//	                                                                   empties the queue (and in one window)
//	gradient2  dropBackoff         1 (ignored)          0.9            an overloaded backend may refuse fast
//	gradient   sqrtHeadroom        1                    0              1.25W + sqrt is +65% latency on 8
//	                                                                   workers, and a queue that never empties
//	gradient   headroom            0                    0.5            cross the allowance every few windows
//	                                                                   and drain, rather than rest on it
//	gradient   buffer/noiseBuffer  0.25 / 0             0.05 / 3       25% is a standing queue of W/4; the
//	                                                                   wait queue's lead keeps W busy instead;
//	                                                                   the noise is the medians' own error or
//	                                                                   their wander on a busy node, if larger
//	gradient   hold / holdMax      none                 50 / 300       rest at the knee, probe above it rarely;
//	                                                                   a stall is followed by a return to it
//	gradient   drain               off                  on             decrease to L x MinRTT/RTT, not to the
//	                                                                   allowance: empties the queue
//	gradient   holdWhenAppLimited  off                  on             Envoy doubles an untested limit
//	gradient   dropBackoff         1 (ignored)          0.9            an overloaded backend may refuse fast
//	greed      increase / decrease 2 / 0.5              1.25 / 0.75    doubling from W lands at 2W (+100%)
//	greed      maxShift            3                    1              a backlog of 3 on 4 workers is +75%
//	greed      decreaseOnEqual     off (hold)           on             "equal holds" keeps a queue standing
//	greed      drain               off                  on             x0.75 may cut below W: lost goodput
//	greed      floor               3                    1              a sidecar must work from 1
//	greed      noiseBand           0                    0.15           as vegas
//
// One departure sits outside the algorithms, in the limiter that enforces them
// (admission.AdaptiveConfig): a short wait queue in front of the limit, up to half the limit deep,
// each wait at most a tenth of MinRTT (config default), newest first, handing a slot over 2 ms
// before it frees (by default at most a twentieth of the latency). Envoy's filter has no queue and keeps a
// sqrt(limit) headroom inside the backend instead; the sidecar keeps its limit at the backend's
// concurrency (above) and the queue hands a freed slot to a waiter at once, so a worker does not
// idle from a completion to the next arrival. Measured against Envoy in the bench's adaptive
// scenario (bench/README.md): on 4 workers at 2x, goodput 0.94 -> 0.975 of capacity; a standing
// queue cannot form, since a wait ends at MinRTT/4 and the gradient still drains the limit.
//
// # Closed-loop model (TestModelSettle)
//
// A saturated backend of W workers and constant S: RTT = S x max(1, floor(L)/W), MinRTT = S,
// 200 windows from the initial limit 4, clamp [1, 256]. Enforced limits over the last 100
// windows (field values run with the same clamp):
//
//	algorithm   W=4 sidecar  W=8 sidecar   W=4 field        W=8 field
//	aimd        4..5         8..9          105..204 (max)   105..204 (max)
//	vegas       4..5         8..9          10               11
//	gradient2   4..5         8..9          78..157 (max)    84..164 (max)
//	gradient    4..6         8..11         7..8             13..14
//	greed       4..5         8..10         4..8             8..16
//
// After the workers halve (8 -> 4) vegas, gradient2, gradient and greed are back in [4, 8) in
// one window and aimd in two (aimd needs three to reach its usual 4..5, greed two). After the
// service time doubles, every algorithm reads the slower backend as a queue and holds the limit
// low until the old MinRTT ages out of the estimator's span (DefaultMinRTTWindows), then
// recovers within a few more windows.
//
// # Min-RTT estimation
//
// MinRTT is a ring of per-window statistics (pass the window's p50; see MinRTT for why not the
// minimum sample). Samples below MinMeaningfulRTT (100 µs) are not latencies of a real round
// trip; the enforcing limiter drops them from its windows, MinRTT.Observe ignores a window
// statistic below it, and the algorithms treat a Window.RTT or Window.MinRTT below it as
// unknown.
package limit
