package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/loadshed/loadshed/cmd/inject/inject"
	"github.com/loadshed/loadshed/internal/config"
)

// appPod is a pod of a Deployment: one container serving on the named port http, with a
// readiness probe on it.
func appPod() *corev1.Pod {
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: "shop", Labels: map[string]string{"app": "shop"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:           "app",
			Image:          "registry.example/shop:1",
			Ports:          []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("http")}}},
		}}},
	}
}

func withAnnotations(p *corev1.Pod, kv ...string) *corev1.Pod {
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		p.Annotations[kv[i]] = kv[i+1]
	}
	return p
}

// reviewOf is the API server's AdmissionReview of creating obj.
func reviewOf(t testing.TB, obj any, op admissionv1.Operation, kind string) []byte {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return reviewRaw(t, raw, op, kind)
}

func reviewRaw(t testing.TB, raw []byte, op admissionv1.Operation, kind string) []byte {
	t.Helper()
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       types.UID("0d2f5a7e-1111-4c1e-9a51-7c3b3d9f0001"),
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: kind},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: strings.ToLower(kind) + "s"},
			Namespace: "shop",
			Operation: op,
			Object:    runtime.RawExtension{Raw: raw},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func testWebhook(t testing.TB, s inject.Settings) (*webhook, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	h, err := newWebhook(s.Defaults(), config.Strategies, slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	return h, reg
}

func post(h http.Handler, body []byte) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/mutate", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// answer posts a review and returns the response, failing unless it is an allowed answer to
// the review's UID.
func answer(t *testing.T, h http.Handler, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	w := post(h, body)
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatalf("response: %v\n%s", err, w.Body)
	}
	if out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" {
		t.Errorf("response is %s %s, want admission.k8s.io/v1 AdmissionReview", out.APIVersion, out.Kind)
	}
	if out.Response == nil || out.Response.UID != "0d2f5a7e-1111-4c1e-9a51-7c3b3d9f0001" {
		t.Fatalf("response does not answer the request's UID: %s", w.Body)
	}
	if !out.Response.Allowed {
		t.Fatalf("pod refused: %s", w.Body)
	}
	return out.Response
}

// patched applies the response's patch to raw with an independent JSON-patch implementation.
func patched(t *testing.T, raw []byte, resp *admissionv1.AdmissionResponse) []byte {
	t.Helper()
	if resp.Patch == nil {
		return raw
	}
	if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("patch type %v, want JSONPatch", resp.PatchType)
	}
	p, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatalf("patch does not decode: %v\n%s", err, resp.Patch)
	}
	out, err := p.Apply(raw)
	if err != nil {
		t.Fatalf("patch does not apply: %v\n%s", err, resp.Patch)
	}
	return out
}

func decodePod(t *testing.T, b []byte) *corev1.Pod {
	t.Helper()
	var p corev1.Pod
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

func sameJSON(t *testing.T, got, want any) {
	t.Helper()
	g, _ := json.MarshalIndent(got, "", "  ")
	w, _ := json.MarshalIndent(want, "", "  ")
	if !bytes.Equal(g, w) {
		t.Errorf("patched pod differs from inject.Pod's\n got: %s\nwant: %s", g, w)
	}
}

// TestPatchIsTheLibrarysInjection: the patch, applied to the pod the API server sent, gives
// exactly what inject.Pod makes of it, and leaves fields this build does not know alone.
func TestPatchIsTheLibrarysInjection(t *testing.T) {
	for _, kube := range []string{"1.33", "1.31"} {
		t.Run(kube, func(t *testing.T) {
			v, _ := inject.ParseVersion(kube)
			s := inject.Settings{ConfigMap: "shop-loadshed", Kube: v, DrainToken: pinnedToken} // random by default
			h, reg := testWebhook(t, s)
			pod := appPod()
			raw, _ := json.Marshal(pod)
			resp := answer(t, h, reviewRaw(t, raw, admissionv1.Create, "Pod"))
			if len(resp.Warnings) != 0 {
				t.Errorf("warnings: %q", resp.Warnings)
			}
			want := appPod()
			res, err := inject.Pod("shop", &want.ObjectMeta, &want.Spec, s, config.Strategies)
			if err != nil || !res.Injected {
				t.Fatalf("inject.Pod: %+v, %v", res, err)
			}
			sameJSON(t, decodePod(t, patched(t, raw, resp)), want)
			if got := testutil.ToFloat64(h.reviews.WithLabelValues(resultInjected)); got != 1 {
				t.Errorf("reviews{result=injected} = %v, want 1", got)
			}
			if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
				t.Errorf("metrics lint: %v %v", problems, err)
			}

			// A field a newer API server knows and this build does not survives the patch.
			var future map[string]any
			_ = json.Unmarshal(raw, &future)
			future["spec"].(map[string]any)["futureField"] = map[string]any{"x": 1.0}
			rawFuture, _ := json.Marshal(future)
			out := patched(t, rawFuture, answer(t, h, reviewRaw(t, rawFuture, admissionv1.Create, "Pod")))
			var got map[string]any
			_ = json.Unmarshal(out, &got)
			if got["spec"].(map[string]any)["futureField"] == nil {
				t.Errorf("spec.futureField lost: %s", out)
			}
		})
	}
}

