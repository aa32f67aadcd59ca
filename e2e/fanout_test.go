//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/loadshed/loadshed/e2e/internal/cluster"
	"github.com/loadshed/loadshed/e2e/internal/criteria"
	"github.com/loadshed/loadshed/e2e/internal/results"
	"github.com/loadshed/loadshed/e2e/manifests"
)

// The fan-out row (issue 32): a frontend (the backend in frontend mode, behind its own sidecar)
// calls four services at once through their Services, each service the backend behind a
// sidecar with an in-flight limit of 4; loadshed's loadgen offers Poisson user requests at twice
// one service's capacity, each with a fresh traceparent. Measured with cohorts off, then, after
// a helm upgrade of the five releases, with cohorts on, and judged by criteria.FanoutChecks.
// The five releases share one cohort Secret. k6 is the other rows' generator; this row needs
// Poisson arrivals, which k6's arrival-rate executors do not make.
const (
	fanoutFrontend = "e2e-fan-front"
	fanoutSecret   = "e2e-cohort" // the Secret values/fanout-cohorts.yaml names
	// fanoutRPS is twice one service's capacity (4 workers x 20 ms = 200 requests/s).
	fanoutRPS = 2 * capacityRPS
	// fanoutWarmup is sent before the measured window: the sidecars' cohort levels settle
	// within seconds of the load's start (the issue asks 5 s for a step to 3x).
	fanoutWarmup = 5 * time.Second
	// fanoutAdminPort is the frontend's admin port (its metrics).
	fanoutAdminPort = 9090
	// fanoutSeed draws the same Poisson arrivals in both runs.
	fanoutSeed = 32
)

// fanoutServices are the services' releases, one leg each.
var fanoutServices = []string{"e2e-fan-a", "e2e-fan-b", "e2e-fan-c", "e2e-fan-d"}

// fanoutURL is the URL of a release's Service inside the cluster.
func fanoutURL(rel string) string {
	return fmt.Sprintf("http://%s.%s.svc.cluster.local/", service(rel), namespace)
}

// buildLoadgen builds loadgen statically and its image.
func (s *suite) buildLoadgen(ctx context.Context) error {
	bins, err := cluster.GoBinaries(ctx, s.run, s.root, ".", s.t.TempDir(), "./cmd/loadgen")
	if err != nil {
		return err
	}
	s.loadgenImage, err = cluster.LoadgenImage(ctx, s.run, s.root, bins["loadgen"])
	return err
}

// fanoutImages are the images the fan-out row loads into the cluster.
func (s *suite) fanoutImages() []string {
	if s.loadgenImage == "" {
		return nil
	}
	return []string{s.loadgenImage}
}

// fanoutRow installs the call graph, measures it with cohorts off and on, and records the row.
func (s *suite) fanoutRow(ctx context.Context) error {
	start := time.Now()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	m, err := manifests.Render("cohort-secret.yaml", manifests.CohortSecret{Name: fanoutSecret, Namespace: namespace, Key: hex.EncodeToString(key)})
	if err != nil {
		return err
	}
	if err := s.kube.Apply(ctx, m); err != nil {
		return err
	}
	var urls []string
	for _, rel := range fanoutServices {
		urls = append(urls, fanoutURL(rel))
	}
	front, err := manifests.Render("fanout-frontend.yaml", manifests.FanoutFrontend{URLs: urls, CallTimeout: "2s", AdminPort: fanoutAdminPort})
	if err != nil {
		return err
	}
	frontValues := filepath.Join(s.t.TempDir(), "fanout-frontend.yaml")
	if err := os.WriteFile(frontValues, front, 0o644); err != nil {
		return err
	}
	releases := func(cohorts bool) []cluster.Release {
		var out []cluster.Release
		for _, rel := range append([]string{fanoutFrontend}, fanoutServices...) {
			files := []string{s.values("common"), s.values("fanout")}
			if rel == fanoutFrontend {
				files = append(files, frontValues)
			} else {
				files = append(files, s.values("fanout-service"))
			}
			if cohorts {
				files = append(files, s.values("fanout-cohorts"))
			}
			out = append(out, cluster.Release{Name: rel, ValuesFiles: files, Set: imageSet()})
		}
		return out
	}
	defer func() {
		for _, r := range releases(false) {
			if err := s.helm.Uninstall(context.WithoutCancel(ctx), r.Name); err != nil {
				s.logf("uninstall %s: %v", r.Name, err)
			}
		}
	}()
	if err := s.fanoutDeploy(ctx, releases(false), s.helm.Install); err != nil {
		return err
	}
	off, err := s.fanoutRun(ctx, false)
	if err != nil {
		return err
	}
	if err := s.fanoutDeploy(ctx, releases(true), s.helm.Upgrade); err != nil {
		return err
	}
	on, err := s.fanoutRun(ctx, true)
	if err != nil {
		return err
	}
	checks := criteria.FanoutChecks(off, on, criteria.DefaultFanoutLimits())
	s.res.Fanout = results.NewFanout(off, on, checks, roundS(time.Since(start)))
	var errs []error
	for _, c := range checks {
		if !c.OK {
			errs = append(errs, fmt.Errorf("%s: %s", c.Name, c.Detail))
		}
	}
	return errors.Join(errs...)
}

