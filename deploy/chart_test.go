package deploy_test

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/loadshed/loadshed/internal/config"
)

// allStrategies is every strategy the chart offers; each has a ci values file.
var allStrategies = []string{"none", "token-bucket", "leaky-bucket", "bounded-queue", "inflight", "adaptive", "codel", "chain"}

func ciValuesFiles(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range files {
		out[strings.TrimSuffix(filepath.Base(f), "-values.yaml")] = f
	}
	for _, s := range allStrategies {
		if _, ok := out[s]; !ok {
			t.Errorf("no ci values file for strategy %s (want %s)", s, filepath.Join(chartDir, "ci", s+"-values.yaml"))
		}
	}
	return out
}

func TestLintEveryCIValuesFile(t *testing.T) {
	for strategy, file := range ciValuesFiles(t) {
		t.Run(strategy, func(t *testing.T) {
			if out, err := helmRun(t, "lint", "--strict", chartDir, "-f", file); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}

// proxyConfigDoc is the part of the rendered proxy config the chart test reads
// itself (the full file is checked by the proxy's own config package).
type proxyConfigDoc struct {
	Listen      string `json:"listen"`
	AdminListen string `json:"adminListen"`
	Upstream    string `json:"upstream"`
	Shutdown    struct {
		DrainDelay  string `json:"drainDelay"`
		GracePeriod string `json:"gracePeriod"`
	} `json:"shutdown"`
	Admission map[string]any `json:"admission"`
}

// TestRenderEveryCIValuesFile renders every example for a server before 1.33 (a regular
// sidecar) and one after (a native sidecar).
func TestRenderEveryCIValuesFile(t *testing.T) {
	for strategy, file := range ciValuesFiles(t) {
		for _, kube := range []struct {
			version string
			native  bool
		}{{"1.32.0", false}, {"1.34.0", true}} {
			t.Run(strategy+"/kube-"+kube.version, func(t *testing.T) {
				m := decode(t, render(t, "-f", file, "--kube-version", kube.version))
				checkWorkload(t, m)
				if got := nativeSidecar(t, m.Deployments[0]); got != kube.native {
					t.Errorf("Kubernetes %s: native sidecar %v, want %v", kube.version, got, kube.native)
				}

				cfg := proxyConfigOf(t, m)
				if got := cfg.Admission["strategy"]; got != strategy {
					t.Errorf("rendered admission.strategy = %v, want %s (from %s)", got, strategy, file)
				}
				checkOnlySelectedBlock(t, strategy, cfg.Admission)
				checkGracePeriod(t, m, cfg)
				checkProxyConfigParses(t, m, strategy)
			})
		}
	}
}

// TestRenderEverything turns on every optional resource at once.
func TestRenderEverything(t *testing.T) {
	m := decode(t, render(t,
		"--set", "serviceMonitor.enabled=true,podMonitor.enabled=true",
		"--set", "prometheusRule.enabled=true,prometheusRule.configMap=true",
		"--set", "grafanaDashboard.enabled=true,autoscaling.enabled=true",
		"--set", "serviceMonitor.labels.release=kube-prometheus",
	))
	checkWorkload(t, m)
	if len(m.HPAs) != 1 {
		t.Fatalf("rendered %d HorizontalPodAutoscalers, want 1", len(m.HPAs))
	}
	hpa, d := m.HPAs[0], m.Deployments[0]
	if hpa.Spec.ScaleTargetRef.Kind != "Deployment" || hpa.Spec.ScaleTargetRef.Name != d.Name {
		t.Errorf("HPA targets %s/%s, want Deployment/%s", hpa.Spec.ScaleTargetRef.Kind, hpa.Spec.ScaleTargetRef.Name, d.Name)
	}
	if d.Spec.Replicas != nil {
		t.Errorf("with autoscaling the Deployment must leave replicas to the HPA, got %d", *d.Spec.Replicas)
	}
	for _, kind := range []string{"ServiceMonitor", "PodMonitor", "PrometheusRule"} {
		if n := len(m.monitoring(kind)); n != 1 {
			t.Errorf("rendered %d %s, want 1", n, kind)
		}
	}
	sm := m.monitoring("ServiceMonitor")[0]
	if got := dig(sm, "metadata", "labels", "release"); got != "kube-prometheus" {
		t.Errorf("ServiceMonitor label release = %v, want kube-prometheus", got)
	}
	// The ServiceMonitor's port must exist on the Service and lead to the admin port.
	smPort := dig(sm, "spec", "endpoints", 0, "port")
	svcPort := findServicePort(m.Services[0], smPort)
	if svcPort == nil {
		t.Fatalf("ServiceMonitor scrapes port %v, which the Service does not have", smPort)
	}
	if svcPort.TargetPort != intstr.FromString("admin") {
		t.Errorf("Service port %s targets %v, want the sidecar's admin port", svcPort.Name, svcPort.TargetPort.String())
	}
	pm := m.monitoring("PodMonitor")[0]
	if got := dig(pm, "spec", "podMetricsEndpoints", 0, "port"); got != "admin" {
		t.Errorf("PodMonitor scrapes port %v, want admin", got)
	}
	for _, mon := range []map[string]any{sm, pm} {
		sel, _ := dig(mon, "spec", "selector", "matchLabels").(map[string]any)
		for k, v := range sel {
			if m.Services[0].Labels[k] != v || d.Spec.Template.Labels[k] != v {
				t.Errorf("%v selector %s=%v does not match the Service and pod labels", mon["kind"], k, v)
			}
		}
	}
	dash := m.configMap(t, "demo-loadshed-dashboard")
	if dash.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels %v, want grafana_dashboard=1", dash.Labels)
	}
	if !strings.Contains(dash.Data["loadshed.json"], `"uid": "loadshed-overview"`) {
		t.Error("dashboard ConfigMap does not hold the dashboard JSON")
	}
}

func TestScrapeAnnotations(t *testing.T) {
	m := decode(t, render(t))
	a := m.Deployments[0].Spec.Template.Annotations
	if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != "9901" || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("pod annotations %v, want prometheus.io scrape=true port=9901 path=/metrics", a)
	}
	m = decode(t, render(t, "--set", "metrics.scrapeAnnotations=false"))
	if _, ok := m.Deployments[0].Spec.Template.Annotations["prometheus.io/scrape"]; ok {
		t.Error("metrics.scrapeAnnotations=false still renders prometheus.io/scrape")
	}
}

func TestReloadModes(t *testing.T) {
	rollout := decode(t, render(t))
	sum := rollout.Deployments[0].Spec.Template.Annotations["checksum/config"]
	if len(sum) != 64 {
		t.Fatalf("reloadMode rollout: checksum/config annotation %q, want a sha256", sum)
	}
	changed := decode(t, render(t, "--set", "admission.inflight.limit=5"))
	if changed.Deployments[0].Spec.Template.Annotations["checksum/config"] == sum {
		t.Error("changing the admission config does not change checksum/config, so pods would not roll")
	}
	inPlace := decode(t, render(t, "--set", "config.reloadMode=inPlace"))
	if _, ok := inPlace.Deployments[0].Spec.Template.Annotations["checksum/config"]; ok {
		t.Error("reloadMode inPlace still renders checksum/config (a config change would roll the pods)")
	}
}

// TestCoDelWithAdaptiveLimit: codel with concurrency 0 takes its limit from the
// adaptive block, so the chart must render that block too.
func TestCoDelWithAdaptiveLimit(t *testing.T) {
	m := decode(t, render(t, "--set", "admission.strategy=codel,admission.codel.concurrency=0,admission.adaptive.algorithm=vegas"))
	cfg := proxyConfigOf(t, m)
	if got := dig(cfg.Admission, "adaptive", "algorithm"); got != "vegas" {
		t.Fatalf("codel with concurrency 0: adaptive block %v, want algorithm vegas", cfg.Admission["adaptive"])
	}
	checkOnlySelectedBlock(t, "codel", cfg.Admission)
	checkProxyConfigParses(t, m, "codel")

	m = decode(t, render(t, "--set", "admission.strategy=codel,admission.codel.concurrency=3"))
	if _, ok := proxyConfigOf(t, m).Admission["adaptive"]; ok {
		t.Error("codel with a fixed concurrency still renders the adaptive block")
	}
}

func TestPriorities(t *testing.T) {
	if _, ok := proxyConfigOf(t, decode(t, render(t))).Admission["priorities"]; ok {
		t.Error("priorities rendered although none are configured")
	}
	m := decode(t, render(t, "--set-json", "admission.priorities.reserved=0.3", "--set", "admission.priorities.reservedFor=critical"))
	cfg := proxyConfigOf(t, m)
	if dig(cfg.Admission, "priorities", "reserved") != 0.3 || dig(cfg.Admission, "priorities", "reservedFor") != "critical" {
		t.Errorf("priorities rendered as %v, want reserved 0.3 for critical", cfg.Admission["priorities"])
	}
	checkProxyConfigParses(t, m, "inflight")
}

// TestAdaptiveDefaultsFollowTheProxy: the chart's adaptive block, as the sidecar reads it, is
// the proxy's own defaults (the algorithm, its limits and its queue), so the acceptance figures
// apply to a default install. The chart passes the block on as it is, so a value left behind
// when the proxy's default moves would otherwise override it in every pod.
func TestAdaptiveDefaultsFollowTheProxy(t *testing.T) {
	var values struct {
		Admission struct {
			Adaptive map[string]any `json:"adaptive"`
		} `json:"admission"`
	}
	if err := yaml.Unmarshal(readFile(t, chartDir+"/values.yaml"), &values); err != nil {
		t.Fatal(err)
	}
	block, err := yaml.Marshal(map[string]any{"strategy": "adaptive", "adaptive": values.Admission.Adaptive})
	if err != nil {
		t.Fatal(err)
	}
	a, err := config.ParseAdmission(block)
	if err != nil {
		t.Fatalf("the chart's adaptive block: %v", err)
	}
	got, want := *config.BlockOf[*config.Adaptive](a), config.DefaultAdaptive()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("chart default admission.adaptive, as the sidecar reads it:\n%+v\nproxy defaults:\n%+v", got, want)
	}
}

