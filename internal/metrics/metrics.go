// Package metrics defines the proxy's Prometheus metrics. Everything is registered on the
// Registerer passed in: no global registry, nothing in init.
package metrics

import (
	"runtime"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/loadshed/loadshed/internal/version"
)

// LatencyBuckets resolve 1 ms to 10 s (seconds).
var LatencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .075, .1, .15, .25, .5, 1, 2.5, 5, 10}

// Outcomes of a request, the "outcome" label of loadshed_requests_total.
const (
	OutcomeSuccess         = "success"          // the upstream answered 1xx-3xx
	OutcomeClientError     = "client_error"     // the upstream answered 4xx
	OutcomeUpstreamError   = "upstream_error"   // the upstream answered 5xx, or could not be reached (502)
	OutcomeUpstreamTimeout = "upstream_timeout" // no answer in time (504)
	OutcomeShed            = "shed"             // refused by admission (429/503/403)
	OutcomeCanceled        = "canceled"         // the client went away first
)

// Doors are the front doors a request can come through, the "door" label: the HTTP reverse
// proxy (HTTP/1.1 and HTTP/2), gRPC calls (on the same port), and Envoy's external processor.
const (
	DoorHTTP    = "http"
	DoorGRPC    = "grpc"
	DoorExtProc = "extproc"
)

// StageState is what the gauges report for one strategy stage of one route.
type StageState struct {
	Route, Strategy string
	InFlight        float64
	QueueDepth      float64
	Limit           float64 // 0: no limit to report
	Tokens          float64 // <0: not a bucket
	// Adaptive stages also report these (NaN or 0 when absent).
	LimitFloor, LimitCeiling float64
	MinRTT, SampleRTT        float64 // seconds
}

// Proxy holds the proxy's metrics.
type Proxy struct {
	Requests        *prometheus.CounterVec
	Shed            *prometheus.CounterVec
	DryRunShed      *prometheus.CounterVec
	QueueWait       *prometheus.HistogramVec
	UpstreamLatency *prometheus.HistogramVec
	RequestDuration *prometheus.HistogramVec
	Reloads         *prometheus.CounterVec
	// CohortShed counts the refusals of routes with cohorts by the refused request's rank band.
	CohortShed *prometheus.CounterVec
	ReloadOK   prometheus.Gauge
	Draining   prometheus.Gauge
}

