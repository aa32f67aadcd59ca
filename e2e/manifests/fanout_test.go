package manifests

import (
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/loadshed/loadshed/e2e/internal/cluster"
)

func TestCohortSecretManifest(t *testing.T) {
	key := `0123456789abcdef0123456789abcdef "quoted" #x`
	m, err := Render("cohort-secret.yaml", CohortSecret{Name: "e2e-cohort", Namespace: "ns", Key: key})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := cluster.Decode(m)
	if err != nil || len(objs) != 1 {
		t.Fatalf("%d objects, err %v", len(objs), err)
	}
	s := objs[0].(*corev1.Secret)
	// The chart mounts the Secret's key "key" at /etc/loadshed-cohort/key.
	if s.Name != "e2e-cohort" || s.Namespace != "ns" || len(s.StringData) != 1 || s.StringData["key"] != key {
		t.Errorf("secret %s/%s data %q", s.Namespace, s.Name, s.StringData)
	}
}

func TestLoadgenJobManifest(t *testing.T) {
	args := []string{"--target", "http://front/", "--rate", "400", "--header", `X-Odd: "quoted" #x`, "--json"}
	m, err := Render("loadgen-job.yaml", LoadgenJob{Name: "lg", Namespace: "ns", Image: "loadgen:1", Args: args, DeadlineSeconds: 120})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := cluster.Decode(m)
	if err != nil || len(objs) != 1 {
		t.Fatalf("%d objects, err %v", len(objs), err)
	}
	job := objs[0].(*batchv1.Job)
	if *job.Spec.BackoffLimit != 0 || *job.Spec.ActiveDeadlineSeconds != 120 {
		t.Errorf("backoffLimit %d, activeDeadlineSeconds %d", *job.Spec.BackoffLimit, *job.Spec.ActiveDeadlineSeconds)
	}
	c := job.Spec.Template.Spec.Containers[0]
	if c.Name != "loadgen" || c.Image != "loadgen:1" || strings.Join(c.Args, "|") != strings.Join(args, "|") {
		t.Errorf("container %s image %s args %q", c.Name, c.Image, c.Args)
	}
	if req := c.Resources.Requests.Cpu().MilliValue(); req == 0 || req > 200 {
		t.Errorf("loadgen requests %dm CPU; the call graph's five pods need the node's room", req)
	}
	restricted(t, job.Spec.Template.Spec)
}

func TestFanoutFrontendValues(t *testing.T) {
	urls := []string{"http://a.ns.svc.cluster.local/", "http://b.ns.svc.cluster.local/"}
	m, err := Render("fanout-frontend.yaml", FanoutFrontend{URLs: urls, CallTimeout: "2s", AdminPort: 9090})
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		App struct {
			Args []string `json:"args"`
		} `json:"app"`
		Admission map[string]any `json:"admission"`
	}
	if err := yaml.UnmarshalStrict(m, &v); err != nil {
		t.Fatalf("values: %v\n%s", err, m)
	}
	want := []string{"--listen=127.0.0.1:8080", "--admin-listen=:9090", "--call-all=" + strings.Join(urls, ","), "--call-timeout=2s"}
	if strings.Join(v.App.Args, " ") != strings.Join(want, " ") {
		t.Errorf("args %q, want %q", v.App.Args, want)
	}
	// The frontend's sidecar refuses nothing itself: with cohorts it only ranks.
	if v.Admission["strategy"] != "none" || len(v.Admission) != 1 {
		t.Errorf("admission %v, want strategy none only", v.Admission)
	}
}
