// Package inject adds the loadshed sidecar to a pod template, so an existing workload is
// protected without moving it into loadshed's chart. cmd/inject runs it over manifests; a
// mutating webhook can run it over pods at admission.
//
// The wiring needs no change on the clients' side: the sidecar takes over the application's
// named port. The application keeps its port number under a new name (the old name with "-app"),
// the sidecar listens on a new number under the old name and forwards to the application's
// number on localhost, so a Service that targets the port by name reaches the sidecar as it is.
// The application's probes that named the port are renamed with it and keep reaching the
// application.
//
// On Kubernetes 1.33 and later the sidecar is a native sidecar (an init container with
// restartPolicy Always): it is started and ready before the application, and gets SIGTERM only
// after the application has exited. So the drain moves to the application's preStop hook, an
// httpGet to the sidecar's admin port: GET /drain?delay=N, with the drain token the sidecar holds
// (a new random one per pod template), makes the sidecar close its clients'
// keep-alive connections (answers carry Connection: close, GOAWAY over HTTP/2) and answers
// after N seconds, while the endpoints update; then the application stops, then the sidecar,
// whose own drain delay is 0. A preStop sleep would not do: the sidecar, not knowing the pod
// stops, would keep those connections open, and kube-proxy keeps routing them to the pod, so
// what they carry after the application has exited would fail. Older servers only list the
// named ports of regular containers in EndpointSlices (kubernetes#128850), so there the sidecar
// is a regular container that drains itself on SIGTERM, and the application gets a preStop
// sleep.
package inject

import (
	"cmp"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/version"
)

// Annotations read from (and written to) a pod template.
const (
	// AnnotationInject "true" injects a pod the injector would skip (a host-network pod, a pod
	// with a mesh's proxy); "false" opts a pod out.
	AnnotationInject = "loadshed.dev/inject"
	// AnnotationStrategy overrides the admission strategy.
	AnnotationStrategy = "loadshed.dev/strategy"
	// AnnotationPort names the application's port the sidecar takes over.
	AnnotationPort = "loadshed.dev/port"
	// AnnotationConfig names a ConfigMap (key config.yaml) holding the sidecar's configuration.
	AnnotationConfig = "loadshed.dev/config"
	// AnnotationLoadReports turns the sidecar's load reports to the balancers on ("orca") or
	// off ("none") in a generated configuration (see LoadReports).
	AnnotationLoadReports = "loadshed.dev/load-reports"
	// AnnotationStatus records what the injection did, as JSON: the port the sidecar took over,
	// its number, the application's new port name and number, the strategy.
	AnnotationStatus = "loadshed.dev/status"
)

// ImageRepository is where the project's release workflow publishes the loadshed image.
const ImageRepository = "ghcr.io/loadshed/loadshed"

// DefaultImage is the loadshed image of this build's version: a released build names its own
// release; a development build names the tag "dev", which no registry serves (see DevImage).
var DefaultImage = ImageRepository + ":" + version.Version

// DevImage reports whether image is a development build's tag (":dev"), which exists only where
// scripts/image.sh built it (a kind cluster the image was loaded into, say).
func DevImage(image string) bool {
	i := strings.LastIndexAny(image, ":/@")
	return i >= 0 && image[i] == ':' && image[i+1:] == "dev"
}

// Defaults of Settings.
const (
	ContainerName    = "loadshed"
	DefaultStrategy  = "adaptive"
	DefaultPort      = 8000
	DefaultAdminPort = 9901
	AdminPortName    = "loadshed-admin"
	configVolume     = "loadshed-config"
	configDir        = "/etc/loadshed"
	// appSuffix is added to the name of the port the sidecar takes over.
	appSuffix = "-app"
	// maxPortName is the longest name a container port may have (IANA_SVC_NAME).
	maxPortName = 15
	// defaultPodGrace is Kubernetes' terminationGracePeriodSeconds when a pod sets none.
	defaultPodGrace = 30
)

// Version is a Kubernetes server version, major.minor.
type Version struct{ Major, Minor int }

