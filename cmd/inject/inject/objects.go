package inject

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Options are Manifests' settings beyond the pod's.
type Options struct {
	Settings
	// Strategies are the names a configuration may use.
	Strategies []string
	// RewriteServices switches a Service that targets the taken-over port by number to its
	// name: the second step of the migration, once the injected pods run everywhere.
	RewriteServices bool
}

// Report is what Manifests did, one line per object it looked at, and the warnings.
type Report struct {
	Lines, Warnings []string
	// Injected counts the pod templates that got the sidecar.
	Injected int
}

// Manifests injects the sidecar into every workload of a multi-document YAML stream and returns
// the stream with the workloads changed, a generated ConfigMap before each workload that needs
// one, and everything else as it was. Nothing is returned when any object fails; the error
// names the object and the field.
func Manifests(in io.Reader, o Options) ([]byte, Report, error) {
	docs, err := split(in)
	if err != nil {
		return nil, Report{}, err
	}
	var (
		rep      Report
		errs     []error
		out      = make([][]byte, len(docs))
		before   = make([][]byte, len(docs))
		injected []workload
	)
	kinds := make([]metav1.TypeMeta, len(docs))
	for i, doc := range docs {
		out[i] = doc
		tm := &kinds[i]
		if err := yaml.Unmarshal(doc, tm); err != nil {
			errs = append(errs, fmt.Errorf("document %d: %w", i+1, err))
			continue
		}
		if !workloadKind(*tm) {
			continue
		}
		w, err := decodeWorkload(*tm, doc)
		if err != nil {
			var named struct {
				Metadata metav1.ObjectMeta `json:"metadata"`
			}
			_ = yaml.Unmarshal(doc, &named)
			errs = append(errs, fmt.Errorf("document %d (%s %s): %w", i+1, tm.Kind, qualified(named.Metadata.Namespace, named.Metadata.Name), err))
			continue
		}
		res, err := Pod(w.name(), w.meta, w.spec, o.Settings, o.Strategies)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", w.id(""), prefixed(w.templatePath, err)))
			continue
		}
		if !res.Injected {
			rep.Lines = append(rep.Lines, fmt.Sprintf("%s: unchanged, %s", w.id(""), res.Skipped))
			if res.AppPort != 0 {
				// Injected before: its Services may be due for the second step.
				w.res = res
				injected = append(injected, w)
			}
			continue
		}
		for _, warn := range res.Warnings {
			rep.Warnings = append(rep.Warnings, w.id("")+": "+warn)
		}
		if out[i], err = yaml.Marshal(w.obj); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", w.id(""), err))
			continue
		}
		if res.Config != "" {
			cm := corev1.ConfigMap{
				TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
				ObjectMeta: metav1.ObjectMeta{Name: res.ConfigMap, Namespace: w.namespace(), Labels: map[string]string{"app.kubernetes.io/managed-by": "loadshed-inject"}},
				Data:       map[string]string{"config.yaml": res.Config},
			}
			if before[i], err = yaml.Marshal(cm); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if (w.kind == "Job" || w.kind == "CronJob") && !o.Kube.Native() {
			rep.Warnings = append(rep.Warnings, w.id("")+": before Kubernetes 1.33 the sidecar is a regular container and keeps the Job's pods running after the application exits")
		}
		w.res, w.fresh = res, true
		injected = append(injected, w)
		rep.Injected++
		line := fmt.Sprintf("%s: injected: port %s is the sidecar's (%d), the application's %d is now %s; strategy %s", w.id(""), res.PortName, res.SidecarPort, res.AppPort, res.AppPortName, res.Strategy)
		if res.LoadReports == LoadReportsORCA {
			line += "; load reports orca"
		}
		rep.Lines = append(rep.Lines, line)
	}
	// Services last: they are judged against every workload of the stream, wherever it stands.
	for i, doc := range docs {
		if kinds[i] != (metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}) {
			continue
		}
		var svc corev1.Service
		if err := yaml.UnmarshalStrict(doc, &svc); err != nil {
			errs = append(errs, fmt.Errorf("document %d (Service): %w", i+1, err))
			continue
		}
		changed, lines := service(&svc, injected, o.RewriteServices)
		rep.Warnings = append(rep.Warnings, lines...)
		if changed {
			b, err := yaml.Marshal(svc)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			out[i] = b
		}
	}
	if len(errs) > 0 {
		return nil, rep, errors.Join(errs...)
	}
	var buf bytes.Buffer
	for i := range docs {
		for _, d := range [][]byte{before[i], out[i]} {
			if d == nil {
				continue
			}
			if buf.Len() > 0 {
				buf.WriteString("---\n")
			}
			buf.Write(d)
			if !bytes.HasSuffix(d, []byte("\n")) {
				buf.WriteByte('\n')
			}
		}
	}
	return buf.Bytes(), rep, nil
}

