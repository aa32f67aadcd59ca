package status

import (
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

// num is a figure in the JSON: null when it is unknown (NaN), such as a rate before the second
// sample or a quantile without observations.
type num float64

func (n num) MarshalJSON() ([]byte, error) {
	v := float64(n)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, v, 'g', -1, 64), nil
}

// round keeps a few decimals of v (NaN stays NaN): the page shows no more.
func round(v float64, decimals int) num {
	p := math.Pow10(decimals)
	return num(math.Round(v*p) / p)
}

// counts are the counted requests of a route, a door or all: totals since the proxy started (as
// /metrics has them) and rates per second over the window.
type counts struct {
	AdmittedRate      num `json:"admittedPerSecond"`
	RefusedRate       num `json:"refusedPerSecond"`
	UpstreamErrorRate num `json:"upstreamErrorsPerSecond"`
	CanceledRate      num `json:"canceledPerSecond"`
	Admitted          num `json:"admittedTotal"`
	Refused           num `json:"refusedTotal"`
	UpstreamErrors    num `json:"upstreamErrorsTotal"`
	Canceled          num `json:"canceledTotal"`
}

// gauges are the admission state and the latency of admitted requests over the window.
type gauges struct {
	Limit    num `json:"limit"`
	Inflight num `json:"inflight"`
	Queued   num `json:"queued"`
	P50      num `json:"p50Seconds"`
	P99      num `json:"p99Seconds"`
}

type stageView struct {
	Strategy string `json:"strategy"`
	Limit    num    `json:"limit"`
	Inflight num    `json:"inflight"`
	Queued   num    `json:"queued"`
}

type routeView struct {
	Route    string      `json:"route"`
	Strategy string      `json:"strategy"`
	Stages   []stageView `json:"stages"`
	gauges
	counts
}

type doorView struct {
	Door string `json:"door"`
	counts
}

type reasonView struct {
	Reason string `json:"reason"`
	Rate   num    `json:"perSecond"`
	Total  num    `json:"total"`
}

// history holds one point per sample, oldest first; T is each point's time in seconds before the
// latest sample (0 for the latest).
type history struct {
	T              []num `json:"t"`
	Admitted       []num `json:"admittedPerSecond"`
	Refused        []num `json:"refusedPerSecond"`
	UpstreamErrors []num `json:"upstreamErrorsPerSecond"`
	P50            []num `json:"p50Seconds"`
	P99            []num `json:"p99Seconds"`
	Limit          []num `json:"limit"`
	Inflight       []num `json:"inflight"`
	Queued         []num `json:"queued"`
}

// view is the JSON the page reads (status.json). Its limit, strategy and the head of the page
// are the default route's; in flight, queued, the rates and the quantiles are over all routes.
type view struct {
	Samples  int          `json:"samples"`
	Time     int64        `json:"time"` // the latest sample, Unix milliseconds
	Interval num          `json:"intervalSeconds"`
	Window   num          `json:"windowSeconds"` // what the rates and quantiles span
	Draining bool         `json:"draining"`
	Strategy string       `json:"strategy"`
	Totals   routeView    `json:"totals"`
	Reasons  []reasonView `json:"reasons"`
	Routes   []routeView  `json:"routes"`
	Doors    []doorView   `json:"doors"`
	History  history      `json:"history"`
}

// point is what the chart shows of one sample: rates and quantiles since the sample before it.
type point struct {
	at                                time.Time
	admitted, refused, upstreamErrors float64
	p50, p99, limit, inflight, queued float64
}

// defaultRoute is the route of the top-level admission block.
const defaultRoute = "default"

// delta is what counter k grew by from old to cur (all of cur when it went down: it restarted).
func delta(cur, old *snapshot, k counterKey) float64 {
	d := cur.counters[k] - old.counters[k]
	if d < 0 {
		return cur.counters[k]
	}
	return d
}

// sumOver adds up, over the counters of cur that match, their values and their growth since old.
func sumOver(cur, old *snapshot, match func(counterKey) bool) (total, grown float64) {
	for k, v := range cur.counters {
		if match(k) {
			total += v
			grown += delta(cur, old, k)
		}
	}
	return total, grown
}