// ParseVersion reads "1.33", "v1.33.2" or "1.33+".
func ParseVersion(s string) (Version, error) {
	t := strings.TrimPrefix(strings.TrimSpace(s), "v")
	major, rest, ok := strings.Cut(t, ".")
	if !ok {
		return Version{}, fmt.Errorf("kube version %q: want major.minor, e.g. 1.33", s)
	}
	minor, _, _ := strings.Cut(rest, ".")
	minor = strings.TrimRight(minor, "+")
	ma, err1 := strconv.Atoi(major)
	mi, err2 := strconv.Atoi(minor)
	if err1 != nil || err2 != nil || ma < 1 || mi < 0 {
		return Version{}, fmt.Errorf("kube version %q: want major.minor, e.g. 1.33", s)
	}
	return Version{ma, mi}, nil
}

func (v Version) atLeast(major, minor int) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

func (v Version) String() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// Native reports whether the server lists a native sidecar's named ports in EndpointSlices
// (1.33 and later).
func (v Version) Native() bool { return v.atLeast(1, 33) }

// PreStop says how the application container waits for its endpoints to update before it gets
// SIGTERM.
type PreStop string

const (
	// PreStopAuto is, with a native sidecar (1.33 and later), an httpGet hook to the sidecar's
	// admin port, GET /drain?delay=<DrainSeconds>s: the sidecar closes its clients' keep-alive
	// connections while the endpoints update, and answers once the delay has passed. With a
	// regular sidecar (which drains itself on SIGTERM) it is Kubernetes' sleep action where the
	// server has it (1.30 and later) and nothing, with a warning, where it does not.
	PreStopAuto PreStop = "auto"
	// PreStopSleep is the sleep action. With a native sidecar it loses requests: the sidecar
	// does not know the pod is stopping, keeps its clients' keep-alive connections open through
	// the sleep, and what arrives on them after the application has exited fails with 502.
	PreStopSleep PreStop = "sleep"
	// PreStopExec runs `sleep N` in the application's image, which must have it; with a native
	// sidecar it loses keep-alive clients' requests as PreStopSleep does.
	PreStopExec PreStop = "exec"
	// PreStopNone adds nothing.
	PreStopNone PreStop = "none"
)

// MaxDrainSeconds is the longest delay the sidecar's GET /drain accepts (10m).
const MaxDrainSeconds = 600

// ParsePreStop reads a PreStop.
func ParsePreStop(s string) (PreStop, error) {
	switch p := PreStop(s); p {
	case PreStopAuto, PreStopSleep, PreStopExec, PreStopNone:
		return p, nil
	}
	return "", fmt.Errorf("pre-stop %q: want auto, sleep, exec or none", s)
}

// LoadReports says whether a generated configuration has the sidecar report its load to the
// balancers in front of the pod (the proxy's loadReports block).
type LoadReports string

const (
	// LoadReportsNone reports nothing (the proxy's default).
	LoadReportsNone LoadReports = "none"
	// LoadReportsORCA reports ORCA load reports (loadReports.orca): on every answer, and on the
	// out-of-band stream of the data port. Every caller gets them: a generated configuration
	// trusts no source, so trustedOnly would give them to nobody (a ConfigMap of your own, with
	// trust settings, can have it).
	LoadReportsORCA LoadReports = "orca"
)

// ParseLoadReports reads a LoadReports.
func ParseLoadReports(s string) (LoadReports, error) {
	switch l := LoadReports(s); l {
	case LoadReportsNone, LoadReportsORCA:
		return l, nil
	}
	return "", fmt.Errorf("load reports %q: want orca or none (reports only to trusted callers need trust settings, which a generated configuration has not: set loadReports in a ConfigMap of your own)", s)
}

// config is the proxy's loadReports block for a generated configuration, empty for none.
func (l LoadReports) config() string {
	if l == LoadReportsORCA {
		return "loadReports:\n  orca: true\n"
	}
	return ""
}