func TestOwnApplication(t *testing.T) {
	m := decode(t, render(t,
		"--set", "app.image.repository=registry.example/shop,app.image.tag=1.2.3",
		"--set", "app.port=3000,app.command=null",
		"--set", "app.args={--port=3000}",
		"--set", "app.env[0].name=MODE,app.env[0].value=prod",
		"--set", "app.probes.startup=null",
		"--set", "app.resources.requests.cpu=1",
	))
	checkWorkload(t, m)
	app := container(t, m.Deployments[0], "app")
	if app.Image != "registry.example/shop:1.2.3" {
		t.Errorf("app image %q, want registry.example/shop:1.2.3", app.Image)
	}
	if len(app.Command) != 0 {
		t.Errorf("app command %v, want the image's entrypoint", app.Command)
	}
	if len(app.Env) != 1 || app.Env[0].Name != "MODE" || app.Env[0].Value != "prod" {
		t.Errorf("app env %v, want MODE=prod", app.Env)
	}
	if got := app.Resources.Requests.Cpu().String(); got != "1" {
		t.Errorf("app cpu request %s, want 1", got)
	}
	if cfg := proxyConfigOf(t, m); cfg.Upstream != "http://127.0.0.1:3000" {
		t.Errorf("sidecar upstream %q, want http://127.0.0.1:3000", cfg.Upstream)
	}
}

