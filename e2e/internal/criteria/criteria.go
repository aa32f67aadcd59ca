// Package criteria holds what the end-to-end test demands of each admission strategy under
// overload (issue 7), as pure functions of the measured runs, so the demands themselves are
// unit-tested apart from the cluster.
package criteria

import (
	"fmt"
	"math"

	"github.com/loadshed/loadshed/bench/k6summary"
)

// The strategies the e2e installs, in the order it runs them: the ones its rows judge, not every
// strategy of the registry (internal/config), which this module does not import (e2e/go.mod
// keeps the sidecar's dependencies out); the chart rejects a name the registry does not know.
const (
	None         = "none"
	TokenBucket  = "token-bucket"
	BoundedQueue = "bounded-queue"
	Inflight     = "inflight"
	Adaptive     = "adaptive"
	CoDel        = "codel"
)

// Strategies lists every strategy the e2e covers, in run order.
var Strategies = []string{None, TokenBucket, BoundedQueue, Inflight, Adaptive, CoDel}

// Limits are the numbers the runs are judged by.
type Limits struct {
	// SLOMs: a 2xx slower than this is not goodput; admitted p99 must stay within it.
	SLOMs float64
	// MaxWaitMs is the bounded queue's maxWait.
	MaxWaitMs float64
	// MinGoodputRatio is the least goodput, as a share of capacity, that in-flight and adaptive
	// keep under overload.
	MinGoodputRatio float64
	// MaxUnloadedFactor bounds admitted p99 under overload as a multiple of the unloaded p99.
	MaxUnloadedFactor float64
	// CollapseRatio: without admission, goodput below this share of capacity has collapsed.
	CollapseRatio float64
	// ServiceMs is the service time a bounded queue's wait adds to, as the client sees it at
	// the same offered load with no queue: the p99.9 admitted latency of the in-flight run of
	// the same e2e run. On a shared node the tail of every run holds scheduling delays of tens
	// of ms; the no-queue run's p99.9 covers them, its p99 did not (measured: a bounded-queue
	// p99 10 ms over maxWait + in-flight p99 in one run of three, while its p90 sat at
	// maxWait + 20 ms in all). 0 uses the run's unloaded p99.
	ServiceMs float64
}

// DefaultLimits are issue 7's numbers for a 100 ms SLO and the e2e's bounded queue.
func DefaultLimits() Limits {
	return Limits{SLOMs: 100, MaxWaitMs: 80, MinGoodputRatio: 0.8, MaxUnloadedFactor: 3, CollapseRatio: 0.25}
}

// Alert is what Prometheus showed of the high-shed alert for one release.
type Alert struct {
	// Fired: the alert was seen firing while the overload ran; FiredAfterS counts from the
	// start of the overload.
	Fired       bool    `json:"fired"`
	FiredAfterS float64 `json:"fired_after_s"`
	// Resolved: after the overload it was seen inactive again; ResolvedAfterS counts from the
	// end of the overload.
	Resolved       bool    `json:"resolved"`
	ResolvedAfterS float64 `json:"resolved_after_s"`
	// Others are other alerts seen firing for the release.
	Others []string `json:"others,omitempty"`
}

// Outcome is everything measured for one strategy.
type Outcome struct {
	Strategy string
	// Unloaded is the run at a quarter of capacity, Overload the one at 3x.
	Unloaded, Overload *k6summary.Summary
	Alert              Alert
	// Attempts counts the measurements made; runs k6 declared invalid, and runs that missed
	// only timed checks (Remeasure), are measured again.
	Attempts int
	// Earlier are the attempts before this one that missed timed checks, for the report.
	Earlier []Earlier
	// CPU is the mean CPU cores each container used during the overload ("k6", and the
	// release pod's "loadshed" sidecar and "app"), from the kubelet; informational.
	CPU map[string]float64
	// Limit is the adaptive limit over the overload run, from Prometheus (rows whose strategy
	// has one); informational: it tells a limit that rose from a node that stalled.
	Limit *LimitRange
	// EnvoyExtProc holds the pod's Envoy's ext_proc counters after the overload (Envoy rows
	// only): streams_started, message_timeouts, failure_mode_allowed and the rest of
	// http.<prefix>.ext_proc.*, by their last name part.
	EnvoyExtProc map[string]int64
}

// Check is one demand and whether the run met it.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	// Timed marks a demand on goodput or admitted latency: the node's scheduling decides it
	// as well as the strategy (see Remeasure).
	Timed bool `json:"timed,omitempty"`
}

// LimitRange is the least, mean and largest value of the adaptive limit over a run, across the
// Prometheus scrapes of the release's pods in it.
type LimitRange struct {
	Min  float64 `json:"min"`
	Mean float64 `json:"mean"`
	Max  float64 `json:"max"`
}