// Settings say what to inject. The zero value of a field means its default.
type Settings struct {
	Image string
	// Strategy is the admission strategy of a generated configuration (a pod's annotation
	// overrides it).
	Strategy string
	// ConfigMap names an existing ConfigMap with the sidecar's config.yaml; empty generates one
	// per workload (Result.Config).
	ConfigMap string
	// PortName is the application's port to take over; empty means the pod's only named port.
	PortName string
	// Port is the sidecar's data port number, moved up if the pod uses it; AdminPort likewise.
	Port, AdminPort int32
	// Kube is the server's version: native sidecar from 1.33.
	Kube Version
	// DrainSeconds is how long a stopping pod keeps serving while its endpoints update (5); at
	// most MaxDrainSeconds where it is the delay of the sidecar's drain hook.
	DrainSeconds int64
	// GraceSeconds is the sidecar's shutdown.gracePeriod (20).
	GraceSeconds int64
	PreStop      PreStop
	Resources    corev1.ResourceRequirements
	// LoadReports turns the load reports of a generated configuration on (LoadReportsORCA) or
	// off (none, the default); a pod's annotation overrides it.
	LoadReports LoadReports
	// DrainToken is the token of the sidecar's GET /drain (config.DrainTokenEnv) for a native
	// sidecar; empty (the default) draws a new random one for every pod template injected, so
	// no two workloads (or, through the webhook, no two pods) share one.
	DrainToken string
}

// Defaults returns the settings with every zero field at its default.
func (s Settings) Defaults() Settings {
	if s.Image == "" {
		s.Image = DefaultImage
	}
	if s.Strategy == "" {
		s.Strategy = DefaultStrategy
	}
	if s.Port == 0 {
		s.Port = DefaultPort
	}
	if s.AdminPort == 0 {
		s.AdminPort = DefaultAdminPort
	}
	if s.Kube == (Version{}) {
		s.Kube = Version{1, 33}
	}
	if s.DrainSeconds == 0 {
		s.DrainSeconds = 5
	}
	if s.GraceSeconds == 0 {
		s.GraceSeconds = 20
	}
	if s.PreStop == "" {
		s.PreStop = PreStopAuto
	}
	if s.LoadReports == "" {
		s.LoadReports = LoadReportsNone
	}
	if s.Resources.Requests == nil && s.Resources.Limits == nil {
		s.Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
		}
	}
	return s
}

// Result is what Pod did to one pod template.
type Result struct {
	// Injected is false when the pod was left alone (Skipped says why, or it had the sidecar).
	Injected bool
	Skipped  string
	Warnings []string
	// PortName is the port the sidecar took over; AppPort the application's number, now named
	// AppPortName; SidecarPort the sidecar's number.
	PortName, AppPortName string
	AppPort, SidecarPort  int32
	Strategy              string
	// LoadReports is what the generated configuration reports (none with a ConfigMap: the
	// ConfigMap says).
	LoadReports LoadReports
	// ConfigMap is the ConfigMap the sidecar reads; Config the config.yaml to put in it when it
	// was generated (empty when Settings.ConfigMap or the pod's annotation named one).
	ConfigMap, Config string
}

