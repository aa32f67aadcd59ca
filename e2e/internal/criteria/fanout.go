package criteria

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// The fan-out row (issue 32): a frontend answers each user request by calling four services at
// once, each behind its own sidecar with an in-flight limit, offered twice one service's
// capacity; measured with cohorts off, then on, in the same run.

// Legs counts what became of the legs one service got, by the frontend's leg result.
type Legs struct {
	// OK: 2xx for a user request that succeeded; Wasted: 2xx for one another leg failed;
	// Refused: 429 or 503 from the service's sidecar; Failed: anything else.
	OK, Wasted, Refused, Failed float64
}

// Total counts the legs.
func (l Legs) Total() float64 { return l.OK + l.Wasted + l.Refused + l.Failed }

// Admitted counts the legs the service answered 2xx.
func (l Legs) Admitted() float64 { return l.OK + l.Wasted }

// Share is the share of its legs the service answered 2xx; NaN without legs.
func (l Legs) Share() float64 { return ratio(l.Admitted(), l.Total()) }

// Load is the load generator's own count of the user requests it sent to the frontend (over
// the measured window, its warm-up left out).
type Load struct {
	Valid         bool
	InvalidReason string
	OfferedRPS    float64
	Offered       int
	// Success counts 2xx answers, Shed 429/503 answers; Timeouts and Errors requests that got
	// no answer.
	Success, Shed, Timeouts, Errors int
}

// SuccessShare is the share of the offered requests answered 2xx.
func (l Load) SuccessShare() float64 { return ratio(float64(l.Success), float64(l.Offered)) }

// FanoutRun is one run of the fan-out row.
type FanoutRun struct {
	// Cohorts says whether the sidecars ranked requests in cohorts.
	Cohorts bool
	// UsersOK and UsersFailed count the frontend's user requests by result (its metrics).
	UsersOK, UsersFailed float64
	// Legs are the legs by service.
	Legs map[string]Legs
	// Load is the load generator's view; Measured says whether it was read.
	Load     Load
	Measured bool
	// Levels holds, by sidecar (the services' and the frontend's), its cohort admission level
	// (loadshed_cohort_level: the priority classes admitted in full plus the share of the next
	// class's ranks) as read every few seconds during the run; none without cohorts.
	Levels map[string][]float64
}

// Name is the run's name in checks and reports.
func (r FanoutRun) Name() string {
	if r.Cohorts {
		return "cohorts on"
	}
	return "cohorts off"
}

// Users counts the user requests the frontend answered.
func (r FanoutRun) Users() float64 { return r.UsersOK + r.UsersFailed }

// Success is the end-to-end success: the share of user requests every leg of which answered 2xx.
func (r FanoutRun) Success() float64 { return ratio(r.UsersOK, r.Users()) }

// LeastLeg returns the service whose legs were answered 2xx least often, and that share.
func (r FanoutRun) LeastLeg() (string, float64) {
	name, least := "", math.NaN()
	for _, svc := range sortedLegs(r.Legs) {
		if s := r.Legs[svc].Share(); name == "" || s < least {
			name, least = svc, s
		}
	}
	return name, least
}

// WastedShare is the share of the legs answered 2xx that served a failed user request.
func (r FanoutRun) WastedShare() float64 {
	var wasted, admitted float64
	for _, l := range r.Legs {
		wasted += l.Wasted
		admitted += l.Admitted()
	}
	return ratio(wasted, admitted)
}

// FanoutLimits are the fan-out row's bounds.
//
// Issue 32 asks, on a quiet machine (the bench's fan-out scenario measures it): with cohorts,
// end-to-end success at least 0.75x the least-served leg's share and 3x the independent
// sidecars', wasted legs at most 0.3 of the admitted ones. The kind row runs the same graph on
// one 2-core node shared with the control plane, Prometheus and the load generator, and its
// bounds leave room for what that node adds, while staying far from what independent shedding
// can reach:
//
//   - Even a perfect ranking is not the whole story: each service's strategy still refuses a
//     share of the requests the ranking passes (StrategyShare, 3%, so that its limit keeps
//     learning), and a release delayed past the waiting room's bound (half the mean service
//     time) is refused for capacity. Those refusals fall on the four legs independently: 3% each
//     already costs 1 - 0.97^4 = 11% of the user requests, and every stall of the shared node
//     (tens of ms, several a run) adds to it. SuccessOfLeastLeg is therefore 0.6, not 0.75;
//     independent shedding of four legs at a share s gets s^4, i.e. s^3 of the least leg
//     (0.4^3 = 0.064), ten times below it.
//   - Wasted legs are the same demand seen from the services: with four equally loaded
//     services at share s and end-to-end success f x s, a share 1 - f of the admitted legs is
//     wasted. MaxWasted is 0.4 to match 0.6; independent shedding wastes 0.8 and more (79% in
//     the measurement).
//   - OverOff is 2 where the issue asks 3: independent sidecars got 7.5% end to end in the
//     issue's run (legs at 31-38%); with cohorts the ceiling is the least leg's share, about
//     0.35-0.45 at 2x, so f = 0.6 alone already gives 0.21-0.27, about 3x. The row demands 2x
//     so that a run which meets the 0.6 bound at the low end of the leg shares, against an
//     independent run that was lucky, still passes; the bench holds the 3x.
//
// Measured on kind in CI's run of 2026-11-27 (after the defaults strategyShare automatic and
// waitFraction 1.5): without cohorts 9% end to end with every leg at 36% and 75% of the
// admitted legs wasted; with cohorts 34% end to end, 0.89x the least leg's 38%, 11% wasted, 3.7x
// the run without. (A first run with strategyShare 0.03 and waitFraction 0.5 gave 20.7%, 2.4x:
// a queue-less limit refusing only 3% of what passed kept its services at 23% of their legs.)
type FanoutLimits struct {
	SuccessOfLeastLeg float64
	OverOff           float64
	MaxWasted         float64
	// MaxLegShare: every service must have refused some of its legs in both runs (its share
	// at most this), or the run did not overload the services and shows nothing.
	MaxLegShare float64
	// MaxLost is the largest share of the offered user requests that may get no answer at all
	// (timeouts, transport errors): the frontend answers within its call timeout.
	MaxLost float64
	// LegsPerUser is the tolerance on every service getting one leg per user request (legs
	// and user requests are counted at different moments, so a few in flight at a snapshot
	// differ).
	LegsPerUser float64
}

