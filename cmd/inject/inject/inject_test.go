package inject

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/loadshed/loadshed/internal/config"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// goldenCases are the testdata inputs with the settings they run under.
var goldenCases = []struct {
	name string
	opt  Options
}{
	{"deployment", Options{Settings: Settings{PortName: "http"}}},
	{"deployment-rewrite", Options{Settings: Settings{PortName: "http"}, RewriteServices: true}},
	{"kinds", Options{}},
	{"skipped", Options{}},
	{"old-server", Options{Settings: Settings{Kube: Version{1, 29}}}},
}

// input reads a case's manifests; a "-rewrite" case starts from its first step's output, as a
// user runs the second step on what the first applied.
func input(t *testing.T, name string) []byte {
	t.Helper()
	first, ok := strings.CutSuffix(name, "-rewrite")
	b, err := os.ReadFile(filepath.Join("testdata", first+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		b, _ = run(t, b, Options{Settings: Settings{PortName: "http"}})
	}
	return b
}

func run(t *testing.T, in []byte, o Options) ([]byte, Report) {
	t.Helper()
	o.Strategies = config.Strategies
	out, rep, err := Manifests(bytes.NewReader(in), o)
	if err != nil {
		t.Fatal(err)
	}
	return out, rep
}

func TestGolden(t *testing.T) {
	for _, c := range goldenCases {
		t.Run(c.name, func(t *testing.T) {
			out, rep := run(t, input(t, c.name), c.opt)
			got := append(out, []byte("# report\n")...)
			for _, l := range append(rep.Lines, rep.Warnings...) {
				got = append(got, []byte("# "+l+"\n")...)
			}
			path := filepath.Join("testdata", c.name+".golden")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("output differs from %s (go test -update rewrites it):\n%s", path, got)
			}
		})
	}
}

// Injecting the output again changes nothing, and so does the second step applied twice.
func TestIdempotent(t *testing.T) {
	for _, c := range goldenCases {
		t.Run(c.name, func(t *testing.T) {
			once, _ := run(t, input(t, c.name), c.opt)
			twice, _ := run(t, once, c.opt)
			if !bytes.Equal(once, twice) {
				t.Errorf("a second run changed the output:\n%s\n--- became ---\n%s", once, twice)
			}
		})
	}
}