// TestGeneratedConfigInAnnotation: with no ConfigMap named, the generated configuration goes
// into an annotation that a downward API volume shows to the sidecar (the webhook creates no
// ConfigMap).
func TestGeneratedConfigInAnnotation(t *testing.T) {
	h, _ := testWebhook(t, inject.Settings{})
	raw, _ := json.Marshal(withAnnotations(appPod(), inject.AnnotationStrategy, "inflight"))
	pod := decodePod(t, patched(t, raw, answer(t, h, reviewRaw(t, raw, admissionv1.Create, "Pod"))))
	cfg := pod.Annotations[annotationGeneratedConfig]
	if !strings.Contains(cfg, "strategy: inflight") || !strings.Contains(cfg, `upstream: "http://127.0.0.1:8080"`) {
		t.Errorf("generated config:\n%s", cfg)
	}
	var vol *corev1.Volume
	for i, v := range pod.Spec.Volumes {
		if v.DownwardAPI != nil {
			vol = &pod.Spec.Volumes[i]
		}
		if v.ConfigMap != nil {
			t.Errorf("volume %s names ConfigMap %s, which nobody creates", v.Name, v.ConfigMap.Name)
		}
	}
	if vol == nil || len(vol.DownwardAPI.Items) != 1 || vol.DownwardAPI.Items[0].Path != "config.yaml" ||
		vol.DownwardAPI.Items[0].FieldRef.FieldPath != "metadata.annotations['loadshed.dev/generated-config']" {
		t.Fatalf("no downward API volume with config.yaml: %+v", pod.Spec.Volumes)
	}
	if len(pod.Spec.InitContainers) != 1 || pod.Spec.InitContainers[0].VolumeMounts[0].Name != vol.Name {
		t.Errorf("the native sidecar does not mount %s: %+v", vol.Name, pod.Spec.InitContainers)
	}
}

// TestLoadReportsAnnotation: loadshed.dev/load-reports: orca turns the reports on in the pod's
// generated configuration, which the proxy accepts, and "none" turns off the settings' default.
func TestLoadReportsAnnotation(t *testing.T) {
	for _, tc := range []struct {
		name     string
		settings inject.Settings
		pod      *corev1.Pod
		want     bool
	}{
		{"annotation", inject.Settings{}, withAnnotations(appPod(), inject.AnnotationLoadReports, "orca"), true},
		{"settings", inject.Settings{LoadReports: inject.LoadReportsORCA}, appPod(), true},
		{"annotation turns the settings off", inject.Settings{LoadReports: inject.LoadReportsORCA}, withAnnotations(appPod(), inject.AnnotationLoadReports, "none"), false},
		{"neither", inject.Settings{}, appPod(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := testWebhook(t, tc.settings)
			raw, _ := json.Marshal(tc.pod)
			resp := answer(t, h, reviewRaw(t, raw, admissionv1.Create, "Pod"))
			pod := decodePod(t, patched(t, raw, resp))
			if sidecarOf(&pod.Spec) == nil {
				t.Fatalf("not injected: warnings %q", resp.Warnings)
			}
			data := pod.Annotations[annotationGeneratedConfig]
			cfg, err := config.Parse([]byte(data))
			if err != nil {
				t.Fatalf("the proxy refuses the generated config: %v\n%s", err, data)
			}
			if cfg.LoadReports.ORCA != tc.want {
				t.Errorf("loadReports %+v, want orca %v:\n%s", cfg.LoadReports, tc.want, data)
			}
		})
	}
}

// TestGenerateName: the pods of a ReplicaSet have no name at admission, only a prefix.
func TestGenerateName(t *testing.T) {
	h, _ := testWebhook(t, inject.Settings{})
	pod := appPod()
	pod.Name, pod.GenerateName = "", "shop-7d9f8c6b5-"
	raw, _ := json.Marshal(pod)
	resp := answer(t, h, reviewRaw(t, raw, admissionv1.Create, "Pod"))
	got := decodePod(t, patched(t, raw, resp))
	if sidecarOf(&got.Spec) == nil || got.Name != "" || got.GenerateName != "shop-7d9f8c6b5-" {
		t.Errorf("pod made from generateName: sidecar %v, name %q, generateName %q", sidecarOf(&got.Spec) != nil, got.Name, got.GenerateName)
	}
	if got.Annotations[annotationGeneratedConfig] == "" {
		t.Error("no generated configuration")
	}
}