// checkWorkload asserts what every rendering must satisfy: restricted Pod
// Security on every container, traffic only through the sidecar, probes, PDB
// and the helm test pod.
func checkWorkload(t *testing.T, m *manifests) {
	t.Helper()
	if len(m.Deployments) != 1 || len(m.Services) != 1 {
		t.Fatalf("rendered %d Deployments and %d Services, want 1 each (kinds: %v)", len(m.Deployments), len(m.Services), m.KindsInOrder)
	}
	d, svc := m.Deployments[0], m.Services[0]
	pod := d.Spec.Template.Spec
	checkRestrictedPod(t, "Deployment "+d.Name, &pod)

	proxy := container(t, d, "loadshed")
	app := container(t, d, "app")

	// The Service selects the pods and sends traffic to the sidecar only.
	for k, v := range svc.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("Service selector %s=%s does not match the pod labels %v", k, v, d.Spec.Template.Labels)
		}
	}
	for k, v := range d.Spec.Selector.MatchLabels {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("Deployment selector %s=%s does not match its pod labels", k, v)
		}
	}
	if len(svc.Spec.Ports) == 0 {
		t.Fatal("the Service has no ports")
	}
	cfg := proxyConfigOf(t, m)
	for _, sp := range svc.Spec.Ports {
		cp := resolvePort(proxy, sp.TargetPort)
		if cp == nil {
			t.Errorf("Service port %s targets %s, which is not a port of the sidecar", sp.Name, sp.TargetPort.String())
		}
	}
	http := findServicePort(svc, "http")
	if http == nil || resolvePort(proxy, http.TargetPort) == nil || ":"+itoa(resolvePort(proxy, http.TargetPort).ContainerPort) != cfg.Listen {
		t.Errorf("the Service's http port must target the sidecar's data port (listen %s)", cfg.Listen)
	}
	if len(app.Ports) != 0 {
		t.Errorf("the app container declares ports %v; its port must stay inside the pod", app.Ports)
	}
	appPort := portOf(cfg.Upstream)
	for _, sp := range svc.Spec.Ports {
		if sp.TargetPort.IntValue() == appPort && appPort != 0 {
			t.Errorf("Service port %s targets the app port %d directly", sp.Name, appPort)
		}
	}
	if !strings.HasPrefix(cfg.Upstream, "http://127.0.0.1:") {
		t.Errorf("sidecar upstream %q, want the app on the pod's loopback", cfg.Upstream)
	}

	// Probes on the sidecar's admin port.
	checkHTTPProbe(t, "liveness", proxy.LivenessProbe, "/healthz", proxy, cfg.AdminListen)
	checkHTTPProbe(t, "readiness", proxy.ReadinessProbe, "/readyz", proxy, cfg.AdminListen)
	if proxy.Lifecycle != nil && proxy.Lifecycle.PreStop != nil && proxy.Lifecycle.PreStop.Exec != nil {
		t.Error("the sidecar has a preStop exec command; the image has no shell")
	}
	if app.Lifecycle != nil && app.Lifecycle.PreStop != nil && app.Lifecycle.PreStop.Exec != nil {
		t.Error("the app has a preStop exec command; the default image has no shell")
	}

	// The config is mounted as a directory so in-place reloads see updates.
	var mounted bool
	for _, vm := range proxy.VolumeMounts {
		if vm.MountPath == "/etc/loadshed" {
			mounted = true
			if vm.SubPath != "" {
				t.Error("the config is mounted with subPath; ConfigMap updates would never reach the sidecar")
			}
		}
	}
	if !mounted || !slices.Equal(proxy.Args[:2], []string{"--config", "/etc/loadshed/config.yaml"}) {
		t.Errorf("sidecar args %v and mounts %v: want --config /etc/loadshed/config.yaml from the ConfigMap volume", proxy.Args, proxy.VolumeMounts)
	}

	// PodDisruptionBudget, when rendered, selects these pods.
	for _, pdb := range m.PDBs {
		for k, v := range pdb.Spec.Selector.MatchLabels {
			if d.Spec.Template.Labels[k] != v {
				t.Errorf("PDB selector %s=%s does not match the pods", k, v)
			}
		}
		if (pdb.Spec.MinAvailable == nil) == (pdb.Spec.MaxUnavailable == nil) {
			t.Error("the PDB must set exactly one of minAvailable and maxUnavailable")
		}
	}

	// The helm test pod uses the loadshed image's own client against the Service.
	if len(m.Pods) != 1 {
		t.Fatalf("rendered %d test pods, want 1", len(m.Pods))
	}
	tp := m.Pods[0]
	if tp.Annotations["helm.sh/hook"] != "test" {
		t.Errorf("test pod hook annotation %q, want test", tp.Annotations["helm.sh/hook"])
	}
	checkRestrictedPod(t, "test pod", &tp.Spec)
	if selects(svc.Spec.Selector, tp.Labels) {
		t.Errorf("the Service selector %v also selects the test pod (labels %v)", svc.Spec.Selector, tp.Labels)
	}
	for _, pdb := range m.PDBs {
		if selects(pdb.Spec.Selector.MatchLabels, tp.Labels) {
			t.Errorf("the PDB selector also selects the test pod (labels %v)", tp.Labels)
		}
	}
	tc := tp.Spec.Containers[0]
	if tc.Image != proxy.Image || !slices.Equal(tc.Command, []string{"/usr/local/bin/backend"}) {
		t.Errorf("test pod runs %s %v, want the loadshed image's /usr/local/bin/backend", tc.Image, tc.Command)
	}
	wantURL := "http://" + svc.Name + ":" + itoa(http.Port) + "/"
	if len(tc.Args) < 2 || tc.Args[0] != "--get" || tc.Args[1] != wantURL {
		t.Errorf("test pod args %v, want --get %s", tc.Args, wantURL)
	}
}

