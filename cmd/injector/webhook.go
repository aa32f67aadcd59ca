package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/loadshed/loadshed/cmd/inject/inject"
)

const (
	// maxReviewBytes bounds a review's body: the API server stores objects of up to 1.5 MiB,
	// and a pod's CREATE review carries one.
	maxReviewBytes = 4 << 20
	// annotationGeneratedConfig holds a generated sidecar configuration, shown to the sidecar
	// as its config.yaml by a downward API volume.
	annotationGeneratedConfig = "loadshed.dev/generated-config"
	// maxWarning keeps one admission warning short enough for kubectl to print whole.
	maxWarning = 400
	// maxEventMessage bounds an event's message, like the 1 KiB note of an events.k8s.io Event
	// (the core/v1 Events the recorder writes have no limit of their own).
	maxEventMessage = 1000
)

// Review outcomes, the result label of loadshed_injector_reviews_total.
const (
	resultInjected = "injected"
	resultSkipped  = "skipped"
	resultError    = "error"
)

// webhook answers the API server's AdmissionReviews for pods: it injects the sidecar with the
// inject library and answers with a JSON patch. It never refuses a pod: one it cannot inject is
// admitted as it is, with a warning and a status annotation saying why, and, withEvents, a
// Warning event on its owner.
type webhook struct {
	settings   inject.Settings
	strategies []string
	log        *slog.Logger
	reviews    *prometheus.CounterVec
	events     record.EventRecorder // nil: none
}

// webhookOption sets one of the webhook's optional collaborators.
type webhookOption func(*webhook)

// withEvents records through rec a Warning event about each pod left without the sidecar by a
// problem in it (not one that opted out), on the object eventTarget names.
func withEvents(rec record.EventRecorder) webhookOption {
	return func(h *webhook) { h.events = rec }
}

func newWebhook(s inject.Settings, strategies []string, log *slog.Logger, reg prometheus.Registerer, opts ...webhookOption) (*webhook, error) {
	h := &webhook{
		settings:   s,
		strategies: strategies,
		log:        log,
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loadshed_injector_reviews_total",
			Help: "Admission reviews answered, by result: injected (the pod got the sidecar), skipped (left alone: opted out, already injected, not a pod creation, or the injection declined it) or error (a malformed review, or a pod the injection refused; admitted unchanged).",
		}, []string{"result"}),
	}
	for _, o := range opts {
		o(h)
	}
	if err := reg.Register(h.reviews); err != nil {
		return nil, err
	}
	for _, r := range []string{resultInjected, resultSkipped, resultError} {
		h.reviews.WithLabelValues(r)
	}
	return h, nil
}