// TestLeftAlone: pods the webhook admits without a patch.
func TestLeftAlone(t *testing.T) {
	injected := appPod()
	if _, err := inject.Pod("shop", &injected.ObjectMeta, &injected.Spec, inject.Settings{ConfigMap: "c"}, config.Strategies); err != nil {
		t.Fatal(err)
	}
	optOutLabel := appPod()
	optOutLabel.Labels[inject.AnnotationInject] = "false"
	svc := &corev1.Service{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}, ObjectMeta: metav1.ObjectMeta{Name: "shop"}}
	for _, tc := range []struct {
		name string
		body []byte
	}{
		{"opted out by annotation", reviewOf(t, withAnnotations(appPod(), inject.AnnotationInject, "false"), admissionv1.Create, "Pod")},
		{"opted out by label", reviewOf(t, optOutLabel, admissionv1.Create, "Pod")},
		{"already injected", reviewOf(t, injected, admissionv1.Create, "Pod")},
		{"an update", reviewOf(t, appPod(), admissionv1.Update, "Pod")},
		{"not a pod", reviewOf(t, svc, admissionv1.Create, "Service")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := testWebhook(t, inject.Settings{})
			resp := answer(t, h, tc.body)
			if resp.Patch != nil || len(resp.Warnings) != 0 {
				t.Errorf("patch %s, warnings %q; want neither", resp.Patch, resp.Warnings)
			}
			if got := testutil.ToFloat64(h.reviews.WithLabelValues(resultSkipped)); got != 1 {
				t.Errorf("reviews{result=skipped} = %v, want 1", got)
			}
		})
	}
}

// TestNotInjectedWithWarning: a pod the injection refuses or declines is admitted unchanged but
// for a status annotation, with a warning that names the annotation at fault.
func TestNotInjectedWithWarning(t *testing.T) {
	twoPorts := appPod()
	twoPorts.Spec.Containers[0].Ports = append(twoPorts.Spec.Containers[0].Ports, corev1.ContainerPort{Name: "grpc", ContainerPort: 9000})
	hostNet := appPod()
	hostNet.Spec.HostNetwork = true
	for _, tc := range []struct {
		name   string
		pod    *corev1.Pod
		result string
		want   string // in the warning and the status annotation
	}{
		{"unknown strategy", withAnnotations(appPod(), inject.AnnotationStrategy, "magic"), resultError, `metadata.annotations[loadshed.dev/strategy]: unknown strategy "magic"`},
		{"inject neither true nor false", withAnnotations(appPod(), inject.AnnotationInject, "yes"), resultError, `metadata.annotations[loadshed.dev/inject]: "yes" is not true or false`},
		{"bad ConfigMap name", withAnnotations(appPod(), inject.AnnotationConfig, "Not_A_Name"), resultError, `metadata.annotations[loadshed.dev/config]: "Not_A_Name" is not a ConfigMap name`},
		{"no such port", withAnnotations(appPod(), inject.AnnotationPort, "web"), resultError, `no TCP port is named "web"`},
		{"several ports", twoPorts, resultError, "several named TCP ports (http, grpc)"},
		{"load reports neither orca nor none", withAnnotations(appPod(), inject.AnnotationLoadReports, "orca,trusted-only"), resultError, `metadata.annotations[loadshed.dev/load-reports]: load reports "orca,trusted-only": want orca or none`},
		{"load reports with strategy none", withAnnotations(appPod(), inject.AnnotationLoadReports, "orca", inject.AnnotationStrategy, "none"), resultError, "metadata.annotations[loadshed.dev/load-reports]: load reports (orca) need a strategy"},
		{"host network", hostNet, resultSkipped, "it uses hostNetwork"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := testWebhook(t, inject.Settings{})
			raw, _ := json.Marshal(tc.pod)
			resp := answer(t, h, reviewRaw(t, raw, admissionv1.Create, "Pod"))
			if len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], tc.want) || !strings.HasPrefix(resp.Warnings[0], "loadshed: sidecar not injected: ") {
				t.Errorf("warnings %q, want one naming %q", resp.Warnings, tc.want)
			}
			got := decodePod(t, patched(t, raw, resp))
			var st webhookStatus
			if err := json.Unmarshal([]byte(got.Annotations[inject.AnnotationStatus]), &st); err != nil {
				t.Fatalf("status annotation %q: %v", got.Annotations[inject.AnnotationStatus], err)
			}
			if st.Injected || !strings.Contains(st.Error+st.Skipped, tc.want) {
				t.Errorf("status %+v, want one naming %q", st, tc.want)
			}
			delete(got.Annotations, inject.AnnotationStatus)
			sameJSON(t, got, tc.pod)
			if n := testutil.ToFloat64(h.reviews.WithLabelValues(tc.result)); n != 1 {
				t.Errorf("reviews{result=%s} = %v, want 1", tc.result, n)
			}
		})
	}
}

