package deploy_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/loadshed/loadshed/internal/config"
)

// TestExtProcMode: mode extproc runs the sidecar as the external processor of the pod's Envoy
// only: no data port, the ext_proc server on loopback with the mirrored timeouts, and the
// Service on the application's port, where that Envoy takes the traffic.
func TestExtProcMode(t *testing.T) {
	m := decode(t, render(t, "--set", "mode=extproc,proxy.extProc.maxMessageTimeout=2s,admission.strategy=adaptive",
		"--set", "app.args={--listen=:8080,--workers=4}"))
	d, svc := m.Deployments[0], m.Services[0]
	pod := d.Spec.Template.Spec
	checkRestrictedPod(t, "Deployment "+d.Name, &pod)
	proxy, app := container(t, d, "loadshed"), container(t, d, "app")

	data := m.configMap(t, "demo-loadshed").Data["config.yaml"]
	c, err := config.Parse([]byte(data))
	if err != nil {
		t.Fatalf("the proxy rejects the rendered config: %v\n%s", err, data)
	}
	if c.Listen != "" || c.Upstream != "" || c.ExtProc.Listen != "127.0.0.1:9002" ||
		c.ExtProc.MessageTimeout.D().String() != "200ms" || c.ExtProc.MaxMessageTimeout.D().String() != "2s" {
		t.Errorf("rendered config: listen %q upstream %q extProc %+v; want ext_proc only on loopback", c.Listen, c.Upstream, c.ExtProc)
	}
	for _, p := range proxy.Ports {
		if p.Name != "admin" {
			t.Errorf("the sidecar declares port %s; in extproc mode it has only its admin port", p.Name)
		}
	}
	http := findServicePort(svc, "http")
	if http == nil {
		t.Fatal("the Service has no http port")
	}
	if p := resolvePort(app, http.TargetPort); p == nil || p.ContainerPort != 8080 {
		t.Errorf("the Service's http port targets %s, want the application's port 8080", http.TargetPort.String())
	}
	if resolvePort(proxy, http.TargetPort) != nil {
		t.Error("the Service must not target the sidecar in extproc mode")
	}
	checkHTTPProbe(t, "readiness", proxy.ReadinessProbe, "/readyz", proxy, c.AdminListen)

	// The shipped loadshed config for deploy/envoy/envoy.yaml is one the proxy accepts.
	if _, err := config.Load(filepath.Join("envoy", "loadshed.yaml")); err != nil {
		t.Errorf("deploy/envoy/loadshed.yaml: %v", err)
	}
	// A queue that cannot fit Envoy's timeouts is refused when the sidecar reads the config.
	m = decode(t, render(t, "--set", "mode=extproc,admission.strategy=bounded-queue,admission.boundedQueue.maxWait=500ms"))
	if _, err := config.Parse([]byte(m.configMap(t, "demo-loadshed").Data["config.yaml"])); err == nil {
		t.Error("a 500ms queue behind Envoy's 200ms message timeout (no extension) must be refused")
	}
}

// TestExtProcWithEnvoyContainer: envoy.enabled adds the pod's Envoy, run with the given config
// (here the shipped deploy/envoy/envoy.yaml): the Service targets its listener, the application
// declares no port, and a change to Envoy's config rolls the pods.
func TestExtProcWithEnvoyContainer(t *testing.T) {
	envoyFile := filepath.Join("envoy", "envoy.yaml")
	args := []string{"--set", "mode=extproc,envoy.enabled=true,proxy.extProc.maxMessageTimeout=2s,admission.strategy=adaptive",
		"--set-file", "envoy.config=" + envoyFile}
	m := decode(t, render(t, args...))
	d, svc := m.Deployments[0], m.Services[0]
	pod := d.Spec.Template.Spec
	checkRestrictedPod(t, "Deployment "+d.Name, &pod)
	if n := len(pod.InitContainers) + len(pod.Containers); n != 3 {
		t.Fatalf("%d containers (the native sidecar among the init containers), want loadshed, app and envoy", n)
	}
	envoy, app, proxy := container(t, d, "envoy"), container(t, d, "app"), container(t, d, "loadshed")

	want := string(readFile(t, envoyFile))
	if got := m.configMap(t, "demo-loadshed-envoy").Data["envoy.yaml"]; strings.TrimSpace(got) != strings.TrimSpace(want) {
		t.Errorf("Envoy's ConfigMap does not hold envoy.config as given:\n%s", got)
	}
	mounted := false
	for _, vm := range envoy.VolumeMounts {
		mounted = mounted || (vm.MountPath == "/etc/envoy" && vm.ReadOnly)
	}
	if !mounted {
		t.Errorf("Envoy's config is not mounted read-only at /etc/envoy: %+v", envoy.VolumeMounts)
	}
	argv := strings.Join(append(append([]string{}, envoy.Command...), envoy.Args...), " ")
	for _, w := range []string{"envoy ", "--config-path /etc/envoy/envoy.yaml", "--disable-hot-restart", "--concurrency 2"} {
		if !strings.Contains(argv, w) {
			t.Errorf("Envoy's command line %q lacks %q", argv, w)
		}
	}

	http := findServicePort(svc, "http")
	if http == nil {
		t.Fatal("the Service has no http port")
	}
	if p := resolvePort(envoy, http.TargetPort); p == nil || p.ContainerPort != 10000 {
		t.Errorf("the Service's http port targets %s, want Envoy's listener on 10000", http.TargetPort.String())
	}
	if len(app.Ports) != 0 || resolvePort(proxy, http.TargetPort) != nil {
		t.Errorf("only Envoy may take the Service's traffic; app ports %+v", app.Ports)
	}
	// The shipped Envoy config listens on the chart's envoy.port and calls the chart's ext_proc
	// port: the two files and the chart's defaults agree.
	for _, addr := range []string{"{address: 0.0.0.0, port_value: 10000}", "{address: 127.0.0.1, port_value: 9002}"} {
		if !strings.Contains(want, addr) {
			t.Errorf("%s has no %s; the chart's defaults expect it", envoyFile, addr)
		}
	}
	if tcp := envoy.ReadinessProbe; tcp == nil || tcp.TCPSocket == nil || resolvePort(envoy, tcp.TCPSocket.Port) == nil {
		t.Errorf("Envoy's readiness probe does not check its listener: %+v", envoy.ReadinessProbe)
	}

	// Envoy does not reload its file: a changed config changes the pod template, also inPlace.
	sum := d.Spec.Template.Annotations["checksum/envoy"]
	m2 := decode(t, render(t, "--set", "mode=extproc,envoy.enabled=true,config.reloadMode=inPlace", "--set", "envoy.config=other"))
	if got := m2.Deployments[0].Spec.Template.Annotations["checksum/envoy"]; sum == "" || got == "" || got == sum {
		t.Errorf("checksum/envoy %q then %q: a changed Envoy config must roll the pods", sum, got)
	}
}