// New creates the proxy's metrics and registers them, with the Go and process collectors and a
// collector that reads the live admission state through stages.
func New(reg prometheus.Registerer, stages func() []StageState) *Proxy {
	m := &Proxy{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loadshed_requests_total",
			Help: "Requests handled, by route, strategy, front door, outcome and HTTP status code.",
		}, []string{"route", "strategy", "door", "outcome", "code"}),
		Shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loadshed_shed_total",
			Help: "Requests refused by admission, by route, refusing strategy stage, reason, priority and front door.",
		}, []string{"route", "strategy", "reason", "priority", "door"}),
		DryRunShed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loadshed_dry_run_would_shed_total",
			Help: "Requests a dry-run strategy would have refused but admitted, by route, strategy, reason, priority and front door.",
		}, []string{"route", "strategy", "reason", "priority", "door"}),
		QueueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "loadshed_queue_wait_seconds",
			Help:    "Time admitted requests waited in admission queues.",
			Buckets: LatencyBuckets,
		}, []string{"route", "strategy"}),
		UpstreamLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "loadshed_upstream_latency_seconds",
			Help:    "Time from forwarding a request to the upstream's response headers.",
			Buckets: LatencyBuckets,
		}, []string{"route"}),
		RequestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "loadshed_request_duration_seconds",
			Help:    "Time admitted requests spent in the proxy, queue wait plus upstream, to the response headers.",
			Buckets: LatencyBuckets,
		}, []string{"route"}),
		Reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loadshed_config_reloads_total",
			Help: "Configuration reloads, by result (success or failure).",
		}, []string{"result"}),
		CohortShed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loadshed_cohort_shed_total",
			Help: "Requests refused on a route with cohorts, by route, rank band (0 the best eighth of the ranks, 7 the worst) and reason.",
		}, []string{"route", "band", "reason"}),
		ReloadOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "loadshed_config_last_reload_successful",
			Help: "1 if the last configuration reload succeeded (or none was tried), 0 if it failed.",
		}),
		Draining: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "loadshed_draining",
			Help: "1 while the proxy shuts down.",
		}),
	}
	m.ReloadOK.Set(1)
	for _, r := range []string{"success", "failure"} {
		m.Reloads.WithLabelValues(r)
	}
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "loadshed_build_info",
		Help: "Build information; always 1.",
	}, []string{"version", "goversion"})
	buildInfo.WithLabelValues(version.Version, runtime.Version()).Set(1)
	reg.MustRegister(m.Requests, m.Shed, m.DryRunShed, m.QueueWait, m.UpstreamLatency, m.RequestDuration,
		m.Reloads, m.CohortShed, m.ReloadOK, m.Draining, buildInfo, &stateCollector{stages: stages},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

var (
	inflightDesc = prometheus.NewDesc("loadshed_inflight", "Cost units held by admitted requests, by route and strategy stage.", []string{"route", "strategy"}, nil)
	queueDesc    = prometheus.NewDesc("loadshed_queue_depth", "Requests waiting in the admission queue, by route and strategy stage.", []string{"route", "strategy"}, nil)
	limitDesc    = prometheus.NewDesc("loadshed_limit", "Current concurrency, depth or burst limit, by route and strategy stage.", []string{"route", "strategy"}, nil)
	floorDesc    = prometheus.NewDesc("loadshed_limit_floor", "Configured floor of an adaptive limit.", []string{"route", "strategy"}, nil)
	ceilDesc     = prometheus.NewDesc("loadshed_limit_ceiling", "Configured ceiling of an adaptive limit.", []string{"route", "strategy"}, nil)
	tokensDesc   = prometheus.NewDesc("loadshed_tokens_available", "Tokens available in a token bucket.", []string{"route", "strategy"}, nil)
	minRTTDesc   = prometheus.NewDesc("loadshed_min_rtt_seconds", "An adaptive limit's estimate of the upstream's unloaded latency.", []string{"route", "strategy"}, nil)
	rttDesc      = prometheus.NewDesc("loadshed_sample_rtt_seconds", "An adaptive limit's latest latency sample (the statistic it compares with min RTT).", []string{"route", "strategy"}, nil)
)

// stateCollector turns the live admission state into gauges at scrape time, so the gauges are
// never stale and follow routes across reloads.
type stateCollector struct {
	stages func() []StageState
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{inflightDesc, queueDesc, limitDesc, floorDesc, ceilDesc, tokensDesc, minRTTDesc, rttDesc} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	if c.stages == nil {
		return
	}
	for _, s := range c.stages() {
		l := []string{s.Route, s.Strategy}
		ch <- prometheus.MustNewConstMetric(inflightDesc, prometheus.GaugeValue, s.InFlight, l...)
		ch <- prometheus.MustNewConstMetric(queueDesc, prometheus.GaugeValue, s.QueueDepth, l...)
		if s.Limit > 0 {
			ch <- prometheus.MustNewConstMetric(limitDesc, prometheus.GaugeValue, s.Limit, l...)
		}
		if s.LimitFloor > 0 {
			ch <- prometheus.MustNewConstMetric(floorDesc, prometheus.GaugeValue, s.LimitFloor, l...)
		}
		if s.LimitCeiling > 0 {
			ch <- prometheus.MustNewConstMetric(ceilDesc, prometheus.GaugeValue, s.LimitCeiling, l...)
		}
		if s.Tokens >= 0 {
			ch <- prometheus.MustNewConstMetric(tokensDesc, prometheus.GaugeValue, s.Tokens, l...)
		}
		if s.MinRTT > 0 {
			ch <- prometheus.MustNewConstMetric(minRTTDesc, prometheus.GaugeValue, s.MinRTT, l...)
		}
		if s.SampleRTT > 0 {
			ch <- prometheus.MustNewConstMetric(rttDesc, prometheus.GaugeValue, s.SampleRTT, l...)
		}
	}
}

// Names returns the name of every metric family the proxy exports (histograms by their base
// name), sorted: the names alert rules and dashboards may use. It builds a throwaway set of
// metrics, gives every vector one child and every gauge a value, and gathers them.
func Names() []string {
	reg := prometheus.NewPedanticRegistry()
	all := StageState{Route: "r", Strategy: "s", Limit: 1, Tokens: 1, LimitFloor: 1, LimitCeiling: 1, MinRTT: 1, SampleRTT: 1}
	m := New(reg, func() []StageState { return []StageState{all} })
	m.Requests.WithLabelValues("r", "s", "d", "o", "200")
	m.Shed.WithLabelValues("r", "s", "x", "p", "d")
	m.DryRunShed.WithLabelValues("r", "s", "x", "p", "d")
	m.QueueWait.WithLabelValues("r", "s")
	m.UpstreamLatency.WithLabelValues("r")
	m.RequestDuration.WithLabelValues("r")
	m.CohortShed.WithLabelValues("r", "0", "x")
	NewCohorts(reg, func() []CohortState { return []CohortState{{Route: "r", Priority: "p"}} })
	q := NewQuota(reg, func() (QuotaState, bool) { return QuotaState{Breaker: BreakerClosed, Replicas: 1}, true })
	q.StoreErrors.WithLabelValues("take", "timeout")
	q.Decisions.WithLabelValues("q", "store", "allowed")
	NewSidecar(reg, func() SidecarState { return SidecarState{} })
	mfs, err := reg.Gather()
	if err != nil {
		panic(err) // the metric definitions themselves are broken: a programming error
	}
	out := make([]string, 0, len(mfs))
	for _, mf := range mfs {
		out = append(out, mf.GetName())
	}
	sort.Strings(out)
	return out
}