func (h *webhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		h.fail(w, http.StatusMethodNotAllowed, "POST an admission.k8s.io/v1 AdmissionReview")
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			h.fail(w, http.StatusUnsupportedMediaType, fmt.Sprintf("content type %q: want application/json", ct))
			return
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxReviewBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			h.fail(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("review larger than %d bytes", maxReviewBytes))
			return
		}
		h.fail(w, http.StatusBadRequest, "reading the review: "+err.Error())
		return
	}
	review, err := decodeReview(body)
	if err != nil {
		h.fail(w, http.StatusBadRequest, err.Error())
		return
	}
	resp, result, reason := h.review(review.Request)
	h.reviews.WithLabelValues(result).Inc()
	req := review.Request
	h.log.Info("review", "uid", req.UID, "namespace", req.Namespace, "pod", podID(req), "result", result, "reason", reason)

	out, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp})
	if err != nil {
		h.fail(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// fail answers a request that carries no review to answer.
func (h *webhook) fail(w http.ResponseWriter, code int, msg string) {
	h.reviews.WithLabelValues(resultError).Inc()
	h.log.Warn("bad review", "status", code, "err", msg)
	http.Error(w, msg, code)
}

// decodeReview reads an admission.k8s.io/v1 AdmissionReview that carries a request.
func decodeReview(body []byte) (*admissionv1.AdmissionReview, error) {
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		return nil, fmt.Errorf("not an AdmissionReview: %v", err)
	}
	if review.APIVersion != "admission.k8s.io/v1" || review.Kind != "AdmissionReview" {
		return nil, fmt.Errorf("apiVersion %q, kind %q: want admission.k8s.io/v1 AdmissionReview", review.APIVersion, review.Kind)
	}
	if review.Request == nil {
		return nil, errors.New("the review has no request")
	}
	if review.Request.UID == "" {
		return nil, errors.New("request.uid is empty")
	}
	return &review, nil
}

// review answers one request: always allowed, patched when the sidecar was injected or a
// status annotation says why not. It returns the result label and a reason for the log.
func (h *webhook) review(req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, string, string) {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Kind.Group != "" || req.Kind.Kind != "Pod" || req.Operation != admissionv1.Create || req.SubResource != "" {
		return resp, resultSkipped, fmt.Sprintf("not a pod creation (%s %s %s)", req.Operation, req.Kind.Kind, req.SubResource)
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		resp.Warnings = warnings("sidecar not injected: the pod does not decode: " + err.Error())
		return resp, resultError, err.Error()
	}
	switch {
	case pod.Labels[inject.AnnotationInject] == "false":
		return resp, resultSkipped, "label " + inject.AnnotationInject + ` is "false"`
	case pod.Annotations[inject.AnnotationInject] == "false":
		return resp, resultSkipped, "annotation " + inject.AnnotationInject + ` is "false"`
	case sidecarOf(&pod.Spec) != nil:
		return resp, resultSkipped, "it already has the sidecar"
	}

	mutated := pod.DeepCopy()
	res, err := inject.Pod(workloadName(&pod), &mutated.ObjectMeta, &mutated.Spec, h.settings, h.strategies)
	if err == nil && res.Injected && res.Config != "" {
		err = configFromAnnotation(&mutated.ObjectMeta, &mutated.Spec, res)
	}
	var result, reason string
	switch {
	case err != nil:
		// Admitted as it was, with a warning and the reason on the pod.
		mutated = pod.DeepCopy()
		setStatus(&mutated.ObjectMeta, webhookStatus{Injected: false, Error: err.Error()})
		resp.Warnings = warnings("sidecar not injected: " + err.Error())
		result, reason = resultError, err.Error()
		h.eventNotInjected(req, &pod, err.Error())
	case !res.Injected:
		setStatus(&mutated.ObjectMeta, webhookStatus{Injected: false, Skipped: res.Skipped})
		resp.Warnings = warnings("sidecar not injected: " + res.Skipped)
		result, reason = resultSkipped, res.Skipped
	default:
		resp.Warnings = warnings(res.Warnings...)
		result, reason = resultInjected, fmt.Sprintf("port %s: sidecar on %d, application on %d as %s, strategy %s", res.PortName, res.SidecarPort, res.AppPort, res.AppPortName, res.Strategy)
	}
	patch, err := diffPatch(&pod, mutated)
	if err != nil {
		// Not expected (both documents come from json.Marshal); the pod is admitted as it was.
		resp.Warnings = warnings("sidecar not injected: " + err.Error())
		return resp, resultError, err.Error()
	}
	if patch != nil {
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = patch, &pt
	}
	return resp, result, reason
}

// eventNotInjected records the Warning event about a pod left without the sidecar by a problem
// in it, when the webhook has a recorder and the pod a target (eventTarget). The recorder only
// queues the event: the review never waits on the events API.
func (h *webhook) eventNotInjected(req *admissionv1.AdmissionRequest, pod *corev1.Pod, why string) {
	if h.events == nil {
		return
	}
	if target := eventTarget(req.Namespace, pod); target != nil {
		h.events.Event(target, corev1.EventTypeWarning, reasonNotInjected, shorten("pod "+podID(req)+" created without the loadshed sidecar: "+why, maxEventMessage))
	}
}

// webhookStatus is the status annotation of a pod the webhook left without the sidecar (an
// injected pod gets the library's own).
type webhookStatus struct {
	Injected bool   `json:"injected"`
	Skipped  string `json:"skipped,omitempty"`
	Error    string `json:"error,omitempty"`
}

func setStatus(meta *metav1.ObjectMeta, st webhookStatus) {
	b, _ := json.Marshal(st)
	if meta.Annotations == nil {
		meta.Annotations = map[string]string{}
	}
	meta.Annotations[inject.AnnotationStatus] = string(b)
}

// diffPatch is the JSON patch that turns the pod into the mutated one, nil when they are the
// same. Both go through the same types, so fields this build does not know (a newer API server's)
// appear in neither and the patch leaves them alone.
func diffPatch(pod, mutated *corev1.Pod) ([]byte, error) {
	a, err := json.Marshal(pod)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(mutated)
	if err != nil {
		return nil, err
	}
	ops, err := jsonpatch.CreatePatch(a, b)
	if err != nil || len(ops) == 0 {
		return nil, err
	}
	return json.Marshal(ops)
}

// configFromAnnotation moves a generated configuration into the pod itself. The webhook creates
// no ConfigMap (it has no side effects, and needs no rights in the pods' namespaces), so the
// configuration goes into an annotation and the sidecar's ConfigMap volume becomes a downward API
// volume that shows the annotation as config.yaml.
func configFromAnnotation(meta *metav1.ObjectMeta, spec *corev1.PodSpec, res inject.Result) error {
	mounted := map[string]bool{}
	if c := sidecarOf(spec); c != nil {
		for _, m := range c.VolumeMounts {
			mounted[m.Name] = true
		}
	}
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		if v.ConfigMap == nil || v.ConfigMap.Name != res.ConfigMap || !mounted[v.Name] {
			continue
		}
		v.VolumeSource = corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
			Items: []corev1.DownwardAPIVolumeFile{{
				Path:     "config.yaml",
				FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['" + annotationGeneratedConfig + "']"},
			}},
		}}
		meta.Annotations[annotationGeneratedConfig] = res.Config
		return nil
	}
	return fmt.Errorf("the sidecar mounts no volume of ConfigMap %s", res.ConfigMap)
}

// sidecarOf returns the pod's loadshed container (native or regular), or nil.
func sidecarOf(spec *corev1.PodSpec) *corev1.Container {
	for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range cs {
			if cs[i].Name == inject.ContainerName {
				return &cs[i]
			}
		}
	}
	return nil
}

// workloadName names the pod for the injection: its name, or for a pod made from generateName
// (every pod of a ReplicaSet, Job, StatefulSet's are named), which has no name yet at
// admission, the prefix.
func workloadName(pod *corev1.Pod) string {
	if pod.Name != "" {
		return pod.Name
	}
	if n := strings.TrimRight(pod.GenerateName, "-."); n != "" {
		return n
	}
	return "pod"
}

// podID names the request's pod for the log: its name, or its generateName prefix with "*".
func podID(req *admissionv1.AdmissionRequest) string {
	if req.Name != "" {
		return req.Name
	}
	var m struct {
		Metadata struct {
			Name, GenerateName string
		}
	}
	_ = json.Unmarshal(req.Object.Raw, &m)
	if m.Metadata.Name != "" {
		return m.Metadata.Name
	}
	return m.Metadata.GenerateName + "*"
}

// warnings prefixes each message with "loadshed: " and shortens long ones.
func warnings(msgs ...string) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, shorten("loadshed: "+m, maxWarning))
	}
	return out
}

// shorten cuts s to n runes, the last one "…" when it was cut.
func shorten(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
