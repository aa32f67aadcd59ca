package inject

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
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

// goldenToken is the golden files' drain token (random by default).
const goldenToken = "golden-drain-token-0123456789"

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
		b, _ = run(t, b, Options{Settings: Settings{PortName: "http", DrainToken: goldenToken}})
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
			o := c.opt
			o.Settings.DrainToken = goldenToken
			out, rep := run(t, input(t, c.name), o)
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
	if want := drainHookFor("/drain?delay=5s", 9901, drainToken(t, sc)); app.Lifecycle == nil || !reflect.DeepEqual(app.Lifecycle.PreStop, want) {
		t.Errorf("want the application's preStop to call the sidecar's /drain for the drain delay on its admin port, got %+v", app.Lifecycle)
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
	if !bytes.Contains(first, []byte("targetPort: 8080")) || !slices.ContainsFunc(rep.Warnings, func(w string) bool {
		return strings.Contains(w, "not switched") && strings.Contains(w, "run inject --rewrite-services on this output")
	}) {
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
		{"strategy needing settings", pod(`loadshed.dev/strategy: inflight`, "{name: a, containerPort: 80}"), `metadata.annotations[loadshed.dev/strategy]: strategy "inflight" needs settings sized for the service`, Options{}},
		{"bad config name", pod(`loadshed.dev/config: "Not A Name"`, "{name: a, containerPort: 80}"), "metadata.annotations[loadshed.dev/config]", Options{}},
		{"unknown field", strings.Replace(pod("", "{name: a, containerPort: 80}"), "image: a", "image: a, imagePolicy: x", 1), `document 2 (Pod ns/p): error unmarshaling JSON: while decoding JSON: json: unknown field "imagePolicy"`, Options{}},
		{"cronjob path", "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: c}\nspec:\n  schedule: '* * * * *'\n  jobTemplate: {spec: {template: {spec: {containers: [{name: a, image: a}]}}}}\n",
			"CronJob c: spec.jobTemplate.spec.template.spec.containers[*].ports", Options{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.o.Strategies = config.NameOnly // as inject and the webhook pass them
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

// What each --pre-stop mode gives the application, with a native sidecar and a regular one, and
// what it does with a preStop hook the application already has (kept, with a warning).
func TestPreStopModes(t *testing.T) {
	const tok = "pinned-drain-token-for-the-test"
	drain := drainHookFor("/drain?delay=7s", 9901, tok)
	sleep := &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 7}}
	exec := &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sleep", "7"}}}
	own := &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/drain"}}}
	cases := []struct {
		name    string
		kube    Version
		mode    PreStop
		has     *corev1.LifecycleHandler
		want    *corev1.LifecycleHandler
		warning string
	}{
		{"native auto", Version{1, 33}, PreStopAuto, nil, drain, ""},
		{"native default", Version{1, 34}, "", nil, drain, ""},
		{"native sleep", Version{1, 33}, PreStopSleep, nil, sleep, ""},
		{"native exec", Version{1, 33}, PreStopExec, nil, exec, ""},
		{"native none", Version{1, 33}, PreStopNone, nil, nil, ""},
		{"native auto, own hook", Version{1, 33}, PreStopAuto, own, own, "the sidecar does not drain before the application stops"},
		{"native auto, own sleep", Version{1, 33}, PreStopAuto, &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 3}}, drain, "its preStop sleep of 3 s is now the sidecar's drain hook"},
		{"native auto, own longer sleep", Version{1, 33}, PreStopAuto, &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 12}},
			drainHookFor("/drain?delay=12s", 9901, tok), "is now the sidecar's drain hook (GET /drain?delay=12s"},
		{"native auto, sleep too long for the hook", Version{1, 33}, PreStopAuto, &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 900}},
			&corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 900}}, "the sidecar does not drain before the application stops"},
		{"native sleep, own sleep", Version{1, 33}, PreStopSleep, &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 3}}, &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 3}}, "should wait 7 s"},
		{"native sleep, own hook", Version{1, 33}, PreStopSleep, own, own, "should wait 7 s"},
		{"native none, own hook", Version{1, 33}, PreStopNone, own, own, ""},
		{"regular auto", Version{1, 32}, PreStopAuto, nil, sleep, ""},
		{"regular auto, no sleep action", Version{1, 29}, PreStopAuto, nil, nil, "no preStop sleep action"},
		{"regular exec", Version{1, 29}, PreStopExec, nil, exec, ""},
		{"regular none", Version{1, 32}, PreStopNone, nil, nil, ""},
		{"regular auto, own hook", Version{1, 32}, PreStopAuto, own, own, "should wait 7 s"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			meta := &metav1.ObjectMeta{Name: "w"}
			app := corev1.Container{Name: "app", Image: "x", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}
			if c.has != nil {
				app.Lifecycle = &corev1.Lifecycle{PreStop: c.has.DeepCopy()}
			}
			spec := &corev1.PodSpec{Containers: []corev1.Container{app}}
			res, err := Pod("w", meta, spec, Settings{Kube: c.kube, PreStop: c.mode, DrainSeconds: 7, DrainToken: tok}, config.Strategies)
			if err != nil || !res.Injected {
				t.Fatalf("not injected: %v %q", err, res.Skipped)
			}
			var got *corev1.LifecycleHandler
			if l := spec.Containers[0].Lifecycle; l != nil {
				got = l.PreStop
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("preStop %+v, want %+v", got, c.want)
			}
			warned := slices.ContainsFunc(res.Warnings, func(w string) bool { return c.warning != "" && strings.Contains(w, c.warning) })
			if c.warning != "" && !warned {
				t.Errorf("want a warning with %q, got %q", c.warning, res.Warnings)
			}
			if c.warning == "" && len(res.Warnings) > 0 {
				t.Errorf("want no warning, got %q", res.Warnings)
			}
		})
	}
}