// Earlier is an attempt that was measured again because it missed timed checks only.
type Earlier struct {
	GoodputRatio  *float64    `json:"goodput_ratio"`
	AdmittedP99Ms *float64    `json:"admitted_p99_ms"`
	UnloadedP99Ms *float64    `json:"unloaded_p99_ms"`
	Missed        []string    `json:"missed"`
	Limit         *LimitRange `json:"adaptive_limit,omitempty"`
}

// Remeasure returns the failed checks when every one of them is timed, and nil otherwise (all
// passed, or a failure the node's timing cannot explain). The e2e measures such a row once
// more and keeps the second run's verdict, with the first in the report: the kind node shares
// two cores with k6, the backend and the control plane, and a stall of a few hundred ms inside
// a 30 s run moves a tail that sits within 1.5x of its bound. Measured before issue 35, when
// the adaptive limit kept W x 1.25 in flight: across four full runs adaptive's p99 was 47, 61,
// 58 and 96 ms against 3x unloaded bounds of 69-80 ms, and the run with 96 had every other
// row's tail up by 20-40% as well. Only the in-flight rows' checks are timed now (Judge). A row
// that misses twice fails.
func Remeasure(checks []Check) []string {
	var missed []string
	for _, c := range checks {
		if c.OK {
			continue
		}
		if !c.Timed {
			return nil
		}
		missed = append(missed, c.Name)
	}
	return missed
}

// EarlierOf records o as an earlier attempt that missed the named checks.
func EarlierOf(o Outcome, missed []string) Earlier {
	e := Earlier{Missed: missed, Limit: o.Limit}
	if o.Overload != nil {
		e.GoodputRatio, e.AdmittedP99Ms = o.Overload.GoodputRatio, o.Overload.AdmittedMs.P99
	}
	if o.Unloaded != nil {
		e.UnloadedP99Ms = o.Unloaded.AdmittedMs.P99
	}
	return e
}

// Failed returns the names of the checks that did not hold.
func Failed(checks []Check) []string {
	var out []string
	for _, c := range checks {
		if !c.OK {
			out = append(out, c.Name)
		}
	}
	return out
}

// MinSentShare is the share of its scheduled requests a late baseline run must have sent (see
// Usable).
const MinSentShare = 0.95

// Usable says whether both runs of an outcome can be judged, or why not: a run in which k6 did
// not keep its schedule says nothing about a strategy. One exception: the overload run of the
// unprotected baseline (None) may start its iterations late, as long as it sent at least
// MinSentShare of the scheduled requests. A late generator offers less load, never more, so a
// collapse it still shows is shown a fortiori; and it is late there precisely because every
// request waits for the client timeout, which holds its virtual users.
func Usable(o Outcome) error {
	for _, r := range []*k6summary.Summary{o.Unloaded, o.Overload} {
		if r == nil {
			return fmt.Errorf("a run is missing")
		}
		if err := runUsable(o.Strategy, r, r == o.Overload); err != nil {
			return err
		}
	}
	return nil
}

func runUsable(strategy string, r *k6summary.Summary, overload bool) error {
	err := r.Usable()
	if err == nil || strategy != None || !overload {
		return err
	}
	scheduled := r.OfferedRPS * r.DurationS
	if !(scheduled > 0) || float64(r.Requests) < MinSentShare*scheduled {
		return fmt.Errorf("%w; sent %d of %.0f scheduled requests, fewer than %g", err, r.Requests, scheduled, MinSentShare)
	}
	return nil
}