// selects says whether a label selector (matchLabels form) matches labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func checkRestrictedPod(t *testing.T, what string, pod *corev1.PodSpec) {
	t.Helper()
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Errorf("%s shares host namespaces", what)
	}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			t.Errorf("%s mounts hostPath %s", what, v.HostPath.Path)
		}
	}
	psc := pod.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	all := append(append([]corev1.Container{}, pod.InitContainers...), pod.Containers...)
	if len(all) == 0 {
		t.Fatalf("%s has no containers", what)
	}
	for _, c := range all {
		name := what + " container " + c.Name
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("%s has no securityContext", name)
			continue
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: allowPrivilegeEscalation must be false", name)
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("%s is privileged", name)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: readOnlyRootFilesystem must be true", name)
		}
		nonRoot := (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (sc.RunAsNonRoot == nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot)
		if !nonRoot {
			t.Errorf("%s: runAsNonRoot must be true", name)
		}
		if (sc.RunAsUser != nil && *sc.RunAsUser == 0) || (sc.RunAsUser == nil && psc.RunAsUser != nil && *psc.RunAsUser == 0) {
			t.Errorf("%s runs as uid 0", name)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("%s: capabilities must drop ALL", name)
		} else if len(sc.Capabilities.Add) > 0 {
			t.Errorf("%s adds capabilities %v", name, sc.Capabilities.Add)
		}
		seccomp := sc.SeccompProfile
		if seccomp == nil {
			seccomp = psc.SeccompProfile
		}
		if seccomp == nil || (seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault && seccomp.Type != corev1.SeccompProfileTypeLocalhost) {
			t.Errorf("%s: seccompProfile must be RuntimeDefault", name)
		}
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				t.Errorf("%s uses hostPort %d", name, p.HostPort)
			}
		}
	}
}

