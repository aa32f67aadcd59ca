package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

var testReplicas = []string{"127.0.0.1:18101", "127.0.0.1:18102", "127.0.0.1:18103"}

// envoyCluster decodes a balancing bootstrap and returns its one cluster.
func envoyCluster(t *testing.T, text string) map[string]any {
	t.Helper()
	var boot struct {
		StaticResources struct {
			Clusters []map[string]any `yaml:"clusters"`
		} `yaml:"static_resources"`
	}
	if err := yaml.Unmarshal([]byte(text), &boot); err != nil {
		t.Fatalf("config does not parse: %v\n%s", err, text)
	}
	if len(boot.StaticResources.Clusters) != 1 {
		t.Fatalf("%d clusters, want 1\n%s", len(boot.StaticResources.Clusters), text)
	}
	return boot.StaticResources.Clusters[0]
}

// dig follows keys (and 0 for a list's first item) through decoded YAML.
func dig(v any, path ...any) any {
	for _, k := range path {
		switch k := k.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func TestBalancingEnvoyConfigsCarryThePolicy(t *testing.T) {
	for _, pol := range BalancingPolicies {
		text, err := balancingEnvoyConfig(pol, "127.0.0.1:18000", "127.0.0.1:19902", testReplicas)
		if err != nil {
			t.Fatal(err)
		}
		c := envoyCluster(t, text)
		switch pol.Name {
		case PolicyRoundRobin, PolicyLeastRequest:
			want := map[string]string{PolicyRoundRobin: "ROUND_ROBIN", PolicyLeastRequest: "LEAST_REQUEST"}[pol.Name]
			if c["lb_policy"] != want || c["load_balancing_policy"] != nil {
				t.Errorf("%s: lb_policy %v, load_balancing_policy %v; want %s alone", pol.Name, c["lb_policy"], c["load_balancing_policy"], want)
			}
		case PolicyCSWRR:
			ext := dig(c, "load_balancing_policy", "policies", 0, "typed_extension_config")
			tc := dig(ext, "typed_config")
			if dig(ext, "name") != "envoy.load_balancing_policies.client_side_weighted_round_robin" ||
				dig(tc, "@type") != "type.googleapis.com/envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin" {
				t.Errorf("%s: extension %v", pol.Name, ext)
			}
			// In-band reports (no OOB stream), weights after a second of reports, every second.
			if dig(tc, "enable_oob_load_report") != nil || dig(tc, "blackout_period") != "1s" || dig(tc, "weight_update_period") != "1s" {
				t.Errorf("%s: typed_config %v", pol.Name, tc)
			}
			if c["lb_policy"] != nil {
				t.Errorf("%s: lb_policy %v next to load_balancing_policy", pol.Name, c["lb_policy"])
			}
		default:
			t.Errorf("policy %s has no test", pol.Name)
		}
		var ports []int
		for i := range testReplicas {
			if p, ok := dig(c, "load_assignment", "endpoints", 0, "lb_endpoints", i, "endpoint", "address", "socket_address", "port_value").(int); ok {
				ports = append(ports, p)
			}
		}
		if len(ports) != 3 || ports[0] != 18101 || ports[2] != 18103 {
			t.Errorf("%s: endpoint ports %v, want 18101 18102 18103", pol.Name, ports)
		}
		if !strings.Contains(text, "port_value: 18000") || !strings.Contains(text, "port_value: 19902") {
			t.Errorf("%s: listener or admin port missing\n%s", pol.Name, text)
		}
	}
	for _, bad := range [][]string{{"nonsense"}, nil} {
		if _, err := balancingEnvoyConfig(BalancingPolicies[0], "127.0.0.1:18000", "127.0.0.1:19902", bad); err == nil {
			t.Errorf("replicas %q: no error", bad)
		}
	}
	if _, err := balancingEnvoyConfig(BalancingPolicies[0], "nonsense", "127.0.0.1:19902", testReplicas); err == nil || !strings.Contains(err.Error(), "listen") {
		t.Errorf("bad listen address: %v", err)
	}
}

// Every balancing config must pass the real Envoy's own validation.
func TestBalancingEnvoyConfigsValidate(t *testing.T) {
	envoy := envoyBinary()
	if envoy == "" {
		t.Skip("no Envoy installed (scripts/install-tools.sh envoy)")
	}
	dir := t.TempDir()
	for _, pol := range BalancingPolicies {
		text, err := balancingEnvoyConfig(pol, "127.0.0.1:18000", "127.0.0.1:19902", testReplicas)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, pol.Name+".yaml")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(envoy, "--mode", "validate", "-c", path, "--disable-hot-restart").CombinedOutput()
		if err != nil {
			t.Errorf("%s: envoy --mode validate: %v\n%s", pol.Name, err, out)
		}
	}
}

func TestBalancingLoadshedConfig(t *testing.T) {
	got := balancingLoadshedConfig(DefaultBalancingLoadshed, "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
	var cfg struct {
		Listen      string `yaml:"listen"`
		Upstream    string `yaml:"upstream"`
		Admission   struct{ Strategy string }
		LoadReports struct{ ORCA bool } `yaml:"loadReports"`
	}
	if err := yaml.Unmarshal([]byte(got), &cfg); err != nil {
		t.Fatalf("%v\n%s", err, got)
	}
	if cfg.Listen != "127.0.0.1:1" || cfg.Upstream != "http://127.0.0.1:3" || cfg.Admission.Strategy != "adaptive" || !cfg.LoadReports.ORCA {
		t.Errorf("config %+v\n%s", cfg, got)
	}
}

func TestParseHosts(t *testing.T) {
	// Envoy writes 64-bit counters as strings and the weight as a number.
	body := []byte(`{"cluster_statuses":[
	 {"name":"other","host_statuses":[{"address":{"socket_address":{"address":"127.0.0.1","port_value":18101}},"stats":[{"name":"rq_total","value":"999"}],"weight":9}]},
	 {"name":"replicas","host_statuses":[
	  {"address":{"socket_address":{"address":"127.0.0.1","port_value":18103}},"stats":[{"name":"cx_total","value":"3"},{"name":"rq_total","value":"30"}],"weight":135},
	  {"address":{"socket_address":{"address":"127.0.0.1","port_value":18101}},"stats":[{"name":"rq_total","value":"100"}],"weight":336},
	  {"address":{"socket_address":{"address":"127.0.0.1","port_value":18102}},"stats":[{"name":"rq_total","value":"90"}],"weight":259}]}]}`)
	sm, ok := parseHosts(body, "replicas", testReplicas)
	if !ok || sm.Requests[0] != 100 || sm.Requests[1] != 90 || sm.Requests[2] != 30 || sm.Weights[0] != 336 || sm.Weights[2] != 135 {
		t.Fatalf("parseHosts = %+v, %v", sm, ok)
	}
	if _, ok := parseHosts(body, "replicas", append(testReplicas, "127.0.0.1:1")); ok {
		t.Error("a replica Envoy does not list was not noticed")
	}
	if _, ok := parseHosts([]byte("not json"), "replicas", testReplicas); ok {
		t.Error("garbage parsed")
	}
}

// samplesAt builds samples every 0.25 s from per-step request counts (one []uint64 per step).
func samplesAt(steps [][]uint64) []ShareSample {
	out := []ShareSample{{T: 0, Requests: make([]uint64, len(steps[0]))}}
	for i, st := range steps {
		prev := out[len(out)-1].Requests
		next := make([]uint64, len(st))
		for k := range st {
			next[k] = prev[k] + st[k]
		}
		out = append(out, ShareSample{T: float64(i+1) * 0.25, Requests: next})
	}
	return out
}

func TestSharesAndRecovery(t *testing.T) {
	// 10 s of a slow third replica (10% of the requests), then from 10 s an equal one.
	var steps [][]uint64
	for i := range 80 {
		if i < 40 {
			steps = append(steps, []uint64{45, 45, 10})
		} else {
			steps = append(steps, []uint64{33, 33, 34})
		}
	}
	samples := samplesAt(steps)
	sh := sharesBetween(samples, 0, 10)
	if len(sh) != 3 || sh[2] < 0.0999 || sh[2] > 0.1001 || sh[0] < 0.4499 || sh[0] > 0.4501 {
		t.Fatalf("shares before the switch %v, want 0.45 0.45 0.10", sh)
	}
	if sharesBetween(samples, 5, 5) != nil || sharesBetween(nil, 0, 1) != nil {
		t.Error("shares over no interval")
	}
	// The switch at 8 s: the last second reads a third from 11 s on (3 s after the switch).
	rec := recoveryTime(samples, 2, 8, 20)
	if rec == nil || *rec != 3 {
		t.Fatalf("recovery = %v, want 3 s", fmtSeconds(rec))
	}
	// The hold: a share that comes back and falls away again is no recovery.
	var blip [][]uint64
	for i := range 80 {
		if i >= 40 && i < 44 {
			blip = append(blip, []uint64{33, 33, 34})
		} else {
			blip = append(blip, []uint64{45, 45, 10})
		}
	}
	if rec := recoveryTime(samplesAt(blip), 2, 8, 20); rec != nil {
		t.Errorf("a one-second blip counted as recovery after %.2f s", *rec)
	}
	// Not before the switch, and not after the end.
	if rec := recoveryTime(samples, 2, 8, 12); rec != nil {
		t.Errorf("recovery at %.2f s with no time to hold it", *rec)
	}
}

func TestBalancingConfigValidateNamesFields(t *testing.T) {
	c := BalancingConfig{Repeats: 0, Duration: time.Second, SLO: time.Second, ClientTimeout: time.Millisecond,
		Cases: []BalancingCase{{Name: "x", Replicas: []Replica{{Workers: 1, Service: time.Millisecond}}, Rate: 1, Policies: []string{"random"},
			SwitchTo: &Replica{Workers: 1, Service: time.Millisecond}, SwitchAfter: time.Minute}}}
	err := c.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"RepoRoot", "Repeats", "Duration", "SLO", "SampleEvery", "Cases[x].SwitchAfter", `unknown policy "random"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
	ok := BalancingConfig{RepoRoot: "r", OutDir: "o", Repeats: 1, Duration: 30 * time.Second, SLO: 250 * time.Millisecond, ClientTimeout: time.Second,
		SampleEvery: 250 * time.Millisecond, Cases: BalancingCases(400, 480, 10*time.Second)}
	if err := ok.Validate(); err != nil {
		t.Errorf("the default cases: %v", err)
	}
}
