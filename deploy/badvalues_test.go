package deploy_test

import (
	"strings"
	"testing"
)

// TestBadValuesFailClearly: a mistake in the values fails helm template (and so
// helm install) with a message naming the value, before anything reaches a cluster.
func TestBadValuesFailClearly(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want []string // every one must appear in helm's error
	}{
		{"unknown strategy", []string{"--set", "admission.strategy=magic"},
			[]string{"/admission/strategy", "inflight", "token-bucket"}},
		{"negative limit", []string{"--set", "admission.inflight.limit=-1"},
			[]string{"/admission/inflight/limit", "minimum"}},
		{"zero rate", []string{"--set", "admission.tokenBucket.rate=0"},
			[]string{"/admission/tokenBucket/rate"}},
		{"negative queue depth", []string{"--set", "admission.boundedQueue.depth=-3"},
			[]string{"/admission/boundedQueue/depth"}},
		{"typo in a key", []string{"--set", "admission.inflght.limit=3"},
			[]string{"/admission", "inflght", "not allowed"}},
		{"typo at the top level", []string{"--set", "replicas=3"},
			[]string{"replicas", "not allowed"}},
		{"not a duration", []string{"--set-string", "admission.boundedQueue.maxWait=eighty"},
			[]string{"/admission/boundedQueue/maxWait"}},
		{"unknown algorithm", []string{"--set", "admission.adaptive.algorithm=pid"},
			[]string{"/admission/adaptive/algorithm", "gradient2"}},
		{"chain stage with two blocks", []string{"--set-json", `admission.chain=[{"tokenBucket":{"rate":1,"burst":1},"inflight":{"limit":2}}]`},
			[]string{"/admission/chain/0", "maxProperties"}},
		{"empty chain", []string{"--set", "admission.strategy=chain", "--set-json", "admission.chain=[]"},
			[]string{"/admission/chain", "minItems"}},
		{"unknown reload mode", []string{"--set", "config.reloadMode=hot"},
			[]string{"/config/reloadMode", "rollout", "inPlace"}},
		{"status code not an error", []string{"--set", "proxy.statusCodes.queueFull=200"},
			[]string{"/proxy/statusCodes/queueFull"}},
		{"alert window not a duration", []string{"--set-string", "prometheusRule.rules.highShedRatio.for=ten minutes"},
			[]string{"/prometheusRule/rules/highShedRatio/for"}},
		{"grace period too short", []string{"--set", "terminationGracePeriodSeconds=10"},
			[]string{"terminationGracePeriodSeconds", "drainDelay", "35"}},
		{"grace period too short for a regular sidecar", []string{"--kube-version", "1.32.0", "--set", "terminationGracePeriodSeconds=34"},
			[]string{"terminationGracePeriodSeconds", "drainDelay + proxy.shutdown.gracePeriod", "35"}},
		{"grace period too short for a native sidecar", []string{"--kube-version", "1.34.0", "--set", "terminationGracePeriodSeconds=34"},
			[]string{"terminationGracePeriodSeconds", "native sidecar", "35"}},
		{"unknown native mode", []string{"--set", "proxy.native=yes"},
			[]string{"/proxy/native", "auto"}},
		{"app port clashes with the sidecar", []string{"--set", "app.port=8000"},
			[]string{"app.port", "proxy.port"}},
		{"unknown mode", []string{"--set", "mode=sidecar"},
			[]string{"/mode", "proxy", "extproc"}},
		{"ext_proc port clashes with the app", []string{"--set", "mode=extproc,proxy.extProc.port=8080"},
			[]string{"proxy.extProc.port", "app.port"}},
		{"envoy without mode extproc", []string{"--set", "envoy.enabled=true,envoy.config=x"},
			[]string{"envoy.enabled", "mode: extproc"}},
		{"envoy without a config", []string{"--set", "mode=extproc,envoy.enabled=true"},
			[]string{"envoy.config", "--set-file"}},
		{"envoy port clashes with the ext_proc port", []string{"--set", "mode=extproc,envoy.enabled=true,envoy.config=x,envoy.port=9002"},
			[]string{"envoy.port", "proxy.extProc.port"}},
		{"autoscaling bounds reversed", []string{"--set", "autoscaling.enabled=true,autoscaling.minReplicas=5,autoscaling.maxReplicas=2"},
			[]string{"autoscaling.minReplicas"}},
		{"quota store: addr and addrs", []string{"--set", "clients.enabled=true,clients.store.redis.addr=r:6379", "--set-json", `clients.store.redis.addrs=["s:1"]`},
			[]string{"clients.store.redis", "not both"}},
		{"quota store: addr without a port", []string{"--set", "clients.store.redis.addr=redis"}, []string{"/clients/store/redis/addr"}},
		{"quota store: pool too large", []string{"--set", "clients.store.redis.poolSize=5000"}, []string{"/clients/store/redis/poolSize"}},
		{"quota store: prefix with a space", []string{"--set", "clients.store.redis.keyPrefix=my app:"}, []string{"/clients/store/redis/keyPrefix"}},
		{"quota store: timeout not a duration", []string{"--set-string", "clients.store.redis.timeout=fast"}, []string{"/clients/store/redis/timeout"}},
		{"quota store: typo", []string{"--set", "clients.store.redis.adr=r:1"}, []string{"/clients/store/redis", "adr", "not allowed"}},
		{"quota: zero rate", []string{"--set", "clients.rate=0"}, []string{"/clients/rate"}},
		{"load reports with strategy none", []string{"--set", "proxy.loadReports.orca=true,admission.strategy=none"},
			[]string{"proxy.loadReports.orca", "admission.strategy is none"}},
		{"load report interval under 1s", []string{"--set", "proxy.loadReports.orca=true,proxy.loadReports.minInterval=500ms"},
			[]string{"proxy.loadReports.minInterval", "1s"}},
		{"load reports: typo", []string{"--set", "proxy.loadReports.orcaa=true"},
			[]string{"/proxy/loadReports", "orcaa", "not allowed"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := helmRun(t, append([]string{"template", "demo", chartDir}, c.args...)...)
			if err == nil {
				t.Fatalf("helm template accepted %v; it must fail\n%s", c.args, out)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestGoodValuesStillPass guards the bad-values test: the same keys with good
// values render.
func TestGoodValuesStillPass(t *testing.T) {
	for _, args := range [][]string{
		// helm --set passes 0.5 as a string; fractions go through --set-json or a values file.
		{"--set", "admission.strategy=token-bucket", "--set-json", "admission.tokenBucket.rate=0.5"},
		{"--set", "admission.inflight.limit=1"},
		{"--set-string", "admission.boundedQueue.maxWait=1m30.5s"},
		{"--set", "admission.adaptive.algorithm=vegas"},
		{"--set", "terminationGracePeriodSeconds=35"},
		{"--kube-version", "1.32.0", "--set", "terminationGracePeriodSeconds=35"},
		{"--set", "proxy.native=false"},
		{"--set", "proxy.native=true"},
		{"--set-string", "prometheusRule.rules.highShedRatio.for=1h30m"},
		{"--set", "proxy.loadReports.orca=true,proxy.loadReports.minInterval=1s"},
		{"--set", "proxy.loadReports.minInterval=500ms,admission.strategy=none"}, // reports off: neither matters
	} {
		if _, err := helmRun(t, append([]string{"template", "demo", chartDir}, args...)...); err != nil {
			t.Errorf("valid values %v rejected: %v", args, err)
		}
	}
}