// FieldError is a problem with one field of the pod template.
type FieldError struct{ Field, Msg string }

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// Pod injects the sidecar into the pod template meta/spec in place. name names the workload
// (for the generated ConfigMap, "<name>-loadshed"); strategies are the names a configuration
// may use. Errors are *FieldError; the template is unchanged when Pod returns one.
func Pod(name string, meta *metav1.ObjectMeta, spec *corev1.PodSpec, s Settings, strategies []string) (Result, error) {
	s = s.Defaults()
	ann := meta.Annotations
	if sidecar(spec) != nil {
		r := Result{Skipped: "it already has the loadshed sidecar"}
		var st status
		if json.Unmarshal([]byte(ann[AnnotationStatus]), &st) == nil {
			r.PortName, r.AppPortName, r.AppPort, r.SidecarPort, r.Strategy = st.Port, st.AppPortName, st.AppPort, st.SidecarPort, st.Strategy
			r.LoadReports = LoadReports(cmp.Or(st.LoadReports, string(LoadReportsNone)))
		}
		return r, nil
	}
	switch v := ann[AnnotationInject]; v {
	case "", "true":
	case "false":
		return Result{Skipped: AnnotationInject + ` is "false"`}, nil
	default:
		return Result{}, &FieldError{"metadata.annotations[" + AnnotationInject + "]", fmt.Sprintf("%q is not true or false", v)}
	}
	forced := ann[AnnotationInject] == "true"
	if spec.HostNetwork && !forced {
		return Result{Skipped: "it uses hostNetwork (the sidecar would take the node's port); annotate " + AnnotationInject + `: "true" to inject anyway`}, nil
	}
	if mesh := meshProxy(meta, spec); mesh != "" && !forced {
		return Result{Skipped: "it already runs " + mesh + "'s proxy; use loadshed as its Envoy's external processor (README, Envoy / Istio), or annotate " + AnnotationInject + `: "true"`}, nil
	}
	if v, ok := ann[AnnotationStrategy]; ok {
		if !slices.Contains(strategies, v) {
			return Result{}, &FieldError{"metadata.annotations[" + AnnotationStrategy + "]", StrategyProblem(v, strategies)}
		}
		s.Strategy = v
	} else if !slices.Contains(strategies, s.Strategy) {
		return Result{}, &FieldError{"strategy", StrategyProblem(s.Strategy, strategies)}
	}
	if v, ok := ann[AnnotationPort]; ok {
		s.PortName = v
	}
	if v, ok := ann[AnnotationConfig]; ok {
		if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
			return Result{}, &FieldError{"metadata.annotations[" + AnnotationConfig + "]", fmt.Sprintf("%q is not a ConfigMap name: %s", v, strings.Join(errs, "; "))}
		}
		s.ConfigMap = v
	}
	if err := loadReports(ann, &s); err != nil {
		return Result{}, err
	}

	if drainHook(s) && s.DrainSeconds > MaxDrainSeconds {
		return Result{}, &FieldError{"drainSeconds", fmt.Sprintf("%d is more than the %d the sidecar's drain hook (GET /drain?delay=) accepts", s.DrainSeconds, MaxDrainSeconds)}
	}

	ci, pi, err := appPort(spec, s.PortName)
	if err != nil {
		return Result{}, err
	}
	app := &spec.Containers[ci]
	port := app.Ports[pi]
	used := usedPorts(spec)
	r := Result{Injected: true, PortName: port.Name, AppPort: port.ContainerPort, Strategy: s.Strategy, LoadReports: LoadReportsNone}
	r.AppPortName, err = renamed(port.Name, usedNames(spec))
	if err != nil {
		return Result{}, &FieldError{fmt.Sprintf("spec.containers[%d].ports[%d].name", ci, pi), err.Error()}
	}
	if n := portNames(spec); n[port.Name] > 1 || n[AdminPortName] > 0 {
		clash := port.Name
		if n[AdminPortName] > 0 {
			clash = AdminPortName
		}
		return Result{}, &FieldError{"spec.containers[*].ports", fmt.Sprintf("another port is named %q, which the sidecar's port needs; port names must be unique in a pod", clash)}
	}
	r.SidecarPort = freePort(s.Port, used)
	used[r.SidecarPort] = true
	admin := freePort(s.AdminPort, used)
	if r.SidecarPort != s.Port {
		r.Warnings = append(r.Warnings, fmt.Sprintf("port %d is in use in the pod; the sidecar listens on %d", s.Port, r.SidecarPort))
	}
	if s.ConfigMap != "" {
		r.ConfigMap = s.ConfigMap
	} else {
		if name == "" {
			return Result{}, &FieldError{"metadata.name", "empty: the generated ConfigMap is named after the workload"}
		}
		r.ConfigMap = ConfigMapName(name)
		r.Config = Config(s.Strategy, r.SidecarPort, admin, r.AppPort, drainFor(s)) + s.LoadReports.config()
		r.LoadReports = s.LoadReports
	}

	// A native sidecar's drain is a call from the application's preStop hook, which must
	// present the token the sidecar holds; a regular sidecar drains itself on SIGTERM and gets
	// none, which leaves its /drain closed.
	token := ""
	if s.Kube.Native() {
		token = s.DrainToken
		if token == "" {
			token = rand.Text()
		}
	}

	// From here on nothing fails: the template is changed only when the whole change is known.
	app.Ports[pi].Name = r.AppPortName
	renameProbePorts(app, port.Name, r.AppPortName)
	r.Warnings = append(r.Warnings, addPreStop(app, s, admin, token)...)
	sidecar := container(s, r.PortName, r.SidecarPort, admin)
	if token != "" {
		sidecar.Env = append(sidecar.Env, corev1.EnvVar{Name: config.DrainTokenEnv, Value: token})
	}
	if s.Kube.Native() {
		always := corev1.ContainerRestartPolicyAlways
		sidecar.RestartPolicy = &always
		sidecar.StartupProbe = &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString(AdminPortName)}},
			PeriodSeconds:    1,
			TimeoutSeconds:   1,
			FailureThreshold: 30,
		}
		spec.InitContainers = append(spec.InitContainers, sidecar)
	} else {
		spec.Containers = append(spec.Containers, sidecar)
	}
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: configVolume, VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: r.ConfigMap}},
	}})
	grace := terminationGrace(spec.TerminationGracePeriodSeconds, s)
	spec.TerminationGracePeriodSeconds = &grace
	if meta.Annotations == nil {
		meta.Annotations = map[string]string{}
	}
	st := status{Port: r.PortName, SidecarPort: r.SidecarPort, AppPortName: r.AppPortName, AppPort: r.AppPort, Strategy: r.Strategy}
	if r.LoadReports == LoadReportsORCA {
		st.LoadReports = string(r.LoadReports)
	}
	stJSON, _ := json.Marshal(st)
	meta.Annotations[AnnotationStatus] = string(stJSON)
	if _, ok := meta.Annotations["kubectl.kubernetes.io/default-container"]; !ok {
		meta.Annotations["kubectl.kubernetes.io/default-container"] = app.Name
	}
	return r, nil
}

