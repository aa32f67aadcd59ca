package cluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
)

// Kube talks to the cluster's API server (published on 127.0.0.1 by kind) for one namespace.
type Kube struct {
	CS kubernetes.Interface
	NS string
}

// NewKube builds a client from a kubeconfig file.
func NewKube(kubeconfig, namespace string) (*Kube, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Kube{CS: cs, NS: namespace}, nil
}

// WaitNodesReady waits until the API server answers and every node reports Ready.
func (k *Kube) WaitNodesReady(ctx context.Context) error {
	return Poll(ctx, time.Second, "nodes Ready", func(ctx context.Context) (bool, string, error) {
		nodes, err := k.CS.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error(), nil // the API server may still be starting
		}
		if len(nodes.Items) == 0 {
			return false, "no nodes yet", nil
		}
		for _, n := range nodes.Items {
			if !nodeReady(&n) {
				return false, "node " + n.Name + " not Ready", nil
			}
		}
		return true, "", nil
	})
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// CreateNamespace creates the test's namespace with the restricted Pod Security level
// enforced, so every pod of the test (the chart's, Prometheus, k6) must meet it.
func (k *Kube) CreateNamespace(ctx context.Context) error {
	return k.CreateNamespaceWith(ctx, nil)
}

// CreateNamespaceWith creates k's namespace, enforcing the restricted Pod Security Standard,
// with more labels.
func (k *Kube) CreateNamespaceWith(ctx context.Context, labels map[string]string) error {
	all := map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted",
		"pod-security.kubernetes.io/warn":    "restricted",
	}
	maps.Copy(all, labels)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: k.NS, Labels: all}}
	_, err := k.CS.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	return err
}

// In returns a client for another namespace on the same connection.
func (k *Kube) In(namespace string) *Kube { return &Kube{CS: k.CS, NS: namespace} }

var strictDecoder = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

// Decode splits a multi-document manifest and decodes every document strictly (unknown fields
// are errors) into the API's typed objects.
func Decode(manifest []byte) ([]runtime.Object, error) {
	rd := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	var objs []runtime.Object
	for {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, gvk, err := strictDecoder.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("decode manifest document %d: %w", len(objs)+1, err)
		}
		if gvk == nil {
			return nil, fmt.Errorf("manifest document %d has no kind", len(objs)+1)
		}
		objs = append(objs, obj)
	}
}

func stripComments(doc []byte) []byte {
	var out bytes.Buffer
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		out.WriteString(line + "\n")
	}
	return out.Bytes()
}

// Apply creates every object of the manifest in the namespace. Only the kinds the test's own
// manifests use are known.
func (k *Kube) Apply(ctx context.Context, manifest []byte) error {
	objs, err := Decode(manifest)
	if err != nil {
		return err
	}
	c := metav1.CreateOptions{FieldManager: "loadshed-e2e"}
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.ServiceAccount:
			_, err = k.CS.CoreV1().ServiceAccounts(k.NS).Create(ctx, o, c)
		case *corev1.ConfigMap:
			_, err = k.CS.CoreV1().ConfigMaps(k.NS).Create(ctx, o, c)
		case *corev1.Secret:
			_, err = k.CS.CoreV1().Secrets(k.NS).Create(ctx, o, c)
		case *corev1.Service:
			_, err = k.CS.CoreV1().Services(k.NS).Create(ctx, o, c)
		case *appsv1.Deployment:
			_, err = k.CS.AppsV1().Deployments(k.NS).Create(ctx, o, c)
		case *batchv1.Job:
			_, err = k.CS.BatchV1().Jobs(k.NS).Create(ctx, o, c)
		default:
			err = fmt.Errorf("the e2e does not apply %T", o)
		}
		if err != nil {
			return fmt.Errorf("create %s: %w", describe(o), err)
		}
	}
	return nil
}

func describe(o runtime.Object) string {
	m, err := metaOf(o)
	if err != nil {
		return fmt.Sprintf("%T", o)
	}
	return fmt.Sprintf("%T %s", o, m.GetName())
}