// DefaultFanoutLimits are the bounds explained at FanoutLimits.
func DefaultFanoutLimits() FanoutLimits {
	return FanoutLimits{SuccessOfLeastLeg: 0.6, OverOff: 2, MaxWasted: 0.4, MaxLegShare: 0.8, MaxLost: 0.01, LegsPerUser: 0.02}
}

// FanoutServices is how many services the frontend calls.
const FanoutServices = 4

// FanoutChecks judges the two runs of the fan-out row: each is a valid overload of every
// service with one leg per service for each user request, cohorts were on in the second only,
// and with them end-to-end success follows the least-served leg, beats the independent run and
// wastes few legs.
func FanoutChecks(off, on FanoutRun, l FanoutLimits) []Check {
	var cs []Check
	add := func(name string, ok bool, format string, args ...any) {
		cs = append(cs, Check{Name: "fan-out: " + name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	for _, r := range []FanoutRun{off, on} {
		n := r.Name()
		ld := r.Load
		add(n+": load valid", r.Measured && ld.Valid, "measured %v, %s", r.Measured, orOK(loadErr(ld)))
		lost := ratio(float64(ld.Timeouts+ld.Errors), float64(ld.Offered))
		add(n+": every user request answered", r.Measured && lost <= l.MaxLost,
			"%d timeouts and %d errors of %d offered (%s, at most %s)", ld.Timeouts, ld.Errors, ld.Offered, frac(lost), frac(l.MaxLost))
		var bad []string
		for _, svc := range sortedLegs(r.Legs) {
			if d := ratio(r.Legs[svc].Total(), r.Users()) - 1; !(math.Abs(d) <= l.LegsPerUser) {
				bad = append(bad, fmt.Sprintf("%s %.0f legs", svc, r.Legs[svc].Total()))
			}
		}
		add(n+": one leg per service for each user request", len(r.Legs) == FanoutServices && len(bad) == 0 && r.Users() > 0,
			"%d services, %.0f user requests; off by more than %s: %v", len(r.Legs), r.Users(), frac(l.LegsPerUser), bad)
		var under []string
		for _, svc := range sortedLegs(r.Legs) {
			if s := r.Legs[svc].Share(); !(s <= l.MaxLegShare) {
				under = append(under, fmt.Sprintf("%s %s", svc, frac(s)))
			}
		}
		add(n+": every service overloaded", len(r.Legs) > 0 && len(under) == 0,
			"legs answered 2xx: %s (each at most %s); not overloaded: %v", legShares(r), frac(l.MaxLegShare), under)
		// The cohort level gauges tell that the sidecars run with cohorts exactly when asked.
		sidecars := len(r.Legs) + 1
		add(n+": cohort metrics present exactly with cohorts", (r.Cohorts && countLevels(r.Levels) == sidecars) || (!r.Cohorts && countLevels(r.Levels) == 0),
			"%d of %d sidecars expose cohort metrics", countLevels(r.Levels), sidecars)
	}
	least, share := on.LeastLeg()
	add(fmt.Sprintf("cohorts on: end-to-end success at least %.2fx the least-served leg's", l.SuccessOfLeastLeg),
		on.Success() >= l.SuccessOfLeastLeg*share,
		"%s end to end (%.0f of %.0f user requests), least-served leg %s %s: %.2fx", frac(on.Success()), on.UsersOK, on.Users(), least, frac(share), on.Success()/share)
	add(fmt.Sprintf("cohorts on: end-to-end success at least %.0fx the independent sidecars'", l.OverOff),
		on.Success() > 0 && on.Success() >= l.OverOff*off.Success(),
		"%s with cohorts against %s without: %.1fx", frac(on.Success()), frac(off.Success()), on.Success()/off.Success())
	add(fmt.Sprintf("cohorts on: wasted legs at most %s of the admitted", frac(l.MaxWasted)), on.WastedShare() <= l.MaxWasted,
		"%s wasted with cohorts (%s without)", frac(on.WastedShare()), frac(off.WastedShare()))
	return cs
}

func loadErr(l Load) error {
	if l.Valid {
		return nil
	}
	return fmt.Errorf("invalid: %s", l.InvalidReason)
}

func countLevels(levels map[string][]float64) int {
	n := 0
	for _, samples := range levels {
		if len(samples) > 0 {
			n++
		}
	}
	return n
}

func legShares(r FanoutRun) string {
	var parts []string
	for _, svc := range sortedLegs(r.Legs) {
		parts = append(parts, svc+" "+frac(r.Legs[svc].Share()))
	}
	return strings.Join(parts, ", ")
}

func sortedLegs(m map[string]Legs) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func ratio(a, b float64) float64 {
	if !(b > 0) {
		return math.NaN()
	}
	return a / b
}