// loadReports applies the pod's AnnotationLoadReports to s and checks the result: reports need
// a generated configuration (a ConfigMap says for itself) and a strategy with a capacity to
// report against (the proxy refuses loadReports.orca with strategy none).
func loadReports(ann map[string]string, s *Settings) error {
	field := "metadata.annotations[" + AnnotationLoadReports + "]"
	v, ok := ann[AnnotationLoadReports]
	if ok {
		l, err := ParseLoadReports(v)
		if err != nil {
			return &FieldError{field, err.Error()}
		}
		if s.ConfigMap != "" {
			return &FieldError{field, fmt.Sprintf("the sidecar reads its configuration from ConfigMap %s, which this annotation cannot change: set loadReports there", s.ConfigMap)}
		}
		s.LoadReports = l
	} else if _, err := ParseLoadReports(string(s.LoadReports)); err != nil {
		return &FieldError{"loadReports", err.Error()}
	}
	if s.LoadReports != LoadReportsORCA || s.ConfigMap != "" || s.Strategy != "none" {
		return nil
	}
	switch _, strategy := ann[AnnotationStrategy]; {
	case ok:
	case strategy:
		field = "metadata.annotations[" + AnnotationStrategy + "]"
	default:
		field = "loadReports"
	}
	return &FieldError{field, fmt.Sprintf("load reports (orca) need a strategy with a capacity to report against, and the strategy is none: choose another, or annotate %s: none", AnnotationLoadReports)}
}

// status is AnnotationStatus' value: what a later run (the Services' second step) needs to know.
type status struct {
	Port        string `json:"port"`
	SidecarPort int32  `json:"sidecarPort"`
	AppPortName string `json:"appPortName"`
	AppPort     int32  `json:"appPort"`
	Strategy    string `json:"strategy"`
	LoadReports string `json:"loadReports,omitempty"`
}

