package metrics

import "github.com/prometheus/client_golang/prometheus"

// CohortState is what the cohort gauges report for one route with cohorts (admission.cohorts).
type CohortState struct {
	Route string
	// Level places the cohort admission level on one scale: the priority classes it admits in
	// full plus the share of the next one's ranks (4 admits everything).
	Level float64
	// Priority and Rank are the level itself: requests of a more important class, or of this
	// class with a rank at most Rank, are admitted.
	Priority string
	Rank     float64
}

var (
	cohortLevelDesc = prometheus.NewDesc("loadshed_cohort_level",
		"The cohort admission level of a route, as the priority classes it admits in full plus the share of the next class's ranks it admits (4: everything, 1.5: critical_plus and the better half of critical).",
		[]string{"route"}, nil)
	cohortRankDesc = prometheus.NewDesc("loadshed_cohort_level_rank",
		"The rank of the cohort admission level of a route within its priority class (the priority label): ranks up to it are admitted.",
		[]string{"route", "priority"}, nil)
)

// NewCohorts registers the gauges of the cohort admission levels on reg, read through state at
// scrape time.
func NewCohorts(reg prometheus.Registerer, state func() []CohortState) {
	reg.MustRegister(&cohortCollector{state: state})
}

type cohortCollector struct{ state func() []CohortState }

func (c *cohortCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- cohortLevelDesc
	ch <- cohortRankDesc
}

func (c *cohortCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.state() {
		ch <- prometheus.MustNewConstMetric(cohortLevelDesc, prometheus.GaugeValue, s.Level, s.Route)
		ch <- prometheus.MustNewConstMetric(cohortRankDesc, prometheus.GaugeValue, s.Rank, s.Route, s.Priority)
	}
}
