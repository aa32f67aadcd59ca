//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/loadshed/loadshed/bench/k6summary"
	"github.com/loadshed/loadshed/e2e/internal/cluster"
	"github.com/loadshed/loadshed/e2e/internal/criteria"
	"github.com/loadshed/loadshed/e2e/internal/results"
	"github.com/loadshed/loadshed/e2e/manifests"
)

// The injection rows (issue 14): a plain workload, with no loadshed in it, gets the sidecar
// from the injector's webhook in a labelled namespace, or from `inject` piped into
// `kubectl apply`; either is then overloaded and judged like the adaptive HTTP row. Before
// them, every golden output of cmd/inject's tests goes through a server-side dry run, so
// Kubernetes' own validation judges what the library writes.
const (
	injectorNS      = "loadshed-injector"
	injectorRelease = "loadshed-injector" // the chart's full name too
	webhookNS       = "loadshed-e2e-webhook"
	cliNS           = "loadshed-e2e-inject"
	injectApp       = "shop"
	// sidecarContainer is the injected container's name (inject.ContainerName).
	sidecarContainer = "loadshed"
	// sidecarPort is the injected sidecar's data port (inject.DefaultPort).
	sidecarPort = 8000
)

// buildInjection builds the inject and injector binaries on the host and the injector's image.
func (s *suite) buildInjection(ctx context.Context) error {
	dir := s.t.TempDir()
	for _, module := range []string{"cmd/inject", "cmd/injector"} {
		bins, err := cluster.GoBinaries(ctx, s.run, s.root, module, dir, ".")
		if err != nil {
			return err
		}
		switch module {
		case "cmd/inject":
			s.injectBin = bins["inject"]
		default:
			s.injectorBin = bins["injector"]
		}
	}
	var err error
	s.injectorImage, err = cluster.InjectorImage(ctx, s.run, s.root, s.injectorBin)
	return err
}

// injectImages are the images the injection rows load into the cluster.
func (s *suite) injectImages() []string {
	if s.inject == switchOff {
		return nil
	}
	return []string{s.injectorImage}
}

// kubectl runs the cluster's own kubectl inside the kind node (where it always exists) with
// stdin, and returns its standard output and error.
func (s *suite) kubectl(ctx context.Context, stdin []byte, args ...string) (string, string, error) {
	full := append([]string{"exec", "-i", s.cluster + "-control-plane", "kubectl", "--kubeconfig=/etc/kubernetes/admin.conf"}, args...)
	return s.run.Pipe(ctx, stdin, "docker", full...)
}

// injectCmd runs `inject` with args (files with -f) for the cluster's version and returns the
// manifests it writes and its report.
func (s *suite) injectCmd(ctx context.Context, args ...string) ([]byte, string, error) {
	full := append([]string{"--image", loadshedRef, "--kube-version", s.kubeVersion}, args...)
	out, report, err := s.run.Pipe(ctx, nil, s.injectBin, full...)
	return []byte(out), report, err
}

// injectionRows runs the dry runs, the webhook row and the inject row.
func (s *suite) injectionRows(ctx context.Context) error {
	v, err := s.kube.CS.Discovery().ServerVersion()
	if err != nil {
		return err
	}
	s.kubeVersion = v.GitVersion
	if err := s.phase("inject: server-side dry run of cmd/inject's golden outputs", func() error { return s.injectDryRun(ctx) }); err != nil {
		return err
	}
	if err := s.phase("inject: the webhook", func() error { return s.webhookRow(ctx) }); err != nil {
		return err
	}
	return s.phase("inject: inject | kubectl apply", func() error { return s.cliRow(ctx) })
}

