package config

import (
	"strings"
	"testing"
)

// TestProtectionByDefault: a file that names no strategy, at the top or in a route's block, runs
// the adaptive strategy with its defaults; none must be asked for.
func TestProtectionByDefault(t *testing.T) {
	for name, file := range map[string]string{
		"only upstream":              "upstream: http://127.0.0.1:8080\n",
		"admission without strategy": "upstream: http://127.0.0.1:8080\nadmission: {dryRun: false}\n",
		"adaptive block alone":       "upstream: http://127.0.0.1:8080\nadmission: {adaptive: {initialLimit: 20}}\n",
	} {
		c, err := Parse([]byte(file))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if c.Admission.Strategy != StrategyAdaptive {
			t.Errorf("%s: strategy %q, want adaptive", name, c.Admission.Strategy)
		}
		if _, err := c.Admission.Build(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	c, err := Parse([]byte("upstream: http://127.0.0.1:8080\nadmission: {strategy: none}\nroutes: [{name: a, pathPrefix: /a, admission: {adaptive: {maxLimit: 50}}}, {name: b, pathPrefix: /b}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Routes[0].Admission.Strategy; got != StrategyAdaptive {
		t.Errorf("a route's admission block without a strategy: %q, want adaptive", got)
	}
	if c.Routes[1].Admission != nil {
		t.Errorf("a route without a block must share the top-level policy (none here), got its own")
	}
	if a, err := ParseAdmission([]byte("{adaptive: {maxLimit: 50}}")); err != nil || a.Strategy != StrategyAdaptive {
		t.Errorf("ParseAdmission without a strategy: %v, %v; want adaptive", a, err)
	}
	for file, field := range map[string]string{
		"admission: {inflight: {limit: 8}}":                        "admission.strategy: required with the inflight block: write strategy: inflight",
		"admission: {chain: [{inflight: {limit: 8}}]}":             "admission.strategy: required with a chain",
		"routes: [{name: a, admission: {tokenBucket: {rate: 5}}}]": "routes[0].admission.strategy: required with the tokenBucket block",
	} {
		_, err := Parse([]byte("upstream: http://127.0.0.1:8080\n" + file + "\n"))
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v; want an error naming %s (the block's own strategy was meant, not adaptive)", file, err, field)
		}
		if _, err := ParseAdmission([]byte("{inflight: {limit: 8}}")); err == nil || !strings.Contains(err.Error(), "admission.strategy") {
			t.Errorf("ParseAdmission of an inflight block alone: %v", err)
		}
	}
}

func TestSummary(t *testing.T) {
	for file, want := range map[string]string{
		"upstream: http://127.0.0.1:8080\n": "strategy adaptive (gradient, initial limit 4, between 1 and 256) on the data port; no routes; quotas off",
		"upstream: http://127.0.0.1:8080\nextProc: {listen: 127.0.0.1:9002}\nadmission: {strategy: inflight, inflight: {limit: 8}, dryRun: true}\n":                                                                                                                                                              "strategy inflight (limit 8) on the data port and Envoy's ext_proc (dry run: counted, never shed); no routes; quotas off",
		"upstream: http://127.0.0.1:8080\nadmission: {strategy: chain, chain: [{tokenBucket: {rate: 100, burst: 10}}, {boundedQueue: {concurrency: 4, depth: 8, maxWait: 50ms}}]}\nclients: {rate: 5, burst: 10}\nroutes: [{name: a, pathPrefix: /a, admission: {strategy: none}}, {name: b, pathPrefix: /b}]\n": "strategy chain (token-bucket (100 rps, burst 10), then bounded-queue (concurrency 4, depth 8, max wait 50ms)) on the data port; 2 routes (1 with their own strategy); quotas 5 rps per client (burst 10), per replica",
	} {
		c, err := Parse([]byte(file))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if got := Summary(c); got != want {
			t.Errorf("%s:\n got %s\nwant %s", file, got, want)
		}
	}
}
