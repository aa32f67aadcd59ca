package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	ktesting "k8s.io/client-go/testing"

	"github.com/loadshed/loadshed/cmd/inject/inject"
	"github.com/loadshed/loadshed/internal/config"
)

// eventsWebhook is a webhook that records its events on client, stopped when the test ends.
func eventsWebhook(t *testing.T, client *fake.Clientset) *webhook {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rec, stop := startEvents(client.CoreV1(), log)
	t.Cleanup(stop)
	h, err := newWebhook(inject.Settings{DrainToken: pinnedToken}.Defaults(), config.Strategies, log, prometheus.NewRegistry(), withEvents(rec))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// recordingWebhook is a webhook whose events go to a fake API server; created receives each
// Event created there, in the order the webhook recorded them.
func recordingWebhook(t *testing.T) (*webhook, <-chan *corev1.Event) {
	t.Helper()
	client := fake.NewClientset()
	created := make(chan *corev1.Event, 16)
	client.PrependReactor("create", "events", func(a ktesting.Action) (bool, runtime.Object, error) {
		created <- a.(ktesting.CreateAction).GetObject().(*corev1.Event)
		return false, nil, nil
	})
	return eventsWebhook(t, client), created
}

// nextEvent waits, at most 10 s, for the next Event created.
func nextEvent(t *testing.T, created <-chan *corev1.Event) *corev1.Event {
	t.Helper()
	select {
	case e := <-created:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no event created within 10 s")
		return nil
	}
}

// ofReplicaSet makes p a pod of ReplicaSet rs: created from generateName, rs its controller.
func ofReplicaSet(p *corev1.Pod, rs string) *corev1.Pod {
	yes := true
	p.Name, p.GenerateName = "", rs+"-"
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs, UID: types.UID(rs + "-uid"), Controller: &yes, BlockOwnerDeletion: &yes}}
	return p
}

// sentinel is the review of a pod whose event follows those of every review posted before it:
// the broadcaster writes events in order, so the next Event created being the sentinel's shows
// that the reviews before it recorded none.
func sentinel(t *testing.T) []byte {
	return reviewOf(t, ofReplicaSet(withAnnotations(appPod(), inject.AnnotationStrategy, "sentinel"), "sentinel"), admissionv1.Create, "Pod")
}

func expectSentinel(t *testing.T, created <-chan *corev1.Event) {
	t.Helper()
	if e := nextEvent(t, created); e.InvolvedObject.Name != "sentinel" {
		t.Errorf("unexpected event on %s %s: %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message)
	}
}

// TestEventOnOwner: a pod left without the sidecar by a problem in it gets one Warning event on
// its controller, or on itself when it has a name and no controller, naming the field at fault.
func TestEventOnOwner(t *testing.T) {
	named := withAnnotations(appPod(), inject.AnnotationPort, "web")
	notController := withAnnotations(appPod(), inject.AnnotationConfig, "Not_A_Name")
	notController.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "owner", UID: "cm-uid"}}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		on   corev1.ObjectReference
		want []string // in the message
	}{
		{
			"invalid annotation on a ReplicaSet's pod", ofReplicaSet(withAnnotations(appPod(), inject.AnnotationStrategy, "magic"), "shop-7d9f8c6b5"),
			corev1.ObjectReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Namespace: "shop", Name: "shop-7d9f8c6b5", UID: "shop-7d9f8c6b5-uid"},
			[]string{"pod shop-7d9f8c6b5-* created without the loadshed sidecar: ", `metadata.annotations[loadshed.dev/strategy]: unknown strategy "magic"`},
		},
		{
			"no such port on a named pod", named,
			corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: "shop", Name: "shop"},
			[]string{"pod shop created without the loadshed sidecar: ", `no TCP port is named "web"`},
		},
		{
			"an owner that is not the controller", notController,
			corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: "shop", Name: "shop"},
			[]string{`metadata.annotations[loadshed.dev/config]: "Not_A_Name" is not a ConfigMap name`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, created := recordingWebhook(t)
			answer(t, h, reviewOf(t, tc.pod, admissionv1.Create, "Pod"))
			e := nextEvent(t, created)
			if e.InvolvedObject != tc.on || e.Namespace != "shop" {
				t.Errorf("event in %q on %+v, want in shop on %+v", e.Namespace, e.InvolvedObject, tc.on)
			}
			if e.Type != corev1.EventTypeWarning || e.Reason != reasonNotInjected || e.Source.Component != eventComponent {
				t.Errorf("event type %q, reason %q, source %q; want Warning, %s, %s", e.Type, e.Reason, e.Source.Component, reasonNotInjected, eventComponent)
			}
			for _, w := range tc.want {
				if !strings.Contains(e.Message, w) {
					t.Errorf("message %q does not say %q", e.Message, w)
				}
			}
			answer(t, h, sentinel(t))
			expectSentinel(t, created) // and no second event for the pod
		})
	}
}

