package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Dump writes what `kubectl get -o yaml`, `kubectl describe` and `kubectl logs` would show
// about the namespaces into dir: every pod, deployment, replica set and job as YAML, the
// events in time order, and the current and previous logs of every container.
func (k *Kube) Dump(ctx context.Context, dir string, namespaces ...string) error {
	var errs []error
	for _, ns := range namespaces {
		d := filepath.Join(dir, ns)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		errs = append(errs, k.dumpNamespace(ctx, d, ns))
	}
	return errors.Join(errs...)
}

func (k *Kube) dumpNamespace(ctx context.Context, dir, ns string) error {
	var errs []error
	write := func(name string, v any) {
		b, err := yaml.Marshal(v)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name), b, 0o644)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s/%s: %w", ns, name, err))
		}
	}
	// save writes what a List returned, or keeps the error of listing it.
	save := func(name string) func(any, error) {
		return func(l any, err error) {
			if err != nil {
				errs = append(errs, err)
				return
			}
			write(name, l)
		}
	}
	lo := metav1.ListOptions{}
	save("deployments.yaml")(k.CS.AppsV1().Deployments(ns).List(ctx, lo))
	save("replicasets.yaml")(k.CS.AppsV1().ReplicaSets(ns).List(ctx, lo))
	save("jobs.yaml")(k.CS.BatchV1().Jobs(ns).List(ctx, lo))
	save("services.yaml")(k.CS.CoreV1().Services(ns).List(ctx, lo))
	save("endpointslices.yaml")(k.CS.DiscoveryV1().EndpointSlices(ns).List(ctx, lo))
	if ev, err := k.CS.CoreV1().Events(ns).List(ctx, lo); err == nil {
		errs = append(errs, os.WriteFile(filepath.Join(dir, "events.txt"), []byte(formatEvents(ev.Items)), 0o644))
	} else {
		errs = append(errs, err)
	}
	pods, err := k.CS.CoreV1().Pods(ns).List(ctx, lo)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	write("pods.yaml", pods)
	for _, p := range pods.Items {
		errs = append(errs, os.WriteFile(filepath.Join(dir, p.Name+".describe.txt"), []byte(describePod(&p)), 0o644))
		for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
			for _, previous := range []bool{false, true} {
				b, err := k.CS.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name, Previous: previous}).DoRaw(ctx)
				if err != nil {
					continue // no previous instance, or not started: nothing to keep
				}
				name := p.Name + "." + c.Name + ".log"
				if previous {
					name = p.Name + "." + c.Name + ".previous.log"
				}
				errs = append(errs, os.WriteFile(filepath.Join(dir, name), b, 0o644))
			}
		}
	}
	return errors.Join(errs...)
}

func formatEvents(evs []corev1.Event) string {
	sort.Slice(evs, func(i, j int) bool { return eventTime(&evs[i]).Time.Before(eventTime(&evs[j]).Time) })
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "%s  %-7s %-22s %s/%s  %s (x%d)\n", eventTime(&e).UTC().Format("15:04:05"), e.Type, e.Reason,
			e.InvolvedObject.Kind, e.InvolvedObject.Name, strings.TrimSpace(e.Message), max(e.Count, 1))
	}
	return b.String()
}

func eventTime(e *corev1.Event) metav1.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp
	case !e.EventTime.IsZero():
		return metav1.Time{Time: e.EventTime.Time}
	default:
		return e.FirstTimestamp
	}
}

// describePod is a short `kubectl describe pod`: phase, conditions and container states.
func describePod(p *corev1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Pod %s/%s on %s: %s %s\n", p.Namespace, p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Reason)
	if p.DeletionTimestamp != nil {
		fmt.Fprintf(&b, "  terminating since %s\n", p.DeletionTimestamp.UTC().Format("15:04:05"))
	}
	for _, c := range p.Status.Conditions {
		fmt.Fprintf(&b, "  condition %s=%s %s %s\n", c.Type, c.Status, c.Reason, c.Message)
	}
	for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		fmt.Fprintf(&b, "  container %s image %s ready=%v restarts=%d\n", cs.Name, cs.Image, cs.Ready, cs.RestartCount)
		b.WriteString("    state: " + stateText(cs.State) + "\n")
		if cs.LastTerminationState.Terminated != nil {
			b.WriteString("    last:  " + stateText(cs.LastTerminationState) + "\n")
		}
	}
	return b.String()
}

func stateText(s corev1.ContainerState) string {
	switch {
	case s.Running != nil:
		return "running since " + s.Running.StartedAt.UTC().Format("15:04:05")
	case s.Waiting != nil:
		return "waiting: " + s.Waiting.Reason + " " + s.Waiting.Message
	case s.Terminated != nil:
		t := s.Terminated
		return fmt.Sprintf("terminated: exit %d %s %s (%s-%s)", t.ExitCode, t.Reason, t.Message,
			t.StartedAt.UTC().Format("15:04:05"), t.FinishedAt.UTC().Format("15:04:05"))
	}
	return "unknown"
}
