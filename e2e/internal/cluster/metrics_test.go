package cluster

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

const page = `# HELP backend_frontend_legs_total Legs the frontend called.
# TYPE backend_frontend_legs_total counter
backend_frontend_legs_total{leg="http://a/",result="ok"} 10
backend_frontend_legs_total{leg="http://a/",result="wasted"} 5
backend_frontend_legs_total{leg="http://b/",result="ok"} 10
backend_frontend_legs_total{leg="http://b/",result="refused"} 7
# TYPE loadshed_cohort_level gauge
loadshed_cohort_level{route="default"} 3.5
# TYPE backend_service_seconds histogram
backend_service_seconds_bucket{le="+Inf"} 4
backend_service_seconds_sum 0.1
backend_service_seconds_count 4
`

func TestParseMetrics(t *testing.T) {
	m, err := ParseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Sum("backend_frontend_legs_total", map[string]string{"result": "ok"}); got != 20 {
		t.Errorf("ok legs %v, want 20", got)
	}
	if got := m.Sum("backend_frontend_legs_total", map[string]string{"leg": "http://a/"}); got != 15 {
		t.Errorf("legs of a %v, want 15", got)
	}
	by := m.By("backend_frontend_legs_total", "result", map[string]string{"leg": "http://b/"})
	if len(by) != 2 || by["ok"] != 10 || by["refused"] != 7 {
		t.Errorf("legs of b by result %v", by)
	}
	found := m.Find("loadshed_cohort")
	if len(found) != 1 || found[`loadshed_cohort_level{route="default"}`] != 3.5 {
		t.Errorf("cohort samples %v", found)
	}
	if _, ok := m["backend_service_seconds"]; ok {
		t.Error("a histogram was kept")
	}
	if _, err := ParseMetrics(strings.NewReader("metric{ 1\n")); err == nil {
		t.Error("a broken page parsed")
	}
}

func TestApplySecret(t *testing.T) {
	k := &Kube{CS: fake.NewClientset(), NS: "ns"}
	m := []byte("apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n  namespace: ns\nstringData:\n  key: \"0123456789abcdef\"\n")
	if err := k.Apply(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	got, err := k.CS.CoreV1().Secrets("ns").Get(context.Background(), "s", metav1.GetOptions{})
	if err != nil || got.StringData["key"] != "0123456789abcdef" {
		t.Fatalf("secret %+v, err %v", got, err)
	}
}