// countsOf sums the counters that match, with rates over dt seconds (NaN when dt is 0).
func countsOf(cur, old *snapshot, dt float64, match func(counterKey) bool) counts {
	var c counts
	for _, f := range []struct {
		kind        string
		total, rate *num
	}{
		{kindAdmitted, &c.Admitted, &c.AdmittedRate},
		{kindRefused, &c.Refused, &c.RefusedRate},
		{kindUpstreamErrors, &c.UpstreamErrors, &c.UpstreamErrorRate},
		{kindCanceled, &c.Canceled, &c.CanceledRate},
	} {
		total, grown := sumOver(cur, old, func(k counterKey) bool { return k.kind == f.kind && match(k) })
		*f.total = num(total)
		*f.rate = rate(grown, dt)
	}
	return c
}

func rate(grown, dt float64) num {
	if dt <= 0 {
		return num(math.NaN())
	}
	return round(grown/dt, 3)
}

// latency merges the growth of the duration histograms of the routes that match, from old to
// cur.
func latency(cur, old *snapshot, match func(route string) bool) histogram {
	var h histogram
	routes := make([]string, 0, len(cur.durations))
	for r := range cur.durations {
		routes = append(routes, r)
	}
	sort.Strings(routes)
	for _, r := range routes {
		if match(r) {
			h = h.plus(cur.durations[r].minus(old.durations[r]))
		}
	}
	return h
}

// routeGauges are a route's limit (its first stage that has one), in flight (its busiest stage:
// an admitted request holds every stage's permit) and queued (a waiting request waits at one
// stage at a time).
func routeGauges(s *snapshot, route string) (limit, inflight, queued float64, stages []stageView) {
	limit = math.NaN()
	for _, st := range s.stages {
		if st.route != route {
			continue
		}
		if math.IsNaN(limit) {
			limit = st.limit
		}
		inflight = max(inflight, st.inflight)
		queued += st.queued
		stages = append(stages, stageView{Strategy: st.strategy, Limit: num(st.limit), Inflight: num(st.inflight), Queued: num(st.queued)})
	}
	return limit, inflight, queued, stages
}

// routesOf lists every route the snapshot knows, the default one first.
func routesOf(s *snapshot) []string {
	seen := map[string]bool{}
	for _, st := range s.stages {
		seen[st.route] = true
	}
	for r := range s.strategies {
		seen[r] = true
	}
	for r := range s.durations {
		seen[r] = true
	}
	for k := range s.counters {
		seen[k.route] = true
	}
	out := make([]string, 0, len(seen))
	for r := range seen {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		if (out[i] == defaultRoute) != (out[j] == defaultRoute) {
			return out[i] == defaultRoute
		}
		return out[i] < out[j]
	})
	return out
}

