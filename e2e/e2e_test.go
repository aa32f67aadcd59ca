//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/loadshed/loadshed/bench/k6summary"
	"github.com/loadshed/loadshed/e2e/internal/cluster"
	"github.com/loadshed/loadshed/e2e/internal/criteria"
	"github.com/loadshed/loadshed/e2e/internal/results"
	"github.com/loadshed/loadshed/e2e/manifests"
)

const (
	namespace    = "loadshed-e2e"
	loadshedRef  = "loadshed:e2e"
	capacityRPS  = 200
	sloMs        = 100
	overloadK    = 3
	unloadedK    = 0.25
	steadyK      = 0.5
	highShed     = "LoadshedHighShedRatio"
	officialProm = "prom/prometheus:v2.55.1"
	// offlineRootfs is the Debian image the offline node image build leaves behind.
	offlineRootfs = "kind-offline/rootfs:bookworm"
)

type settings struct {
	root, artifacts, cache     string
	cluster                    string
	nodeImage, promImage       string
	strategies                 []string
	overload, unloaded, steady time.Duration
	keep                       bool
	quota                      switchMode    // E2E_QUOTA (quota_test.go)
	envoy                      switchMode    // E2E_ENVOY (envoy_test.go)
	inject                     switchMode    // E2E_INJECT (inject_test.go)
	cohorts                    switchMode    // E2E_COHORTS (fanout_test.go)
	steal                      cluster.Steal // E2E_STEAL: the node stalled through each strategy row's measurement
}

func loadSettings(t *testing.T) settings {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "go.mod")); err != nil || !strings.Contains(string(b), "module github.com/loadshed/loadshed\n") {
		t.Fatalf("%s is not the loadshed repository root (run the test from e2e/)", root)
	}
	s := settings{
		root:       root,
		artifacts:  envOr("E2E_ARTIFACTS", filepath.Join(root, "out", "e2e")),
		cache:      envOr("LOADSHED_CACHE", filepath.Join(os.Getenv("HOME"), ".cache", "loadshed")),
		cluster:    os.Getenv("E2E_CLUSTER"),
		nodeImage:  os.Getenv("KIND_NODE_IMAGE"),
		promImage:  os.Getenv("PROMETHEUS_IMAGE"),
		strategies: criteria.Strategies,
		overload:   durationEnv(t, "E2E_OVERLOAD", 30*time.Second),
		unloaded:   durationEnv(t, "E2E_UNLOADED", 10*time.Second),
		steady:     durationEnv(t, "E2E_STEADY", 40*time.Second),
		keep:       os.Getenv("E2E_KEEP_CLUSTER") == "1",
		quota:      switchSetting(t, "E2E_QUOTA"),
		envoy:      switchSetting(t, "E2E_ENVOY"),
		inject:     switchSetting(t, "E2E_INJECT"),
		cohorts:    switchSetting(t, "E2E_COHORTS"),
	}
	steal, err := cluster.ParseSteal(os.Getenv("E2E_STEAL"))
	if err != nil {
		t.Fatal(err)
	}
	s.steal = steal
	if !filepath.IsAbs(s.artifacts) {
		s.artifacts = filepath.Join(root, s.artifacts)
	}
	if s.cluster == "" {
		b := make([]byte, 3)
		_, _ = rand.Read(b)
		s.cluster = "loadshed-e2e-" + hex.EncodeToString(b)
	}
	if v := os.Getenv("E2E_STRATEGIES"); v != "" {
		s.strategies = nil
		for _, name := range strings.Split(v, ",") {
			name = strings.TrimSpace(name)
			if !contains(criteria.Strategies, name) {
				t.Fatalf("E2E_STRATEGIES: unknown strategy %q (want some of %s)", name, strings.Join(criteria.Strategies, ","))
			}
			s.strategies = append(s.strategies, name)
		}
	}
	only := 0
	for _, m := range []switchMode{s.quota, s.envoy, s.inject, s.cohorts} {
		if m == switchOnly {
			only++
		}
	}
	if only > 1 {
		t.Fatal("E2E_QUOTA, E2E_ENVOY, E2E_INJECT, E2E_COHORTS: at most one of them may be only")
	}
	switch {
	case s.quota == switchOnly:
		s.strategies, s.envoy, s.inject, s.cohorts = nil, switchOff, switchOff, switchOff
	case s.envoy == switchOnly:
		s.strategies, s.quota, s.inject, s.cohorts = nil, switchOff, switchOff, switchOff
	case s.inject == switchOnly:
		s.strategies, s.quota, s.envoy, s.cohorts = nil, switchOff, switchOff, switchOff
	case s.cohorts == switchOnly:
		s.strategies, s.quota, s.envoy, s.inject = nil, switchOff, switchOff, switchOff
	}
	return s
}

// switchMode is the setting of a group of rows that can also run alone (E2E_QUOTA, E2E_ENVOY):
// 1 (default) runs them after the strategies' rows, 0 leaves them out, only runs nothing else.
type switchMode int

const (
	switchOn switchMode = iota
	switchOff
	switchOnly
)