func checkHTTPProbe(t *testing.T, kind string, p *corev1.Probe, path string, c *corev1.Container, adminListen string) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("sidecar %s probe missing or not an HTTP GET", kind)
		return
	}
	if p.HTTPGet.Path != path {
		t.Errorf("sidecar %s probe path %s, want %s", kind, p.HTTPGet.Path, path)
	}
	cp := resolvePort(c, p.HTTPGet.Port)
	if cp == nil || ":"+itoa(cp.ContainerPort) != adminListen {
		t.Errorf("sidecar %s probe port %s is not the admin port (%s)", kind, p.HTTPGet.Port.String(), adminListen)
	}
}

// checkGracePeriod: the pod may take as long as its shutdown needs, and the app's preStop hook
// must end before the pod is killed. A regular sidecar drains beside the app, which sleeps
// through drainDelay + gracePeriod. A native sidecar gets SIGTERM only after the app has
// exited: its own drainDelay is 0 (the app's preStop, its drain hook, is the drain), and its
// gracePeriod comes after that hook.
func checkGracePeriod(t *testing.T, m *manifests, cfg proxyConfigDoc) {
	t.Helper()
	drain, err1 := time.ParseDuration(cfg.Shutdown.DrainDelay)
	grace, err2 := time.ParseDuration(cfg.Shutdown.GracePeriod)
	if err1 != nil || err2 != nil {
		t.Fatalf("rendered shutdown durations do not parse: %v %v", err1, err2)
	}
	pod := m.Deployments[0].Spec.Template.Spec
	if pod.TerminationGracePeriodSeconds == nil {
		t.Fatal("terminationGracePeriodSeconds is not set")
	}
	podGrace := *pod.TerminationGracePeriodSeconds
	d, _ := appPreStop(t, m)
	hold := int64(math.Ceil(d.Seconds()))
	if nativeSidecar(t, m.Deployments[0]) {
		if drain != 0 {
			t.Errorf("native sidecar with drainDelay %s; it stops after the app, whose preStop hook is the drain, so want 0", drain)
		}
		if need := hold + int64(math.Ceil(grace.Seconds())); podGrace < need {
			t.Errorf("terminationGracePeriodSeconds %d, want at least the app's preStop %ds + gracePeriod = %ds", podGrace, hold, need)
		}
	} else {
		need := int64(math.Ceil((drain + grace).Seconds()))
		if podGrace < need {
			t.Fatalf("terminationGracePeriodSeconds %d, want at least drainDelay+gracePeriod = %ds", podGrace, need)
		}
		if hold > 0 && hold < need {
			t.Errorf("app preStop sleep %ds ends before the sidecar has drained (%ds)", hold, need)
		}
	}
	if hold > 0 && hold >= podGrace {
		t.Errorf("app preStop %ds leaves the app no time to stop within terminationGracePeriodSeconds %d", hold, podGrace)
	}
}

// checkOnlySelectedBlock: only the selected strategy's block reaches the proxy config.
func checkOnlySelectedBlock(t *testing.T, strategy string, adm map[string]any) {
	t.Helper()
	blocks := map[string]string{"token-bucket": "tokenBucket", "leaky-bucket": "leakyBucket", "bounded-queue": "boundedQueue",
		"inflight": "inflight", "adaptive": "adaptive", "codel": "codel", "chain": "chain"}
	for k := range adm {
		if k == "strategy" || k == "dryRun" || k == "priorities" {
			continue
		}
		if strategy == "codel" && k == "adaptive" && dig(adm, "codel", "concurrency") == float64(0) {
			continue // codel's adaptive limit
		}
		if blocks[strategy] != k {
			t.Errorf("the proxy config holds block %s, but strategy is %s", k, strategy)
		}
	}
	if b := blocks[strategy]; b != "" && adm[b] == nil {
		t.Errorf("the proxy config lacks block %s for strategy %s", b, strategy)
	}
}

