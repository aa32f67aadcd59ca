package cluster

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestK6SummaryFromLog(t *testing.T) {
	summary, err := os.ReadFile(filepath.Join("..", "..", "..", "bench", "k6summary", "testdata", "spike-valid.json"))
	if err != nil {
		t.Fatal(err)
	}
	log := strings.Join([]string{
		`time="2026-01-01T00:00:00Z" level=warning msg="Request Failed" error="Get \"http://x/\": EOF"`,
		"{",
		`  "not": "a summary"`,
		"}",
		"spike: valid",
		"  goodput 99 rps",
		string(summary),
		`time="2026-01-01T00:00:31Z" level=info msg="a line after the summary"`,
	}, "\n")
	s, err := K6Summary(log)
	if err != nil {
		t.Fatal(err)
	}
	if s.Script != "spike" || s.CapacityRPS != 100 {
		t.Fatalf("script %q capacity %v, want the spike summary", s.Script, s.CapacityRPS)
	}
	if _, err := K6Summary("k6 crashed\n"); err == nil {
		t.Fatal("a log without a summary parsed")
	}
	if _, err := K6Summary("{\n  \"schema\": \"other/v1\"\n}\n"); err == nil || !strings.Contains(err.Error(), "schema") {
		t.Fatalf("a foreign JSON object: err = %v, want a schema error", err)
	}
}

func TestParseTools(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"kind", "helm", "k6"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	out := "kind=" + filepath.Join(dir, "kind") + "\nk6=" + filepath.Join(dir, "k6") + "\nhelm=" + filepath.Join(dir, "helm") + "\n"
	tools, err := parseTools(out)
	if err != nil || tools.K6 != filepath.Join(dir, "k6") || tools.Helm != filepath.Join(dir, "helm") {
		t.Fatalf("tools %+v, err %v", tools, err)
	}
	if tools.Envoy != "" {
		t.Errorf("no envoy line, Envoy %q", tools.Envoy)
	}
	if tools, err := parseTools(out + "envoy=" + filepath.Join(dir, "k6") + "\n"); err != nil || tools.Envoy != filepath.Join(dir, "k6") {
		t.Errorf("with an envoy line: tools %+v, err %v", tools, err)
	}
	_, err = parseTools("kind=" + filepath.Join(dir, "kind") + "\nhelm=/nonexistent/helm\n")
	if err == nil || !strings.Contains(err.Error(), "k6=PATH") || !strings.Contains(err.Error(), "/nonexistent/helm") {
		t.Fatalf("err = %v, want the missing k6 and the absent helm named", err)
	}
}

func TestRolledOut(t *testing.T) {
	three := int32(3)
	d := func(gen, observed int64, replicas, updated, available int32) *appsv1.Deployment {
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "d", Generation: gen},
			Spec:       appsv1.DeploymentSpec{Replicas: &three},
			Status: appsv1.DeploymentStatus{ObservedGeneration: observed, Replicas: replicas,
				UpdatedReplicas: updated, AvailableReplicas: available},
		}
	}
	cases := []struct {
		name string
		d    *appsv1.Deployment
		done bool
	}{
		{"done", d(2, 2, 3, 3, 3), true},
		{"generation not observed", d(3, 2, 3, 3, 3), false},
		{"not all updated", d(2, 2, 4, 2, 3), false},
		{"old replica left", d(2, 2, 4, 3, 3), false},
		{"updated not available", d(2, 2, 3, 3, 2), false},
	}
	for _, c := range cases {
		done, reason, err := rolledOut(c.d)
		if err != nil || done != c.done || (!done && reason == "") {
			t.Errorf("%s: done %v reason %q err %v, want done %v with a reason when not", c.name, done, reason, err, c.done)
		}
	}
	stuck := d(2, 2, 3, 1, 1)
	stuck.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentProgressing, Reason: "ProgressDeadlineExceeded"}}
	if _, _, err := rolledOut(stuck); err == nil {
		t.Error("a deployment past its progress deadline is not an error")
	}
}

func TestDecodeIsStrict(t *testing.T) {
	good := "# a comment\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  k: v\n---\n# only a comment\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: b\nspec:\n  ports: [{port: 80}]\n"
	objs, err := Decode([]byte(good))
	if err != nil || len(objs) != 2 {
		t.Fatalf("decoded %d objects, err %v; want 2", len(objs), err)
	}
	bad := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndatta:\n  k: v\n"
	if _, err := Decode([]byte(bad)); err == nil || !strings.Contains(err.Error(), "datta") {
		t.Fatalf("err = %v, want the unknown field named", err)
	}
}

