package main

import (
	"context"
	"log/slog"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

const (
	// reasonNotInjected is the reason of the Warning event about a pod left without the sidecar
	// by a problem in it that its owner must fix (an invalid annotation, no port to take over).
	reasonNotInjected = "LoadshedNotInjected"
	// eventComponent is the events' source, kubectl's "From".
	eventComponent = "loadshed-injector"
)

// startEvents starts client-go's event broadcaster, which writes core/v1 Events through client
// in the background, and returns its recorder and the function that stops it. Recording never
// blocks and never fails the caller: the broadcaster queues at most 1000 events and drops the
// rest; its correlator counts repeats of one event in a single Event, folds many similar ones
// together and rate-limits the events of each object; a write is retried (up to 12 times, 10 s
// apart) only while the API server is unreachable, and an error is logged to log.
func startEvents(client corev1client.EventsGetter, log *slog.Logger) (record.EventRecorder, func()) {
	logger := logr.FromSlogHandler(log.Handler())
	b := record.NewBroadcaster(record.WithContext(logr.NewContext(context.Background(), logger)))
	b.StartRecordingToSink(&corev1client.EventSinkImpl{Interface: client.Events("")})
	// The recorder is given object references only, so it needs no types in its scheme.
	rec := b.NewRecorder(runtime.NewScheme(), corev1.EventSource{Component: eventComponent}).WithLogger(logger)
	return rec, b.Shutdown
}

// eventTarget is the object an event about a pod under admission goes on: the pod's controller
// (its ReplicaSet, Job, StatefulSet, ...), where `kubectl describe` shows it; else the pod
// itself by name (it has no UID yet, so `kubectl describe pod` does not show it, but `kubectl
// events --for pod/NAME` does); else nil: a pod made from generateName has no name before it is
// stored, and without a controller there is nothing to name.
func eventTarget(namespace string, pod *corev1.Pod) *corev1.ObjectReference {
	if c := metav1.GetControllerOfNoCopy(pod); c != nil {
		return &corev1.ObjectReference{APIVersion: c.APIVersion, Kind: c.Kind, Namespace: namespace, Name: c.Name, UID: c.UID}
	}
	if pod.Name != "" {
		return &corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: namespace, Name: pod.Name}
	}
	return nil
}