// checkProxyConfigParses decodes the rendered config with the proxy's own
// config package: strict, defaulted and validated exactly as the sidecar will.
func checkProxyConfigParses(t *testing.T, m *manifests, strategy string) {
	t.Helper()
	if !slices.Contains(config.Strategies, strategy) {
		// The adaptive and codel strategies arrive with issue 3; until the proxy's config
		// package lists them, their rendered config cannot be checked by it.
		t.Logf("SKIPPED config.Parse for %s: the proxy's config package does not know this strategy yet", strategy)
		return
	}
	data := m.configMap(t, "demo-loadshed").Data["config.yaml"]
	c, err := config.Parse([]byte(data))
	if err != nil {
		t.Fatalf("the proxy rejects the rendered config: %v\n%s", err, data)
	}
	if c.Admission.Strategy != strategy {
		t.Errorf("the proxy reads strategy %q, want %q", c.Admission.Strategy, strategy)
	}
}

func proxyConfigOf(t *testing.T, m *manifests) proxyConfigDoc {
	t.Helper()
	data, ok := m.configMap(t, "demo-loadshed").Data["config.yaml"]
	if !ok {
		t.Fatal("the ConfigMap has no config.yaml")
	}
	var cfg proxyConfigDoc
	if err := yaml.Unmarshal([]byte(data), &cfg); err != nil {
		t.Fatalf("rendered config.yaml is not YAML: %v", err)
	}
	return cfg
}

// container returns the named container of the Deployment's pods: an init container (the
// native sidecar) or a regular one.
func container(t *testing.T, d *appsv1.Deployment, name string) *corev1.Container {
	t.Helper()
	pod := &d.Spec.Template.Spec
	for _, cs := range [][]corev1.Container{pod.InitContainers, pod.Containers} {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
	}
	t.Fatalf("Deployment %s has no container %q", d.Name, name)
	return nil
}

// nativeSidecar reports whether the Deployment runs the loadshed sidecar as a native sidecar: an
// init container, which must then have restartPolicy Always (a plain init container would have
// to exit before the application starts).
func nativeSidecar(t *testing.T, d *appsv1.Deployment) bool {
	t.Helper()
	for _, c := range d.Spec.Template.Spec.InitContainers {
		if c.Name != "loadshed" {
			continue
		}
		if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			t.Errorf("the sidecar is an init container without restartPolicy Always (%v)", c.RestartPolicy)
		}
		return true
	}
	return false
}

func resolvePort(c *corev1.Container, p intstr.IntOrString) *corev1.ContainerPort {
	for i := range c.Ports {
		cp := &c.Ports[i]
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp
		}
	}
	return nil
}

func findServicePort(svc *corev1.Service, name any) *corev1.ServicePort {
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Name == name {
			return &svc.Spec.Ports[i]
		}
	}
	return nil
}

func portOf(url string) int {
	i := strings.LastIndex(url, ":")
	if i < 0 {
		return 0
	}
	n := 0
	for _, r := range url[i+1:] {
		if r < '0' || r > '9' {
			break
		}
		n = n*10 + int(r-'0')
	}
	return n
}

func itoa[T ~int32 | ~int64 | ~int](n T) string { return strconv.FormatInt(int64(n), 10) }

// dig walks nested maps and lists decoded from YAML.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