// service checks a Service against the injected workloads it selects. A port that targets the
// taken-over port by name reaches the sidecar as it is. One that targets it by number cannot be
// switched in one step: its endpoints would move to the sidecar's port on pods that have no
// sidecar yet. So the run that injects reports it, and rewrite switches it to the port's name
// only for workloads that came in injected (the second step, after their rollout).
func service(svc *corev1.Service, ws []workload, rewrite bool) (bool, []string) {
	if len(svc.Spec.Selector) == 0 {
		return false, nil
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	changed := false
	var lines []string
	for _, w := range ws {
		if svc.Namespace != w.namespace() || !sel.Matches(labels.Set(w.meta.Labels)) {
			continue
		}
		for i := range svc.Spec.Ports {
			p := &svc.Spec.Ports[i]
			byNumber := (p.TargetPort.Type == intstr.Int && p.TargetPort.IntVal == w.res.AppPort) ||
				(p.TargetPort.Type == intstr.Int && p.TargetPort.IntVal == 0 && p.Port == w.res.AppPort)
			if !byNumber {
				continue
			}
			id := fmt.Sprintf("Service %s port %d", qualified(svc.Namespace, svc.Name), p.Port)
			if rewrite && !w.fresh {
				p.TargetPort = intstr.FromString(w.res.PortName)
				changed = true
				lines = append(lines, fmt.Sprintf("%s: targetPort %d -> %q (the sidecar)", id, w.res.AppPort, w.res.PortName))
				continue
			}
			if rewrite {
				lines = append(lines, fmt.Sprintf("%s: not switched: %s had no sidecar in the input, and switching the Service in the same apply "+
					"would send traffic to pods that have no sidecar yet. Apply this output, wait for the rollout, then run inject --rewrite-services "+
					"on this output (the injected manifests) and apply that.", id, w.id("")))
				continue
			}
			lines = append(lines, fmt.Sprintf("%s targets %s's port by number (%d), which still reaches the application directly, past the sidecar. "+
				"Switching it now would send traffic to pods that have no sidecar yet, so do it in two steps: "+
				"1) apply this output and wait for the rollout; 2) run inject --rewrite-services on this output (the injected manifests) and apply that, "+
				"so the Service targets the port by its name %q, which is the sidecar's on every pod.", id, w.id(""), w.res.AppPort, w.res.PortName))
		}
	}
	return changed, lines
}

// workload is one object with a pod template.
type workload struct {
	obj          any
	kind         string
	top          *metav1.ObjectMeta
	meta         *metav1.ObjectMeta
	spec         *corev1.PodSpec
	templatePath string
	res          Result
	// fresh is true for a workload injected by this run, false for one that had the sidecar.
	fresh bool
}

func (w workload) name() string      { return w.top.Name }
func (w workload) namespace() string { return w.top.Namespace }

func (w workload) id(field string) string {
	s := w.kind + " " + qualified(w.top.Namespace, w.top.Name)
	if field != "" {
		s += " " + field
	}
	return s
}

func qualified(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

// prefixed turns a FieldError's pod-template path into the object's: spec.X and
// metadata.annotations are the template's, metadata.name the object's own.
func prefixed(templatePath string, err error) error {
	var fe *FieldError
	if !errors.As(err, &fe) {
		return err
	}
	f := *fe
	switch {
	case strings.HasPrefix(f.Field, "spec."):
		f.Field = templatePath + strings.TrimPrefix(f.Field, "spec")
	case strings.HasPrefix(f.Field, "metadata.annotations"):
		f.Field = strings.TrimSuffix(templatePath, "spec") + f.Field
	}
	return &f
}

func workloadKind(tm metav1.TypeMeta) bool {
	switch tm.APIVersion + "/" + tm.Kind {
	case "apps/v1/Deployment", "apps/v1/StatefulSet", "apps/v1/DaemonSet", "apps/v1/ReplicaSet",
		"batch/v1/Job", "batch/v1/CronJob", "v1/Pod":
		return true
	}
	return false
}

func decodeWorkload(tm metav1.TypeMeta, doc []byte) (workload, error) {
	w := workload{kind: tm.Kind, templatePath: "spec.template.spec"}
	switch tm.Kind {
	case "Deployment":
		return w, decodeAs(doc, &w, func(o *appsv1.Deployment) (*metav1.ObjectMeta, *corev1.PodTemplateSpec) {
			return &o.ObjectMeta, &o.Spec.Template
		})
	case "StatefulSet":
		return w, decodeAs(doc, &w, func(o *appsv1.StatefulSet) (*metav1.ObjectMeta, *corev1.PodTemplateSpec) {
			return &o.ObjectMeta, &o.Spec.Template
		})
	case "DaemonSet":
		return w, decodeAs(doc, &w, func(o *appsv1.DaemonSet) (*metav1.ObjectMeta, *corev1.PodTemplateSpec) {
			return &o.ObjectMeta, &o.Spec.Template
		})
	case "ReplicaSet":
		return w, decodeAs(doc, &w, func(o *appsv1.ReplicaSet) (*metav1.ObjectMeta, *corev1.PodTemplateSpec) {
			return &o.ObjectMeta, &o.Spec.Template
		})
	case "Job":
		return w, decodeAs(doc, &w, func(o *batchv1.Job) (*metav1.ObjectMeta, *corev1.PodTemplateSpec) {
			return &o.ObjectMeta, &o.Spec.Template
		})
	case "CronJob":
		w.templatePath = "spec.jobTemplate.spec.template.spec"
		return w, decodeAs(doc, &w, func(o *batchv1.CronJob) (*metav1.ObjectMeta, *corev1.PodTemplateSpec) {
			return &o.ObjectMeta, &o.Spec.JobTemplate.Spec.Template
		})
	}
	// A Pod is its own template.
	w.templatePath = "spec"
	var o corev1.Pod
	err := yaml.UnmarshalStrict(doc, &o)
	w.obj, w.top, w.meta, w.spec = &o, &o.ObjectMeta, &o.ObjectMeta, &o.Spec
	return w, err
}

// decodeAs decodes doc strictly as a T and points w at its metadata and pod template.
func decodeAs[T any](doc []byte, w *workload, parts func(*T) (*metav1.ObjectMeta, *corev1.PodTemplateSpec)) error {
	var o T
	err := yaml.UnmarshalStrict(doc, &o)
	top, tmpl := parts(&o)
	w.obj, w.top, w.meta, w.spec = &o, top, &tmpl.ObjectMeta, &tmpl.Spec
	return err
}

// split reads a multi-document YAML stream; documents with nothing but comments and blank
// lines are dropped.
func split(in io.Reader) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(in))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if err == io.EOF {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading YAML: %w", err)
		}
		if !blank(doc) {
			docs = append(docs, doc)
		}
	}
}

func blank(doc []byte) bool {
	for _, line := range strings.Split(string(doc), "\n") {
		t := strings.TrimSpace(line)
		if t != "" && t != "---" && !strings.HasPrefix(t, "#") {
			return false
		}
	}
	return true
}