// doorsOf lists every door the snapshot's counters name, sorted.
func doorsOf(s *snapshot) []string {
	seen := map[string]bool{}
	for k := range s.counters {
		seen[k.door] = true
	}
	out := make([]string, 0, len(seen))
	for d := range seen {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// reasonsOf lists the refusal reasons that the counters name (no other: the page shows nothing
// /metrics does not): those the admission core knows in its order, then any other, sorted.
func reasonsOf(s *snapshot) []string {
	named := map[string]bool{}
	for k := range s.counters {
		if k.kind == kindRefused {
			named[k.reason] = true
		}
	}
	var out, more []string
	for _, r := range admission.AllReasons {
		if named[string(r)] {
			out = append(out, string(r))
			delete(named, string(r))
		}
	}
	for r := range named {
		more = append(more, r)
	}
	sort.Strings(more)
	return append(out, more...)
}

// pointOf is the chart's point for cur, the sample after prev (nil: the first sample).
func pointOf(cur, prev *snapshot) point {
	nan := math.NaN()
	p := point{at: cur.at, admitted: nan, refused: nan, upstreamErrors: nan, p50: nan, p99: nan, limit: nan}
	var inflight, queued float64
	for _, r := range routesOf(cur) {
		l, i, q, _ := routeGauges(cur, r)
		if r == defaultRoute {
			p.limit = l
		}
		inflight += i
		queued += q
	}
	p.inflight, p.queued = inflight, queued
	if prev == nil {
		return p
	}
	dt := cur.at.Sub(prev.at).Seconds()
	if dt <= 0 {
		return p
	}
	c := countsOf(cur, prev, dt, func(counterKey) bool { return true })
	p.admitted, p.refused, p.upstreamErrors = float64(c.AdmittedRate), float64(c.RefusedRate), float64(c.UpstreamErrorRate)
	h := latency(cur, prev, func(string) bool { return true })
	p.p50, p.p99 = h.quantile(0.5), h.quantile(0.99)
	return p
}

// buildView is the JSON view of the latest snapshot cur, with rates and quantiles since old (the
// oldest snapshot of the window; cur itself when there is only one) and the chart's points.
func buildView(cur, old *snapshot, points []point, samples int, interval time.Duration) view {
	dt := cur.at.Sub(old.at).Seconds()
	v := view{
		Samples:  samples,
		Time:     cur.at.UnixMilli(),
		Interval: num(interval.Seconds()),
		Window:   round(dt, 3),
		Draining: cur.draining,
		Strategy: cur.routeStrategy(defaultRoute),
		Reasons:  []reasonView{},
		Routes:   []routeView{},
		Doors:    []doorView{},
	}
	all := func(counterKey) bool { return true }
	v.Totals.Limit = num(math.NaN())
	var inflight, queued float64
	for _, r := range routesOf(cur) {
		limit, in, q, stages := routeGauges(cur, r)
		inflight += in
		queued += q
		h := latency(cur, old, func(route string) bool { return route == r })
		rv := routeView{
			Route: r, Strategy: cur.routeStrategy(r), Stages: stages,
			gauges: gauges{Limit: num(limit), Inflight: num(in), Queued: num(q), P50: round(h.quantile(0.5), 6), P99: round(h.quantile(0.99), 6)},
			counts: countsOf(cur, old, dt, func(k counterKey) bool { return k.route == r }),
		}
		if rv.Stages == nil {
			rv.Stages = []stageView{}
		}
		if r == defaultRoute {
			v.Totals.Limit = num(limit)
		}
		v.Routes = append(v.Routes, rv)
	}
	h := latency(cur, old, func(string) bool { return true })
	v.Totals.Route, v.Totals.Strategy, v.Totals.Stages = "", v.Strategy, []stageView{}
	v.Totals.Inflight, v.Totals.Queued = num(inflight), num(queued)
	v.Totals.P50, v.Totals.P99 = round(h.quantile(0.5), 6), round(h.quantile(0.99), 6)
	v.Totals.counts = countsOf(cur, old, dt, all)
	for _, d := range doorsOf(cur) {
		v.Doors = append(v.Doors, doorView{Door: d, counts: countsOf(cur, old, dt, func(k counterKey) bool { return k.door == d })})
	}
	for _, r := range reasonsOf(cur) {
		total, grown := sumOver(cur, old, func(k counterKey) bool { return k.kind == kindRefused && k.reason == r })
		v.Reasons = append(v.Reasons, reasonView{Reason: r, Rate: rate(grown, dt), Total: num(total)})
	}
	hs := &v.History
	for _, p := range points {
		hs.T = append(hs.T, round(p.at.Sub(cur.at).Seconds(), 1))
		hs.Admitted = append(hs.Admitted, num(p.admitted))
		hs.Refused = append(hs.Refused, num(p.refused))
		hs.UpstreamErrors = append(hs.UpstreamErrors, num(p.upstreamErrors))
		hs.P50 = append(hs.P50, round(p.p50, 6))
		hs.P99 = append(hs.P99, round(p.p99, 6))
		hs.Limit = append(hs.Limit, num(p.limit))
		hs.Inflight = append(hs.Inflight, num(p.inflight))
		hs.Queued = append(hs.Queued, num(p.queued))
	}
	return v
}
