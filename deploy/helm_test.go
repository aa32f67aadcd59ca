package deploy_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const chartDir = "helm/loadshed"

// helmBinary returns the helm to test with: $HELM, else (outside CI) the one
// scripts/install-helm.sh leaves in the tool cache or one on PATH.
func helmBinary(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("HELM is not set; CI must set HELM=$(scripts/install-helm.sh)")
	}
	cache := os.Getenv("LOADSHED_CACHE")
	if cache == "" {
		if home, err := os.UserHomeDir(); err == nil {
			cache = filepath.Join(home, ".cache", "loadshed")
		}
	}
	if cache != "" {
		if p := filepath.Join(cache, "bin", "helm"); fileExists(p) {
			return p
		}
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	t.Skip("no helm: set HELM=$(scripts/install-helm.sh) to run the chart tests")
	return ""
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// helmRun runs helm with args and returns stdout, or an error holding stderr.
func helmRun(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start helm: %v", err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return stdout.Bytes(), fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return stdout.Bytes(), nil
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("helm %s did not finish within 2 minutes", strings.Join(args, " "))
		return nil, nil
	}
}

// render runs helm template for release "demo" in namespace "shop" with the
// given extra arguments (values files, --set ...).
func render(t *testing.T, args ...string) []byte {
	t.Helper()
	out, err := helmRun(t, append([]string{"template", "demo", chartDir, "--namespace", "shop"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// manifests holds a rendered chart decoded into typed objects.
type manifests struct {
	Deployments  []*appsv1.Deployment
	Services     []*corev1.Service
	ConfigMaps   []*corev1.ConfigMap
	Accounts     []*corev1.ServiceAccount
	PDBs         []*policyv1.PodDisruptionBudget
	HPAs         []*autoscalingv2.HorizontalPodAutoscaler
	Pods         []*corev1.Pod
	NetPolicies  []*networkingv1.NetworkPolicy
	Monitoring   []map[string]any // monitoring.coreos.com objects
	KindsInOrder []string
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// decode splits helm's output into documents and decodes each one strictly
// (unknown or duplicate fields are errors) into its typed Kubernetes object.
func decode(t *testing.T, out []byte) *manifests {
	t.Helper()
	m := &manifests{}
	for _, doc := range docSep.Split(string(out), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("a rendered document is not YAML: %v\n%s", err, doc)
		}
		gvk := tm.APIVersion + "/" + tm.Kind
		m.KindsInOrder = append(m.KindsInOrder, gvk)
		var err error
		switch gvk {
		case "apps/v1/Deployment":
			m.Deployments = append(m.Deployments, strict[appsv1.Deployment](doc, &err))
		case "v1/Service":
			m.Services = append(m.Services, strict[corev1.Service](doc, &err))
		case "v1/ConfigMap":
			m.ConfigMaps = append(m.ConfigMaps, strict[corev1.ConfigMap](doc, &err))
		case "v1/ServiceAccount":
			m.Accounts = append(m.Accounts, strict[corev1.ServiceAccount](doc, &err))
		case "policy/v1/PodDisruptionBudget":
			m.PDBs = append(m.PDBs, strict[policyv1.PodDisruptionBudget](doc, &err))
		case "autoscaling/v2/HorizontalPodAutoscaler":
			m.HPAs = append(m.HPAs, strict[autoscalingv2.HorizontalPodAutoscaler](doc, &err))
		case "v1/Pod":
			m.Pods = append(m.Pods, strict[corev1.Pod](doc, &err))
		case "networking.k8s.io/v1/NetworkPolicy":
			m.NetPolicies = append(m.NetPolicies, strict[networkingv1.NetworkPolicy](doc, &err))
		case "monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PodMonitor",
			"monitoring.coreos.com/v1/PrometheusRule":
			var u map[string]any
			err = yaml.UnmarshalStrict([]byte(doc), &u)
			if err == nil {
				err = checkMonitoringObject(tm.Kind, u)
			}
			m.Monitoring = append(m.Monitoring, u)
		default:
			err = fmt.Errorf("the chart renders %s, which this test does not know", gvk)
		}
		if err != nil {
			t.Fatalf("%s: %v\n%s", gvk, err, doc)
		}
	}
	return m
}

func strict[T any](doc string, errp *error) *T {
	var v T
	if err := yaml.UnmarshalStrict([]byte(doc), &v); err != nil {
		*errp = err
	}
	return &v
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func (m *manifests) monitoring(kind string) []map[string]any {
	var out []map[string]any
	for _, u := range m.Monitoring {
		if u["kind"] == kind {
			out = append(out, u)
		}
	}
	return out
}

func (m *manifests) configMap(t *testing.T, name string) *corev1.ConfigMap {
	t.Helper()
	for _, c := range m.ConfigMaps {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no ConfigMap %q rendered", name)
	return nil
}

// The prometheus-operator CRDs are not vendored here; this is a schema check of
// our own for the fields the chart writes, strict about unknown keys.
var monitoringSchema = map[string]map[string][]string{
	"ServiceMonitor": {
		"":          {"apiVersion", "kind", "metadata", "spec"},
		"spec":      {"selector", "namespaceSelector", "endpoints"},
		"endpoints": {"port", "path", "interval", "scrapeTimeout", "relabelings", "metricRelabelings"},
	},
	"PodMonitor": {
		"":                    {"apiVersion", "kind", "metadata", "spec"},
		"spec":                {"selector", "namespaceSelector", "podMetricsEndpoints"},
		"podMetricsEndpoints": {"port", "path", "interval", "scrapeTimeout", "relabelings", "metricRelabelings"},
	},
	"PrometheusRule": {
		"":       {"apiVersion", "kind", "metadata", "spec"},
		"spec":   {"groups"},
		"groups": {"name", "interval", "rules"},
		"rules":  {"alert", "expr", "for", "labels", "annotations"},
	},
}

func checkMonitoringObject(kind string, u map[string]any) error {
	schema := monitoringSchema[kind]
	var check func(path, key string, v any) error
	check = func(path, key string, v any) error {
		allowed, ok := schema[key]
		if !ok {
			return nil // a leaf or a Kubernetes-typed field (selector, relabelings, metadata)
		}
		switch x := v.(type) {
		case map[string]any:
			for k, child := range x {
				if !contains(allowed, k) {
					return fmt.Errorf("%s: unknown field %q in %s", kind, k, path)
				}
				if err := check(path+"."+k, k, child); err != nil {
					return err
				}
			}
		case []any:
			if len(x) == 0 {
				return fmt.Errorf("%s: %s is empty", kind, path)
			}
			for i, item := range x {
				m, ok := item.(map[string]any)
				if !ok {
					return fmt.Errorf("%s: %s[%d] is not an object", kind, path, i)
				}
				for k, child := range m {
					if !contains(allowed, k) {
						return fmt.Errorf("%s: unknown field %q in %s[%d]", kind, k, path, i)
					}
					if err := check(fmt.Sprintf("%s[%d].%s", path, i, k), k, child); err != nil {
						return err
					}
				}
			}
		default:
			return fmt.Errorf("%s: %s has type %T, want an object or a list", kind, path, v)
		}
		return nil
	}
	if err := check(kind, "", u); err != nil {
		return err
	}
	spec, ok := u["spec"].(map[string]any)
	if !ok {
		return errors.New(kind + ": no spec")
	}
	switch kind {
	case "ServiceMonitor", "PodMonitor":
		if _, ok := spec["selector"].(map[string]any); !ok {
			return errors.New(kind + ": spec.selector missing")
		}
	case "PrometheusRule":
		if _, ok := spec["groups"].([]any); !ok {
			return errors.New(kind + ": spec.groups missing")
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
