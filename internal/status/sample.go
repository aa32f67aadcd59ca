package status

import (
	"math"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/loadshed/loadshed/internal/metrics"
)

// The metric families the page reads; everything it shows is derived from these.
const (
	famRequests = "loadshed_requests_total"
	famShed     = "loadshed_shed_total"
	famDuration = "loadshed_request_duration_seconds"
	famInflight = "loadshed_inflight"
	famQueue    = "loadshed_queue_depth"
	famLimit    = "loadshed_limit"
	famDraining = "loadshed_draining"
)

// Kinds of counted requests, derived from loadshed_requests_total's outcome and from
// loadshed_shed_total.
const (
	kindAdmitted       = "admitted"        // forwarded: outcome success, client_error, upstream_error or upstream_timeout
	kindUpstreamErrors = "upstream_errors" // outcome upstream_error or upstream_timeout (also admitted)
	kindCanceled       = "canceled"        // outcome canceled: the client left first
	kindRefused        = "refused"         // loadshed_shed_total, by reason
)

// Bounds on what one snapshot holds, whatever the registry holds: the label values come from the
// configuration (routes) and from fixed sets (doors, reasons), so these are never reached in
// practice, but a snapshot's size is bounded all the same.
const (
	maxCounters = 4096
	maxRoutes   = 256
)

// counterKey names one counter series the page follows.
type counterKey struct {
	route, door, kind, reason string
}

// stage is one strategy stage's gauges (loadshed_inflight, _queue_depth, _limit).
type stage struct {
	route, strategy         string
	inflight, queued, limit float64 // limit NaN: none reported
	hasInflight, hasQueued  bool
}

// histogram is a cumulative histogram: counts[i] requests took at most bounds[i] seconds;
// the last bound is +Inf.
type histogram struct {
	bounds, counts []float64
}

// snapshot is what one gathering of the registry says, reduced to what the page shows.
type snapshot struct {
	at         time.Time
	counters   map[counterKey]float64
	durations  map[string]histogram // by route
	stages     []stage              // sorted by route, in the registry's stage order
	strategies map[string]string    // route -> its policy's strategy (loadshed_requests_total)
	draining   bool
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// reduce turns gathered metric families into a snapshot taken at at.
func reduce(at time.Time, mfs []*dto.MetricFamily) *snapshot {
	s := &snapshot{at: at, counters: map[counterKey]float64{}, durations: map[string]histogram{}, strategies: map[string]string{}}
	add := func(k counterKey, v float64) {
		if _, ok := s.counters[k]; !ok && len(s.counters) >= maxCounters {
			return
		}
		s.counters[k] += v
	}
	stageAt := map[[2]string]int{}
	stageOf := func(m *dto.Metric) *stage {
		k := [2]string{label(m, "route"), label(m, "strategy")}
		i, ok := stageAt[k]
		if !ok {
			if len(s.stages) >= maxRoutes*4 {
				return nil
			}
			i = len(s.stages)
			stageAt[k] = i
			s.stages = append(s.stages, stage{route: k[0], strategy: k[1], limit: math.NaN()})
		}
		return &s.stages[i]
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case famRequests:
			for _, m := range mf.GetMetric() {
				route, door, v := label(m, "route"), label(m, "door"), m.GetCounter().GetValue()
				if _, ok := s.strategies[route]; !ok && len(s.strategies) < maxRoutes {
					s.strategies[route] = label(m, "strategy")
				}
				switch label(m, "outcome") {
				case metrics.OutcomeSuccess, metrics.OutcomeClientError:
					add(counterKey{route: route, door: door, kind: kindAdmitted}, v)
				case metrics.OutcomeUpstreamError, metrics.OutcomeUpstreamTimeout:
					add(counterKey{route: route, door: door, kind: kindAdmitted}, v)
					add(counterKey{route: route, door: door, kind: kindUpstreamErrors}, v)
				case metrics.OutcomeCanceled:
					add(counterKey{route: route, door: door, kind: kindCanceled}, v)
				}
			}
		case famShed:
			for _, m := range mf.GetMetric() {
				add(counterKey{route: label(m, "route"), door: label(m, "door"), kind: kindRefused, reason: label(m, "reason")}, m.GetCounter().GetValue())
			}
		case famDuration:
			for _, m := range mf.GetMetric() {
				if len(s.durations) < maxRoutes {
					s.durations[label(m, "route")] = cumulative(m.GetHistogram())
				}
			}
		case famInflight, famQueue, famLimit:
			for _, m := range mf.GetMetric() {
				st := stageOf(m)
				if st == nil {
					continue
				}
				v := m.GetGauge().GetValue()
				switch mf.GetName() {
				case famInflight:
					st.inflight, st.hasInflight = v, true
				case famQueue:
					st.queued, st.hasQueued = v, true
				default:
					st.limit = v
				}
			}
		case famDraining:
			for _, m := range mf.GetMetric() {
				s.draining = m.GetGauge().GetValue() > 0
			}
		}
	}
	sort.SliceStable(s.stages, func(i, j int) bool { return s.stages[i].route < s.stages[j].route })
	return s
}

