package deploy_test

import (
	"bytes"
	"math"
	"net/url"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/loadshed/loadshed/internal/config"
)

// TestSidecarModeFollowsKubeVersion: proxy.native auto makes the sidecar a native sidecar from
// Kubernetes 1.33, the first version that puts a native sidecar's named ports into
// EndpointSlices; true and false force the choice. (helm template keeps only major.minor.patch
// of a vendor's --kube-version; a live server's, such as v1.33.1-eks-2b6e1a0, keeps its
// suffix, which the chart's ">=1.33.0-0" constraint accepts.)
func TestSidecarModeFollowsKubeVersion(t *testing.T) {
	cases := []struct {
		kube   string
		set    string
		native bool
	}{
		{"1.30.0", "", false},
		{"1.32.9", "", false},
		{"1.33.0", "", true},
		{"v1.33.1-eks-2b6e1a0", "", true},
		{"1.34.0", "", true},
		{"1.34.0", "proxy.native=false", false},
		{"1.34.0", "proxy.native=auto", true},
		{"1.32.0", "proxy.native=true", true},
	}
	for _, c := range cases {
		t.Run(c.kube+"/"+c.set, func(t *testing.T) {
			args := []string{"--kube-version", c.kube}
			if c.set != "" {
				args = append(args, "--set", c.set)
			}
			m := decode(t, render(t, args...))
			checkWorkload(t, m)
			if got := nativeSidecar(t, m.Deployments[0]); got != c.native {
				t.Fatalf("native sidecar %v, want %v", got, c.native)
			}
			checkSidecarMode(t, m, c.native, shutdownWant{drain: 5, grace: 20, margin: 10})
		})
	}
}

// TestNativeShutdownTimes: with a native sidecar the app's preStop hook is the sidecar's drain,
// GET /drain?delay=<drainDelay> on its admin port, the sidecar's own drain delay is 0, and the
// pod's grace period is that delay (rounded up), the app's own shutdown (the margin) and then
// the sidecar's grace period (rounded up), as cmd/inject computes it. A regular sidecar keeps
// today's times: the app sleeps through drainDelay + gracePeriod, and the pod gets that plus the
// margin.
func TestNativeShutdownTimes(t *testing.T) {
	set := []string{"--set-string", "proxy.shutdown.drainDelay=1500ms,proxy.shutdown.gracePeriod=1m30.5s", "--set", "terminationGraceMarginSeconds=7"}
	want := shutdownWant{drain: 1.5, grace: 90.5, margin: 7}
	for _, c := range []struct {
		kube   string
		native bool
	}{{"1.32.0", false}, {"1.34.0", true}} {
		t.Run("kube-"+c.kube, func(t *testing.T) {
			m := decode(t, render(t, append(set, "--kube-version", c.kube)...))
			checkSidecarMode(t, m, c.native, want)
		})
	}

	// An explicit app.shutdownDelaySeconds is the drain's delay, and counts in the grace period.
	m := decode(t, render(t, "--kube-version", "1.34.0", "--set", "app.shutdownDelaySeconds=40"))
	if hold, drain := appPreStop(t, m); hold != 40*time.Second || !drain {
		t.Errorf("app.shutdownDelaySeconds=40: preStop holds the app %s (drain hook %v), want the drain hook for 40s", hold, drain)
	}
	if got := *m.Deployments[0].Spec.Template.Spec.TerminationGracePeriodSeconds; got != 40+10+20 {
		t.Errorf("app.shutdownDelaySeconds=40: terminationGracePeriodSeconds %d, want 40 + 10 + 20", got)
	}
	// 0 turns the hook off; the sidecar's drain stays 0 (it would come after the app has exited).
	m = decode(t, render(t, "--kube-version", "1.34.0", "--set", "app.shutdownDelaySeconds=0"))
	if hold, drain := appPreStop(t, m); hold != 0 || drain {
		t.Errorf("app.shutdownDelaySeconds=0: preStop holds the app %s (drain hook %v), want no hook", hold, drain)
	}
	if got := *m.Deployments[0].Spec.Template.Spec.TerminationGracePeriodSeconds; got != 10+20 {
		t.Errorf("app.shutdownDelaySeconds=0: terminationGracePeriodSeconds %d, want 10 + 20", got)
	}
	// A fixed grace period is kept when it is long enough, and refused below the native sum.
	m = decode(t, render(t, "--kube-version", "1.34.0", "--set", "terminationGracePeriodSeconds=35"))
	if got := *m.Deployments[0].Spec.Template.Spec.TerminationGracePeriodSeconds; got != 35 {
		t.Errorf("terminationGracePeriodSeconds=35: rendered %d", got)
	}
	_, err := helmRun(t, "template", "demo", chartDir, "--kube-version", "1.34.0", "--set", "app.shutdownDelaySeconds=30,terminationGracePeriodSeconds=59")
	if err == nil || !strings.Contains(err.Error(), "native sidecar") || !strings.Contains(err.Error(), "= 60 seconds") {
		t.Errorf("terminationGracePeriodSeconds 59 below 30 + 10 + 20 with a native sidecar: %v", err)
	}
}

