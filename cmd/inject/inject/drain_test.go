package inject

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/loadshed/loadshed/internal/config"
)

// drainHookFor is the preStop hook that calls the sidecar's drain endpoint path on port admin
// with token.
func drainHookFor(path string, admin int32, token string) *corev1.LifecycleHandler {
	return &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(admin),
		HTTPHeaders: []corev1.HTTPHeader{{Name: "Authorization", Value: "Bearer " + token}}}}
}

// drainToken is the sidecar's drain token (its config.DrainTokenEnv), failing the test when it
// has none.
func drainToken(t testing.TB, sc *corev1.Container) string {
	t.Helper()
	i := slices.IndexFunc(sc.Env, func(e corev1.EnvVar) bool { return e.Name == config.DrainTokenEnv })
	if i < 0 || sc.Env[i].Value == "" || sc.Env[i].ValueFrom != nil {
		t.Fatalf("the sidecar has no %s in its environment: %+v", config.DrainTokenEnv, sc.Env)
	}
	return sc.Env[i].Value
}

// TestDrainTokenPerPod: a native sidecar gets a drain token of its own in its environment, the
// application's drain hook presents the same one, and two injections never share one (the
// webhook injects pod by pod, so every pod has its own). A regular sidecar, which drains itself
// on SIGTERM, gets none: its /drain stays closed.
func TestDrainTokenPerPod(t *testing.T) {
	inject := func(kube Version) *corev1.PodSpec {
		t.Helper()
		spec := &corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "x", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}}
		if res, err := Pod("w", &metav1.ObjectMeta{Name: "w"}, spec, Settings{Kube: kube}, config.Strategies); err != nil || !res.Injected {
			t.Fatalf("not injected: %v %q", err, res.Skipped)
		}
		return spec
	}
	seen := map[string]bool{}
	for range 20 {
		spec := inject(Version{1, 33})
		tok := drainToken(t, sidecar(spec))
		if len(tok) < 16 {
			t.Fatalf("drain token %q: too short to resist guessing", tok)
		}
		if seen[tok] {
			t.Fatalf("drain token %q given twice", tok)
		}
		seen[tok] = true
		h := spec.Containers[0].Lifecycle.PreStop
		if want := drainHookFor("/drain?delay=5s", DefaultAdminPort, tok); h.HTTPGet == nil || !slices.Equal(h.HTTPGet.HTTPHeaders, want.HTTPGet.HTTPHeaders) {
			t.Fatalf("drain hook %+v, want it to present the sidecar's token", h)
		}
	}
	spec := inject(Version{1, 32})
	for _, e := range sidecar(spec).Env {
		if e.Name == config.DrainTokenEnv {
			t.Errorf("a regular sidecar got a drain token; it never calls /drain")
		}
	}
}

func TestDevImage(t *testing.T) {
	for img, want := range map[string]bool{
		"loadshed:dev": true, "ghcr.io/loadshed/loadshed:dev": true, "registry:5000/loadshed:dev": true,
		"ghcr.io/loadshed/loadshed:v0.2.0": false, "registry:5000/loadshed": false, "loadshed:develop": false,
		"loadshed@sha256:0123": false, "dev": false,
	} {
		if got := DevImage(img); got != want {
			t.Errorf("DevImage(%q) = %v, want %v", img, got, want)
		}
	}
}