// injectDryRun sends the golden outputs of cmd/inject's tests (every workload kind, named and
// numbered ports, the two-step Service switch, skipped pods, a server before native sidecars)
// through `kubectl apply --dry-run=server`: the API server's validation and defaulting judge
// each object the library writes, as the unit tests pin it.
func (s *suite) injectDryRun(ctx context.Context) error {
	files, err := filepath.Glob(filepath.Join(s.root, "cmd", "inject", "inject", "testdata", "*.golden"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no golden outputs in cmd/inject/inject/testdata (%v)", err)
	}
	// The testdata's own namespace; not restricted: its pods are the users' examples.
	if _, err := s.kube.CS.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "store"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		res, _, err := s.kubectl(ctx, b, "apply", "--dry-run=server", "-f", "-")
		if err != nil {
			return fmt.Errorf("server-side dry run of %s: %w", filepath.Base(f), err)
		}
		s.logf("dry run of %s: %d objects accepted", filepath.Base(f), strings.Count(res, "(server dry run)"))
	}
	return nil
}

// webhookRow installs the injector's chart, creates plain manifests in a labelled namespace and
// checks the pod got the sidecar, a pod in an unlabelled namespace did not, the sidecar sheds
// the Service's overload, and pods are still created with the injector scaled to 0.
func (s *suite) webhookRow(ctx context.Context) error {
	inj := s.kube.In(injectorNS)
	if err := inj.CreateNamespace(ctx); err != nil {
		return err
	}
	repo, tag, _ := strings.Cut(s.injectorImage, ":")
	lrepo, ltag, _ := strings.Cut(loadshedRef, ":")
	h := *s.helm
	h.Namespace, h.Chart = injectorNS, filepath.Join(s.root, "deploy", "helm", "loadshed-injector")
	err := h.Install(ctx, cluster.Release{Name: injectorRelease, Set: []string{
		"fullnameOverride=" + injectorRelease, "replicaCount=1",
		"image.repository=" + repo, "image.tag=" + tag,
		"injection.image.repository=" + lrepo, "injection.image.tag=" + ltag,
	}})
	if err != nil {
		return err
	}
	if err := inj.WaitEndpoints(ctx, injectorRelease, 1); err != nil {
		return err
	}

	var checks []criteria.Check
	add := func(name string, ok bool, format string, args ...any) {
		checks = append(checks, criteria.Check{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	labelled := s.kube.In(webhookNS)
	if err := labelled.CreateNamespaceWith(ctx, map[string]string{"loadshed.dev/inject": "enabled"}); err != nil {
		return err
	}
	// Ready endpoints are not enough: the API server calls the webhook through the Service's
	// cluster IP, which kube-proxy may not have programmed yet, and with failurePolicy Ignore a
	// call that fails admits the pod unchanged.
	if err := waitInjecting(ctx, labelled); err != nil {
		return err
	}
	pod, err := s.applyPlain(ctx, labelled, injectApp, "")
	if err != nil {
		return err
	}
	add("the webhook gave the pod the sidecar", hasSidecar(pod), "%s", describeSidecar(pod))
	add("as a native sidecar on this server", nativeSidecar(pod), "%s", describeSidecar(pod))

	// The same manifests in the test's own namespace, which carries no label.
	plain, err := s.applyPlain(ctx, s.kube, "shop-unlabelled", "")
	if err != nil {
		return err
	}
	add("a pod in an unlabelled namespace is untouched", !hasSidecar(plain), "%s", describeSidecar(plain))
	if err := s.deletePlain(ctx, s.kube, "shop-unlabelled"); err != nil {
		return err
	}

	o, err := s.measureInjected(ctx, criteria.InjectPrefix+"webhook", webhookNS)
	if err != nil {
		return err
	}

	// With the injector gone, failurePolicy Ignore admits pods unchanged.
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := inj.Scale(ctx, injectorRelease, 0); err != nil {
		return err
	}
	if err := inj.WaitEndpoints(wctx, injectorRelease, 0); err != nil {
		return err
	}
	before, err := labelled.PodNames(ctx, "app.kubernetes.io/name="+injectApp)
	if err != nil {
		return err
	}
	err = labelled.RolloutRestart(ctx, injectApp)
	if err == nil {
		err = labelled.WaitRollout(wctx, webhookNS, injectApp)
	}
	if err == nil {
		err = labelled.WaitPodsGone(wctx, before)
	}
	add("with the injector scaled to 0, pods are still created", err == nil, "rollout restart: %v", orOK(err))
	if err := h.Uninstall(context.WithoutCancel(ctx), injectorRelease); err != nil {
		return err
	}
	s.recordInjected(o, checks)
	// Its CPU goes to the next row.
	return s.kube.CS.CoreV1().Namespaces().Delete(ctx, webhookNS, metav1.DeleteOptions{})
}

// cliRow pipes plain manifests through `inject` into `kubectl apply` under steady load on the
// Service that targets the port by number (the documented two-step switch), overloads the
// Service that targets it by name, and restarts the Deployment under steady load.
func (s *suite) cliRow(ctx context.Context) error {
	k := s.kube.In(cliNS)
	if err := k.CreateNamespace(ctx); err != nil {
		return err
	}
	m, err := manifests.Render("plain-backend.yaml", manifests.PlainBackend{Name: injectApp, Namespace: cliNS, Image: loadshedRef})
	if err != nil {
		return err
	}
	file := filepath.Join(s.t.TempDir(), "app.yaml")
	if err := os.WriteFile(file, m, 0o644); err != nil {
		return err
	}
	if _, _, err := s.kubectl(ctx, m, "apply", "-f", "-"); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := k.WaitRollout(wctx, cliNS, injectApp); err != nil {
		return err
	}
	// The steady load below starts at once: a client that connects before kube-proxy has
	// routed the new Services can keep its connection to whatever answered instead.
	if err := s.waitRoutableIn(wctx, k, injectApp, injectApp+"-by-number"); err != nil {
		return err
	}

	// Step one rolls out the injected pods while the Service by number still reaches the
	// application directly; step two switches that Service to the sidecar's named port.
	byNumber := injectApp + "-by-number"
	err = s.steadyUnder(ctx, "two-step switch of a Service by number", cliNS, byNumber, func(ctx context.Context) ([]criteria.Check, error) {
		before, err := k.PodNames(ctx, "app.kubernetes.io/name="+injectApp)
		if err != nil {
			return nil, err
		}
		out, report, err := s.injectCmd(ctx, "-f", file)
		if err != nil {
			return nil, err
		}
		reported := criteria.Check{
			Name: "inject reported the Service by number", OK: strings.Contains(report, byNumber),
			Detail: fmt.Sprintf("report: %q", strings.TrimSpace(report)),
		}
		if _, _, err := s.kubectl(ctx, out, "apply", "-f", "-"); err != nil {
			return nil, err
		}
		if err := k.WaitRollout(ctx, cliNS, injectApp); err != nil {
			return nil, err
		}
		if err := k.WaitPodsGone(ctx, before); err != nil {
			return nil, err
		}
		// The second step rewrites the first step's output, as inject's report says.
		injected := filepath.Join(filepath.Dir(file), "app-injected.yaml")
		if err := os.WriteFile(injected, out, 0o644); err != nil {
			return nil, err
		}
		out, _, err = s.injectCmd(ctx, "--rewrite-services", "-f", injected)
		if err != nil {
			return nil, err
		}
		if _, _, err := s.kubectl(ctx, out, "apply", "-f", "-"); err != nil {
			return nil, err
		}
		return []criteria.Check{reported}, waitEndpointPort(ctx, k, byNumber, sidecarPort)
	})
	if err != nil {
		return err
	}

	pods, err := k.CS.CoreV1().Pods(cliNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + injectApp})
	if err != nil || len(pods.Items) != 1 {
		return fmt.Errorf("pods of %s: %d (%v)", injectApp, len(pods.Items), err)
	}
	pod := &pods.Items[0]
	o, err := s.measureInjected(ctx, criteria.InjectPrefix+"cli", cliNS)
	if err != nil {
		return err
	}
	s.recordInjected(o, []criteria.Check{
		{Name: "inject | kubectl apply gave the pod the sidecar", OK: hasSidecar(pod), Detail: describeSidecar(pod)},
		{Name: "as a native sidecar on this server", OK: nativeSidecar(pod), Detail: describeSidecar(pod)},
	})

	return s.steadyUnder(ctx, "rollout restart of an injected Deployment", cliNS, injectApp, func(ctx context.Context) ([]criteria.Check, error) {
		before, err := k.PodNames(ctx, "app.kubernetes.io/name="+injectApp)
		if err != nil {
			return nil, err
		}
		if err := k.RolloutRestart(ctx, injectApp); err != nil {
			return nil, err
		}
		if err := k.WaitRollout(ctx, cliNS, injectApp); err != nil {
			return nil, err
		}
		return nil, k.WaitPodsGone(ctx, before)
	})
}

// waitInjecting waits until a server-side dry run of the plain workload's pod in k's namespace
// comes back with the webhook's status annotation: the webhook is called and answers.
func waitInjecting(ctx context.Context, k *cluster.Kube) error {
	m, err := manifests.Render("plain-backend.yaml", manifests.PlainBackend{Name: "probe", Namespace: k.NS, Image: loadshedRef})
	if err != nil {
		return err
	}
	objs, err := cluster.Decode(m)
	if err != nil {
		return err
	}
	var pod *corev1.Pod
	for _, o := range objs {
		if d, ok := o.(*appsv1.Deployment); ok {
			pod = &corev1.Pod{ObjectMeta: d.Spec.Template.ObjectMeta, Spec: d.Spec.Template.Spec}
			pod.Name = "webhook-probe"
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return cluster.Poll(wctx, time.Second, "the webhook to answer", func(ctx context.Context) (bool, string, error) {
		got, err := k.CS.CoreV1().Pods(k.NS).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err.Error(), nil
		}
		_, ok := got.Annotations["loadshed.dev/status"]
		return ok, "a dry-run pod came back without the webhook's status annotation", nil
	})
}

// applyPlain creates the plain workload name in k's namespace, waits for its rollout and
// returns its pod. image "" is the loadshed image (the synthetic backend).
func (s *suite) applyPlain(ctx context.Context, k *cluster.Kube, name, image string) (*corev1.Pod, error) {
	if image == "" {
		image = loadshedRef
	}
	m, err := manifests.Render("plain-backend.yaml", manifests.PlainBackend{Name: name, Namespace: k.NS, Image: image})
	if err != nil {
		return nil, err
	}
	if err := k.Apply(ctx, m); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := k.WaitRollout(wctx, k.NS, name); err != nil {
		return nil, err
	}
	if err := s.waitRoutableIn(wctx, k, name, name+"-by-number"); err != nil {
		return nil, err
	}
	pods, err := k.CS.CoreV1().Pods(k.NS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + name})
	if err != nil {
		return nil, err
	}
	if len(pods.Items) != 1 {
		return nil, fmt.Errorf("%d pods of %s/%s, want 1", len(pods.Items), k.NS, name)
	}
	return &pods.Items[0], nil
}

// deletePlain removes what applyPlain created.
func (s *suite) deletePlain(ctx context.Context, k *cluster.Kube, name string) error {
	if err := k.CS.AppsV1().Deployments(k.NS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	for _, svc := range []string{name, name + "-by-number"} {
		if err := k.CS.CoreV1().Services(k.NS).Delete(ctx, svc, metav1.DeleteOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// measureInjected measures the injected workload's Service by name like a chart row: a quarter
// of capacity, then 3x; a run k6 could not keep to schedule, or one that missed only timed
// checks, is measured again, up to maxAttempts runs (again).
func (s *suite) measureInjected(ctx context.Context, name, ns string) (criteria.Outcome, error) {
	target := manifests.EnvVar{Name: "TARGET_URL", Value: fmt.Sprintf("http://%s.%s.svc.cluster.local/", injectApp, ns)}
	job := strings.ReplaceAll(name, "/", "-")
	o := criteria.Outcome{Strategy: name}
	var earlier []criteria.Earlier
	for attempt := 1; ; attempt++ {
		suffix := ""
		if attempt > 1 {
			suffix = fmt.Sprintf("-%d", attempt)
		}
		var err error
		o.Unloaded, _, err = s.k6(ctx, job+"-unloaded"+suffix, "", "smoke.js", unloadedK, s.unloaded, target, manifests.EnvVar{Name: "MIN_CHECKS", Value: "0"})
		if err != nil {
			return o, err
		}
		if _, err := s.startK6(ctx, job+"-overload"+suffix, "", "overload.js", overloadK, s.overload, "none", target); err != nil {
			return o, err
		}
		if o.Overload, _, err = s.finishK6(ctx, job+"-overload"+suffix, s.overload); err != nil {
			return o, err
		}
		o.Attempts, o.Earlier = attempt, earlier
		s.logf("%s overload: goodput %.1f rps, p99 %.1f ms, shed %.1f%%", name, o.Overload.GoodputRPS,
			k6summary.Value(o.Overload.AdmittedMs.P99), o.Overload.ShedShare*100)
		if attempt == maxAttempts {
			return o, nil
		}
		why := again(o, criteria.JudgeInjected, criteria.DefaultLimits(), &earlier)
		if why == "" {
			return o, nil
		}
		s.logf("%s: %s; measuring again", name, why)
	}
}

// recordInjected judges an injection row; it joins the results table after the chart's rows.
func (s *suite) recordInjected(o criteria.Outcome, extra []criteria.Check) {
	checks := append(criteria.JudgeInjected(o, criteria.DefaultLimits()), extra...)
	s.injected = append(s.injected, results.NewRow(o, checks))
	for _, c := range checks {
		if !c.OK {
			s.t.Errorf("%s: %s: %s", o.Strategy, c.Name, c.Detail)
		}
	}
}

// steadyUnder runs op while k6 sends half the capacity to svc in ns, and demands that nothing
// was lost to it (criteria.InjectedSteadyChecks), that the load outlasted op, and the checks op
// returns.
func (s *suite) steadyUnder(ctx context.Context, name, ns, svc string, op func(context.Context) ([]criteria.Check, error)) error {
	load := steadyLoad{
		job:    "inject-steady-" + fmt.Sprint(len(s.res.Steady)+1),
		target: []manifests.EnvVar{{Name: "TARGET_URL", Value: fmt.Sprintf("http://%s.%s.svc.cluster.local/", svc, ns)}},
		judge:  criteria.InjectedSteadyChecks,
	}
	checks, err := s.underSteadyLoad(ctx, name, load, op)
	if err != nil {
		return err
	}
	for _, c := range checks {
		if !c.OK {
			s.t.Errorf("%s: %s", c.Name, c.Detail)
		}
	}
	return nil
}

// waitEndpointPort waits until every ready endpoint of the Service is on port (the Service's
// switch to the sidecar reached its EndpointSlices).
func waitEndpointPort(ctx context.Context, k *cluster.Kube, svc string, port int32) error {
	return cluster.Poll(ctx, time.Second, fmt.Sprintf("endpoints of %s on port %d", svc, port), func(ctx context.Context) (bool, string, error) {
		ready, byPort, err := k.ReadyEndpoints(ctx, svc)
		if err != nil {
			return false, err.Error(), nil
		}
		return ready > 0 && byPort[port] == ready, fmt.Sprintf("%d ready endpoints, by port %v", ready, byPort), nil
	})
}

// hasSidecar says whether the pod runs loadshed's sidecar, as a container or a native sidecar.
func hasSidecar(p *corev1.Pod) bool {
	for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
		if c.Name == sidecarContainer {
			return true
		}
	}
	return false
}

// nativeSidecar says whether the sidecar is a restartable init container.
func nativeSidecar(p *corev1.Pod) bool {
	for _, c := range p.Spec.InitContainers {
		if c.Name == sidecarContainer && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			return true
		}
	}
	return false
}

func describeSidecar(p *corev1.Pod) string {
	var init, main []string
	for _, c := range p.Spec.InitContainers {
		init = append(init, c.Name)
	}
	for _, c := range p.Spec.Containers {
		main = append(main, c.Name)
	}
	return fmt.Sprintf("pod %s/%s: init containers %v, containers %v, loadshed.dev/status %q", p.Namespace, p.Name, init, main, p.Annotations["loadshed.dev/status"])
}
