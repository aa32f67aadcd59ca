package main

import (
	"encoding/json"
	"net/http"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/loadshed/loadshed/cmd/inject/inject"
)

// FuzzReview: whatever body arrives, the webhook never panics; it answers 400 or 413, or 200
// with an allowed response to the request's UID whose patch applies to the pod it was sent.
func FuzzReview(f *testing.F) {
	gen := appPod()
	gen.Name, gen.GenerateName = "", "shop-"
	hostNet := appPod()
	hostNet.Spec.HostNetwork = true
	for _, p := range []*corev1.Pod{
		appPod(), gen, hostNet,
		withAnnotations(appPod(), inject.AnnotationStrategy, "magic"),
		withAnnotations(appPod(), inject.AnnotationInject, "false"),
		withAnnotations(appPod(), inject.AnnotationPort, "http", inject.AnnotationConfig, "mine"),
	} {
		f.Add(reviewOf(f, p, admissionv1.Create, "Pod"))
	}
	f.Add(reviewRaw(f, []byte(`{"metadata":{"annotations":{"loadshed.dev/inject":"true"}},"spec":{"hostNetwork":true,"containers":[{"name":"a","ports":[{"name":"h","containerPort":80}]}]}}`), admissionv1.Create, "Pod"))
	f.Add(reviewRaw(f, []byte(`null`), admissionv1.Create, "Pod"))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u"}}`))
	f.Add([]byte(`{`))

	h, _ := testWebhook(f, inject.Settings{})
	f.Fuzz(func(t *testing.T, body []byte) {
		w := post(h, body)
		switch w.Code {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			return
		case http.StatusOK:
		default:
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		var in, out admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &in); err != nil {
			t.Fatalf("answered a body that does not decode: %v", err)
		}
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
			t.Fatalf("response does not decode: %v", err)
		}
		if out.Response == nil || out.Response.UID != in.Request.UID || !out.Response.Allowed {
			t.Fatalf("response %+v to request %s", out.Response, in.Request.UID)
		}
		if out.Response.Patch == nil {
			return
		}
		p, err := jsonpatch.DecodePatch(out.Response.Patch)
		if err != nil {
			t.Fatalf("patch: %v", err)
		}
		// The patch was computed against the decoded pod; apply it to that.
		var pod corev1.Pod
		if err := json.Unmarshal(in.Request.Object.Raw, &pod); err != nil {
			t.Fatalf("patched a pod that does not decode: %v", err)
		}
		orig, _ := json.Marshal(&pod)
		res, err := p.Apply(orig)
		if err != nil {
			t.Fatalf("patch does not apply: %v\n%s", err, out.Response.Patch)
		}
		if err := json.Unmarshal(res, &pod); err != nil {
			t.Fatalf("patched pod does not decode: %v", err)
		}
	})
}
