package inject

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/loadshed/loadshed/internal/config"
)

// podFrom builds a pod spec from fuzz bytes: up to three containers and an init container,
// ports from a small set of names and numbers (so they collide with the sidecar's defaults and
// with the names the injection picks), probes on names and numbers, hostNetwork.
func podFrom(data []byte) (*metav1.ObjectMeta, *corev1.PodSpec, string) {
	next := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	names := []string{"", "http", "http-app", "grpc", "web", "a-very-long-nam", "loadshed-admin", "metrics"}
	numbers := []int32{80, 8000, 8001, 8080, 9901, 9902, 50051}
	meta := &metav1.ObjectMeta{Name: "w", Annotations: map[string]string{}}
	spec := &corev1.PodSpec{HostNetwork: next()%8 == 0}
	if next()%4 == 0 {
		meta.Annotations[AnnotationInject] = "true"
	}
	for c := 0; c < 1+int(next()%3); c++ {
		ct := corev1.Container{Name: []string{"app", "side", "third"}[c], Image: "x"}
		for p := 0; p < int(next()%4); p++ {
			port := corev1.ContainerPort{Name: names[int(next())%len(names)], ContainerPort: numbers[int(next())%len(numbers)]}
			if next()%6 == 0 {
				port.Protocol = corev1.ProtocolUDP
			}
			ct.Ports = append(ct.Ports, port)
		}
		if b := next(); b%3 == 0 {
			ct.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromString(names[int(b/3)%len(names)])}}}
		} else if b%3 == 1 {
			ct.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(numbers[int(b/3)%len(numbers)])}}}
		}
		spec.Containers = append(spec.Containers, ct)
	}
	if next()%2 == 0 {
		spec.InitContainers = []corev1.Container{{Name: "init", Image: "x", Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: 8000}}}}
	}
	return meta, spec, names[int(next())%len(names)]
}

// FuzzPod: the injection never panics; a failure leaves the pod as it was; a success keeps
// container and port names unique and valid, the application's ports and probes intact (renamed
// where they named the port), adds exactly one sidecar on numbers no one else uses, gives only
// the application a preStop hook (with a native sidecar, the drain call to the sidecar's admin
// port by number), and a second injection changes nothing.
func FuzzPod(f *testing.F) {
	f.Add([]byte{1, 1, 0, 2, 1, 3, 0, 2, 1, 1, 1})
	f.Add([]byte{1, 1, 2, 2, 1, 1, 2, 3, 0, 0, 1, 0, 5})
	f.Add([]byte{0, 0, 1, 1, 1, 1, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		meta, spec, portName := podFrom(data)
		before, beforeMeta := spec.DeepCopy(), meta.DeepCopy()
		for _, native := range []Version{{1, 33}, {1, 29}} {
			spec, meta := before.DeepCopy(), beforeMeta.DeepCopy()
			res, err := Pod("w", meta, spec, Settings{PortName: portName, Kube: native}, config.Strategies)
			if err != nil || !res.Injected {
				if !reflect.DeepEqual(spec, before) {
					t.Fatalf("a pod left alone (err %v, skipped %q) was changed", err, res.Skipped)
				}
				continue
			}
			check(t, before, spec, res)
			checkPreStop(t, before, spec, res, native.Native())
			again, againMeta := spec.DeepCopy(), meta.DeepCopy()
			res2, err := Pod("w", againMeta, again, Settings{PortName: portName, Kube: native}, config.Strategies)
			if err != nil || res2.Injected || !reflect.DeepEqual(again, spec) || !reflect.DeepEqual(againMeta, meta) {
				t.Fatalf("a second injection changed the pod (err %v)", err)
			}
			if res2.AppPort != res.AppPort || res2.PortName != res.PortName {
				t.Fatalf("the status annotation does not give back the ports: %+v, want %+v", res2, res)
			}
		}
	})
}

