package manifests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/loadshed/loadshed/e2e/internal/cluster"
)

func TestPrometheusManifest(t *testing.T) {
	m, err := Render("prometheus.yaml", Prometheus{
		Namespace: "ns", Image: "prom:1", RulesConfigMap: "loadshed-rules", ScrapeInterval: "2s",
		Releases: []string{"e2e-inflight", "e2e-steady"},
	})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := cluster.Decode(m)
	if err != nil {
		t.Fatal(err)
	}
	var cfg string
	var headless []string
	var dep *appsv1.Deployment
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.ConfigMap:
			cfg = o.Data["prometheus.yml"]
		case *corev1.Service:
			if o.Spec.ClusterIP == corev1.ClusterIPNone {
				headless = append(headless, o.Name)
			}
		case *appsv1.Deployment:
			dep = o
		}
	}
	if strings.Join(headless, ",") != "e2e-inflight-metrics,e2e-steady-metrics" {
		t.Errorf("headless services %v", headless)
	}
	if dep == nil || dep.Spec.Template.Spec.Containers[0].Image != "prom:1" {
		t.Fatalf("deployment %+v", dep)
	}
	for _, want := range []string{"e2e-inflight-metrics.ns.svc.cluster.local", "e2e-steady-metrics.ns.svc.cluster.local", "/etc/prometheus/rules/*.yaml"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("prometheus.yml lacks %q:\n%s", want, cfg)
		}
	}
	restricted(t, dep.Spec.Template.Spec)
	// promtool, where installed, checks the configuration as Prometheus will read it.
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool not installed: the Prometheus configuration was only checked as YAML")
		return
	}
	path := filepath.Join(t.TempDir(), "prometheus.yml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "config", "--syntax-only", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
}

func TestK6JobManifest(t *testing.T) {
	m, err := Render("k6-job.yaml", K6Job{
		Name: "j", Namespace: "ns", Image: "k6:1", Script: "overload.js", DeadlineSeconds: 200, LogOutput: "none",
		Env: []EnvVar{{Name: "TARGET_URL", Value: "http://svc/"}, {Name: "K", Value: "3"}, {Name: "ODD", Value: `a "quoted" \ value: #x`}},
	})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := cluster.Decode(m)
	if err != nil || len(objs) != 1 {
		t.Fatalf("%d objects, err %v", len(objs), err)
	}
	job := objs[0].(*batchv1.Job)
	if *job.Spec.BackoffLimit != 0 || *job.Spec.ActiveDeadlineSeconds != 200 {
		t.Errorf("backoffLimit %d, activeDeadlineSeconds %d", *job.Spec.BackoffLimit, *job.Spec.ActiveDeadlineSeconds)
	}
	c := job.Spec.Template.Spec.Containers[0]
	if strings.Join(c.Args, " ") != "run --quiet --no-color --log-output=none /scripts/overload.js" {
		t.Errorf("args %q", c.Args)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["K"] != "3" || env["ODD"] != `a "quoted" \ value: #x` {
		t.Errorf("env %v", env)
	}
	if lim, req := c.Resources.Limits.Cpu().MilliValue(), c.Resources.Requests.Cpu().MilliValue(); lim > 1500 || req > 500 || req == 0 {
		t.Errorf("k6 requests %dm and may use %dm CPU; the node has 2000m for everything", req, lim)
	}
	restricted(t, job.Spec.Template.Spec)
}

// restricted checks what the namespace's restricted Pod Security level demands.
func restricted(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil {
		t.Errorf("pod security context %+v is not restricted", psc)
	}
	for _, c := range spec.Containers {
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || len(sc.Capabilities.Drop) == 0 {
			t.Errorf("container %s security context %+v is not restricted", c.Name, sc)
		}
	}
}

func TestRenderMissingValue(t *testing.T) {
	if _, err := Render("k6-job.yaml", map[string]any{"Name": "j"}); err == nil {
		t.Fatal("a template with missing values rendered")
	}
}

func TestPlainBackendManifest(t *testing.T) {
	m, err := Render("plain-backend.yaml", PlainBackend{Name: "shop", Namespace: "ns", Image: "loadshed:e2e"})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := cluster.Decode(m)
	if err != nil {
		t.Fatal(err)
	}
	var dep *appsv1.Deployment
	targets := map[string]string{}
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.Deployment:
			dep = o
		case *corev1.Service:
			targets[o.Name] = o.Spec.Ports[0].TargetPort.String()
		}
	}
	if dep == nil || len(dep.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("deployment %+v", dep)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	if len(c.Ports) != 1 || c.Ports[0].Name != "http" || c.Ports[0].ContainerPort != 8080 {
		t.Errorf("the backend's ports %+v, want one named http on 8080 (the port injection takes over)", c.Ports)
	}
	if !strings.Contains(string(m), "--listen=:8080") {
		t.Error("the backend must listen beyond loopback: the Service by number reaches it directly")
	}
	if targets["shop"] != "http" || targets["shop-by-number"] != "8080" {
		t.Errorf("service targets %v, want shop by name and shop-by-number by number", targets)
	}
	restricted(t, dep.Spec.Template.Spec)
}
