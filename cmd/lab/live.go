package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/loadshed/loadshed/internal/lab"
	"github.com/loadshed/loadshed/internal/live"
	"github.com/loadshed/loadshed/internal/loadgen"
)

// newLive returns the live half of "lab compare": the backend and the proxy started in-process
// on loopback and driven by internal/loadgen with the comparison's own schedule.
func newLive(log io.Writer) lab.Live { return liveRunner{log: log} }

type liveRunner struct{ log io.Writer }

func (r liveRunner) RunLive(ctx context.Context, sc lab.Scenario, sched loadgen.Schedule, st lab.Strategy) (lab.LiveResult, error) {
	adm, err := admissionYAML(st.Spec)
	if err != nil {
		return lab.LiveResult{}, err
	}
	env, err := live.Start(live.Setup{Workers: sc.Servers, Service: sc.Service, Seed: sc.Seed, Admission: adm})
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

// blockNames maps the lab's stage kinds to the proxy config's block names.
var blockNames = map[string]string{
	"token-bucket": "tokenBucket", "leaky-bucket": "leakyBucket", "bounded-queue": "boundedQueue",
	"inflight": "inflight", "adaptive": "adaptive", "codel": "codel",
}

// admissionYAML turns a lab strategy spec ("inflight:limit=8", "token-bucket:rate=300+bounded-queue")
// into the proxy's admission block, so both halves run the same policy.
func admissionYAML(spec string) (string, error) {
	stages, err := lab.ParseStages(spec)
	if err != nil {
		return "", err
	}
	block := func(s lab.StageSpec) string {
		keys := make([]string, 0, len(s.Args))
		queue := []string{}
		for k, v := range s.Args {
			if s.Kind == "adaptive" && (k == "depth" || k == "maxWait") {
				queue = append(queue, k+": "+v)
				continue
			}
			keys = append(keys, k+": "+v)
		}
		if len(queue) > 0 {
			sort.Strings(queue)
			keys = append(keys, "queue: {"+strings.Join(queue, ", ")+"}")
		}
		sort.Strings(keys)
		return blockNames[s.Kind] + ": {" + strings.Join(keys, ", ") + "}"
	}
	if len(stages) == 1 {
		s := stages[0]
		if s.Kind == "none" {
			return "strategy: none", nil
		}
		return "strategy: " + s.Kind + "\n" + block(s), nil
	}
	items := make([]string, len(stages))
	for i, s := range stages {
		items[i] = "  - " + block(s)
	}
	return "strategy: chain\nchain:\n" + strings.Join(items, "\n"), nil
}
