package admission

// TEMPORARY STAND-IN for the lead's cohorts (COHORTS.md §1), dropped when main's lands: it
// passes everything to the inner core and keeps the level open.

import (
	"strconv"
	"time"
)

const ReasonCohort Reason = "cohort"

type CohortOptions struct {
	Ranks         int
	StrategyShare float64
	WaitFraction  float64
	MaxWait       time.Duration
	Window        time.Duration
}

type Cohorts struct {
	Core
	o CohortOptions
}

func NewCohorts(inner Core, o CohortOptions) (*Cohorts, error) { return &Cohorts{Core: inner, o: o}, nil }

func (c *Cohorts) Level() CohortLevel { return CohortLevel{Priority: Sheddable, Rank: c.o.Ranks - 1} }

func CohortsOf(c Core) *Cohorts {
	co, _ := c.(*Cohorts)
	return co
}

type CohortLevel struct {
	Priority Priority
	Rank     int
}

func (l CohortLevel) String() string { return l.Priority.String() + "/" + strconv.Itoa(l.Rank) }

func (l CohortLevel) Admits(p Priority, rank int) bool {
	return p < l.Priority || p == l.Priority && rank <= l.Rank
}