// ConfigMapName is the generated ConfigMap's name for a workload.
func ConfigMapName(workload string) string { return workload + "-loadshed" }

// Config is a generated sidecar configuration.
func Config(strategy string, port, admin, app int32, drainSeconds int64) string {
	return fmt.Sprintf(`listen: ":%d"
adminListen: ":%d"
upstream: "http://127.0.0.1:%d"
shutdown:
  drainDelay: %ds
admission:
  strategy: %s
`, port, admin, app, drainSeconds, strategy)
}

// drainFor is the sidecar's own drain delay: 0 as a native sidecar (it stops after the
// application, whose preStop hook was the drain), the drain delay as a regular container.
func drainFor(s Settings) int64 {
	if s.Kube.Native() {
		return 0
	}
	return s.DrainSeconds
}

// terminationGrace covers the application's drain and its own shutdown, then (native) the
// sidecar's grace period, which starts only after the application has exited; a regular
// sidecar drains and shuts down beside the application. It never lowers the pod's own value.
func terminationGrace(current *int64, s Settings) int64 {
	own := int64(defaultPodGrace)
	if current != nil {
		own = *current
	}
	var need int64
	if s.Kube.Native() {
		need = s.DrainSeconds + own + s.GraceSeconds
	} else {
		need = s.DrainSeconds + max(own, s.GraceSeconds)
	}
	return max(need, own)
}

// drainHook reports whether the application's preStop is the sidecar's drain hook.
func drainHook(s Settings) bool { return s.Kube.Native() && s.PreStop == PreStopAuto }

// drainPath is the sidecar's drain endpoint, on its admin port, for a drain of seconds.
func drainPath(seconds int64) string { return fmt.Sprintf("/drain?delay=%ds", seconds) }

// drainCall is the preStop hook that calls the sidecar's drain endpoint on its admin port with
// the pod's drain token.
func drainCall(seconds int64, admin int32, token string) *corev1.LifecycleHandler {
	return &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{
		Path:        drainPath(seconds),
		Port:        intstr.FromInt32(admin),
		HTTPHeaders: []corev1.HTTPHeader{{Name: "Authorization", Value: "Bearer " + token}},
	}}
}

// addPreStop gives the application its preStop hook (see PreStop); admin is the sidecar's admin
// port number (a port name in a hook would resolve against the application's own ports), token
// the sidecar's drain token. A hook the application already has is kept.
func addPreStop(app *corev1.Container, s Settings, admin int32, token string) []string {
	mode := s.PreStop
	if mode == PreStopNone {
		return nil
	}
	if mode == PreStopAuto && !s.Kube.Native() {
		mode = PreStopSleep
		if !s.Kube.atLeast(1, 30) {
			return []string{fmt.Sprintf("container %s: Kubernetes %s has no preStop sleep action, so the application gets no drain delay; --pre-stop exec adds `sleep %d` if its image has it", app.Name, s.Kube, s.DrainSeconds)}
		}
	}
	if app.Lifecycle != nil && app.Lifecycle.PreStop != nil {
		if own := app.Lifecycle.PreStop; mode == PreStopAuto && own.Sleep != nil && own.Exec == nil && own.HTTPGet == nil && own.TCPSocket == nil {
			// A sleep is a wait for the endpoints to update, which is what the drain hook does
			// too, for as long: it becomes the hook, so the sidecar closes its keep-alive
			// connections in the meantime.
			d := max(own.Sleep.Seconds, s.DrainSeconds)
			if d <= MaxDrainSeconds {
				app.Lifecycle.PreStop = drainCall(d, admin, token)
				return []string{fmt.Sprintf("container %s: its preStop sleep of %d s is now the sidecar's drain hook (GET %s on port %d), which waits as long and has the sidecar close its clients' keep-alive connections meanwhile", app.Name, own.Sleep.Seconds, drainPath(d), admin)}
			}
		}
		if mode == PreStopAuto {
			return []string{fmt.Sprintf("container %s already has a preStop hook; it is kept, so the sidecar does not drain before the application stops: it keeps clients' keep-alive connections open, and what they send after the application has exited fails. Remove the hook, or have it call http://127.0.0.1:%d%s first with the header \"Authorization: Bearer $%s\" (the sidecar's; it answers after the delay)", app.Name, admin, drainPath(s.DrainSeconds), config.DrainTokenEnv)}
		}
		return []string{fmt.Sprintf("container %s already has a preStop hook; it is kept, and should wait %d s for the endpoints to update", app.Name, s.DrainSeconds)}
	}
	if app.Lifecycle == nil {
		app.Lifecycle = &corev1.Lifecycle{}
	}
	switch mode {
	case PreStopAuto:
		app.Lifecycle.PreStop = drainCall(s.DrainSeconds, admin, token)
	case PreStopExec:
		app.Lifecycle.PreStop = &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sleep", strconv.FormatInt(s.DrainSeconds, 10)}}}
	default:
		app.Lifecycle.PreStop = &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: s.DrainSeconds}}
	}
	return nil
}

