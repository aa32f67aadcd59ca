//go:build !nolive

package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/loadshed/loadshed/internal/lab"
	"github.com/loadshed/loadshed/internal/loadgen"
)

// newFanoutLive returns the live half of "lab compare --fanout". It calibrates like the
// single-service comparison (liveRunner.Calibrate, on the first service's backend).
func newFanoutLive() lab.FanoutLive { return fanoutLiveRunner{} }

type fanoutLiveRunner struct{ liveRunner }

// errNoCallGraph: the live call graph needs two pieces of issue 32 that land with their own
// branches: the backend's frontend mode (backend --call-all URL,...: every leg at once, 200 only
// when every leg answered 2xx, metrics of user requests and legs by result, the load generator's
// fresh traceparent per request) and cohorts in the proxy's configuration (admission.cohorts).
var errNoCallGraph = errors.New("the live call graph needs the backend's frontend mode (--call-all) and cohorts in the proxy's configuration (issue 32), not in this build yet: use --lab-only")

// RunFanoutLive runs the call graph live: per service i, the synthetic backend (the service's
// workers and service time, seeded with sc.Services[i].ServiceSeed) behind its own proxy with the
// service's policy and, when sc.Cohorts is set, admission.cohorts (key traceparent, sc.Cohorts'
// count, strategyShare and waitFraction, one secret file shared by all, the frontend trusted);
// a frontend backend with --call-all to the proxies and --call-timeout sc.Timeout; the load
// generator offering sched to the frontend with a fresh traceparent per request. The figures:
// user requests and successes and the p99 of successful ones from the load generator; per leg
// the frontend's legs by result (ok, wasted, refused, failed) and each proxy's admitted count.
func (r fanoutLiveRunner) RunFanoutLive(ctx context.Context, sc lab.FanoutScenario, sched loadgen.Schedule) (lab.FanoutLiveResult, error) {
	for i, s := range sc.Services {
		if s.Strategy.Admission == nil {
			return lab.FanoutLiveResult{}, fmt.Errorf("service %s: %s is not a proxy policy, nothing to run live", sc.ServiceName(i), s.Strategy.Name)
		}
	}
	return lab.FanoutLiveResult{}, errNoCallGraph
}
