package lab

import "github.com/loadshed/loadshed/pkg/admission"

// withCohorts wraps a sidecar's core in ranked admission.
func withCohorts(core admission.Core, c Cohorts) (admission.Core, error) {
	return admission.NewCohorts(core, admission.CohortOptions{Ranks: c.Ranks, StrategyShare: c.StrategyShare,
		WaitFraction: c.WaitFraction, MaxWait: c.MaxWait, Window: c.Window})
}

// setRank gives a leg its user request's rank.
func setRank(req *admission.Request, rank int) { req.Rank = rank }

// reasonCohort is the refusal reason of ranked admission below its level.
const reasonCohort = admission.ReasonCohort