// decodePods returns the injected pod specs of a stream, by object name.
func decodePods(t *testing.T, stream []byte) (map[string]*corev1.PodSpec, map[string]*metav1.ObjectMeta, map[string]string) {
	t.Helper()
	docs, err := split(bytes.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	specs, metas, configs := map[string]*corev1.PodSpec{}, map[string]*metav1.ObjectMeta{}, map[string]string{}
	for _, d := range docs {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(d, &tm); err != nil {
			t.Fatal(err)
		}
		if tm.Kind == "ConfigMap" {
			var cm corev1.ConfigMap
			if err := yaml.UnmarshalStrict(d, &cm); err != nil {
				t.Fatal(err)
			}
			configs[cm.Name] = cm.Data["config.yaml"]
			continue
		}
		if !workloadKind(tm) {
			continue
		}
		w, err := decodeWorkload(tm, d)
		if err != nil {
			t.Fatal(err)
		}
		specs[w.name()], metas[w.name()] = w.spec, w.meta
	}
	return specs, metas, configs
}

// The wiring, read back from the output: the sidecar has the old port name on a new number,
// the application keeps its number under a new name, probes on the name follow the
// application, the generated config forwards to the application and the proxy accepts it.
func TestWiring(t *testing.T) {
	out, _ := run(t, input(t, "deployment"), Options{Settings: Settings{PortName: "http"}})
	specs, metas, configs := decodePods(t, out)
	spec := specs["shop"]
	sc := sidecar(spec)
	if sc == nil || sc.RestartPolicy == nil || *sc.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Fatalf("want a native sidecar (init container, restartPolicy Always), got %+v", sc)
	}
	if spec.InitContainers[0].Name != "migrate" {
		t.Errorf("existing init containers must run first, got %s first", spec.InitContainers[0].Name)
	}
	if sc.Ports[0].Name != "http" || sc.Ports[0].ContainerPort != 8001 {
		t.Errorf("sidecar port = %+v, want http on 8001 (8000 is the log shipper's)", sc.Ports[0])
	}
	app := spec.Containers[0]
	if app.Ports[0].Name != "http-app" || app.Ports[0].ContainerPort != 8080 {
		t.Errorf("application port = %+v, want http-app 8080", app.Ports[0])
	}
	if got := app.ReadinessProbe.HTTPGet.Port; got != intstr.FromString("http-app") {
		t.Errorf("readiness probe port = %v, want the application's new name", got)
	}
	if got := app.LivenessProbe.TCPSocket.Port; got != intstr.FromInt32(8080) {
		t.Errorf("liveness probe by number = %v, want it untouched", got)
	}
	if app.Lifecycle == nil || app.Lifecycle.PreStop == nil || app.Lifecycle.PreStop.Sleep == nil || app.Lifecycle.PreStop.Sleep.Seconds != 5 {
		t.Errorf("want a preStop sleep of the drain delay on the application, got %+v", app.Lifecycle)
	}
	if g := *spec.TerminationGracePeriodSeconds; g != 5+30+20 {
		t.Errorf("terminationGracePeriodSeconds = %d, want drain 5 + the app's 30 + the sidecar's 20", g)
	}
	cfg, err := config.Parse([]byte(configs["shop-loadshed"]))
	if err != nil {
		t.Fatalf("the proxy refuses the generated config: %v", err)
	}
	if cfg.Upstream != "http://127.0.0.1:8080" || cfg.Listen != ":8001" || cfg.Shutdown.DrainDelay != 0 || cfg.Admission.Strategy != "adaptive" {
		t.Errorf("generated config = %+v", cfg)
	}
	if metas["shop"].Annotations[AnnotationStatus] == "" {
		t.Error("no status annotation")
	}
}

func TestOldServerGetsARegularSidecarThatDrainsItself(t *testing.T) {
	out, rep := run(t, input(t, "old-server"), Options{Settings: Settings{Kube: Version{1, 29}}})
	specs, _, configs := decodePods(t, out)
	spec := specs["old"]
	if len(spec.InitContainers) != 0 || spec.Containers[1].Name != ContainerName {
		t.Fatalf("want the sidecar as a second regular container, got init %d, containers %d", len(spec.InitContainers), len(spec.Containers))
	}
	if spec.Containers[0].Lifecycle != nil {
		t.Errorf("1.29 has no sleep action; want no preStop, got %+v", spec.Containers[0].Lifecycle)
	}
	cfg, err := config.Parse([]byte(configs["old-loadshed"]))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Shutdown.DrainDelay.D() != 5*time.Second {
		t.Errorf("a regular sidecar drains itself: drainDelay = %v, want 5s", cfg.Shutdown.DrainDelay)
	}
	if !slices.ContainsFunc(rep.Warnings, func(w string) bool { return strings.Contains(w, "no preStop sleep action") }) {
		t.Errorf("want a warning about the missing sleep action, got %q", rep.Warnings)
	}
	if !slices.ContainsFunc(rep.Warnings, func(w string) bool { return strings.Contains(w, "Service old port 8080 targets") }) {
		t.Errorf("a Service with no targetPort targets the number: want the two-step warning, got %q", rep.Warnings)
	}
}

// The Service that targets the port by number is switched only in the second step: switching it
// with the injection would send its traffic to the sidecar's port on pods that have none yet.
func TestServiceByNumberNeedsTwoSteps(t *testing.T) {
	o := Options{Settings: Settings{PortName: "http"}, RewriteServices: true}
	first, rep := run(t, input(t, "deployment"), o)
	if !bytes.Contains(first, []byte("targetPort: 8080")) || !slices.ContainsFunc(rep.Warnings, func(w string) bool { return strings.Contains(w, "two steps") }) {
		t.Fatalf("the injecting run must leave the Service by number and say how to switch it; warnings %q", rep.Warnings)
	}
	second, rep := run(t, first, o)
	if bytes.Contains(second, []byte("targetPort: 8080")) || !slices.ContainsFunc(rep.Warnings, func(w string) bool { return strings.Contains(w, `targetPort 8080 -> "http"`) }) {
		t.Fatalf("the second run must switch the Service to the port's name; warnings %q", rep.Warnings)
	}
}