// TestMalformedReview: what is not a review gets a 4xx naming the problem, never a crash.
func TestMalformedReview(t *testing.T) {
	noUID := strings.Replace(string(reviewOf(t, appPod(), admissionv1.Create, "Pod")), `"uid":"0d2f5a7e-1111-4c1e-9a51-7c3b3d9f0001",`, "", 1)
	for _, tc := range []struct {
		name, method, contentType, body string
		code                            int
		want                            string
	}{
		{"not JSON", "POST", "application/json", "<xml/>", 400, "not an AdmissionReview"},
		{"empty", "POST", "application/json", "", 400, "not an AdmissionReview"},
		{"trailing garbage", "POST", "application/json", string(reviewOf(t, appPod(), admissionv1.Create, "Pod")) + "}", 400, "not an AdmissionReview"},
		{"no apiVersion", "POST", "application/json", `{"request":{"uid":"1"}}`, 400, "want admission.k8s.io/v1 AdmissionReview"},
		{"v1beta1", "POST", "application/json", `{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"1"}}`, 400, "want admission.k8s.io/v1"},
		{"no request", "POST", "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, 400, "no request"},
		{"no uid", "POST", "application/json", noUID, 400, "request.uid is empty"},
		{"wrong types", "POST", "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":7}}`, 400, "not an AdmissionReview"},
		{"too large", "POST", "application/json", `{"x":"` + strings.Repeat("a", maxReviewBytes) + `"}`, 413, "larger than"},
		{"GET", "GET", "", "", 405, "POST"},
		{"text", "POST", "text/plain", "{}", 415, "want application/json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := testWebhook(t, inject.Settings{})
			r := httptest.NewRequest(tc.method, "/mutate", strings.NewReader(tc.body))
			if tc.contentType != "" {
				r.Header.Set("Content-Type", tc.contentType)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.code || !strings.Contains(w.Body.String(), tc.want) {
				t.Errorf("%d %q, want %d naming %q", w.Code, w.Body, tc.code, tc.want)
			}
			if n := testutil.ToFloat64(h.reviews.WithLabelValues(resultError)); n != 1 {
				t.Errorf("reviews{result=error} = %v, want 1", n)
			}
		})
	}
}

// TestUndecodablePod: a review whose pod does not decode is answered, allowed, with a warning.
func TestUndecodablePod(t *testing.T) {
	h, _ := testWebhook(t, inject.Settings{})
	resp := answer(t, h, reviewRaw(t, []byte(`{"spec":{"containers":"no"}}`), admissionv1.Create, "Pod"))
	if resp.Patch != nil || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "does not decode") {
		t.Errorf("patch %s, warnings %q", resp.Patch, resp.Warnings)
	}
}

// pinnedToken is the drain token of tests that compare whole pods (random by default).
const pinnedToken = "pinned-drain-token-0123456789"

// TestDrainTokenPerPod: the webhook gives every pod it injects a drain token of its own, in the
// sidecar's environment and in the application's drain hook, so one pod's token opens no other
// pod's /drain.
func TestDrainTokenPerPod(t *testing.T) {
	h, _ := testWebhook(t, inject.Settings{Kube: inject.Version{Major: 1, Minor: 33}})
	seen := map[string]bool{}
	for range 5 {
		raw, _ := json.Marshal(appPod())
		pod := decodePod(t, patched(t, raw, answer(t, h, reviewRaw(t, raw, admissionv1.Create, "Pod"))))
		if len(pod.Spec.InitContainers) != 1 {
			t.Fatalf("want the native sidecar, got init containers %+v", pod.Spec.InitContainers)
		}
		var token string
		for _, e := range pod.Spec.InitContainers[0].Env {
			if e.Name == config.DrainTokenEnv {
				token = e.Value
			}
		}
		if len(token) < 16 || seen[token] {
			t.Fatalf("drain token %q: want a new one of at least 16 characters for every pod", token)
		}
		seen[token] = true
		hook := pod.Spec.Containers[0].Lifecycle.PreStop
		if hook == nil || hook.HTTPGet == nil || len(hook.HTTPGet.HTTPHeaders) != 1 ||
			hook.HTTPGet.HTTPHeaders[0] != (corev1.HTTPHeader{Name: "Authorization", Value: "Bearer " + token}) {
			t.Fatalf("drain hook %+v, want it to present the sidecar's token", hook)
		}
	}
}
