package gate

import (
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/loadshed/loadshed/internal/metrics"
	"github.com/loadshed/loadshed/pkg/admission"
)

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

func reasonIndex(r admission.Reason) int {
	for i, v := range admission.AllReasons {
		if v == r {
			return i
		}
	}
	return -1
}

// policyMetrics are one policy's metric children, resolved once when the policy is built, so the
// hot path never looks labels up by string: histograms are fully labelled observers; counters
// whose labels vary per request (door, outcome, code; stage, reason, priority) are created on
// first use into lock-free tables.
type policyMetrics struct {
	queueWait, upstream, duration prometheus.Observer

	requests *prometheus.CounterVec // curried: route, strategy
	// byCode[door][outcome] is allocated on first use; codes 100-599 index it.
	byCode [numDoors][numOutcomes]atomic.Pointer[codeTable]

	shed, dryRun *prometheus.CounterVec // curried: route
	// stages are the stage names a refusal can carry: the policy's strategy, "clients" (the
	// per-client limits) and the name of every stage of its core.
	stages          []string
	shedTab, dryTab []atomic.Pointer[counterRef] // [stage][reason][priority][door]
	// The load report's counts: admitted, refused and failed upstream, since the policy began.
	admittedN, shedN, failedN atomic.Int64
	// cohortShed counts a cohorts policy's refusals by rank band (curried: route; nil without
	// cohorts), through cohortTab [band][reason].
	cohortShed *prometheus.CounterVec
	cohortTab  [rankBands]atomic.Pointer[[]atomic.Pointer[counterRef]]
}

type codeTable [500]atomic.Pointer[counterRef]

type counterRef struct{ c prometheus.Counter }

func newPolicyMetrics(m *metrics.Proxy, route, strategy string, stages []string) *policyMetrics {
	names := []string{strategy, "clients"}
	for _, s := range stages {
		if indexOf(names, s) < 0 {
			names = append(names, s)
		}
	}
	n := len(names) * len(admission.AllReasons) * admission.NumPriorities * numDoors
	return &policyMetrics{
		queueWait: m.QueueWait.WithLabelValues(route, strategy),
		upstream:  m.UpstreamLatency.WithLabelValues(route),
		duration:  m.RequestDuration.WithLabelValues(route),
		requests:  m.Requests.MustCurryWith(prometheus.Labels{"route": route, "strategy": strategy}),
		shed:      m.Shed.MustCurryWith(prometheus.Labels{"route": route}),
		dryRun:    m.DryRunShed.MustCurryWith(prometheus.Labels{"route": route}),
		stages:    names,
		shedTab:   make([]atomic.Pointer[counterRef], n),
		dryTab:    make([]atomic.Pointer[counterRef], n),
	}
}

// count adds one request to loadshed_requests_total.
func (pm *policyMetrics) count(door DoorKind, o Outcome, code int) {
	switch o {
	case OutcomeShed:
		pm.shedN.Add(1)
	case OutcomeUpstreamError, OutcomeUpstreamTimeout:
		pm.failedN.Add(1)
	}
	outcome := o.String()
	if code < 100 || code > 599 {
		pm.requests.WithLabelValues(door.String(), outcome, strconv.Itoa(code)).Inc()
		return
	}
	tab := pm.byCode[door][o].Load()
	if tab == nil {
		pm.byCode[door][o].CompareAndSwap(nil, new(codeTable))
		tab = pm.byCode[door][o].Load()
	}
	slot := &tab[code-100]
	if ref := slot.Load(); ref != nil {
		ref.c.Inc()
		return
	}
	store(slot, pm.requests.WithLabelValues(door.String(), outcome, strconv.Itoa(code))).Inc()
}

// refused adds one refusal to loadshed_shed_total (or, for a dry run, to
// loadshed_dry_run_would_shed_total).
func (pm *policyMetrics) refused(door DoorKind, stage string, reason admission.Reason, prio admission.Priority, dry bool) {
	vec, tab := pm.shed, pm.shedTab
	if dry {
		vec, tab = pm.dryRun, pm.dryTab
	}
	s, r := indexOf(pm.stages, stage), reasonIndex(reason)
	if s < 0 || r < 0 || prio >= admission.NumPriorities {
		vec.WithLabelValues(stage, string(reason), prio.String(), door.String()).Inc()
		return
	}
	slot := &tab[((s*len(admission.AllReasons)+r)*admission.NumPriorities+int(prio))*numDoors+int(door)]
	if ref := slot.Load(); ref != nil {
		ref.c.Inc()
		return
	}
	store(slot, vec.WithLabelValues(stage, string(reason), prio.String(), door.String())).Inc()
}

// cohortRefused adds one refusal to loadshed_cohort_shed_total, in the band of its rank.
func (pm *policyMetrics) cohortRefused(band int, reason admission.Reason) {
	r := reasonIndex(reason)
	if pm.cohortShed == nil {
		return
	}
	if r < 0 || band < 0 || band >= rankBands {
		pm.cohortShed.WithLabelValues(strconv.Itoa(band), string(reason)).Inc()
		return
	}
	row := pm.cohortTab[band].Load()
	if row == nil {
		fresh := make([]atomic.Pointer[counterRef], len(admission.AllReasons))
		pm.cohortTab[band].CompareAndSwap(nil, &fresh)
		row = pm.cohortTab[band].Load()
	}
	slot := &(*row)[r]
	if ref := slot.Load(); ref != nil {
		ref.c.Inc()
		return
	}
	store(slot, pm.cohortShed.WithLabelValues(strconv.Itoa(band), string(reason))).Inc()
}

// store puts c into an empty slot and returns the counter the slot holds (another goroutine's,
// if it was first: both are the same child of the vector).
func store(slot *atomic.Pointer[counterRef], c prometheus.Counter) prometheus.Counter {
	if slot.CompareAndSwap(nil, &counterRef{c}) {
		return c
	}
	return slot.Load().c
}

// counts are the load report's counts now.
func (pm *policyMetrics) counts() policyCounts {
	return policyCounts{admitted: pm.admittedN.Load(), refused: pm.shedN.Load(), failed: pm.failedN.Load()}
}
