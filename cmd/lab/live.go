//go:build !nolive

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/loadshed/loadshed/internal/lab"
	"github.com/loadshed/loadshed/internal/live"
	"github.com/loadshed/loadshed/internal/loadgen"
)

// newLive returns the live half of "lab compare": the backend and the proxy started in-process
// on loopback and driven by internal/loadgen with the comparison's own schedule. It also
// calibrates (lab.Calibrator).
func newLive() lab.Live { return liveRunner{} }

type liveRunner struct {
	// unloaded and loaded override the calibration's phase lengths (0: its defaults).
	unloaded, loaded time.Duration
}

func (r liveRunner) RunLive(ctx context.Context, sc lab.Scenario, sched loadgen.Schedule, st lab.Strategy) (lab.LiveResult, error) {
	if st.Admission == nil {
		return lab.LiveResult{}, fmt.Errorf("%s: not a proxy policy, nothing to run live", st.Name)
	}
	env, err := live.Start(live.Setup{Workers: sc.Servers, Service: sc.Service, Seed: sc.Seed, Admission: *st.Admission})
	if err != nil {
		return lab.LiveResult{}, err
	}
	defer env.Close()
	meter := live.StartCPUMeter()
	res, err := env.Run(ctx, live.Load{Schedule: &sched, Timeout: sc.Client.Timeout, SLO: sc.SLO})
	if err != nil && res == nil {
		return lab.LiveResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return lab.LiveResult{}, err
	}
	out := lab.LiveResult{Incoming: int64(res.Offered), Accepted: int64(res.Admitted), P99: res.AdmittedLatency.P99,
		Machine: machineLoad(meter)}
	// The lab counts a request its client gave up on after admission as admitted, with the
	// client's timeout as its latency; the load generator counts it apart. Count it the lab's
	// way: admitted, and p99 the timeout once more than 1% of the admitted timed out. (Below
	// that, the admitted answers' p99 stands: it is at most a few ranks low.)
	if res.Timeouts > 0 {
		out.Accepted += int64(res.Timeouts)
		if 100*int64(res.Timeouts) > out.Accepted {
			out.P99 = res.Timeout
		}
	}
	if !res.Valid {
		out.Invalid = "the load generator fell behind: " + res.InvalidReason
	}
	return out, nil
}

// Calibrate implements lab.Calibrator with live.Calibrate: the backend at the scenario's mean
// service time behind the proxy, unloaded and at capacity.
func (r liveRunner) Calibrate(ctx context.Context, sc lab.Scenario) (lab.Calibration, error) {
	mean := lab.MeanService(sc.Service).Round(time.Microsecond)
	start := time.Now()
	meter := live.StartCPUMeter()
	c, err := live.Calibrate(ctx, live.CalibrateSetup{Workers: sc.Servers, Service: mean, Unloaded: r.unloaded, Loaded: r.loaded})
	if err != nil {
		return lab.Calibration{}, err
	}
	return lab.Calibration{
		Workers: c.Workers, Service: c.Service,
		Unloaded:   lab.HopDist{Samples: c.Unloaded.Hops},
		Loaded:     lab.HopDist{Samples: c.Loaded.Hops},
		Throughput: c.Loaded.Throughput, Overshoot: c.Loaded.Overshoot,
		Took: time.Since(start), Machine: machineLoad(meter),
	}, nil
}

func machineLoad(m *live.CPUMeter) lab.MachineLoad {
	others, ok := m.Others()
	return lab.MachineLoad{Known: ok, Others: others, CPUs: m.CPUs()}
}