// TestNativeDrainHook: the drain hook calls the sidecar's admin port by number (a port name in a
// hook would resolve against the app's own ports), wherever proxy.adminPort puts it; it passes a
// Go duration through as the sidecar parses it (escaped for the URL); and a drain longer than
// the 10m the sidecar's /drain accepts fails the install instead of a hook that would fail at
// every shutdown.
func TestNativeDrainHook(t *testing.T) {
	for _, c := range []struct {
		set  []string
		hold time.Duration
	}{
		{[]string{"--set", "proxy.adminPort=9911"}, 5 * time.Second},
		{[]string{"--set-string", "proxy.shutdown.drainDelay=1m30s"}, 90 * time.Second},
		{[]string{"--set-string", "proxy.shutdown.drainDelay=2s500µs"}, 2*time.Second + 500*time.Microsecond},
		{[]string{"--set-string", "proxy.shutdown.drainDelay=10m"}, 10 * time.Minute},
		{[]string{"--set", "app.shutdownDelaySeconds=600"}, 10 * time.Minute},
	} {
		m := decode(t, render(t, append([]string{"--kube-version", "1.34.0"}, c.set...)...))
		if hold, drain := appPreStop(t, m); hold != c.hold || !drain {
			t.Errorf("%v: preStop holds the app %s (drain hook %v), want the drain hook for %s", c.set, hold, drain, c.hold)
		}
	}
	for _, set := range [][]string{{"--set-string", "proxy.shutdown.drainDelay=10m1s"}, {"--set", "app.shutdownDelaySeconds=601"}} {
		_, err := helmRun(t, append([]string{"template", "demo", chartDir, "--kube-version", "1.34.0"}, set...)...)
		if err == nil || !strings.Contains(err.Error(), "601 seconds is more than the 10m") {
			t.Errorf("%v: want the install refused, naming the drain hook's limit; got %v", set, err)
		}
	}
	// Before 1.33 the limit does not apply: a regular sidecar drains itself, the app sleeps.
	if _, err := helmRun(t, "template", "demo", chartDir, "--kube-version", "1.32.0", "--set-string", "proxy.shutdown.drainDelay=10m1s"); err != nil {
		t.Errorf("a regular sidecar's 10m1s drain: %v", err)
	}
}