// Judge returns every check issue 7 asks of the outcome's strategy.
func Judge(o Outcome, l Limits) []Check {
	var cs []Check
	add := func(name string, ok bool, format string, args ...any) {
		cs = append(cs, Check{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	timed := func(name string, ok bool, format string, args ...any) {
		cs = append(cs, Check{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...), Timed: true})
	}
	if o.Unloaded == nil || o.Overload == nil {
		add("measured", false, "unloaded run %v, overload run %v", o.Unloaded != nil, o.Overload != nil)
		return cs
	}
	u, s := o.Unloaded, o.Overload
	for _, r := range []*k6summary.Summary{u, s} {
		err := runUsable(o.Strategy, r, r == s)
		add(r.Script+" run valid", err == nil, "%v", orOK(err))
	}
	add("unloaded: every request 2xx", u.Requests > 0 && u.OK == u.Requests,
		"%d of %d requests 2xx (shed %d, timeouts %d, other %d)", u.OK, u.Requests, u.Shed, u.Timeouts, u.Unexpected)

	p99 := k6summary.Value(s.AdmittedMs.P99)
	unloadedP99 := k6summary.Value(u.AdmittedMs.P99)
	ratio := k6summary.Value(s.GoodputRatio)

	if o.Strategy == None {
		add("admitted p99 exceeds the SLO", p99 > l.SLOMs, "p99 %s ms vs SLO %g ms", ms(p99), l.SLOMs)
		add("goodput collapses", !(ratio >= l.CollapseRatio), "goodput %s of capacity, collapse below %g", frac(ratio), l.CollapseRatio)
		add("nothing shed", s.Shed == 0, "%d refusals", s.Shed)
		add("high-shed alert stays quiet", !o.Alert.Fired, "fired %v", o.Alert.Fired)
		return cs
	}

	// Every strategy that admits sheds the excess honestly and only the excess.
	add("sheds under overload", s.Shed > 0, "%d refusals (%s of requests)", s.Shed, frac(s.ShedShare))
	cov := k6summary.Value(s.RetryAfterCoverage)
	add("Retry-After on every refusal", cov == 1, "coverage %s", frac(cov))
	add("no timeouts or errors", s.Timeouts == 0 && s.Unexpected == 0, "timeouts %d, unexpected %d", s.Timeouts, s.Unexpected)
	add("high-shed alert fires during the overload", o.Alert.Fired, "fired %v after %.0f s", o.Alert.Fired, o.Alert.FiredAfterS)
	add("high-shed alert resolves after the overload", o.Alert.Resolved, "resolved %v after %.0f s", o.Alert.Resolved, o.Alert.ResolvedAfterS)

	switch o.Strategy {
	case TokenBucket:
		n429 := s.ShedByStatus["429"]
		add("refusals are 429", n429 > 0 && n429 == s.Shed, "%d of %d refusals are 429", n429, s.Shed)
	case BoundedQueue:
		// Service time as the client sees it: the backend's 20 ms plus the path through the
		// Service and the sidecar, measured with no queue at the same load (or at rest).
		service, from := l.ServiceMs, "no-queue p99.9 at the same load"
		if !(service > 0) {
			service, from = unloadedP99, "unloaded p99"
		}
		bound := l.MaxWaitMs + service
		add("admitted p99 within maxWait + service", p99 <= bound,
			"p99 %s ms vs maxWait %g ms + service %s ms (%s) = %s ms", ms(p99), l.MaxWaitMs, ms(service), from, ms(bound))
	case Inflight, Adaptive:
		// The adaptive rows are measured once (a miss of theirs fails at once): since issue 35
		// their limit sits on the backend's workers and their p99 near the unloaded one, far
		// inside these bounds. The in-flight row's fixed limit keeps a miss measured again.
		check := timed
		if o.Strategy == Adaptive {
			check = add
		}
		check(fmt.Sprintf("goodput >= %g of capacity", l.MinGoodputRatio), ratio >= l.MinGoodputRatio,
			"goodput %.1f rps = %s of capacity", s.GoodputRPS, frac(ratio))
		check("admitted p99 within the SLO", p99 <= l.SLOMs, "p99 %s ms vs SLO %g ms", ms(p99), l.SLOMs)
		check(fmt.Sprintf("admitted p99 <= %gx unloaded p99", l.MaxUnloadedFactor), p99 <= l.MaxUnloadedFactor*unloadedP99,
			"p99 %s ms vs %g x %s ms = %s ms", ms(p99), l.MaxUnloadedFactor, ms(unloadedP99), ms(l.MaxUnloadedFactor*unloadedP99))
	}
	return cs
}

// SteadyChecks judges a run at steady load below capacity during which pods were replaced:
// no request may fail in any way (refused, timed out, errored or dropped).
func SteadyChecks(name string, s *k6summary.Summary) []Check {
	checks := steadyRun(name, s)
	if s == nil {
		return checks
	}
	failures := s.Requests - s.OK
	return append(checks, Check{Name: name + ": no failed request", OK: s.Requests > 0 && failures == 0 && s.DroppedIterations == 0,
		Detail: fmt.Sprintf("%d requests, %d not 2xx (shed %d, timeouts %d, other %s), %d dropped iterations",
			s.Requests, failures, s.Shed, s.Timeouts, s.UnexpectedDetail(), s.DroppedIterations)})
}

// steadyRun is the first check of every steady-load row: "measured" failed when there is no
// summary, else whether the run is valid.
func steadyRun(name string, s *k6summary.Summary) []Check {
	if s == nil {
		return []Check{{Name: name + ": measured", OK: false, Detail: "no summary"}}
	}
	err := s.Usable()
	return []Check{{Name: name + ": run valid", OK: err == nil, Detail: fmt.Sprint(orOK(err))}}
}

func orOK(err error) any {
	if err == nil {
		return "ok"
	}
	return err
}

func ms(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.1f", v)
}

func frac(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", v*100)
}