// TestTrustAndHeaders: the chart sets the admission headers (an empty name turns one off) and
// trust, a network or a vouched identity, and the proxy reads them as set.
func TestTrustAndHeaders(t *testing.T) {
	m := decode(t, render(t, "--set", "proxy.headers.priority=,proxy.headers.clientKey=X-Tenant,proxy.headers.clientKeyFold=true",
		"--set-json", `proxy.trust.sources=["10.0.0.0/8"]`,
		"--set-json", `proxy.trust.identity={"header":"X-Forwarded-Client-Cert","from":["127.0.0.1/32"],"match":["spiffe://cluster.local/ns/web/sa/*"]}`))
	data := m.configMap(t, "demo-loadshed").Data["config.yaml"]
	c, err := config.Parse([]byte(data))
	if err != nil {
		t.Fatalf("the proxy rejects the rendered config: %v\n%s", err, data)
	}
	if c.Headers.Priority != "" || c.Headers.ClientKey != "X-Tenant" || !c.Headers.ClientKeyFold {
		t.Errorf("headers rendered as %+v", c.Headers)
	}
	if len(c.Trust.Sources) != 1 || c.Trust.Identity == nil || c.Trust.Identity.Match[0] != "spiffe://cluster.local/ns/web/sa/*" {
		t.Errorf("trust rendered as %+v", c.Trust)
	}
	c, err = config.Parse([]byte(decode(t, render(t)).configMap(t, "demo-loadshed").Data["config.yaml"]))
	if err != nil || len(c.Trust.Sources) != 0 || c.Trust.Identity != nil || c.Headers.Priority != "X-Loadshed-Priority" {
		t.Errorf("defaults: trust %+v headers %+v (%v)", c.Trust, c.Headers, err)
	}
}

// TestTLSAndGRPCValues: a TLS Secret is mounted into the sidecar and named in its config; the
// upstream protocol, gRPC settings and the Service's appProtocol reach where they belong.
func TestTLSAndGRPCValues(t *testing.T) {
	m := decode(t, render(t, "--set", "proxy.tls.secretName=web-tls,proxy.upstreamProtocol=h2c,service.appProtocol=kubernetes.io/h2c,proxy.grpc.streamAfter=30s"))
	data := m.configMap(t, "demo-loadshed").Data["config.yaml"]
	c, err := config.Parse([]byte(data))
	if err != nil {
		t.Fatalf("the proxy rejects the rendered config: %v\n%s", err, data)
	}
	if c.TLS == nil || c.TLS.CertFile != "/etc/loadshed-tls/tls.crt" || c.UpstreamProtocol != "h2c" || c.GRPC.StreamAfter.D() != 30*time.Second {
		t.Fatalf("rendered config: tls %+v, upstreamProtocol %q, streamAfter %s", c.TLS, c.UpstreamProtocol, c.GRPC.StreamAfter)
	}
	pod := m.Deployments[0].Spec.Template.Spec
	mounted := false
	for _, ctr := range append(pod.InitContainers, pod.Containers...) {
		for _, vm := range ctr.VolumeMounts {
			if vm.Name == "tls" && vm.MountPath == "/etc/loadshed-tls" {
				mounted = true
			}
		}
	}
	secret := false
	for _, v := range pod.Volumes {
		if v.Secret != nil && v.Secret.SecretName == "web-tls" {
			secret = true
		}
	}
	if !mounted || !secret {
		t.Errorf("TLS Secret: mounted %v, volume %v", mounted, secret)
	}
	if ap := m.Services[0].Spec.Ports[0].AppProtocol; ap == nil || *ap != "kubernetes.io/h2c" {
		t.Errorf("Service appProtocol %v", ap)
	}
}

// TestLoadReportsValues: proxy.loadReports reaches the sidecar's config as set, in both modes,
// and nothing is rendered while the reports are off (the proxy's defaults hold).
func TestLoadReportsValues(t *testing.T) {
	for _, mode := range []string{"proxy", "extproc"} {
		t.Run(mode, func(t *testing.T) {
			data := decode(t, render(t, "--set", "mode="+mode+",proxy.loadReports.orca=true,proxy.loadReports.trustedOnly=true,proxy.loadReports.minInterval=5s")).
				configMap(t, "demo-loadshed").Data["config.yaml"]
			c, err := config.Parse([]byte(data))
			if err != nil {
				t.Fatalf("the proxy rejects the rendered config: %v\n%s", err, data)
			}
			if !c.LoadReports.ORCA || !c.LoadReports.TrustedOnly || c.LoadReports.MinInterval.D() != 5*time.Second {
				t.Errorf("loadReports rendered as %+v", c.LoadReports)
			}
		})
	}
	data := decode(t, render(t, "--set", "proxy.loadReports.trustedOnly=true")).configMap(t, "demo-loadshed").Data["config.yaml"]
	if strings.Contains(data, "loadReports") {
		t.Errorf("reports off, yet the config has a loadReports block:\n%s", data)
	}
	c, err := config.Parse([]byte(data))
	if err != nil || c.LoadReports.ORCA || c.LoadReports.MinInterval.D() != time.Second {
		t.Errorf("defaults: loadReports %+v (%v)", c.LoadReports, err)
	}
}

