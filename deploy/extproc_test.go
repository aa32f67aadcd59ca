package deploy_test

import (
	"path/filepath"
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
