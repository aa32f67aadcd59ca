//go:build !nolive

package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/loadshed/loadshed/internal/backend"
	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/lab"
	"github.com/loadshed/loadshed/internal/live"
	"github.com/loadshed/loadshed/internal/loadgen"
	"github.com/loadshed/loadshed/pkg/admission"
)

// newFanoutLive returns the live half of "lab compare --fanout". It calibrates like the
// single-service comparison (liveRunner.Calibrate, on the first service's backend).
func newFanoutLive() lab.FanoutLive { return fanoutLiveRunner{} }

type fanoutLiveRunner struct{ liveRunner }

// RunFanoutLive runs the call graph live, in-process on loopback: per service i, the synthetic
// backend (the service's workers and service time, seeded with its ServiceSeed) behind its own
// proxy with the service's policy and, when sc.Cohorts is set, admission.cohorts (key
// traceparent, sc.Cohorts' count, strategyShare and waitFraction, one secret file shared by all,
// the frontend on loopback trusted); a frontend (the backend's --call-all mode) calling every
// proxy at once with sc.Timeout per leg; the load generator offering sched to the frontend with
// a fresh traceparent per request. The figures: user requests, successes and the p99 of the
// successful ones from the load generator; per leg the frontend's legs by result.
func (r fanoutLiveRunner) RunFanoutLive(ctx context.Context, sc lab.FanoutScenario, sched loadgen.Schedule) (lab.FanoutLiveResult, error) {
	for i, s := range sc.Services {
		if s.Strategy.Admission == nil {
			return lab.FanoutLiveResult{}, fmt.Errorf("service %s: %s is not a proxy policy, nothing to run live", sc.ServiceName(i), s.Strategy.Name)
		}
	}
	dir, err := os.MkdirTemp("", "loadshed-lab-fanout-")
	if err != nil {
		return lab.FanoutLiveResult{}, err
	}
	defer os.RemoveAll(dir)
	var cohorts *config.Cohorts
	if c := sc.Cohorts; c != nil {
		secret := make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return lab.FanoutLiveResult{}, err
		}
		path := filepath.Join(dir, "cohort.key")
		if err := os.WriteFile(path, secret, 0o600); err != nil {
			return lab.FanoutLiveResult{}, err
		}
		wait := c.WaitFraction // the lab's: 0 the default, < 0 no room; the file's: 0 no room
		switch {
		case wait == 0:
			wait = admission.DefaultCohortWaitFraction
		case wait < 0:
			wait = 0
		}
		cohorts = &config.Cohorts{Key: config.CohortKeyTraceparent, Count: cmp.Or(c.Ranks, lab.DefaultCohortRanks),
			Rotate: config.Duration(time.Hour), SecretFile: path, StrategyShare: c.StrategyShare, WaitFraction: wait}
	}
	var legs []string
	for i, s := range sc.Services {
		a := *s.Strategy.Admission
		a.Cohorts = cohorts
		env, err := live.Start(live.Setup{Workers: s.Servers, Service: s.Service,
			Seed: cmp.Or(s.ServiceSeed, lab.FanoutServiceSeed(sc.Seed, i)), Admission: a,
			Extra: "trust: {sources: [127.0.0.1/32, '::1/128']}\n"})
		if err != nil {
			return lab.FanoutLiveResult{}, fmt.Errorf("service %s: %w", sc.ServiceName(i), err)
		}
		defer env.Close()
		legs = append(legs, env.ProxyURL+"/")
	}
	reg := prometheus.NewRegistry()
	timeout := cmp.Or(sc.Timeout, backend.DefaultCallTimeout)
	fe, err := backend.New(backend.DefaultConfig(), backend.WithRegistry(reg),
		backend.WithCallAll(backend.CallAll{URLs: legs, Timeout: timeout}))
	if err != nil {
		return lab.FanoutLiveResult{}, fmt.Errorf("frontend: %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return lab.FanoutLiveResult{}, err
	}
	serveCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fe.Serve(serveCtx, backend.ServeConfig{Data: l, ShutdownTimeout: timeout}) }()
	defer func() { stop(); <-done }()

	prepare, err := loadgen.Identity{Traceparent: true}.Wrap(nil)
	if err != nil {
		return lab.FanoutLiveResult{}, err
	}
	meter := live.StartCPUMeter()
	res, err := loadgen.Run(ctx, loadgen.Config{Target: "http://" + l.Addr().String() + "/", Schedule: sched,
		Timeout: timeout + time.Second, SLO: timeout + time.Second, Prepare: prepare})
	if err != nil && res == nil {
		return lab.FanoutLiveResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return lab.FanoutLiveResult{}, err
	}
	byLeg, err := legCounts(reg)
	if err != nil {
		return lab.FanoutLiveResult{}, err
	}
	out := lab.FanoutLiveResult{Machine: machineLoad(meter)}
	out.Cohorts = sc.Cohorts != nil
	out.Users, out.OK = int64(res.Offered), int64(res.Success)
	out.P50, out.P99 = res.SuccessLatency.P50, res.SuccessLatency.P99
	out.P99Lo, out.P99Hi = out.P99, out.P99
	for i, u := range legs {
		c := byLeg[u]
		ls := lab.LegStats{Name: sc.ServiceName(i), Offered: out.Users, OK: c[backend.LegOK] + c[backend.LegWasted],
			Refused: c[backend.LegRefused], Admitted: c[backend.LegOK] + c[backend.LegWasted] + c[backend.LegFailed]}
		out.Legs = append(out.Legs, ls)
		out.Admitted += ls.Admitted
		out.Wasted += c[backend.LegWasted]
	}
	if !res.Valid {
		out.Invalid = "the load generator fell behind: " + res.InvalidReason
	}
	return out, nil
}

// legCounts reads the frontend's backend_frontend_legs_total: per leg URL, per result.
func legCounts(reg *prometheus.Registry) (map[string]map[string]int64, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]int64{}
	for _, mf := range mfs {
		if mf.GetName() != "backend_frontend_legs_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var leg, result string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "leg":
					leg = lp.GetValue()
				case "result":
					result = lp.GetValue()
				}
			}
			if out[leg] == nil {
				out[leg] = map[string]int64{}
			}
			out[leg][result] += int64(m.GetCounter().GetValue())
		}
	}
	return out, nil
}