// TestRegularModeUnchanged: on a server before 1.33, and with proxy.native=false on any, the
// chart renders exactly the same manifests (the regular sidecar as it was before native mode).
func TestRegularModeUnchanged(t *testing.T) {
	for _, values := range [][]string{
		nil,
		{"-f", chartDir + "/ci/chain-values.yaml"},
		{"--set", "mode=extproc,envoy.enabled=true,envoy.config=x"},
		{"--set", "proxy.tls.secretName=web-tls,clients.enabled=true,clients.store.redis.addr=r:6379,clients.store.redis.password.secretName=pw"},
	} {
		old := render(t, append([]string{"--kube-version", "1.32.0"}, values...)...)
		forced := render(t, append([]string{"--kube-version", "1.34.0", "--set", "proxy.native=false"}, values...)...)
		if !bytes.Equal(old, forced) {
			t.Errorf("values %v: proxy.native=false on 1.34 renders differently from 1.32", values)
		}
		if bytes.Contains(old, []byte("initContainers:")) || bytes.Contains(old, []byte("restartPolicy: Always")) {
			t.Errorf("values %v: a regular sidecar rendered as an init container", values)
		}
	}
}

// TestNativeSidecarWithEnvoy: in mode extproc the native sidecar is the ext_proc server only
// (admin port, no data port), started before Envoy and the app and stopped after them.
func TestNativeSidecarWithEnvoy(t *testing.T) {
	m := decode(t, render(t, "--kube-version", "1.34.0", "--set", "mode=extproc,envoy.enabled=true,envoy.config=x"))
	d := m.Deployments[0]
	if !nativeSidecar(t, d) {
		t.Fatal("mode extproc on 1.34: the sidecar is not native")
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == "loadshed" {
			t.Error("the sidecar is both an init container and a regular one")
		}
	}
	for _, p := range container(t, d, "loadshed").Ports {
		if p.Name != "admin" {
			t.Errorf("the ext_proc sidecar declares port %s", p.Name)
		}
	}
	container(t, d, "envoy")
	checkSidecarMode(t, m, true, shutdownWant{drain: 5, grace: 20, margin: 10})
	// The clients' connections are Envoy's, which the sidecar's /drain cannot close: the app
	// sleeps through the drain.
	if hold, drain := appPreStop(t, m); hold != 5*time.Second || drain {
		t.Errorf("mode extproc: preStop holds the app %s (drain hook %v), want a 5s sleep", hold, drain)
	}
}

// shutdownWant are the shutdown values a rendering was given, in seconds.
type shutdownWant struct{ drain, grace, margin float64 }