func container(s Settings, portName string, port, admin int32) corev1.Container {
	no, yes := false, true
	return corev1.Container{
		Name:  ContainerName,
		Image: s.Image,
		Args:  []string{"--config", configDir + "/config.yaml"},
		Ports: []corev1.ContainerPort{
			{Name: portName, ContainerPort: port, Protocol: corev1.ProtocolTCP},
			{Name: AdminPortName, ContainerPort: admin, Protocol: corev1.ProtocolTCP},
		},
		Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
		LivenessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString(AdminPortName)}},
			PeriodSeconds: 10, TimeoutSeconds: 2, FailureThreshold: 3,
		},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString(AdminPortName)}},
			PeriodSeconds: 2, TimeoutSeconds: 1, FailureThreshold: 1,
		},
		Resources:    s.Resources,
		VolumeMounts: []corev1.VolumeMount{{Name: configVolume, MountPath: configDir, ReadOnly: true}},
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: &no,
			ReadOnlyRootFilesystem:   &yes,
			RunAsNonRoot:             &yes,
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
}

// appPort finds the application's port: the one named name, or the pod's only named port.
func appPort(spec *corev1.PodSpec, name string) (int, int, error) {
	type at struct{ c, p int }
	var named []at
	for c := range spec.Containers {
		for p, port := range spec.Containers[c].Ports {
			if port.Name == "" || (name != "" && port.Name != name) {
				continue
			}
			if port.Protocol != "" && port.Protocol != corev1.ProtocolTCP {
				if name != "" {
					return 0, 0, &FieldError{fmt.Sprintf("spec.containers[%d].ports[%d].protocol", c, p), fmt.Sprintf("port %s is %s; the sidecar proxies TCP (HTTP and gRPC) only", name, port.Protocol)}
				}
				continue
			}
			named = append(named, at{c, p})
		}
	}
	switch {
	case len(named) == 1:
		return named[0].c, named[0].p, nil
	case name != "":
		return 0, 0, &FieldError{"spec.containers[*].ports", fmt.Sprintf("no TCP port is named %q; name the port the Service sends traffic to, or pick another with --port or the %s annotation", name, AnnotationPort)}
	case len(named) == 0:
		return 0, 0, &FieldError{"spec.containers[*].ports", fmt.Sprintf("no named TCP port to put the sidecar in front of; declare the application's port with a name, and pick it with --port or the %s annotation", AnnotationPort)}
	default:
		var names []string
		for _, a := range named {
			names = append(names, spec.Containers[a.c].Ports[a.p].Name)
		}
		return 0, 0, &FieldError{"spec.containers[*].ports", fmt.Sprintf("several named TCP ports (%s); pick one with --port or the %s annotation", strings.Join(names, ", "), AnnotationPort)}
	}
}