func metaOf(o runtime.Object) (metav1.Object, error) {
	m, ok := o.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no metadata", o)
	}
	return m, nil
}

// WaitRollout waits until the deployment's newest generation is fully rolled out: every
// replica updated and available and no old replica left (what `kubectl rollout status` waits
// for).
func (k *Kube) WaitRollout(ctx context.Context, namespace, name string) error {
	return Poll(ctx, time.Second, "rollout of deployment "+name, func(ctx context.Context) (bool, string, error) {
		d, err := k.CS.AppsV1().Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		done, reason, err := rolledOut(d)
		if done || err != nil {
			return done, reason, err
		}
		// A container that keeps crashing will not get better by waiting.
		if err := k.crashLooping(ctx, namespace, d); err != nil {
			return false, "", err
		}
		return false, reason, nil
	})
}

func (k *Kube) crashLooping(ctx context.Context, namespace string, d *appsv1.Deployment) error {
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return err
	}
	pods, err := k.CS.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil // transient; the rollout check will ask again
	}
	for _, p := range pods.Items {
		// A native sidecar (a restartable init container) reports among the init containers.
		for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
			w := cs.State.Waiting
			if w == nil || cs.RestartCount < 2 {
				continue
			}
			if w.Reason == "CrashLoopBackOff" || w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff" {
				last := ""
				if t := cs.LastTerminationState.Terminated; t != nil {
					last = fmt.Sprintf(" (last exit %d %s: %s)", t.ExitCode, t.Reason, t.Message)
				}
				return fmt.Errorf("pod %s container %s: %s after %d restarts%s", p.Name, cs.Name, w.Reason, cs.RestartCount, last)
			}
		}
	}
	return nil
}

func rolledOut(d *appsv1.Deployment) (bool, string, error) {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	for _, c := range s.Conditions {
		if c.Type == appsv1.DeploymentProgressing && c.Reason == "ProgressDeadlineExceeded" {
			return false, "", fmt.Errorf("deployment %s exceeded its progress deadline: %s", d.Name, c.Message)
		}
	}
	switch {
	case s.ObservedGeneration < d.Generation:
		return false, "generation not observed yet", nil
	case s.UpdatedReplicas < want:
		return false, fmt.Sprintf("%d of %d replicas updated", s.UpdatedReplicas, want), nil
	case s.Replicas > s.UpdatedReplicas:
		return false, fmt.Sprintf("%d old replicas pending termination", s.Replicas-s.UpdatedReplicas), nil
	case s.AvailableReplicas < s.UpdatedReplicas:
		return false, fmt.Sprintf("%d of %d updated replicas available", s.AvailableReplicas, s.UpdatedReplicas), nil
	}
	return true, "", nil
}

