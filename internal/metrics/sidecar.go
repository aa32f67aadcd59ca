package metrics

import "github.com/prometheus/client_golang/prometheus"

// SidecarState is what the sidecar gauges report of the sidecar's own load (internal/selfload).
type SidecarState struct {
	// Delay is the sidecar's own delay per forwarded request, in seconds.
	Delay float64
	// Saturated is true while the sidecar's CPU is its bottleneck.
	Saturated bool
	// Shed is the share of new requests refused at the door for the sidecar's own overload.
	Shed float64
	// Throttled is the share of the last tick's CFS periods in which the container was
	// throttled (0 without a CPU limit).
	Throttled float64
}

var (
	sidecarDelayDesc = prometheus.NewDesc("loadshed_sidecar_delay_seconds",
		"The sidecar's own delay per forwarded request: how long its goroutines waited for the CPU (Go scheduling latency x hand-offs), taken off the adaptive limit's latency samples.", nil, nil)
	sidecarSaturatedDesc = prometheus.NewDesc("loadshed_sidecar_saturated",
		"1 while the sidecar's own CPU is its bottleneck: its delay is at least server.saturation.above, or a tenth of its CPU periods are throttled.", nil, nil)
	sidecarShedDesc = prometheus.NewDesc("loadshed_sidecar_shed_share",
		"Share of new requests refused at the door (503, reason sidecar_overload) while the sidecar's delay stays above server.saturation.shedAbove.", nil, nil)
	sidecarThrottledDesc = prometheus.NewDesc("loadshed_sidecar_cpu_throttled_ratio",
		"Share of the container's CFS periods throttled by its CPU limit over the last 100 ms (0 without a limit).", nil, nil)
)

// NewSidecar registers the gauges of the sidecar's own load on reg, read through state at
// scrape time.
func NewSidecar(reg prometheus.Registerer, state func() SidecarState) {
	reg.MustRegister(&sidecarCollector{state: state})
}

type sidecarCollector struct{ state func() SidecarState }

func (c *sidecarCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sidecarDelayDesc
	ch <- sidecarSaturatedDesc
	ch <- sidecarShedDesc
	ch <- sidecarThrottledDesc
}

func (c *sidecarCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.state()
	sat := 0.0
	if s.Saturated {
		sat = 1
	}
	ch <- prometheus.MustNewConstMetric(sidecarDelayDesc, prometheus.GaugeValue, s.Delay)
	ch <- prometheus.MustNewConstMetric(sidecarSaturatedDesc, prometheus.GaugeValue, sat)
	ch <- prometheus.MustNewConstMetric(sidecarShedDesc, prometheus.GaugeValue, s.Shed)
	ch <- prometheus.MustNewConstMetric(sidecarThrottledDesc, prometheus.GaugeValue, s.Throttled)
}