// renamed is the application port's new name: name with "-app", shortened to the 15 characters
// a port name may have, with a number where that name is taken.
func renamed(name string, taken map[string]bool) (string, error) {
	for i := 0; i < 100; i++ {
		suffix := appSuffix
		if i > 0 {
			suffix = fmt.Sprintf("-app%d", i)
		}
		base := name
		if n := maxPortName - len(suffix); len(base) > n {
			base = strings.TrimRight(base[:n], "-")
		}
		cand := base + suffix
		if !taken[cand] && len(validation.IsValidPortName(cand)) == 0 {
			return cand, nil
		}
	}
	return "", errors.New("no free name for the application's port")
}

func renameProbePorts(c *corev1.Container, from, to string) {
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		if p == nil {
			continue
		}
		if g := p.HTTPGet; g != nil && g.Port.Type == intstr.String && g.Port.StrVal == from {
			g.Port = intstr.FromString(to)
		}
		if t := p.TCPSocket; t != nil && t.Port.Type == intstr.String && t.Port.StrVal == from {
			t.Port = intstr.FromString(to)
		}
	}
	if l := c.Lifecycle; l != nil {
		for _, h := range []*corev1.LifecycleHandler{l.PostStart, l.PreStop} {
			if h != nil && h.HTTPGet != nil && h.HTTPGet.Port.Type == intstr.String && h.HTTPGet.Port.StrVal == from {
				h.HTTPGet.Port = intstr.FromString(to)
			}
		}
	}
}

// containers returns the pod's init and regular containers, in that order, as pointers into
// spec.
func containers(spec *corev1.PodSpec) []*corev1.Container {
	all := make([]*corev1.Container, 0, len(spec.InitContainers)+len(spec.Containers))
	for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range cs {
			all = append(all, &cs[i])
		}
	}
	return all
}

// sidecar returns the pod's loadshed container, or nil.
func sidecar(spec *corev1.PodSpec) *corev1.Container {
	for _, c := range containers(spec) {
		if c.Name == ContainerName {
			return c
		}
	}
	return nil
}

// meshProxy names the mesh whose proxy the pod already runs, or "".
func meshProxy(meta *metav1.ObjectMeta, spec *corev1.PodSpec) string {
	if _, ok := meta.Annotations["sidecar.istio.io/status"]; ok {
		return "Istio"
	}
	if _, ok := meta.Annotations["linkerd.io/proxy-version"]; ok {
		return "Linkerd"
	}
	for _, c := range containers(spec) {
		switch c.Name {
		case "istio-proxy":
			return "Istio"
		case "linkerd-proxy":
			return "Linkerd"
		}
	}
	return ""
}

func usedPorts(spec *corev1.PodSpec) map[int32]bool {
	used := map[int32]bool{}
	for _, c := range containers(spec) {
		for _, p := range c.Ports {
			used[p.ContainerPort] = true
		}
	}
	return used
}

// portNames counts the pod's port names.
func portNames(spec *corev1.PodSpec) map[string]int {
	names := map[string]int{}
	for _, c := range containers(spec) {
		for _, p := range c.Ports {
			if p.Name != "" {
				names[p.Name]++
			}
		}
	}
	return names
}

// usedNames are the names the application's renamed port may not take.
func usedNames(spec *corev1.PodSpec) map[string]bool {
	names := map[string]bool{AdminPortName: true}
	for n := range portNames(spec) {
		names[n] = true
	}
	return names
}

func freePort(p int32, used map[int32]bool) int32 {
	for used[p] && p < math.MaxUint16 {
		p++
	}
	return p
}

// StrategyProblem says why a generated configuration cannot run strategy name: it is unknown, or
// it needs settings sized for the service, which only the user's own ConfigMap can give.
func StrategyProblem(name string, allowed []string) string {
	if !slices.Contains(config.Strategies, name) {
		return fmt.Sprintf("unknown strategy %q (want one of %s)", name, strings.Join(allowed, ", "))
	}
	return fmt.Sprintf("strategy %q needs settings sized for the service, which a generated configuration cannot know "+
		"(want one of %s, or write your own ConfigMap and annotate %s)", name, strings.Join(allowed, ", "), AnnotationConfig)
}