func check(t *testing.T, before, after *corev1.PodSpec, res Result) {
	t.Helper()
	sidecars := 0
	seen := map[string]bool{}
	for _, c := range containers(after) {
		if seen[c.Name] {
			t.Fatalf("container name %s twice", c.Name)
		}
		seen[c.Name] = true
		if c.Name == ContainerName {
			sidecars++
		}
	}
	if sidecars != 1 {
		t.Fatalf("%d sidecars", sidecars)
	}
	sc := sidecar(after)
	others := map[int32]bool{}
	names := portNames(after)
	for _, c := range containers(after) {
		for _, p := range c.Ports {
			if c.Name != ContainerName {
				others[p.ContainerPort] = true
			}
		}
	}
	for _, p := range sc.Ports {
		if others[p.ContainerPort] {
			t.Fatalf("the sidecar's port %d is also another container's", p.ContainerPort)
		}
	}
	for n := range names {
		if errs := validation.IsValidPortName(n); len(errs) > 0 {
			t.Fatalf("port name %q: %v", n, errs)
		}
	}
	// The names the injection gives out are each the pod's only port of that name.
	final := portNames(after)
	for _, n := range []string{res.PortName, res.AppPortName, AdminPortName} {
		if final[n] != 1 {
			t.Fatalf("port name %q is on %d ports", n, final[n])
		}
	}
	// The application's containers: same ports (numbers and protocols), the one taken over
	// renamed, probes on its old name following it.
	for i, b := range before.Containers {
		a := after.Containers[i]
		if len(a.Ports) != len(b.Ports) {
			t.Fatalf("container %s: ports %v became %v", b.Name, b.Ports, a.Ports)
		}
		for j := range b.Ports {
			bp, ap := b.Ports[j], a.Ports[j]
			if bp.ContainerPort != ap.ContainerPort || bp.Protocol != ap.Protocol {
				t.Fatalf("container %s: port %v became %v", b.Name, bp, ap)
			}
			if bp.Name != ap.Name && !(bp.Name == res.PortName && ap.Name == res.AppPortName && ap.ContainerPort == res.AppPort) {
				t.Fatalf("container %s: port %v renamed to %q", b.Name, bp, ap.Name)
			}
		}
		if p := b.ReadinessProbe; p != nil {
			want := p.HTTPGet.Port
			if want.StrVal == res.PortName && a.Ports != nil && hasPort(a, res.AppPortName) {
				want = intstr.FromString(res.AppPortName)
			}
			if a.ReadinessProbe.HTTPGet.Port != want {
				t.Fatalf("container %s: probe port %v, want %v", b.Name, a.ReadinessProbe.HTTPGet.Port, want)
			}
		}
		if !reflect.DeepEqual(b.LivenessProbe, a.LivenessProbe) {
			t.Fatalf("container %s: a probe by number changed", b.Name)
		}
	}
}

func hasPort(c corev1.Container, name string) bool {
	for _, p := range c.Ports {
		if p.Name == name {
			return true
		}
	}
	return false
}

// checkPreStop: with a native sidecar, only the container whose port the sidecar took over gets
// a preStop hook, the drain call to the sidecar's admin port by number. (The regular sidecar is
// fuzzed on 1.29, which has no sleep action: no hook.)
func checkPreStop(t *testing.T, before, after *corev1.PodSpec, res Result, native bool) {
	t.Helper()
	var admin int32
	for _, p := range sidecar(after).Ports {
		if p.Name == AdminPortName {
			admin = p.ContainerPort
		}
	}
	for i, b := range before.Containers {
		a := after.Containers[i]
		if !native || !hasPort(a, res.AppPortName) {
			if !reflect.DeepEqual(a.Lifecycle, b.Lifecycle) {
				t.Fatalf("container %s: lifecycle %+v became %+v", b.Name, b.Lifecycle, a.Lifecycle)
			}
			continue
		}
		if a.Lifecycle == nil || a.Lifecycle.PreStop == nil {
			t.Fatalf("native sidecar: the application %s has no preStop hook", a.Name)
		}
		h := a.Lifecycle.PreStop
		if want := drainHookFor("/drain?delay=5s", admin, drainToken(t, sidecar(after))); !reflect.DeepEqual(h, want) {
			t.Fatalf("native sidecar: the application's preStop is %+v, want GET /drain?delay=5s on port %d with the sidecar's token", h, admin)
		}
	}
}