// TestGoRuntimeSizedFromResources: the sidecar's GOMAXPROCS follows its CPU limit (rounded up)
// and its memory limit reaches the proxy, unless switched off; the config carries the
// saturation settings.
func TestGoRuntimeSizedFromResources(t *testing.T) {
	sidecarEnv := func(m *manifests) map[string]corev1.EnvVar {
		env := map[string]corev1.EnvVar{}
		for _, ctr := range append(m.Deployments[0].Spec.Template.Spec.InitContainers, m.Deployments[0].Spec.Template.Spec.Containers...) {
			if ctr.Name == "loadshed" {
				for _, e := range ctr.Env {
					env[e.Name] = e
				}
			}
		}
		return env
	}
	m := decode(t, render(t, "--set", "proxy.resources.limits.cpu=500m,proxy.server.saturation.shedAbove=80ms"))
	env := sidecarEnv(m)
	cpu, mem := env["GOMAXPROCS"].ValueFrom, env["LOADSHED_MEMORY_LIMIT"].ValueFrom
	if cpu == nil || cpu.ResourceFieldRef == nil || cpu.ResourceFieldRef.Resource != "limits.cpu" || cpu.ResourceFieldRef.Divisor.String() != "1" {
		t.Fatalf("GOMAXPROCS: %+v", env["GOMAXPROCS"])
	}
	if mem == nil || mem.ResourceFieldRef == nil || mem.ResourceFieldRef.Resource != "limits.memory" {
		t.Fatalf("LOADSHED_MEMORY_LIMIT: %+v", env["LOADSHED_MEMORY_LIMIT"])
	}
	c, err := config.Parse([]byte(m.configMap(t, "demo-loadshed").Data["config.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	if c.Server.Saturation.ShedAbove.D() != 80*time.Millisecond || c.Server.Saturation.Above.D() != time.Millisecond {
		t.Fatalf("saturation %+v", c.Server.Saturation)
	}
	off := sidecarEnv(decode(t, render(t, "--set", "proxy.goRuntimeFromResources=false")))
	if _, ok := off["GOMAXPROCS"]; ok {
		t.Fatal("GOMAXPROCS set though goRuntimeFromResources is false")
	}
}

// TestCohortsValues: proxy.cohorts.secretName mounts the shared secret read-only into the sidecar
// and turns cohorts on, with the settings given; without it the config has no cohorts block.
func TestCohortsValues(t *testing.T) {
	m := decode(t, render(t, "--set", "proxy.cohorts.secretName=cohort,proxy.cohorts.secretKey=shared,proxy.cohorts.settings.count=64,proxy.cohorts.settings.key=header:X-User-ID"))
	data := m.configMap(t, "demo-loadshed").Data["config.yaml"]
	if !strings.Contains(data, "secretFile: /etc/loadshed-cohort/key") {
		t.Fatalf("rendered config has no secretFile under /etc/loadshed-cohort:\n%s", data)
	}
	// (The proxy reads the secret as it loads the file: point it at a test secret.)
	secret := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(secret, []byte("a test secret of enough bytes"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse([]byte(strings.ReplaceAll(data, "/etc/loadshed-cohort/key", secret)))
	if err != nil {
		t.Fatalf("the proxy rejects the rendered config: %v\n%s", err, data)
	}
	if co := c.Admission.Cohorts; co == nil || co.Count != 64 || co.Key != "header:X-User-ID" || c.StatusCodes.Cohort != 503 || c.GRPC.StatusCodes.Cohort != 14 {
		t.Fatalf("rendered cohorts %+v, statusCodes.cohort %d, grpc %d", co, c.StatusCodes.Cohort, c.GRPC.StatusCodes.Cohort)
	}
	pod := m.Deployments[0].Spec.Template.Spec
	mounted := false
	for _, ctr := range append(pod.InitContainers, pod.Containers...) {
		for _, vm := range ctr.VolumeMounts {
			if vm.Name == "cohort-secret" && vm.MountPath == "/etc/loadshed-cohort" && vm.ReadOnly {
				mounted = true
			}
		}
	}
	volume := false
	for _, v := range pod.Volumes {
		if s := v.Secret; s != nil && s.SecretName == "cohort" && len(s.Items) == 1 && s.Items[0].Key == "shared" && s.Items[0].Path == "key" {
			volume = true
		}
	}
	if !mounted || !volume {
		t.Errorf("cohort Secret: mounted read-only %v, volume %v", mounted, volume)
	}

	data = decode(t, render(t)).configMap(t, "demo-loadshed").Data["config.yaml"]
	if strings.Contains(data, "cohorts") {
		t.Errorf("no secretName, yet the config has cohorts:\n%s", data)
	}
}
