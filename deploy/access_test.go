package deploy_test

import (
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// drainTokens returns the sidecar's LOADSHED_DRAIN_TOKEN ("" without one) and the Authorization
// header of the app's drain hook ("" without one).
func drainTokens(t *testing.T, m *manifests) (env, header string) {
	t.Helper()
	d := m.Deployments[0]
	for _, e := range container(t, d, "loadshed").Env {
		if e.Name == "LOADSHED_DRAIN_TOKEN" {
			if e.ValueFrom != nil {
				t.Fatalf("LOADSHED_DRAIN_TOKEN from %+v, want a value", e.ValueFrom)
			}
			env = e.Value
		}
	}
	if l := container(t, d, "app").Lifecycle; l != nil && l.PreStop != nil && l.PreStop.HTTPGet != nil {
		for _, h := range l.PreStop.HTTPGet.HTTPHeaders {
			if h.Name == "Authorization" {
				header = h.Value
			}
		}
	}
	return env, header
}

// TestDrainToken: a native sidecar's /drain needs the pod's token: the chart gives the sidecar
// one and the app's drain hook presents the same; a new rendering draws a new one unless
// proxy.drainToken pins it. Where there is no drain hook (a regular sidecar, mode extproc, no
// shutdown delay) there is no token, and /drain stays closed.
func TestDrainToken(t *testing.T) {
	native := []string{"--kube-version", "1.34.0"}
	env, header := drainTokens(t, decode(t, render(t, native...)))
	if len(env) < 16 || header != "Bearer "+env {
		t.Fatalf("native: sidecar token %q, hook header %q; want a token of 16+ characters, presented by the hook", env, header)
	}
	again, _ := drainTokens(t, decode(t, render(t, native...)))
	if again == env {
		t.Errorf("two renderings drew the same token %q", env)
	}
	pinned := "pinned-token-0123456789"
	if env, header := drainTokens(t, decode(t, render(t, append(native, "--set", "proxy.drainToken="+pinned)...))); env != pinned || header != "Bearer "+pinned {
		t.Errorf("proxy.drainToken: sidecar %q, hook %q, want %q", env, header, pinned)
	}
	for _, c := range [][]string{
		{"--kube-version", "1.32.0"},
		append(native, "--set", "app.shutdownDelaySeconds=0"),
		append(native, "--set", "mode=extproc"),
	} {
		if env, header := drainTokens(t, decode(t, render(t, c...))); env != "" || header != "" {
			t.Errorf("%v: token %q, hook header %q; want none without a drain hook", c, env, header)
		}
	}
	if _, err := helmRun(t, "template", "bad", chartDir, "--set", "proxy.drainToken=short"); err == nil {
		t.Error("proxy.drainToken=short accepted, want at least 16 characters")
	}
}

// TestNetworkPolicy: off by default. On, it selects the release's pods and admits the data port
// from anyone (as without it), the sidecar's admin port only from the node CIDRs and the metrics
// scraper given, and no other port.
func TestNetworkPolicy(t *testing.T) {
	if m := decode(t, render(t)); len(m.NetPolicies) != 0 {
		t.Fatalf("a NetworkPolicy by default: %+v", m.NetPolicies)
	}
	m := decode(t, render(t, "--set", "networkPolicy.enabled=true", "--set", "networkPolicy.nodeCIDRs={10.0.0.0/16,fd00::/64}",
		"--set-json", `networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}},"podSelector":{"matchLabels":{"app":"prometheus"}}}]`))
	checkWorkload(t, m)
	if len(m.NetPolicies) != 1 {
		t.Fatalf("%d NetworkPolicies, want 1", len(m.NetPolicies))
	}
	np := m.NetPolicies[0]
	if !selects(np.Spec.PodSelector.MatchLabels, m.Deployments[0].Spec.Template.Labels) || len(np.Spec.PodSelector.MatchExpressions) > 0 {
		t.Errorf("pod selector %+v does not select the release's pods", np.Spec.PodSelector)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policy types %v, want Ingress only", np.Spec.PolicyTypes)
	}
	from := map[int][]networkingv1.NetworkPolicyPeer{}
	for _, r := range np.Spec.Ingress {
		if len(r.Ports) != 1 || r.Ports[0].Port == nil || r.Ports[0].Port.Type != intstr.Int {
			t.Fatalf("ingress rule %+v, want one port by number", r)
		}
		from[r.Ports[0].Port.IntValue()] = r.From
	}
	data, okData := from[8000]
	admin, okAdmin := from[9901]
	if len(from) != 2 || !okData || !okAdmin {
		t.Fatalf("ingress ports %v, want the data port 8000 and the admin port 9901 only", from)
	}
	if len(data) != 0 {
		t.Errorf("data port admits only %+v, want everyone", data)
	}
	var cidrs []string
	var scraper bool
	for _, p := range admin {
		switch {
		case p.IPBlock != nil:
			cidrs = append(cidrs, p.IPBlock.CIDR)
		case p.PodSelector != nil && p.NamespaceSelector != nil:
			scraper = p.PodSelector.MatchLabels["app"] == "prometheus" && p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == "monitoring"
		default:
			t.Errorf("admin port admits %+v, want only the nodes and the scraper", p)
		}
	}
	if !slices.Equal(cidrs, []string{"10.0.0.0/16", "fd00::/64"}) || !scraper {
		t.Errorf("admin port admits CIDRs %v, scraper %v; want the node CIDRs and the scraper", cidrs, scraper)
	}

	// Nothing named for the admin port: it admits nobody (the data port still everyone).
	m = decode(t, render(t, "--set", "networkPolicy.enabled=true"))
	if r := m.NetPolicies[0].Spec.Ingress; len(r) != 1 || r[0].Ports[0].Port.IntValue() != 8000 {
		t.Errorf("no node or scraper: ingress %+v, want the data port only", r)
	}
	// Mode extproc with the chart's Envoy: the Service's target is Envoy's port.
	m = decode(t, render(t, "--set", "networkPolicy.enabled=true,mode=extproc,envoy.enabled=true", "--set-file", "envoy.config=envoy/envoy.yaml"))
	if r := m.NetPolicies[0].Spec.Ingress; len(r) != 1 || r[0].Ports[0].Port.IntValue() != 10000 {
		t.Errorf("extproc with Envoy: ingress %+v, want Envoy's port 10000", r)
	}
	if _, err := helmRun(t, "template", "bad", chartDir, "--set", "networkPolicy.nodeCIDRs={10.0.0.0}"); err == nil {
		t.Error("a node CIDR without a prefix length was accepted")
	}
}