// The drain hook calls the sidecar's admin port by number, after it moved off a port the pod
// uses, and the warning about a hook the application already has names that port.
func TestDrainHookFollowsTheAdminPort(t *testing.T) {
	pod := func(own *corev1.Lifecycle) *corev1.PodSpec {
		return &corev1.PodSpec{Containers: []corev1.Container{
			{Name: "app", Image: "x", Lifecycle: own, Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "debug", ContainerPort: 9901}}},
			{Name: "other", Image: "y"},
		}}
	}
	spec := pod(nil)
	res, err := Pod("w", &metav1.ObjectMeta{Name: "w"}, spec, Settings{PortName: "http"}, config.Strategies)
	if err != nil || !res.Injected {
		t.Fatalf("not injected: %v %q", err, res.Skipped)
	}
	if admin := sidecar(spec).Ports[1]; admin.Name != AdminPortName || admin.ContainerPort != 9902 {
		t.Fatalf("admin port %+v, want %s on 9902 (9901 is the application's)", admin, AdminPortName)
	}
	want := drainHookFor("/drain?delay=5s", 9902, drainToken(t, sidecar(spec)))
	if got := spec.Containers[0].Lifecycle.PreStop; !reflect.DeepEqual(got, want) {
		t.Errorf("preStop %+v, want GET /drain?delay=5s on port 9902", got)
	}
	if spec.Containers[1].Lifecycle != nil {
		t.Errorf("a container that does not serve the port got a hook: %+v", spec.Containers[1].Lifecycle)
	}

	own := &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/drain"}}}}
	spec = pod(own.DeepCopy())
	res, err = Pod("w", &metav1.ObjectMeta{Name: "w"}, spec, Settings{PortName: "http"}, config.Strategies)
	if err != nil || !slices.ContainsFunc(res.Warnings, func(w string) bool { return strings.Contains(w, "http://127.0.0.1:9902/drain?delay=5s") }) {
		t.Errorf("want a warning naming the drain call on the moved admin port, got %q (err %v)", res.Warnings, err)
	}
	if !reflect.DeepEqual(spec.Containers[0].Lifecycle, own) {
		t.Errorf("the application's own hook became %+v", spec.Containers[0].Lifecycle)
	}
}

// The sidecar's /drain takes delays up to 10m; a longer drain is refused before anything changes,
// where the hook would carry it.
func TestDrainHookDelayBound(t *testing.T) {
	pod := func() *corev1.PodSpec {
		return &corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "x", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}}
	}
	spec := pod()
	_, err := Pod("w", &metav1.ObjectMeta{Name: "w"}, spec, Settings{DrainSeconds: MaxDrainSeconds + 1}, config.Strategies)
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "drainSeconds" {
		t.Fatalf("drain of %d s: err %v, want a drainSeconds error", MaxDrainSeconds+1, err)
	}
	if !reflect.DeepEqual(spec, pod()) {
		t.Error("the pod changed although the injection failed")
	}
	for _, s := range []Settings{
		{DrainSeconds: MaxDrainSeconds},
		{DrainSeconds: MaxDrainSeconds + 1, PreStop: PreStopSleep},
		{DrainSeconds: MaxDrainSeconds + 1, Kube: Version{1, 32}},
	} {
		if _, err := Pod("w", &metav1.ObjectMeta{Name: "w"}, pod(), s, config.Strategies); err != nil {
			t.Errorf("%+v: %v", s, err)
		}
	}
}