func TestPoll(t *testing.T) {
	n := 0
	err := Poll(context.Background(), time.Millisecond, "third call", func(context.Context) (bool, string, error) {
		n++
		return n == 3, "not yet", nil
	})
	if err != nil || n != 3 {
		t.Fatalf("n %d err %v", n, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err = Poll(ctx, time.Millisecond, "never", func(context.Context) (bool, string, error) { return false, "still waiting", nil })
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "still waiting") {
		t.Fatalf("err = %v, want a deadline naming the last reason", err)
	}
	boom := errors.New("boom")
	if err := Poll(context.Background(), time.Millisecond, "x", func(context.Context) (bool, string, error) { return false, "", boom }); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
}

// TestTranslated reads connection-tracking entries as the node's conntrack prints them: a
// connection to a cluster IP that kube-proxy has programmed is answered by an endpoint; one
// that left the node unrouted (accepted there by whatever answers every address) is answered
// by the cluster IP itself, and must not count as routed.
func TestTranslated(t *testing.T) {
	for name, c := range map[string]struct {
		entry, ip string
		ok        bool
		why       string
	}{
		"routed to an endpoint": {
			entry: "tcp      6 86399 ESTABLISHED src=172.19.0.2 dst=10.96.171.67 sport=48462 dport=80 src=10.244.0.41 dst=10.244.0.1 sport=8000 dport=3166 [ASSURED] mark=0 use=1\n",
			ip:    "10.96.171.67", ok: true,
		},
		"accepted unrouted": {
			entry: "tcp      6 86399 ESTABLISHED src=172.19.0.2 dst=10.96.250.250 sport=34390 dport=80 src=10.96.250.250 dst=172.19.0.2 sport=80 dport=34390 [ASSURED] mark=0 use=1\n",
			ip:    "10.96.250.250", why: "not translated",
		},
		"IPv6 routed": {
			entry: "tcp      6 431999 ESTABLISHED src=fc00:f853:ccd:e793::2 dst=fd00:10:96::a1 sport=40000 dport=80 src=fd00:10:244::7 dst=fc00:f853:ccd:e793::2 sport=8080 dport=40000 [ASSURED] mark=0 use=1",
			ip:    "fd00:10:96::a1", ok: true,
		},
		"IPv6 unrouted, written another way": {
			entry: "tcp 6 10 ESTABLISHED src=fc00::2 dst=fd00:10:96::a1 sport=1 dport=80 src=fd00:10:96:0:0::a1 dst=fc00::2 sport=80 dport=1",
			ip:    "fd00:10:96::a1", why: "not translated",
		},
		"no entry": {entry: " \n", ip: "10.96.0.5", why: "no connection-tracking entry"},
		"no reply": {entry: "tcp 6 10 SYN_SENT src=172.19.0.2 dst=10.96.0.5 sport=1 dport=80", ip: "10.96.0.5", why: "without a reply source"},
	} {
		ok, why := translated(c.entry, c.ip)
		if ok != c.ok || !strings.Contains(why, c.why) || (c.ok && why != "") {
			t.Errorf("%s: translated = %v, %q; want %v with %q", name, ok, why, c.ok, c.why)
		}
	}
}

func TestRunnerRecordsAndReportsTail(t *testing.T) {
	dir := t.TempDir()
	r := &Runner{Dir: dir, LogFile: filepath.Join(dir, "commands.log")}
	out, err := r.Output(context.Background(), nil, "sh", "-c", "echo out; echo err >&2")
	if err != nil || out != "out\n" {
		t.Fatalf("out %q err %v", out, err)
	}
	err = r.Run(context.Background(), nil, "sh", "-c", "echo first; echo the reason >&2; exit 3")
	if err == nil || !strings.Contains(err.Error(), "the reason") || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("err = %v, want the exit status and the output's tail", err)
	}
	log, _ := os.ReadFile(r.LogFile)
	if !strings.Contains(string(log), "echo out; echo err") || !strings.Contains(string(log), "the reason") {
		t.Fatalf("command log lacks the commands or their output:\n%s", log)
	}
}

func TestReadyEndpoints(t *testing.T) {
	port := func(n int32) discoveryv1.EndpointPort { return discoveryv1.EndpointPort{Port: &n} }
	slice := func(name string, ports []discoveryv1.EndpointPort, ready ...bool) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: map[string]string{"kubernetes.io/service-name": "app"}},
			Ports:      ports,
		}
		for _, r := range ready {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Conditions: discoveryv1.EndpointConditions{Ready: &r}})
		}
		return s
	}
	other := slice("other", []discoveryv1.EndpointPort{port(80)}, true)
	other.Labels["kubernetes.io/service-name"] = "elsewhere"
	k := &Kube{NS: "ns", CS: fake.NewClientset(
		slice("a", []discoveryv1.EndpointPort{port(8080)}, true, false, true),
		slice("b", []discoveryv1.EndpointPort{port(8080), port(9090)}, true),
		slice("c", []discoveryv1.EndpointPort{port(9000)}, false, true),
		slice("d", nil, false, true),
		other,
	)}
	ready, byPort, err := k.ReadyEndpoints(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[int32]int{8080: 3, 9090: 1, 9000: 1}; ready != 5 || !maps.Equal(byPort, want) {
		t.Errorf("ReadyEndpoints = %d, %v; want 5, %v", ready, byPort, want)
	}
}