// cumulative copies a gathered histogram, with +Inf as its last bound.
func cumulative(h *dto.Histogram) histogram {
	out := histogram{}
	for _, b := range h.GetBucket() {
		if math.IsInf(b.GetUpperBound(), +1) {
			continue
		}
		out.bounds = append(out.bounds, b.GetUpperBound())
		out.counts = append(out.counts, float64(b.GetCumulativeCount()))
	}
	out.bounds = append(out.bounds, math.Inf(+1))
	out.counts = append(out.counts, float64(h.GetSampleCount()))
	return out
}

// minus returns h - old bucket by bucket (what was observed between the two), or h itself when
// the bounds differ or a count went down (the series restarted).
func (h histogram) minus(old histogram) histogram {
	if len(old.bounds) != len(h.bounds) {
		return h
	}
	out := histogram{bounds: h.bounds, counts: make([]float64, len(h.counts))}
	for i := range h.counts {
		if h.bounds[i] != old.bounds[i] || h.counts[i] < old.counts[i] {
			return h
		}
		out.counts[i] = h.counts[i] - old.counts[i]
	}
	return out
}

// plus returns h + o bucket by bucket; h empty: o. Bounds that differ: h unchanged (every route
// uses the same buckets, metrics.LatencyBuckets).
func (h histogram) plus(o histogram) histogram {
	if len(h.bounds) == 0 {
		return histogram{bounds: o.bounds, counts: append([]float64(nil), o.counts...)}
	}
	if len(o.bounds) != len(h.bounds) {
		return h
	}
	for i := range h.counts {
		h.counts[i] += o.counts[i]
	}
	return h
}

// quantile estimates the q-quantile as Prometheus's histogram_quantile does: it finds the bucket
// that holds rank q*count and interpolates linearly inside it (from 0 in the first bucket); in
// the +Inf bucket it answers the largest finite bound. NaN without observations.
func (h histogram) quantile(q float64) float64 {
	n := len(h.counts)
	if n == 0 || h.counts[n-1] <= 0 || q < 0 || q > 1 {
		return math.NaN()
	}
	rank := q * h.counts[n-1]
	i := sort.Search(n, func(i int) bool { return h.counts[i] >= rank })
	if i >= n-1 {
		if n < 2 {
			return math.NaN()
		}
		return h.bounds[n-2]
	}
	lower, below := 0.0, 0.0
	if i > 0 {
		lower, below = h.bounds[i-1], h.counts[i-1]
	}
	inBucket := h.counts[i] - below
	if inBucket <= 0 {
		return h.bounds[i]
	}
	return lower + (h.bounds[i]-lower)*(rank-below)/inBucket
}

// routeStrategy is the strategy a route runs: its policy's (from loadshed_requests_total), or
// else the names of its stages.
func (s *snapshot) routeStrategy(route string) string {
	if st, ok := s.strategies[route]; ok && st != "" {
		return st
	}
	var names []string
	for _, st := range s.stages {
		if st.route == route {
			names = append(names, st.strategy)
		}
	}
	return strings.Join(names, " + ")
}