// Errors name the object and the field, and nothing is written.
func TestErrorsNameTheObjectAndField(t *testing.T) {
	pod := func(ann string, ports string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: ns\n  annotations: {" + ann + "}\nspec:\n  containers: [{name: a, image: a, ports: [" + ports + "]}]\n"
	}
	good := "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: fine}\nspec:\n  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n    spec:\n      containers: [{name: a, image: a, ports: [{name: http, containerPort: 80}]}]\n---\n"
	cases := []struct {
		name, doc, want string
		o               Options
	}{
		{"no named port", pod("", "{containerPort: 80}"), "Pod ns/p: spec.containers[*].ports: no named TCP port", Options{}},
		{"several", pod("", "{name: a, containerPort: 80}, {name: b, containerPort: 81}"), "several named TCP ports (a, b)", Options{}},
		{"unknown port", pod("", "{name: a, containerPort: 80}"), `no TCP port is named "web"`, Options{Settings: Settings{PortName: "web"}}},
		{"udp port", pod("", "{name: dns, containerPort: 53, protocol: UDP}"), "Pod ns/p: spec.containers[0].ports[0].protocol: port dns is UDP", Options{Settings: Settings{PortName: "dns"}}},
		{"bad inject", pod(`loadshed.dev/inject: "yes"`, "{name: a, containerPort: 80}"), "Pod ns/p: metadata.annotations[loadshed.dev/inject]", Options{}},
		{"bad strategy", pod(`loadshed.dev/strategy: fastest`, "{name: a, containerPort: 80}"), `metadata.annotations[loadshed.dev/strategy]: unknown strategy "fastest"`, Options{}},
		{"bad config name", pod(`loadshed.dev/config: "Not A Name"`, "{name: a, containerPort: 80}"), "metadata.annotations[loadshed.dev/config]", Options{}},
		{"unknown field", strings.Replace(pod("", "{name: a, containerPort: 80}"), "image: a", "image: a, imagePolicy: x", 1), `document 2 (Pod ns/p): error unmarshaling JSON: while decoding JSON: json: unknown field "imagePolicy"`, Options{}},
		{"cronjob path", "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: c}\nspec:\n  schedule: '* * * * *'\n  jobTemplate: {spec: {template: {spec: {containers: [{name: a, image: a}]}}}}\n",
			"CronJob c: spec.jobTemplate.spec.template.spec.containers[*].ports", Options{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.o.Strategies = config.Strategies
			out, _, err := Manifests(strings.NewReader(good+c.doc), c.o)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
			if out != nil {
				t.Errorf("nothing may be written when an object fails, got %d bytes", len(out))
			}
		})
	}
}

func TestParseVersion(t *testing.T) {
	for in, want := range map[string]Version{"1.33": {1, 33}, "v1.29.4": {1, 29}, "1.34+": {1, 34}, " v2.0 ": {2, 0}} {
		got, err := ParseVersion(in)
		if err != nil || got != want {
			t.Errorf("ParseVersion(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "1", "one.two", "1.x", "0.5"} {
		if _, err := ParseVersion(in); err == nil {
			t.Errorf("ParseVersion(%q) accepted", in)
		}
	}
	if !(Version{1, 33}).Native() || (Version{1, 32}).Native() || !(Version{2, 0}).Native() {
		t.Error("native sidecars from 1.33")
	}
}

func TestRenamedFitsAPortName(t *testing.T) {
	taken := map[string]bool{"http-app": true}
	for in, want := range map[string]string{"http": "http-app1", "web": "web-app", "a-very-long-nam": "a-very-long-app", "abcdefghijk-mno": "abcdefghijk-app"} {
		got, err := renamed(in, taken)
		if err != nil || got != want {
			t.Errorf("renamed(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
