package lab

// Chart file names written by WriteCharts and WriteSweepCharts.
const (
	ChartLatency    = "latency.png"
	ChartAcceptance = "acceptance.png"
	ChartTimeline   = "timeline.png"
	ChartGoodput    = "sweep-goodput.png"
	ChartSweepP99   = "sweep-p99.png"
)