// RolloutRestart does what `kubectl rollout restart` does: it stamps the pod template with a
// restartedAt annotation, which rolls every pod.
func (k *Kube) RolloutRestart(ctx context.Context, name string) error {
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`,
		time.Now().Format(time.RFC3339))
	_, err := k.CS.AppsV1().Deployments(k.NS).Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "loadshed-e2e"})
	return err
}

// PodNames lists the names of the namespace's pods matching selector, terminating ones included.
func (k *Kube) PodNames(ctx context.Context, selector string) ([]string, error) {
	pods, err := k.CS.CoreV1().Pods(k.NS).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name)
	}
	sort.Strings(names)
	return names, nil
}

// WaitPodsGone waits until none of the named pods exists any more (their termination, the
// sidecar's drain included, is over).
func (k *Kube) WaitPodsGone(ctx context.Context, names []string) error {
	return Poll(ctx, time.Second, "pods "+strings.Join(names, ", ")+" to be gone", func(ctx context.Context) (bool, string, error) {
		for _, n := range names {
			_, err := k.CS.CoreV1().Pods(k.NS).Get(ctx, n, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return false, err.Error(), nil
			}
			return false, "pod " + n + " still exists", nil
		}
		return true, "", nil
	})
}

// WaitEndpoints waits until the service has exactly n ready endpoints.
func (k *Kube) WaitEndpoints(ctx context.Context, service string, n int) error {
	return Poll(ctx, time.Second, fmt.Sprintf("%d ready endpoints of service %s", n, service), func(ctx context.Context) (bool, string, error) {
		ready, _, err := k.ReadyEndpoints(ctx, service)
		if err != nil {
			return false, err.Error(), nil
		}
		return ready == n, fmt.Sprintf("%d ready endpoints", ready), nil
	})
}

// ReadyEndpoints counts the ready endpoints of a Service's EndpointSlices: in all, and by each
// port of the slice they are in.
func (k *Kube) ReadyEndpoints(ctx context.Context, service string) (int, map[int32]int, error) {
	slices, err := k.CS.DiscoveryV1().EndpointSlices(k.NS).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + service})
	if err != nil {
		return 0, nil, err
	}
	ready, byPort := 0, map[int32]int{}
	for _, s := range slices.Items {
		n := 0
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && *e.Conditions.Ready {
				n++
			}
		}
		ready += n
		for _, p := range s.Ports {
			if p.Port != nil {
				byPort[*p.Port] += n
			}
		}
	}
	return ready, byPort, nil
}

// ServiceAddress returns a Service's cluster IP and its ports.
func (k *Kube) ServiceAddress(ctx context.Context, service string) (string, []int32, error) {
	svc, err := k.CS.CoreV1().Services(k.NS).Get(ctx, service, metav1.GetOptions{})
	if err != nil {
		return "", nil, err
	}
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return "", nil, fmt.Errorf("service %s has no cluster IP", service)
	}
	ports := make([]int32, 0, len(svc.Spec.Ports))
	for _, p := range svc.Spec.Ports {
		ports = append(ports, p.Port)
	}
	return svc.Spec.ClusterIP, ports, nil
}

// ProxyGet sends GET path to a service's port through the API server's service proxy, so the
// test reaches in-cluster services through 127.0.0.1 only.
func (k *Kube) ProxyGet(ctx context.Context, service, port, path string, params map[string]string) ([]byte, error) {
	return k.CS.CoreV1().Services(k.NS).ProxyGet("http", service, port, path, params).DoRaw(ctx)
}

// Job is a finished Job's pod: its container's exit code and log, and when it ran.
type Job struct {
	Name, Pod         string
	ExitCode          int32
	Log               string
	Started, Finished time.Time
}

// StartJob creates the Job in manifest and returns its name.
func (k *Kube) StartJob(ctx context.Context, manifest []byte) (string, error) {
	objs, err := Decode(manifest)
	if err != nil {
		return "", err
	}
	if len(objs) != 1 {
		return "", fmt.Errorf("job manifest holds %d objects, want 1", len(objs))
	}
	job, ok := objs[0].(*batchv1.Job)
	if !ok {
		return "", fmt.Errorf("job manifest holds a %T", objs[0])
	}
	if _, err := k.CS.BatchV1().Jobs(k.NS).Create(ctx, job, metav1.CreateOptions{FieldManager: "loadshed-e2e"}); err != nil {
		return "", fmt.Errorf("create job %s: %w", job.Name, err)
	}
	return job.Name, nil
}

// JobPod returns the job's pod once it exists.
func (k *Kube) JobPod(ctx context.Context, job string) (*corev1.Pod, error) {
	pods, err := k.CS.CoreV1().Pods(k.NS).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job})
	if err != nil {
		return nil, err
	}
	if len(pods.Items) == 0 {
		return nil, nil
	}
	if len(pods.Items) > 1 {
		return nil, fmt.Errorf("job %s has %d pods; backoffLimit 0 should allow one", job, len(pods.Items))
	}
	return &pods.Items[0], nil
}

// WaitJobRunning waits until the job's container has started and returns when it did.
func (k *Kube) WaitJobRunning(ctx context.Context, job string) (time.Time, error) {
	var started time.Time
	err := Poll(ctx, 500*time.Millisecond, "job "+job+" to start", func(ctx context.Context) (bool, string, error) {
		p, err := k.JobPod(ctx, job)
		if err != nil || p == nil {
			return false, "no pod yet", err
		}
		for _, cs := range p.Status.ContainerStatuses {
			switch {
			case cs.State.Running != nil:
				started = cs.State.Running.StartedAt.Time
				return true, "", nil
			case cs.State.Terminated != nil:
				started = cs.State.Terminated.StartedAt.Time
				return true, "", nil
			case cs.State.Waiting != nil:
				if bad := cs.State.Waiting.Reason; bad == "ErrImagePull" || bad == "ImagePullBackOff" || bad == "ErrImageNeverPull" || bad == "CreateContainerConfigError" {
					return false, "", fmt.Errorf("pod %s: %s: %s", p.Name, bad, cs.State.Waiting.Message)
				}
				return false, "waiting: " + cs.State.Waiting.Reason, nil
			}
		}
		return false, "pod " + string(p.Status.Phase), nil
	})
	return started, err
}

// WaitJob waits until the job's only container has terminated, then returns its exit code and
// log. A non-zero exit is not an error here: k6 exits 99 when a threshold is crossed, and the
// caller judges the run from its summary.
func (k *Kube) WaitJob(ctx context.Context, job, container string) (*Job, error) {
	var res *Job
	err := Poll(ctx, time.Second, "job "+job+" to finish", func(ctx context.Context) (bool, string, error) {
		p, err := k.JobPod(ctx, job)
		if err != nil || p == nil {
			return false, "no pod yet", err
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name != container || cs.State.Terminated == nil {
				continue
			}
			t := cs.State.Terminated
			res = &Job{Name: job, Pod: p.Name, ExitCode: t.ExitCode, Started: t.StartedAt.Time, Finished: t.FinishedAt.Time}
			return true, "", nil
		}
		return false, "pod " + string(p.Status.Phase), nil
	})
	if err != nil {
		return nil, err
	}
	logs, err := k.CS.CoreV1().Pods(k.NS).GetLogs(res.Pod, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("logs of %s: %w", res.Pod, err)
	}
	res.Log = string(logs)
	return res, nil
}

// CPUSample is a container's cumulative CPU time as the kubelet reports it.
type CPUSample struct {
	At           time.Time
	CoreNanosecs uint64
}

// ContainerCPU reads the cumulative CPU time of each named container of pod from the kubelet's
// summary API (through the API server's node proxy; no metrics-server needed).
func (k *Kube) ContainerCPU(ctx context.Context, pod string) (map[string]CPUSample, error) {
	p, err := k.CS.CoreV1().Pods(k.NS).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	b, err := k.CS.CoreV1().RESTClient().Get().Resource("nodes").Name(p.Spec.NodeName).
		SubResource("proxy").Suffix("stats", "summary").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("kubelet stats of %s: %w", p.Spec.NodeName, err)
	}
	var sum struct {
		Pods []struct {
			PodRef struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"podRef"`
			Containers []struct {
				Name string `json:"name"`
				CPU  struct {
					Time                 time.Time `json:"time"`
					UsageCoreNanoSeconds uint64    `json:"usageCoreNanoSeconds"`
				} `json:"cpu"`
			} `json:"containers"`
		} `json:"pods"`
	}
	if err := json.Unmarshal(b, &sum); err != nil {
		return nil, fmt.Errorf("kubelet stats: %w", err)
	}
	out := map[string]CPUSample{}
	for _, ps := range sum.Pods {
		if ps.PodRef.Name != pod || ps.PodRef.Namespace != k.NS {
			continue
		}
		for _, c := range ps.Containers {
			out[c.Name] = CPUSample{At: c.CPU.Time, CoreNanosecs: c.CPU.UsageCoreNanoSeconds}
		}
	}
	return out, nil
}

// Cores returns the mean CPU cores used between two samples, or 0 when they do not span time.
func Cores(from, to CPUSample) float64 {
	dt := to.At.Sub(from.At)
	if dt <= 0 || to.CoreNanosecs < from.CoreNanosecs {
		return 0
	}
	return float64(to.CoreNanosecs-from.CoreNanosecs) / float64(dt.Nanoseconds())
}
