package main

import (
	"context"
	"fmt"
	"io"

	"github.com/loadshed/loadshed/internal/lab"
	"github.com/loadshed/loadshed/internal/live"
	"github.com/loadshed/loadshed/internal/loadgen"
)

// newLive returns the live half of "lab compare": the backend and the proxy started in-process
// on loopback and driven by internal/loadgen with the comparison's own schedule.
func newLive(log io.Writer) lab.Live { return liveRunner{log: log} }

type liveRunner struct{ log io.Writer }

func (r liveRunner) RunLive(ctx context.Context, sc lab.Scenario, sched loadgen.Schedule, st lab.Strategy) (lab.LiveResult, error) {
	if st.Admission == nil {
		return lab.LiveResult{}, fmt.Errorf("%s: not a proxy policy, nothing to run live", st.Name)
	}
	env, err := live.Start(live.Setup{Workers: sc.Servers, Service: sc.Service, Seed: sc.Seed, Admission: *st.Admission})
	if err != nil {
		return lab.LiveResult{}, err
	}
	defer env.Close()
	fmt.Fprintf(r.log, "live: %s ...\n", st.Name)
	res, err := env.Run(ctx, live.Load{Schedule: &sched, Timeout: sc.Client.Timeout, SLO: sc.SLO})
	if err != nil {
		return lab.LiveResult{}, err
	}
	if !res.Valid {
		return lab.LiveResult{}, fmt.Errorf("live %s: the load generator fell behind (%s)", st.Name, res.InvalidReason)
	}
	return lab.LiveResult{Incoming: int64(res.Offered), Accepted: int64(res.Admitted), P99: res.AdmittedLatency.P99}, nil
}
