package metrics

import "github.com/prometheus/client_golang/prometheus"

// StoreBuckets resolve 50 µs to 1 s (seconds): a quota store call takes well under a
// millisecond on a healthy network and is cut off at its timeout (20 ms by default).
var StoreBuckets = []float64{.00005, .0001, .00025, .0005, .001, .002, .005, .01, .02, .05, .1, .25, 1}

// Breaker states of a quota store, the "state" label of loadshed_quota_store_breaker_state.
const (
	BreakerClosed   = "closed"    // the store is called
	BreakerOpen     = "open"      // the store is not called; decisions are local
	BreakerHalfOpen = "half_open" // one background probe is testing the store
)

// QuotaState is what the quota gauges report for the quota store.
type QuotaState struct {
	// Breaker is BreakerClosed, BreakerOpen or BreakerHalfOpen.
	Breaker string
	// Replicas is the count of live replicas last read from the store (1 if never read).
	Replicas float64
}

// Quota holds the metrics of the quotas shared across replicas (internal/quota).
type Quota struct {
	// StoreLatency observes every store call by op: take (a quota check), heartbeat, probe.
	StoreLatency *prometheus.HistogramVec
	// StoreErrors counts failed store calls by op and kind (timeout, pool_timeout,
	// connection, reply, other).
	StoreErrors *prometheus.CounterVec
	// Decisions counts quota checks by quota, source (store or fallback) and result (allowed
	// or limited).
	Decisions *prometheus.CounterVec
}

// NewQuota creates the quota metrics and registers them on reg, with gauges that read the
// store's live state through state at scrape time (ok false: no store, no gauges).
func NewQuota(reg prometheus.Registerer, state func() (s QuotaState, ok bool)) *Quota {
	m := &Quota{
		StoreLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "loadshed_quota_store_latency_seconds",
			Help:    "Duration of quota store calls, by op (take, heartbeat, probe), failed ones included.",
			Buckets: StoreBuckets,
		}, []string{"op"}),
		StoreErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loadshed_quota_store_errors_total",
			Help: "Failed quota store calls, by op and kind (timeout, pool_timeout, connection, reply, other).",
		}, []string{"op", "kind"}),
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loadshed_quota_decisions_total",
			Help: "Shared quota checks, by quota, source (store, or fallback: decided locally at rate / replicas) and result (allowed, limited).",
		}, []string{"quota", "source", "result"}),
	}
	for _, op := range []string{"take", "heartbeat", "probe"} {
		m.StoreLatency.WithLabelValues(op)
	}
	reg.MustRegister(m.StoreLatency, m.StoreErrors, m.Decisions, &quotaCollector{state: state})
	return m
}

var (
	fallbackDesc = prometheus.NewDesc("loadshed_quota_fallback_active",
		"1 while the quota store is not called (its breaker is open or probing) and shared quotas are enforced locally at rate / replicas.", nil, nil)
	breakerDesc = prometheus.NewDesc("loadshed_quota_store_breaker_state",
		"State of the quota store's circuit breaker: 1 for the current state (closed, open, half_open), 0 for the others.", []string{"state"}, nil)
	replicasDesc = prometheus.NewDesc("loadshed_quota_replicas",
		"Live replicas sharing the quota store, as last counted from their heartbeats (the divisor of the local fallback).", nil, nil)
)

type quotaCollector struct {
	state func() (QuotaState, bool)
}

func (c *quotaCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- fallbackDesc
	ch <- breakerDesc
	ch <- replicasDesc
}

func (c *quotaCollector) Collect(ch chan<- prometheus.Metric) {
	if c.state == nil {
		return
	}
	s, ok := c.state()
	if !ok {
		return
	}
	fallback := 0.0
	if s.Breaker != BreakerClosed {
		fallback = 1
	}
	ch <- prometheus.MustNewConstMetric(fallbackDesc, prometheus.GaugeValue, fallback)
	for _, st := range []string{BreakerClosed, BreakerOpen, BreakerHalfOpen} {
		v := 0.0
		if s.Breaker == st {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(breakerDesc, prometheus.GaugeValue, v, st)
	}
	ch <- prometheus.MustNewConstMetric(replicasDesc, prometheus.GaugeValue, s.Replicas)
}
