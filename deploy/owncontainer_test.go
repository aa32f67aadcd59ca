package deploy_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestReadmeOwnImageCommand: the README's command for putting your own application behind the
// sidecar,
//
//	helm template shop deploy/helm/loadshed --set app.image.repository=registry.example.com/shop --set app.port=3000
//
// renders an app container that is exactly the user's: their image (with their tag when given),
// the sidecar forwarding to their port, and nothing of the demo backend (no command, args,
// probes or resources). What the chart adds to every app container (the drain hook, the
// restricted security context, the pull policy) is all there is besides.
func TestReadmeOwnImageCommand(t *testing.T) {
	for _, tc := range []struct {
		set   []string
		image string
	}{
		{nil, "registry.example.com/shop"},
		{[]string{"--set", "app.image.tag=1.4.2"}, "registry.example.com/shop:1.4.2"},
	} {
		args := append([]string{"--set", "app.image.repository=registry.example.com/shop", "--set", "app.port=3000"}, tc.set...)
		m := decode(t, render(t, args...)) // (release "demo": the name changes nothing in the pod)
		checkWorkload(t, m)
		app := *container(t, m.Deployments[0], "app")
		if app.Lifecycle == nil || app.Lifecycle.PreStop == nil || app.SecurityContext == nil {
			t.Errorf("%v: the app container lost the chart's drain hook or security context: %+v", args, app)
		}
		app.Lifecycle, app.SecurityContext, app.ImagePullPolicy = nil, nil, ""
		if want := (corev1.Container{Name: "app", Image: tc.image}); !reflect.DeepEqual(app, want) {
			t.Errorf("%v: app container %+v, want exactly %+v (plus the chart's hook and security context)", args, app, want)
		}
		if cfg := proxyConfigOf(t, m); cfg.Upstream != "http://127.0.0.1:3000" {
			t.Errorf("%v: sidecar upstream %q, want http://127.0.0.1:3000", args, cfg.Upstream)
		}
	}
}

// TestOwnImageKeepsWhatTheUserSets: with their own image, what the user sets (command, args,
// probes, resources) is rendered as set.
func TestOwnImageKeepsWhatTheUserSets(t *testing.T) {
	m := decode(t, render(t,
		"--set", "app.image.repository=registry.example.com/shop,app.port=3000",
		"--set", "app.command={/app/shop},app.args={--port=3000}",
		"--set", "app.probes.startup.tcpSocket.port=3000",
		"--set", "app.resources.limits.memory=1Gi"))
	app := container(t, m.Deployments[0], "app")
	if !slices.Equal(app.Command, []string{"/app/shop"}) || !slices.Equal(app.Args, []string{"--port=3000"}) {
		t.Errorf("command %v args %v, want the user's", app.Command, app.Args)
	}
	if p := app.StartupProbe; p == nil || p.TCPSocket == nil || p.TCPSocket.Port.IntValue() != 3000 || p.Exec != nil {
		t.Errorf("startup probe %+v, want the user's tcpSocket on 3000", p)
	}
	if got := app.Resources.Limits.Memory().String(); got != "1Gi" || app.Resources.Requests != nil {
		t.Errorf("resources %+v, want only the user's 1Gi limit", app.Resources)
	}
}

// TestDemoBackend: without app.image.repository the app is the demo backend, which the chart
// starts itself: its command, its args (listening on app.port, on loopback), its startup probe
// and its sizing, each replaced by what the user sets.
func TestDemoBackend(t *testing.T) {
	m := decode(t, render(t, "--set", "app.port=3000"))
	checkWorkload(t, m)
	app := container(t, m.Deployments[0], "app")
	if !strings.HasPrefix(app.Image, "ghcr.io/loadshed/loadshed:") {
		t.Errorf("demo image %q, want the loadshed image", app.Image)
	}
	if !slices.Equal(app.Command, []string{"/usr/local/bin/backend"}) || !slices.Contains(app.Args, "--listen=127.0.0.1:3000") {
		t.Errorf("demo command %v args %v, want the backend listening on 127.0.0.1:3000", app.Command, app.Args)
	}
	if p := app.StartupProbe; p == nil || p.Exec == nil || p.Exec.Command[0] != "/usr/local/bin/backend" {
		t.Errorf("demo startup probe %+v, want the backend's own client", p)
	}
	if app.Resources.Limits.Memory().IsZero() {
		t.Error("demo backend without its memory limit")
	}
	m = decode(t, render(t, "--set", "app.args={--listen=127.0.0.1:8080,--workers=8}"))
	if app := container(t, m.Deployments[0], "app"); !slices.Equal(app.Args, []string{"--listen=127.0.0.1:8080", "--workers=8"}) || len(app.Command) != 1 {
		t.Errorf("demo with args set: command %v args %v, want the backend with exactly the args set", app.Command, app.Args)
	}
}

// TestDefaultImage: the chart's default image is the project's release at the chart's
// appVersion; image.repository and image.tag name another (your registry's copy).
func TestDefaultImage(t *testing.T) {
	chart := readFile(t, chartDir+"/Chart.yaml")
	var appVersion string
	for _, l := range strings.Split(string(chart), "\n") {
		if v, ok := strings.CutPrefix(l, "appVersion: "); ok {
			appVersion = strings.Trim(v, `"`)
		}
	}
	m := decode(t, render(t))
	if got, want := container(t, m.Deployments[0], "loadshed").Image, "ghcr.io/loadshed/loadshed:"+appVersion; got != want {
		t.Errorf("sidecar image %q, want %q", got, want)
	}
	m = decode(t, render(t, "--set", "image.repository=registry.example.com/tools/loadshed,image.tag=v9"))
	for _, c := range []string{"loadshed", "app"} {
		if got := container(t, m.Deployments[0], c).Image; got != "registry.example.com/tools/loadshed:v9" {
			t.Errorf("%s image %q, want registry.example.com/tools/loadshed:v9", c, got)
		}
	}
}