// TestNoEvent: opt-outs, deliberate skips and injections record no event, nor does a pod made
// from generateName without a controller (it has no name to record on); the answer is the one
// the webhook gives without events.
func TestNoEvent(t *testing.T) {
	noOwner := withAnnotations(appPod(), inject.AnnotationStrategy, "magic")
	noOwner.Name, noOwner.GenerateName = "", "shop-"
	hostNet := ofReplicaSet(appPod(), "net")
	hostNet.Spec.HostNetwork = true
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
	}{
		{"generateName without a controller", noOwner},
		{"opted out", withAnnotations(ofReplicaSet(appPod(), "out"), inject.AnnotationInject, "false")},
		{"host network", hostNet},
		{"injected", ofReplicaSet(appPod(), "shop")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, created := recordingWebhook(t)
			plain, _ := testWebhook(t, inject.Settings{DrainToken: pinnedToken}) // the same pod from both
			raw, _ := json.Marshal(tc.pod)
			review := reviewRaw(t, raw, admissionv1.Create, "Pod")
			sameAnswer(t, raw, answer(t, h, review), answer(t, plain, review))
			answer(t, h, sentinel(t))
			expectSentinel(t, created)
		})
	}
}

// TestEventsAPIDown: the answer never waits on the events API, and an events API that hangs
// and then fails changes nothing in it.
func TestEventsAPIDown(t *testing.T) {
	client := fake.NewClientset()
	called, release := make(chan struct{}, 1), make(chan struct{})
	client.PrependReactor("create", "events", func(ktesting.Action) (bool, runtime.Object, error) {
		select {
		case called <- struct{}{}:
		default:
		}
		<-release
		return true, nil, errors.New("connection refused")
	})
	h := eventsWebhook(t, client)
	t.Cleanup(func() { close(release) })
	plain, _ := testWebhook(t, inject.Settings{})

	raw, _ := json.Marshal(ofReplicaSet(withAnnotations(appPod(), inject.AnnotationStrategy, "magic"), "shop-7d9f8c6b5"))
	review := reviewRaw(t, raw, admissionv1.Create, "Pod")
	want := answer(t, plain, review)
	sameAnswer(t, raw, answer(t, h, review), want)
	select {
	case <-called:
	case <-time.After(10 * time.Second):
		t.Fatal("the event was not sent within 10 s")
	}
	// The events API now hangs on the first event; reviews are answered all the same.
	for range 3 {
		sameAnswer(t, raw, answer(t, h, review), want)
	}
	if n := testutil.ToFloat64(h.reviews.WithLabelValues(resultError)); n != 4 {
		t.Errorf("reviews{result=error} = %v, want 4", n)
	}
}

// sameAnswer fails unless got, the answer to creating pod raw, is want, the answer of a webhook
// without events: the same warnings, and a patch that makes the same pod of raw.
func sameAnswer(t *testing.T, raw []byte, got, want *admissionv1.AdmissionResponse) {
	t.Helper()
	if got.Allowed != want.Allowed || !slices.Equal(got.Warnings, want.Warnings) {
		t.Errorf("answer with events: allowed %v, warnings %q; without: %v, %q", got.Allowed, got.Warnings, want.Allowed, want.Warnings)
	}
	g, _ := json.Marshal(decodePod(t, patched(t, raw, got)))
	w, _ := json.Marshal(decodePod(t, patched(t, raw, want)))
	if !bytes.Equal(g, w) {
		t.Errorf("answer with events makes another pod than the one without\n got: %s\nwant: %s", g, w)
	}
}