// TestLoadReports: the loadshed.dev/load-reports annotation, or the setting, turns the reports on
// in the generated configuration, which the proxy accepts; the annotation overrides the setting;
// a value it cannot honour is an error naming the annotation (or the setting).
func TestLoadReports(t *testing.T) {
	pod := func(ann string) *corev1.Pod {
		var p corev1.Pod
		doc := "metadata:\n  name: p\n  annotations: {" + ann + "}\nspec:\n  containers: [{name: a, image: a, ports: [{name: http, containerPort: 8080}]}]\n"
		if err := yaml.UnmarshalStrict([]byte(doc), &p); err != nil {
			t.Fatal(err)
		}
		return &p
	}
	for _, c := range []struct {
		name, ann string
		s         Settings
		want      bool
	}{
		{"default", "", Settings{}, false},
		{"annotation", `loadshed.dev/load-reports: orca`, Settings{}, true},
		{"setting", "", Settings{LoadReports: LoadReportsORCA}, true},
		{"annotation turns the setting off", `loadshed.dev/load-reports: none`, Settings{LoadReports: LoadReportsORCA}, false},
		{"with another strategy", `loadshed.dev/load-reports: orca, loadshed.dev/strategy: codel`, Settings{}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := pod(c.ann)
			res, err := Pod("p", &p.ObjectMeta, &p.Spec, c.s, config.Strategies)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := config.Parse([]byte(res.Config))
			if err != nil {
				t.Fatalf("the proxy refuses the generated config: %v\n%s", err, res.Config)
			}
			if cfg.LoadReports.ORCA != c.want || cfg.LoadReports.TrustedOnly || (res.LoadReports == LoadReportsORCA) != c.want {
				t.Errorf("loadReports %+v, result %q; want orca %v", cfg.LoadReports, res.LoadReports, c.want)
			}
			if got := strings.Contains(p.Annotations[AnnotationStatus], `"loadReports":"orca"`); got != c.want {
				t.Errorf("status annotation %s: want loadReports in it %v", p.Annotations[AnnotationStatus], c.want)
			}
			again, err := Pod("p", &p.ObjectMeta, &p.Spec, c.s, config.Strategies)
			if err != nil || again.Injected || again.LoadReports != res.LoadReports {
				t.Errorf("a second run reads back load reports %q (err %v), want %q", again.LoadReports, err, res.LoadReports)
			}
		})
	}
	for _, c := range []struct {
		name, ann string
		s         Settings
		want      string
	}{
		{"unknown value", `loadshed.dev/load-reports: "orca,trusted-only"`, Settings{},
			`metadata.annotations[loadshed.dev/load-reports]: load reports "orca,trusted-only": want orca or none`},
		{"empty value", `loadshed.dev/load-reports: ""`, Settings{}, `metadata.annotations[loadshed.dev/load-reports]: load reports ""`},
		{"with a ConfigMap", `loadshed.dev/load-reports: orca, loadshed.dev/config: mine`, Settings{},
			"metadata.annotations[loadshed.dev/load-reports]: the sidecar reads its configuration from ConfigMap mine"},
		{"off with the settings' ConfigMap", `loadshed.dev/load-reports: none`, Settings{ConfigMap: "shared"},
			"metadata.annotations[loadshed.dev/load-reports]: the sidecar reads its configuration from ConfigMap shared"},
		{"annotation with strategy none", `loadshed.dev/load-reports: orca, loadshed.dev/strategy: none`, Settings{},
			"metadata.annotations[loadshed.dev/load-reports]: load reports (orca) need a strategy"},
		{"setting with the annotation's strategy none", `loadshed.dev/strategy: none`, Settings{LoadReports: LoadReportsORCA},
			"metadata.annotations[loadshed.dev/strategy]: load reports (orca) need a strategy"},
		{"setting with strategy none", "", Settings{LoadReports: LoadReportsORCA, Strategy: "none"},
			"loadReports: load reports (orca) need a strategy"},
		{"bad setting", "", Settings{LoadReports: "yes"}, `loadReports: load reports "yes"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := pod(c.ann)
			before := p.DeepCopy()
			_, err := Pod("p", &p.ObjectMeta, &p.Spec, c.s, config.Strategies)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
			if !reflect.DeepEqual(p, before) {
				t.Error("the pod changed though the injection failed")
			}
		})
	}
	// A pod with a ConfigMap of its own and no annotation is injected whatever the setting says:
	// the ConfigMap says whether it reports.
	p := pod(`loadshed.dev/config: mine`)
	res, err := Pod("p", &p.ObjectMeta, &p.Spec, Settings{LoadReports: LoadReportsORCA}, config.Strategies)
	if err != nil || !res.Injected || res.Config != "" || res.LoadReports != LoadReportsNone {
		t.Errorf("ConfigMap of its own: injected %v, config %q, load reports %q, err %v", res.Injected, res.Config, res.LoadReports, err)
	}
}
