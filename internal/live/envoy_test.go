package live

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestRenderEnvoyConfig: the shipped Envoy file takes the test's addresses and settings, each
// replaced where the file has it, and Envoy itself accepts the result when it is installed.
func TestRenderEnvoyConfig(t *testing.T) {
	s := EnvoySetup{App: "127.0.0.1:1001", ExtProc: "127.0.0.1:1002", MessageTimeout: 150 * time.Millisecond,
		MaxMessageTimeout: 1500 * time.Millisecond, FailClosed: true, RouteTimeout: 300 * time.Millisecond}
	y, err := RenderEnvoyConfig(s, "127.0.0.1:1003", "127.0.0.1:1004")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"{address: 127.0.0.1, port_value: 1001}", "{address: 127.0.0.1, port_value: 1002}",
		"{address: 127.0.0.1, port_value: 1003}", "{address: 127.0.0.1, port_value: 1004}",
		"message_timeout: 0.15s", "max_message_timeout: 1.5s", "failure_mode_allow: false", "{cluster: app, timeout: 0.3s}",
	} {
		if !strings.Contains(y, want) {
			t.Errorf("rendered config lacks %q", want)
		}
	}
	for _, gone := range []string{"0.0.0.0", "port_value: 9901", "port_value: 9902", "port_value: 10000"} {
		if strings.Contains(y, gone) {
			t.Errorf("rendered config still has %q", gone)
		}
	}
	s.WithoutExtProc = true
	plain, err := RenderEnvoyConfig(s, "127.0.0.1:1003", "127.0.0.1:1004")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plain, "ext_proc.v3.ExternalProcessor") || !strings.Contains(plain, "envoy.filters.http.router") {
		t.Errorf("without ext_proc: the filter must go and the router stay")
	}
	bin, err := FindEnvoy()
	if err != nil {
		t.Logf("not validated by Envoy: %v", err)
		return
	}
	for _, cfg := range []string{y, plain} {
		out, err := exec.Command(bin, "--mode", "validate", "--disable-hot-restart", "--config-yaml", cfg).CombinedOutput()
		if err != nil {
			t.Errorf("envoy --mode validate: %v\n%s", err, out)
		}
	}
}
