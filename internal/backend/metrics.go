package backend

import "github.com/prometheus/client_golang/prometheus"

// latencyBuckets resolve 1ms to 10s, finest around the default 20ms service time.
var latencyBuckets = []float64{
	.001, .002, .005, .01, .015, .02, .025, .03, .04, .05, .075,
	.1, .15, .2, .3, .5, .75, 1, 2, 5, 10,
}

type metrics struct {
	requests  *prometheus.CounterVec
	grpcCalls *prometheus.CounterVec
	service   prometheus.Histogram
	wait      prometheus.Histogram
}

// register creates the backend_* metrics on r. The gauges read the pool when scraped. gRPC calls
// share the pool with HTTP requests, so the gauges and the wait and service histograms count
// both ("requests" in their help texts); answers are counted by protocol.
func (m *metrics) register(r prometheus.Registerer, p *pool) error {
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "backend_requests_total",
		Help: "Requests answered by the backend, by HTTP status code.",
	}, []string{"code"})
	m.grpcCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "backend_grpc_requests_total",
		Help: "gRPC calls answered by the backend's gRPC port, by gRPC status code.",
	}, []string{"grpc_code"})
	m.service = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "backend_service_seconds",
		Help:    "Time a request held a worker (its service time).",
		Buckets: latencyBuckets,
	})
	m.wait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "backend_wait_seconds",
		Help:    "Time a request waited inside the backend for a free worker.",
		Buckets: latencyBuckets,
	})
	gauge := func(name, help string, f func(Stats) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help},
			func() float64 { return float64(f(p.stats())) })
	}
	for _, c := range []prometheus.Collector{
		m.requests, m.grpcCalls, m.service, m.wait,
		gauge("backend_inflight", "Requests holding a worker (busy workers).", func(s Stats) int { return s.Busy }),
		gauge("backend_queue_depth", "Requests waiting inside the backend for a worker.", func(s Stats) int { return s.Waiting }),
		gauge("backend_workers", "Configured worker count.", func(s Stats) int { return s.Workers }),
	} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}
