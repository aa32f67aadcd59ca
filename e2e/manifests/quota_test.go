package manifests

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/loadshed/loadshed/e2e/internal/cluster"
)

func TestRedisManifest(t *testing.T) {
	m, err := Render("redis.yaml", Redis{Name: "quota-redis", Namespace: "ns", Image: "redis:1"})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := cluster.Decode(m)
	if err != nil || len(objs) != 2 {
		t.Fatalf("%d objects, err %v", len(objs), err)
	}
	dep, ok := objs[0].(*appsv1.Deployment)
	svc, ok2 := objs[1].(*corev1.Service)
	if !ok || !ok2 {
		t.Fatalf("objects %T %T, want a Deployment and a Service", objs[0], objs[1])
	}
	c := dep.Spec.Template.Spec.Containers[0]
	if c.Image != "redis:1" || !strings.Contains(strings.Join(c.Args, " "), "--save  --appendonly no") {
		t.Errorf("container %s args %q", c.Image, c.Args)
	}
	if svc.Name != "quota-redis" || svc.Spec.Ports[0].Port != 6379 || svc.Spec.Selector["app.kubernetes.io/name"] != dep.Spec.Template.Labels["app.kubernetes.io/name"] {
		t.Errorf("service %+v does not reach the pods", svc.Spec)
	}
	restricted(t, dep.Spec.Template.Spec)
}