// checkSidecarMode checks where the sidecar runs and the shutdown times that go with it.
func checkSidecarMode(t *testing.T, m *manifests, native bool, w shutdownWant) {
	t.Helper()
	d := m.Deployments[0]
	pod := d.Spec.Template.Spec
	proxy := container(t, d, "loadshed")
	inContainers := false
	for _, c := range pod.Containers {
		inContainers = inContainers || c.Name == "loadshed"
	}
	data := m.configMap(t, "demo-loadshed").Data["config.yaml"]
	cfg, err := config.Parse([]byte(data))
	if err != nil {
		t.Fatalf("the proxy rejects the rendered config: %v\n%s", err, data)
	}
	if cfg.Shutdown.GracePeriod.D() != time.Duration(w.grace*float64(time.Second)) {
		t.Errorf("sidecar gracePeriod %s, want %gs", cfg.Shutdown.GracePeriod.D(), w.grace)
	}
	ceil := func(f float64) int64 { return int64(math.Ceil(f)) }
	hold, drainHook := appPreStop(t, m)
	podGrace := *pod.TerminationGracePeriodSeconds

	if native {
		if inContainers || len(pod.InitContainers) != 1 {
			t.Errorf("native: the sidecar must be the only init container and not a regular one (%d init containers)", len(pod.InitContainers))
		}
		if proxy.RestartPolicy == nil || *proxy.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			t.Errorf("native: sidecar restartPolicy %v, want Always", proxy.RestartPolicy)
		}
		// The app starts only once the sidecar passes its startup probe: ready to forward.
		checkHTTPProbe(t, "startup", proxy.StartupProbe, "/readyz", proxy, cfg.AdminListen)
		if d := cfg.Shutdown.DrainDelay.D(); d != 0 {
			t.Errorf("native: sidecar drainDelay %s, want 0 (it gets SIGTERM after the app has drained and exited)", d)
		}
		// The drain is the app's preStop: in mode proxy the sidecar's /drain (it closes its
		// clients' keep-alive connections while the endpoints update), in mode extproc a sleep.
		if want := time.Duration(w.drain * float64(time.Second)); hold != want || drainHook != (cfg.Listen != "") {
			t.Errorf("native: app preStop holds it %s (drain hook %v), want the drain delay %s (drain hook in mode proxy)", hold, drainHook, want)
		}
		if want := ceil(w.drain) + int64(w.margin) + ceil(w.grace); podGrace != want {
			t.Errorf("native: terminationGracePeriodSeconds %d, want drain %d + margin %d + sidecar grace %d = %d",
				podGrace, ceil(w.drain), int64(w.margin), ceil(w.grace), want)
		}
		return
	}
	if len(pod.InitContainers) != 0 || !inContainers {
		t.Errorf("regular: the sidecar must be a regular container (%d init containers)", len(pod.InitContainers))
	}
	if proxy.RestartPolicy != nil || proxy.StartupProbe != nil {
		t.Errorf("regular: sidecar restartPolicy %v, startupProbe %v; want neither", proxy.RestartPolicy, proxy.StartupProbe)
	}
	if want := time.Duration(w.drain * float64(time.Second)); cfg.Shutdown.DrainDelay.D() != want {
		t.Errorf("regular: sidecar drainDelay %s, want %s", cfg.Shutdown.DrainDelay.D(), want)
	}
	if want := time.Duration(ceil(w.drain+w.grace)) * time.Second; hold != want || drainHook {
		t.Errorf("regular: app preStop holds it %s (drain hook %v), want a sleep of drainDelay + gracePeriod = %s", hold, drainHook, want)
	}
	if want := ceil(w.drain+w.grace) + int64(w.margin); podGrace != want {
		t.Errorf("regular: terminationGracePeriodSeconds %d, want %d", podGrace, want)
	}
}

// appPreStop is how long the app's preStop hook holds it before SIGTERM (0 without a hook), and
// whether the hook is the native sidecar's drain: GET /drain?delay=D on the sidecar's admin port
// by number (a port name in a hook resolves against the app's own ports), with a delay the
// sidecar accepts. Any other handler is an error: the default image has no shell.
func appPreStop(t *testing.T, m *manifests) (hold time.Duration, drain bool) {
	t.Helper()
	d := m.Deployments[0]
	app := container(t, d, "app")
	if app.Lifecycle == nil || app.Lifecycle.PreStop == nil {
		return 0, false
	}
	h := app.Lifecycle.PreStop
	switch {
	case h.Sleep != nil && h.HTTPGet == nil && h.Exec == nil:
		return time.Duration(h.Sleep.Seconds) * time.Second, false
	case h.HTTPGet != nil && h.Sleep == nil && h.Exec == nil:
		g := h.HTTPGet
		admin := resolvePort(container(t, d, "loadshed"), intstr.FromString("admin"))
		if admin == nil || g.Port.Type != intstr.Int || g.Port.IntVal != admin.ContainerPort || g.Host != "" || (g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP) {
			t.Fatalf("app preStop GET %s:%s, want the sidecar's admin port by number over HTTP on the pod's IP", g.Host, g.Port.String())
		}
		u, err := url.Parse(g.Path)
		if err != nil || u.Path != "/drain" {
			t.Fatalf("app preStop GET %q, want the sidecar's /drain", g.Path)
		}
		delay, err := time.ParseDuration(u.Query().Get("delay"))
		if err != nil || delay < 0 || delay > 10*time.Minute {
			t.Fatalf("app preStop GET %q: delay %v, want a Go duration from 0s to 10m", g.Path, err)
		}
		return delay, true
	}
	t.Fatalf("app preStop %+v, want a sleep action or the sidecar's drain", h)
	return 0, false
}