func switchSetting(t *testing.T, name string) switchMode {
	t.Helper()
	switch v := os.Getenv(name); v {
	case "", "1":
		return switchOn
	case "0":
		return switchOff
	case "only":
		return switchOnly
	default:
		t.Fatalf("%s: want 1, 0 or only, got %q", name, v)
		return switchOff
	}
}

// suite is one run of the end-to-end test.
type suite struct {
	t *testing.T
	settings
	run     *cluster.Runner
	tools   cluster.Tools
	kind    *cluster.Kind
	kube    *cluster.Kube
	helm    *cluster.Helm
	prom    *cluster.Prometheus
	k6Image string
	res     results.Results
	// redisImage is the quota rows' Redis (quota_test.go).
	redisImage string
	// envoyImage and envoyConfig are the Envoy row's image and Envoy config file (envoy_test.go).
	envoyImage, envoyConfig string
	// The injection rows' binaries, the injector's image, the server's version and the rows'
	// results (inject_test.go).
	injectBin, injectorBin, injectorImage, kubeVersion string
	injected                                           []results.Row
	// loadgenImage is the fan-out row's load generator (fanout_test.go).
	loadgenImage string

	mu      sync.Mutex
	timings []results.Timing
}

func (s *suite) logf(format string, args ...any) {
	s.t.Helper()
	s.t.Logf("%s "+format, append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// phase runs fn and records how long it took.
func (s *suite) phase(name string, fn func() error) error {
	s.logf("== %s", name)
	start := time.Now()
	err := fn()
	s.mu.Lock()
	s.timings = append(s.timings, results.Timing{Phase: name, Seconds: roundS(time.Since(start))})
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func TestKind(t *testing.T) {
	st := loadSettings(t)
	start := time.Now()
	// Outputs of an earlier run go; the folder itself stays (scripts/e2e.sh logs into it).
	for _, old := range []string{"k6", "cluster", "commands.log", "results.md", "results.json"} {
		if err := os.RemoveAll(filepath.Join(st.artifacts, old)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(st.artifacts, "k6"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := &suite{t: t, settings: st}
	s.run = &cluster.Runner{Dir: st.root, LogFile: filepath.Join(st.artifacts, "commands.log"), Log: s.logf}

	// Interrupts end the run through its context, so every cleanup below still happens.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if dl, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-3*time.Minute))
		defer cancel()
	}
	s.res = results.Results{
		Command: "scripts/e2e.sh", Started: start.UTC(), Cluster: st.cluster,
		CapacityRPS: capacityRPS, SLOMs: sloMs, LoadFactor: overloadK, DurationS: st.overload.Seconds(),
	}
	s.logf("cluster %s, artifacts in %s", st.cluster, st.artifacts)

	var promImage string
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.phase("prerequisites", func() error { return s.prerequisites(ctx) }))
	must(s.phase("images", func() (err error) { promImage, err = s.images(ctx); return err }))
	if st.quota != switchOff {
		must(s.phase("redis image", func() error { return s.buildRedisImage(ctx) }))
	}
	if st.envoy != switchOff {
		must(s.phase("envoy image", func() error { return s.buildEnvoyImage(ctx) }))
	}
	if st.inject != switchOff {
		must(s.phase("inject and injector: binaries and image", func() error { return s.buildInjection(ctx) }))
	}
	if st.cohorts != switchOff {
		must(s.phase("loadgen: binary and image", func() error { return s.buildLoadgen(ctx) }))
	}
	must(s.phase("cluster and images in it", func() error {
		images := append([]string{loadshedRef, s.k6Image, promImage}, s.quotaImages()...)
		images = append(images, s.injectImages()...)
		images = append(images, s.fanoutImages()...)
		return s.createCluster(ctx, append(images, s.envoyImages()...)...)
	}))
	must(s.phase("prometheus", func() error { return s.prometheus(ctx, promImage) }))

	// Strategies run one after another; while one's high-shed alert resolves (about 25 s with
	// the e2e's 20 s windows) the next is installed and measured. Its release stays until then.
	var wg sync.WaitGroup
	rows := s.rows()
	outcomes := make([]criteria.Outcome, len(rows))
	for i, r := range rows {
		if ctx.Err() != nil {
			break
		}
		name := r.name
		var o criteria.Outcome
		var finished time.Time
		err := s.phase("strategy "+name, func() error {
			var earlier []criteria.Earlier
			for attempt := 1; ; attempt++ {
				var err error
				o, finished, err = s.measure(ctx, r, attempt)
				o.Attempts, o.Earlier = attempt, earlier
				if err != nil || attempt == maxAttempts {
					return err
				}
				// A run in which k6 could not keep its schedule (the node's CPU went elsewhere)
				// says nothing about the strategy, and one that missed only goodput or latency
				// bounds may have met a stall of the node: measure again on a fresh release,
				// once its alert has cleared.
				why := again(o, r.judge, judgeLimits(outcomes), &earlier)
				if why == "" {
					return nil
				}
				s.logf("%s: %s; measuring again", name, why)
				if o.Alert.Fired {
					s.waitResolved(ctx, r.release, finished)
				}
				if err := s.helm.Uninstall(ctx, r.release); err != nil {
					return err
				}
			}
		})
		outcomes[i] = o
		if err != nil {
			t.Error(err)
			_ = s.helm.Uninstall(context.WithoutCancel(ctx), r.release)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if o.Alert.Fired {
				o.Alert.Resolved, o.Alert.ResolvedAfterS = s.waitResolved(ctx, r.release, finished)
				outcomes[i].Alert = o.Alert
			}
			if err := s.helm.Uninstall(context.WithoutCancel(ctx), r.release); err != nil {
				t.Errorf("uninstall %s: %v", r.release, err)
			}
		}()
	}
	if ctx.Err() == nil && len(st.strategies) > 0 {
		if err := s.phase("steady load: rollout restart and helm upgrade", func() error { return s.steadyReplacements(ctx) }); err != nil {
			t.Error(err)
		}
	}
	wg.Wait()
	if ctx.Err() == nil && st.quota != switchOff {
		if err := s.phase("quota across replicas", func() error { return s.quotaRows(ctx) }); err != nil {
			t.Error(err)
		}
	}
	if ctx.Err() == nil && st.cohorts != switchOff {
		if err := s.phase("fan-out: cohorts off against on", func() error { return s.fanoutRow(ctx) }); err != nil {
			t.Error(err)
		}
	}
	if ctx.Err() == nil && st.inject != switchOff {
		if err := s.injectionRows(ctx); err != nil {
			t.Error(err)
		}
	}
	// Judged together: the bounded queue's bound takes its service time under load from the
	// in-flight run (same load, no queue).
	limits := judgeLimits(outcomes)
	for i, o := range outcomes {
		if o.Strategy == "" {
			continue
		}
		checks := rows[i].judge(o, limits)
		s.res.Strategies = append(s.res.Strategies, results.NewRow(o, checks))
		for _, c := range checks {
			if !c.OK {
				t.Errorf("%s: %s: %s", o.Strategy, c.Name, c.Detail)
			}
		}
	}
	s.res.Strategies = append(s.res.Strategies, s.injected...)
	s.timings = append(s.timings, results.Timing{Phase: "total", Seconds: roundS(time.Since(start))})
	s.res.Timings = s.timings
	s.res.Pass = !t.Failed() && ctx.Err() == nil
	if err := s.res.Write(st.artifacts); err != nil {
		t.Error(err)
	}
	t.Logf("results (%s):\n%s", filepath.Join(st.artifacts, "results.md"), s.res.Markdown())
	if ctx.Err() != nil {
		t.Fatalf("run cut short: %v", ctx.Err())
	}
}

func (s *suite) prerequisites(ctx context.Context) error {
	if s.nodeImage == "" {
		if dir, ok := cluster.OfflineToolsDir(s.root); ok {
			s.logf("no container registry tools: building the offline node image with %s", dir)
			img, err := cluster.OfflineNodeImage(ctx, s.run, dir)
			if err != nil {
				return err
			}
			s.nodeImage = img
		}
	}
	s.res.NodeImage = s.nodeImage
	if !s.steal.IsZero() {
		s.res.Steal = s.steal.String()
	}
	if s.nodeImage == "" {
		s.res.NodeImage = "kind's default"
	}
	if err := cluster.DockerReady(ctx, s.run); err != nil {
		return err
	}
	tools, err := cluster.InstallTools(ctx, s.run, s.envoy != switchOff)
	s.tools = tools
	return err
}

func (s *suite) images(ctx context.Context) (prom string, err error) {
	if _, err := cluster.LoadshedImage(ctx, s.run, loadshedRef); err != nil {
		return "", err
	}
	if s.k6Image, err = cluster.K6Image(ctx, s.run, s.root, s.tools.K6); err != nil {
		return "", err
	}
	switch {
	case s.promImage != "":
		return s.promImage, cluster.PullImage(ctx, s.run, s.promImage)
	case cluster.ImageExists(ctx, offlineRootfs):
		return cluster.PrometheusImage(ctx, s.run, s.root, s.cache, offlineRootfs)
	default:
		return officialProm, cluster.PullImage(ctx, s.run, officialProm)
	}
}

// createCluster creates the kind cluster and loads the images into its node while the
// control plane comes up.
func (s *suite) createCluster(ctx context.Context, images ...string) error {
	tmp := s.t.TempDir()
	s.kind = &cluster.Kind{Bin: s.tools.Kind, Name: s.cluster, Kubeconfig: filepath.Join(tmp, "kubeconfig"), Runner: s.run}
	// Cleanups run last-registered first: logs are exported before the cluster goes.
	s.t.Cleanup(func() {
		if s.keep {
			s.logf("E2E_KEEP_CLUSTER=1: keeping cluster %s (kubeconfig %s)", s.cluster, s.kind.Kubeconfig)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := s.kind.Delete(ctx); err != nil {
			s.t.Errorf("delete cluster %s: %v", s.cluster, err)
		}
	})
	s.t.Cleanup(func() {
		if !s.t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		dir := filepath.Join(s.artifacts, "cluster")
		s.logf("the run failed: exporting the cluster's logs to %s", dir)
		if err := s.kind.ExportLogs(ctx, filepath.Join(dir, "kind")); err != nil {
			// The offline node image has no crictl; kind still exports everything else.
			s.logf("kind export logs (partly done): %v", err)
		}
		if s.kube != nil {
			// The injection rows' namespaces too: their workloads are not the chart's.
			if err := s.kube.Dump(ctx, dir, namespace, "kube-system", injectorNS, webhookNS, cliNS); err != nil {
				s.logf("dump: %v", err)
			}
		}
	})
	if err := s.kind.Create(ctx, s.nodeImage); err != nil {
		return err
	}
	kube, err := cluster.NewKube(s.kind.Kubeconfig, namespace)
	if err != nil {
		return err
	}
	s.kube = kube
	loaded := make(chan error, 1)
	go func() { loaded <- s.kind.Load(ctx, images...) }()
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	err = kube.WaitNodesReady(wctx)
	if err == nil {
		// Services are reached by name: DNS must answer first.
		err = kube.WaitRollout(wctx, "kube-system", "coredns")
	}
	if lerr := <-loaded; lerr != nil {
		return lerr
	}
	if err != nil {
		return err
	}
	s.helm = &cluster.Helm{Bin: s.tools.Helm, Kubeconfig: s.kind.Kubeconfig, Namespace: namespace,
		Chart: filepath.Join(s.root, "deploy", "helm", "loadshed"), Runner: s.run}
	return kube.CreateNamespace(ctx)
}

// prometheus deploys Prometheus with the chart's alert rules, rendered by the chart itself
// with the e2e's short windows, and waits until it has loaded them.
func (s *suite) prometheus(ctx context.Context, image string) error {
	rules, err := s.helm.Template(ctx, cluster.Release{
		Name:        "alerts",
		ValuesFiles: []string{s.values("alerts")},
		Set:         []string{"fullnameOverride=loadshed"},
	}, "templates/prometheusrule.yaml")
	if err != nil {
		return err
	}
	if err := s.kube.Apply(ctx, []byte(rules)); err != nil {
		return err
	}
	m, err := manifests.Render("prometheus.yaml", manifests.Prometheus{
		Namespace: namespace, Image: image, RulesConfigMap: "loadshed-rules", ScrapeInterval: "2s",
		Releases: append(append(releases(s.rows()), steadyRelease), s.quotaReleases()...),
	})
	if err != nil {
		return err
	}
	if err := s.kube.Apply(ctx, m); err != nil {
		return err
	}
	s.prom = &cluster.Prometheus{Kube: s.kube, Service: "prometheus", Port: "9090"}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := s.kube.WaitRollout(wctx, namespace, "prometheus"); err != nil {
		return err
	}
	return cluster.Poll(wctx, time.Second, "Prometheus to load the loadshed alert rules", func(ctx context.Context) (bool, string, error) {
		if err := s.prom.Ready(ctx); err != nil {
			return false, err.Error(), nil
		}
		names, err := s.prom.AlertingRules(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		return contains(names, highShed), fmt.Sprintf("rules %v", names), nil
	})
}

func release(strategy string) string { return "e2e-" + strategy }

// row is one line of the results table: a strategy's release, the k6 runs that measure it and
// how they are judged.
type row struct {
	name     string // the row's name in the results (Outcome.Strategy)
	release  string
	values   []string // values files of e2e/values after common.yaml
	unloaded script   // the run at a quarter of capacity
	overload script   // the run at 3x
	judge    func(criteria.Outcome, criteria.Limits) []criteria.Check
	// install, when set, gives the release's --set and --set-file pairs beyond the image's.
	install func() (set, setFiles []string)
	// after, when set, adds to the outcome once the overload run has ended.
	after func(ctx context.Context, rel string, o *criteria.Outcome) error
}

// script is a k6 script of loadtest/k6 and the environment it gets beyond startK6's.
type script struct {
	name string
	env  []manifests.EnvVar
}

// strategyRow is the HTTP row of a strategy.
func strategyRow(strategy string) row {
	return row{
		name: strategy, release: release(strategy), values: []string{strategy},
		unloaded: script{"smoke.js", []manifests.EnvVar{{Name: "MIN_CHECKS", Value: "0"}}},
		overload: script{name: "overload.js"},
		judge:    criteria.Judge,
	}
}

// rows are the rows of this run: the strategies' HTTP rows, then those of other protocols.
func (s *suite) rows() []row {
	var out []row
	for _, name := range s.strategies {
		out = append(out, strategyRow(name))
	}
	out = append(out, s.grpcRows()...)
	return append(out, s.envoyRows()...)
}

func releases(rows []row) []string {
	var out []string
	for _, r := range rows {
		out = append(out, r.release)
	}
	return out
}

// maxAttempts bounds how often a strategy is measured when k6 reports an invalid run or the
// row misses only timed checks (again).
const maxAttempts = 3

// judgeLimits are the limits rows are judged by, given the outcomes measured so far: the
// bounded queue's bound takes its service time under load from the in-flight run (same load,
// no queue) once there is one.
func judgeLimits(outcomes []criteria.Outcome) criteria.Limits {
	limits := criteria.DefaultLimits()
	for _, o := range outcomes {
		if o.Strategy == criteria.Inflight && o.Overload != nil && o.Overload.Usable() == nil {
			limits.ServiceMs = k6summary.Value(o.Overload.AdmittedMs.P999)
		}
	}
	return limits
}

// again says why a measured row is to be measured once more, or "" when its run stands: k6 did
// not keep its schedule, or the row missed timed checks only (criteria.Remeasure), which are
// then appended to earlier for the report. The alert's resolution is judged after the row's
// run, so here it counts as met.
func again(o criteria.Outcome, judge func(criteria.Outcome, criteria.Limits) []criteria.Check, l criteria.Limits, earlier *[]criteria.Earlier) string {
	if err := criteria.Usable(o); err != nil {
		return err.Error()
	}
	probe := o
	probe.Alert.Resolved = true
	missed := criteria.Remeasure(judge(probe, l))
	if len(missed) == 0 {
		return ""
	}
	*earlier = append(*earlier, criteria.EarlierOf(o, missed))
	return "missed only timed checks (" + strings.Join(missed, "; ") + ")"
}

// steadyRelease is the release whose pods are replaced under steady load.
const steadyRelease = "e2e-steady"

func service(rel string) string { return rel + "-loadshed" }

func (s *suite) values(name string) string {
	return filepath.Join(s.root, "e2e", "values", name+".yaml")
}

func (s *suite) install(ctx context.Context, rel string, valuesFiles ...string) error {
	return s.installRow(ctx, row{release: rel, values: valuesFiles})
}

// installRow installs the row's release and waits for its Service's endpoint.
func (s *suite) installRow(ctx context.Context, r row) error {
	rel := r.release
	files := []string{s.values("common")}
	for _, f := range r.values {
		files = append(files, s.values(f))
	}
	set, setFiles := imageSet(), []string(nil)
	if r.install != nil {
		more, fromFiles := r.install()
		set, setFiles = append(set, more...), fromFiles
	}
	err := s.helm.Install(ctx, cluster.Release{Name: rel, ValuesFiles: files, Set: set, SetFiles: setFiles})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := s.kube.WaitEndpoints(wctx, service(rel), 1); err != nil {
		return err
	}
	return s.waitRoutable(wctx, service(rel))
}

// waitRoutable waits until the Service's cluster IP is routed to its endpoints: they can be
// ready before kube-proxy has programmed it, and a load that starts then is refused or, worse,
// holds keep-alive connections to whatever answers the unrouted address.
func (s *suite) waitRoutable(ctx context.Context, svc string) error {
	return s.waitRoutableIn(ctx, s.kube, svc)
}

// waitRoutableIn is waitRoutable for Services in k's namespace.
func (s *suite) waitRoutableIn(ctx context.Context, k *cluster.Kube, svcs ...string) error {
	for _, svc := range svcs {
		ip, ports, err := k.ServiceAddress(ctx, svc)
		if err != nil {
			return err
		}
		if err := s.kind.WaitRoutable(ctx, ip, ports); err != nil {
			return fmt.Errorf("%s/%s: %w", k.NS, svc, err)
		}
	}
	return nil
}

func imageSet() []string {
	repo, tag, _ := strings.Cut(loadshedRef, ":")
	return []string{"image.repository=" + repo, "image.tag=" + tag}
}

// k6 runs script as a Job against the release's Service at load factor k for dur and returns
// the run's summary. extra environment variables override the defaults.
func (s *suite) k6(ctx context.Context, job, rel, script string, k float64, dur time.Duration, extra ...manifests.EnvVar) (*k6summary.Summary, *cluster.Job, error) {
	if _, err := s.startK6(ctx, job, rel, script, k, dur, "stderr", extra...); err != nil {
		return nil, nil, err
	}
	return s.finishK6(ctx, job, dur)
}

func (s *suite) startK6(ctx context.Context, job, rel, script string, k float64, dur time.Duration, logOutput string, extra ...manifests.EnvVar) (time.Time, error) {
	env := []manifests.EnvVar{
		{Name: "TARGET_URL", Value: fmt.Sprintf("http://%s.%s.svc.cluster.local/", service(rel), namespace)},
		{Name: "CAPACITY_RPS", Value: fmt.Sprint(capacityRPS)},
		{Name: "SLO_MS", Value: fmt.Sprint(sloMs)},
		{Name: "CLIENT_TIMEOUT", Value: "1s"},
		{Name: "K", Value: fmt.Sprint(k)},
		{Name: "DURATION", Value: dur.String()},
	}
	for _, e := range extra {
		// An extra variable replaces a default of the same name: duplicate names in a container's
		// env are ambiguous to Kubernetes.
		if i := slices.IndexFunc(env, func(d manifests.EnvVar) bool { return d.Name == e.Name }); i >= 0 {
			env[i] = e
		} else {
			env = append(env, e)
		}
	}
	m, err := manifests.Render("k6-job.yaml", manifests.K6Job{
		Name: job, Namespace: namespace, Image: s.k6Image, Script: script, Env: env,
		DeadlineSeconds: int(dur.Seconds()) + 180, LogOutput: logOutput,
	})
	if err != nil {
		return time.Time{}, err
	}
	if _, err := s.kube.StartJob(ctx, m); err != nil {
		return time.Time{}, err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return s.kube.WaitJobRunning(wctx, job)
}

func (s *suite) finishK6(ctx context.Context, job string, dur time.Duration) (*k6summary.Summary, *cluster.Job, error) {
	wctx, cancel := context.WithTimeout(ctx, dur+2*time.Minute)
	defer cancel()
	res, err := s.kube.WaitJob(wctx, job, "k6")
	if err != nil {
		return nil, nil, err
	}
	_ = os.WriteFile(filepath.Join(s.artifacts, "k6", job+".log"), []byte(res.Log), 0o644)
	// k6 exits 99 when one of the script's own thresholds is crossed; the e2e judges the run
	// by its own criteria, so that is not an error. Anything else is.
	if res.ExitCode != 0 && res.ExitCode != 99 {
		return nil, res, fmt.Errorf("k6 job %s exited %d; log in %s", job, res.ExitCode, filepath.Join(s.artifacts, "k6", job+".log"))
	}
	sum, err := cluster.K6Summary(res.Log)
	if err != nil {
		return nil, res, fmt.Errorf("k6 job %s: %w", job, err)
	}
	if err := writeJSON(filepath.Join(s.artifacts, "k6", job+".json"), sum); err != nil {
		return nil, res, err
	}
	return sum, res, nil
}

// measure installs the row's release, measures it at a quarter of capacity and then at 3x
// while watching its alerts, and returns the outcome and when the overload ended. The release
// is left installed: the caller watches its alert resolve, then uninstalls it.
func (s *suite) measure(ctx context.Context, r row, attempt int) (criteria.Outcome, time.Time, error) {
	strategy, after := r.name, r.after
	o := criteria.Outcome{Strategy: strategy}
	rel := r.release
	suffix := ""
	if attempt > 1 {
		suffix = fmt.Sprintf("-%d", attempt)
	}
	if err := s.installRow(ctx, r); err != nil {
		return o, time.Time{}, err
	}
	// E2E_STEAL: the node stalls from here until the overload's k6 job is done, the unloaded
	// run included, so that the row's latency bound (a multiple of its unloaded p99) is taken
	// under the same stalls. Nothing in between runs docker exec, which a frozen node refuses.
	unsteal := func() {}
	if !s.steal.IsZero() {
		stop, err := s.steal.Start(ctx, "docker", s.cluster+"-control-plane", uint64(len(rel)+attempt))
		if err != nil {
			return o, time.Time{}, err
		}
		unsteal = func() {
			share, err := stop()
			if err != nil {
				s.logf("%s: E2E_STEAL: %v", strategy, err)
			}
			s.logf("%s: the node was frozen %.1f%% of the measurement (E2E_STEAL=%s)", strategy, share*100, s.steal)
			unsteal = func() {}
		}
	}
	defer func() { unsteal() }()
	unloaded, _, err := s.k6(ctx, rel+"-unloaded"+suffix, rel, r.unloaded.name, unloadedK, s.unloaded, r.unloaded.env...)
	if err != nil {
		return o, time.Time{}, err
	}
	o.Unloaded = unloaded
	s.logf("%s unloaded: %d requests, p99 %.1f ms", strategy, unloaded.Requests, k6summary.Value(unloaded.AdmittedMs.P99))

	// The alert's rates need the release's counters in Prometheus before the overload starts,
	// and the alert must be inactive then: it is to fire because of the overload.
	if err := s.waitScraped(ctx, rel); err != nil {
		return o, time.Time{}, err
	}
	if ok, _ := s.waitResolved(ctx, rel, time.Now()); !ok {
		return o, time.Time{}, fmt.Errorf("the %s alert of %s is active before the overload", highShed, rel)
	}
	job := rel + "-overload" + suffix
	// Without admission nearly every request times out, and k6 would log each one.
	started, err := s.startK6(ctx, job, rel, r.overload.name, overloadK, s.overload, "none", r.overload.env...)
	if err != nil {
		return o, time.Time{}, err
	}
	type result struct {
		sum *k6summary.Summary
		job *cluster.Job
		err error
	}
	done := make(chan result, 1)
	go func() {
		sum, j, err := s.finishK6(ctx, job, s.overload)
		done <- result{sum, j, err}
	}()
	others := map[string]bool{}
	cpu := newCPUWatch(s.kube, job, rel)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case r := <-done:
			unsteal()
			if r.err != nil {
				return o, time.Time{}, r.err
			}
			o.Overload = r.sum
			o.CPU = cpu.cores()
			if lr, err := s.limitRange(ctx, rel, s.overload); err != nil {
				s.logf("%s: adaptive limit: %v", strategy, err)
			} else {
				o.Limit = lr
			}
			if after != nil {
				if err := after(ctx, rel, &o); err != nil {
					return o, time.Time{}, err
				}
			}
			for name := range others {
				o.Alert.Others = append(o.Alert.Others, name)
			}
			s.logf("%s overload: goodput %.1f rps, p99 %.1f ms, shed %.1f%%, high-shed alert fired %v after %.0f s",
				strategy, r.sum.GoodputRPS, k6summary.Value(r.sum.AdmittedMs.P99), r.sum.ShedShare*100, o.Alert.Fired, o.Alert.FiredAfterS)
			return o, r.job.Finished, nil
		case <-tick.C:
			if n%3 == 0 {
				cpu.sample(ctx)
			}
			alerts, err := s.prom.Alerts(ctx)
			if err != nil {
				s.logf("alerts: %v", err)
				continue
			}
			for _, a := range alerts {
				if a.Labels["job"] != rel || a.State != "firing" {
					continue
				}
				if a.Labels["alertname"] == highShed {
					if !o.Alert.Fired {
						o.Alert.Fired, o.Alert.FiredAfterS = true, roundS(time.Since(started))
					}
				} else {
					others[a.Labels["alertname"]] = true
				}
			}
		}
	}
}

// limitRange reads the release's adaptive limit over the last d from Prometheus: its least,
// mean and largest scraped value across the release's pods. Nil, without error, when the
// release has no adaptive limit.
func (s *suite) limitRange(ctx context.Context, rel string, d time.Duration) (*criteria.LimitRange, error) {
	sel := fmt.Sprintf(`loadshed_limit{namespace=%q,job=%q,strategy="adaptive"}[%ds]`, namespace, rel, int(d.Seconds()))
	var v [3]float64
	for i, q := range []string{"min(min_over_time(%s))", "avg(avg_over_time(%s))", "max(max_over_time(%s))"} {
		samples, err := s.prom.Query(ctx, fmt.Sprintf(q, sel))
		if err != nil {
			return nil, err
		}
		if len(samples) == 0 {
			return nil, nil
		}
		v[i] = samples[0].Value
	}
	return &criteria.LimitRange{Min: v[0], Mean: v[1], Max: v[2]}, nil
}

// cpuWatch follows the CPU time of k6 and of the release pod's containers during a run, from
// the kubelet's summary (refreshed every few seconds), to show what the run cost.
type cpuWatch struct {
	kube          *cluster.Kube
	job, rel      string
	k6Pod, appPod string
	first, last   map[string]cluster.CPUSample
}

func newCPUWatch(kube *cluster.Kube, job, rel string) *cpuWatch {
	return &cpuWatch{kube: kube, job: job, rel: rel, first: map[string]cluster.CPUSample{}, last: map[string]cluster.CPUSample{}}
}

func (w *cpuWatch) sample(ctx context.Context) {
	if w.k6Pod == "" {
		if p, err := w.kube.JobPod(ctx, w.job); err == nil && p != nil {
			w.k6Pod = p.Name
		}
	}
	if w.appPod == "" {
		if names, err := w.kube.PodNames(ctx, serverSelector(w.rel)); err == nil && len(names) == 1 {
			w.appPod = names[0]
		}
	}
	for _, pod := range []string{w.k6Pod, w.appPod} {
		if pod == "" {
			continue
		}
		got, err := w.kube.ContainerCPU(ctx, pod)
		if err != nil {
			continue // stats are informational; a missed sample only shortens the span
		}
		for name, v := range got {
			if _, ok := w.first[name]; !ok {
				w.first[name] = v
			}
			w.last[name] = v
		}
	}
}

// cores returns the mean cores each container used between its first and last sample.
func (w *cpuWatch) cores() map[string]float64 {
	out := map[string]float64{}
	for name, f := range w.first {
		if c := cluster.Cores(f, w.last[name]); c > 0 {
			out[name] = math.Round(c*100) / 100
		}
	}
	return out
}

func serverSelector(rel string) string {
	return "app.kubernetes.io/instance=" + rel + ",app.kubernetes.io/component=server"
}

// waitScraped waits until Prometheus has scraped the release's sidecar and holds its request
// counter.
func (s *suite) waitScraped(ctx context.Context, rel string) error {
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	q := fmt.Sprintf(`sum(loadshed_requests_total{namespace=%q,job=%q})`, namespace, rel)
	return cluster.Poll(wctx, time.Second, "Prometheus to scrape "+rel, func(ctx context.Context) (bool, string, error) {
		v, err := s.prom.Sum(ctx, q)
		if err != nil {
			return false, err.Error(), nil
		}
		return v > 0, fmt.Sprintf("%s = %v", q, v), nil
	})
}

// waitResolved waits until the release's high-shed alert is neither pending nor firing and
// returns the seconds since the overload ended.
func (s *suite) waitResolved(ctx context.Context, rel string, finished time.Time) (bool, float64) {
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	err := cluster.Poll(wctx, time.Second, highShed+" of "+rel+" to resolve", func(ctx context.Context) (bool, string, error) {
		alerts, err := s.prom.Alerts(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		for _, a := range alerts {
			if a.Labels["job"] == rel && a.Labels["alertname"] == highShed {
				return false, "alert " + a.State, nil
			}
		}
		return true, "", nil
	})
	if err != nil {
		s.logf("%v", err)
		return false, 0
	}
	return true, roundS(time.Since(finished))
}

// steadyReplacements replaces the pods of a release twice under steady load at half the
// capacity, first with a rollout restart, then with a helm upgrade that changes the strategy
// (bounded queue to token bucket), and demands that no request fails either time. Both
// strategies admit everything at half the capacity even when the shared node slows the pods
// down for a moment (a queue, a rate), so any failure is the replacement's.
func (s *suite) steadyReplacements(ctx context.Context) error {
	const rel = steadyRelease
	selector := serverSelector(rel)
	if err := s.install(ctx, rel, criteria.BoundedQueue, "steady"); err != nil {
		return err
	}
	ops := []struct {
		name string
		do   func(context.Context) error
	}{
		{"kubectl rollout restart", func(ctx context.Context) error { return s.kube.RolloutRestart(ctx, service(rel)) }},
		{"helm upgrade bounded-queue -> token-bucket", func(ctx context.Context) error {
			return s.helm.Upgrade(ctx, cluster.Release{
				Name:        rel,
				ValuesFiles: []string{s.values("common"), s.values(criteria.TokenBucket), s.values("steady")},
				Set:         imageSet(),
			})
		}},
	}
	var errs []error
	for i, op := range ops {
		before, err := s.kube.PodNames(ctx, selector)
		if err != nil {
			return err
		}
		load := steadyLoad{
			job: fmt.Sprintf("%s-%d", rel, i+1), rel: rel, judge: criteria.SteadyChecks,
			// Replace the pods only once requests flow through the Service.
			ready: func(ctx context.Context) error { return s.waitRequests(ctx, rel, 50) },
		}
		checks, err := s.underSteadyLoad(ctx, op.name, load, func(ctx context.Context) ([]criteria.Check, error) {
			s.logf("%s: pods %v", op.name, before)
			err := op.do(ctx)
			if err == nil {
				err = s.kube.WaitRollout(ctx, namespace, service(rel))
			}
			if err == nil {
				// The old pods drain before they go: the sidecar keeps serving for drainDelay (a
				// regular container), or the application's preStop holds it in a drain window
				// (a native sidecar, from Kubernetes 1.33).
				err = s.kube.WaitPodsGone(ctx, before)
			}
			if err != nil || i != 1 {
				return nil, err
			}
			q := fmt.Sprintf(`sum(loadshed_requests_total{namespace=%q,job=%q,strategy="token-bucket"})`, namespace, rel)
			n, err := s.prom.Sum(ctx, q)
			return []criteria.Check{{
				Name: op.name + ": the new strategy serves", OK: err == nil && n > 0,
				Detail: fmt.Sprintf("%s = %v (%v)", q, n, err),
			}}, nil
		})
		if err != nil {
			return err
		}
		for _, c := range checks {
			if !c.OK {
				errs = append(errs, fmt.Errorf("%s: %s", c.Name, c.Detail))
			}
		}
	}
	if err := s.helm.Uninstall(context.WithoutCancel(ctx), rel); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// steadyLoad is the k6 job of an operation under steady load at half the capacity: to the
// release rel's Service, or to target; ready, when set, is waited for before the operation
// starts; judge judges the run.
type steadyLoad struct {
	job, rel string
	target   []manifests.EnvVar
	ready    func(context.Context) error
	judge    func(name string, s *k6summary.Summary) []criteria.Check
}

// underSteadyLoad runs op (within 3 minutes) under load and records the row named name in the
// results: load's judgement of the run, whether the load outlasted op, and the checks op
// returned. It returns those checks; an error means the row could not be measured.
func (s *suite) underSteadyLoad(ctx context.Context, name string, load steadyLoad, op func(context.Context) ([]criteria.Check, error)) ([]criteria.Check, error) {
	if _, err := s.startK6(ctx, load.job, load.rel, "overload.js", steadyK, s.steady, "stderr", load.target...); err != nil {
		return nil, err
	}
	if load.ready != nil {
		if err := load.ready(ctx); err != nil {
			return nil, err
		}
	}
	s.logf("%s under load", name)
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	extra, err := op(wctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	s.logf("%s done in %.0f s", name, time.Since(start).Seconds())
	p, err := s.kube.JobPod(ctx, load.job)
	if err != nil {
		return nil, err
	}
	stillRunning := p != nil && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
	sum, _, err := s.finishK6(ctx, load.job, s.steady)
	if err != nil {
		return nil, err
	}
	checks := append(load.judge(name, sum), criteria.Check{
		Name: name + ": load lasted past it", OK: stillRunning,
		Detail: fmt.Sprintf("k6 still running when it was done: %v (E2E_STEADY=%s)", stillRunning, s.steady),
	})
	checks = append(checks, extra...)
	s.res.Steady = append(s.res.Steady, results.NewSteady(name, sum, checks))
	return checks, nil
}

// waitRequests waits until the release's sidecars have counted at least n requests more than
// when it was called.
func (s *suite) waitRequests(ctx context.Context, rel string, n float64) error {
	q := fmt.Sprintf(`sum(loadshed_requests_total{namespace=%q,job=%q})`, namespace, rel)
	base, err := s.prom.Sum(ctx, q)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return cluster.Poll(wctx, time.Second, fmt.Sprintf("%g requests through %s", n, rel), func(ctx context.Context) (bool, string, error) {
		v, err := s.prom.Sum(ctx, q)
		if err != nil {
			return false, err.Error(), nil
		}
		return v-base >= n, fmt.Sprintf("%v requests", v-base), nil
	})
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func durationEnv(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s: want a positive Go duration, got %q", name, v)
	}
	return d
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func roundS(d time.Duration) float64 {
	return float64(d.Round(100*time.Millisecond)) / float64(time.Second)
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