// fanoutDeploy installs or upgrades the releases at once, then waits until the pods they
// replaced are gone and every Service takes connections.
func (s *suite) fanoutDeploy(ctx context.Context, rels []cluster.Release, do func(context.Context, cluster.Release) error) error {
	var before []string
	for _, r := range rels {
		pods, err := s.kube.PodNames(ctx, serverSelector(r.Name))
		if err != nil {
			return err
		}
		before = append(before, pods...)
	}
	errs := make([]error, len(rels))
	var wg sync.WaitGroup
	for i, r := range rels {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = do(ctx, r)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	// The old pods would take the node's CPU from the measured ones while they drain.
	if err := s.kube.WaitPodsGone(wctx, before); err != nil {
		return err
	}
	for _, r := range rels {
		if err := s.kube.WaitEndpoints(wctx, service(r.Name), 1); err != nil {
			return err
		}
		if err := s.waitRoutable(wctx, service(r.Name)); err != nil {
			return err
		}
	}
	return nil
}

// fanoutRun offers the frontend the load and returns what became of the user requests and the
// legs over the measured window (the warm-up left out), with the sidecars' cohort levels read
// every few seconds. A run the load generator declares invalid (it could not keep its
// schedule) is measured again, up to maxAttempts runs, as the other rows' runs are.
func (s *suite) fanoutRun(ctx context.Context, cohorts bool) (criteria.FanoutRun, error) {
	run := criteria.FanoutRun{Cohorts: cohorts}
	pods := map[string]string{} // release -> its pod
	for _, rel := range append([]string{fanoutFrontend}, fanoutServices...) {
		names, err := s.kube.PodNames(ctx, serverSelector(rel))
		if err != nil {
			return run, err
		}
		if len(names) != 1 {
			return run, fmt.Errorf("%d pods of %s, want 1", len(names), rel)
		}
		pods[rel] = names[0]
	}
	for attempt := 1; ; attempt++ {
		job := fmt.Sprintf("%s-%s", fanoutFrontend, map[bool]string{false: "off", true: "on"}[cohorts])
		if attempt > 1 {
			job += fmt.Sprintf("-%d", attempt)
		}
		var err error
		run, err = s.fanoutMeasure(ctx, job, run, pods)
		if err != nil || run.Load.Valid || attempt == maxAttempts {
			s.logf("fan-out %s: end to end %.1f%%, wasted %.1f%% of admitted legs, load valid %v (%s)",
				run.Name(), 100*run.Success(), 100*run.WastedShare(), run.Load.Valid, run.Load.InvalidReason)
			return run, err
		}
		s.logf("fan-out %s: %s; measuring again", run.Name(), run.Load.InvalidReason)
	}
}

func (s *suite) fanoutMeasure(ctx context.Context, job string, run criteria.FanoutRun, pods map[string]string) (criteria.FanoutRun, error) {
	run.Legs, run.Levels, run.Measured = map[string]criteria.Legs{}, map[string][]float64{}, false
	dur := s.overload + fanoutWarmup
	args := []string{
		"--target", fanoutURL(fanoutFrontend), "--rate", fmt.Sprint(fanoutRPS), "--duration", dur.String(),
		"--warmup", fanoutWarmup.String(), "--poisson-seed", fmt.Sprint(fanoutSeed), "--traceparent",
		// Past the frontend's call timeout (2 s): every user request is answered.
		"--timeout", "3s",
		// The k6 rows' bound (MAX_LATE_MS, at p99): loadgen's default of 10 ms declared two runs
		// of three invalid on the busy node (p99 lateness 32-34 ms; 2026-11-27).
		"--late-tolerance", "100ms", "--json",
	}
	m, err := manifests.Render("loadgen-job.yaml", manifests.LoadgenJob{Name: job, Namespace: namespace, Image: s.loadgenImage,
		Args: args, DeadlineSeconds: int(dur.Seconds()) + 180})
	if err != nil {
		return run, err
	}
	if _, err := s.kube.StartJob(ctx, m); err != nil {
		return run, err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	started, err := s.kube.WaitJobRunning(wctx, job)
	cancel()
	if err != nil {
		return run, err
	}
	// The measured window starts after the warm-up, as loadgen's own figures do; the
	// container's start time is whole seconds (rounded down), hence the second more, so that
	// the window holds none of the levels' settling.
	select {
	case <-ctx.Done():
		return run, ctx.Err()
	case <-time.After(time.Until(started.Add(fanoutWarmup + time.Second))):
	}
	before, err := s.kube.PodMetrics(ctx, pods[fanoutFrontend], fmt.Sprint(fanoutAdminPort))
	if err != nil {
		return run, err
	}
	type done struct {
		res *cluster.Job
		err error
	}
	finished := make(chan done, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, dur+2*time.Minute)
		defer cancel()
		res, err := s.kube.WaitJob(wctx, job, "loadgen")
		finished <- done{res, err}
	}()
	tick := time.NewTicker(3 * time.Second)
	defer tick.Stop()
	var res *cluster.Job
	for res == nil {
		select {
		case d := <-finished:
			if d.err != nil {
				return run, d.err
			}
			res = d.res
		case <-tick.C:
			s.readLevels(ctx, pods, run.Levels)
		}
	}
	logPath := filepath.Join(s.artifacts, "k6", job+".log")
	_ = os.WriteFile(logPath, []byte(res.Log), 0o644)
	// loadgen exits 1 when its run is invalid, which the run's result says; anything else
	// (2: bad flags) is an error.
	if res.ExitCode != 0 && res.ExitCode != 1 {
		return run, fmt.Errorf("loadgen job %s exited %d; log in %s", job, res.ExitCode, logPath)
	}
	lg, err := cluster.ParseLoadgen(res.Log)
	if err != nil {
		return run, fmt.Errorf("loadgen job %s: %w (log in %s)", job, err, logPath)
	}
	run.Measured = true
	run.Load = criteria.Load{Valid: lg.Valid, InvalidReason: lg.InvalidReason, OfferedRPS: lg.OfferedRPS, Offered: lg.Offered,
		Success: lg.Success, Shed: lg.Shed, Timeouts: lg.Timeouts, Errors: lg.TransportErrors}
	after, err := s.kube.PodMetrics(ctx, pods[fanoutFrontend], fmt.Sprint(fanoutAdminPort))
	if err != nil {
		return run, err
	}
	users := diffBy(after, before, "backend_frontend_requests_total", "result", nil)
	run.UsersOK, run.UsersFailed = users["ok"], users["failed"]
	for _, rel := range fanoutServices {
		legs := diffBy(after, before, "backend_frontend_legs_total", "result", map[string]string{"leg": fanoutURL(rel)})
		run.Legs[rel] = criteria.Legs{OK: legs["ok"], Wasted: legs["wasted"], Refused: legs["refused"], Failed: legs["failed"]}
	}
	_ = writeJSON(filepath.Join(s.artifacts, "k6", job+".json"), map[string]any{"loadgen": lg, "run": run})
	return run, nil
}

// readLevels reads each sidecar's cohort admission level (the least over its routes) into
// levels; a sidecar without cohorts has none. A failed read only shortens the series.
func (s *suite) readLevels(ctx context.Context, pods map[string]string, levels map[string][]float64) {
	for rel, pod := range pods {
		m, err := s.kube.PodMetrics(ctx, pod, "9901")
		if err != nil {
			continue
		}
		samples := m["loadshed_cohort_level"]
		if len(samples) == 0 {
			continue
		}
		least := math.Inf(1)
		for _, smp := range samples {
			least = math.Min(least, smp.Value)
		}
		name := rel
		if rel == fanoutFrontend {
			name = "frontend"
		}
		levels[name] = append(levels[name], least)
	}
}

// diffBy is after's counter name, by label by among the samples matching match, less before's.
func diffBy(after, before cluster.Metrics, name, by string, match map[string]string) map[string]float64 {
	out := after.By(name, by, match)
	for k, v := range before.By(name, by, match) {
		out[k] -= v
	}
	return out
}
