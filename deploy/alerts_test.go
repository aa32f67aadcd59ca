package deploy_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"

	"github.com/loadshed/loadshed/deploy/internal/chartgen"
	"github.com/loadshed/loadshed/internal/metrics"
)

const (
	rulesFile     = "prometheus/rules.yaml"
	dashboardFile = "grafana/loadshed-dashboard.json"
)

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func sourceRules(t *testing.T) *chartgen.RuleFile {
	t.Helper()
	f, err := chartgen.ParseRules(readFile(t, rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// renderedRules returns the rule groups of the chart's PrometheusRule and of
// its rules ConfigMap, rendered with args.
func renderedRules(t *testing.T, args ...string) (fromCRD, fromConfigMap *chartgen.RuleFile) {
	t.Helper()
	args = append([]string{"--set", "prometheusRule.enabled=true,prometheusRule.configMap=true"}, args...)
	m := decode(t, render(t, args...))
	prs := m.monitoring("PrometheusRule")
	if len(prs) != 1 {
		t.Fatalf("rendered %d PrometheusRules, want 1", len(prs))
	}
	spec, err := json.Marshal(prs[0]["spec"])
	if err != nil {
		t.Fatal(err)
	}
	fromCRD = &chartgen.RuleFile{}
	if err := yaml.UnmarshalStrict(spec, fromCRD); err != nil {
		t.Fatalf("PrometheusRule spec: %v", err)
	}
	cm := m.configMap(t, "demo-loadshed-rules")
	fromConfigMap, err = chartgen.ParseRules([]byte(cm.Data["loadshed-rules.yaml"]))
	if err != nil {
		t.Fatalf("rules ConfigMap: %v", err)
	}
	return fromCRD, fromConfigMap
}

// TestChartRulesMatchSource: deploy/prometheus/rules.yaml is the one source; the
// chart renders exactly its groups when the values are left at their defaults.
func TestChartRulesMatchSource(t *testing.T) {
	want := sourceRules(t)
	crd, cm := renderedRules(t)
	if !reflect.DeepEqual(crd, want) {
		t.Errorf("the chart's PrometheusRule differs from %s:\n got %+v\nwant %+v", rulesFile, crd, want)
	}
	if !reflect.DeepEqual(cm, want) {
		t.Errorf("the chart's rules ConfigMap differs from %s", rulesFile)
	}
}

// TestChartRuleValues: thresholds, windows, severities and switches come from values.
func TestChartRuleValues(t *testing.T) {
	crd, _ := renderedRules(t,
		"--set-json", "prometheusRule.rules.highShedRatio.threshold=0.25",
		"--set", "prometheusRule.rules.highShedRatio.minRate=5",
		"--set", "prometheusRule.rules.highShedRatio.for=2m,prometheusRule.rules.highShedRatio.severity=page",
		"--set-json", "prometheusRule.rules.queueWaitHigh.threshold=0.35",
		"--set-json", "prometheusRule.rules.upstreamErrors.threshold=0.02",
		"--set", "prometheusRule.rules.metricsAbsent.enabled=false",
		"--set", "prometheusRule.rules.upstreamErrors.window=1m",
	)
	rules := map[string]chartgen.Rule{}
	for _, g := range crd.Groups {
		for _, r := range g.Rules {
			rules[r.Alert] = r
			if _, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr); err != nil {
				t.Errorf("%s: rendered expression does not parse: %v\n%s", r.Alert, err, r.Expr)
			}
		}
	}
	if _, ok := rules["LoadshedMetricsAbsent"]; ok {
		t.Error("metricsAbsent.enabled=false still renders LoadshedMetricsAbsent")
	}
	hs := rules["LoadshedHighShedRatio"]
	if !strings.Contains(hs.Expr, ") > 0.25\n") || !strings.Contains(hs.Expr, "[5m])) > 5\n") {
		t.Errorf("LoadshedHighShedRatio does not use threshold 0.25 and minRate 5:\n%s", hs.Expr)
	}
	if hs.For != "2m" || hs.Labels["severity"] != "page" {
		t.Errorf("LoadshedHighShedRatio for=%q severity=%q, want 2m and page", hs.For, hs.Labels["severity"])
	}
	if !strings.Contains(rules["LoadshedQueueWaitHigh"].Expr, ") > 0.35") {
		t.Errorf("LoadshedQueueWaitHigh does not use threshold 0.35:\n%s", rules["LoadshedQueueWaitHigh"].Expr)
	}
	if !strings.Contains(rules["LoadshedUpstreamErrors"].Expr, ") > 0.02") {
		t.Errorf("LoadshedUpstreamErrors does not use threshold 0.02:\n%s", rules["LoadshedUpstreamErrors"].Expr)
	}
	if ue := rules["LoadshedUpstreamErrors"].Expr; strings.Count(ue, "[1m]") != 2 || strings.Contains(ue, "[5m]") {
		t.Errorf("LoadshedUpstreamErrors does not use window 1m in both rates:\n%s", ue)
	}
	if got := rules["LoadshedLimitAtFloor"]; got.For != "15m" || !strings.Contains(got.Expr, "[5m]") {
		t.Errorf("an untouched alert changed: LoadshedLimitAtFloor for=%q, want 15m", got.For)
	}

	// promtool, when present, checks the rendered file as Prometheus would load it.
	promtool := os.Getenv("PROMTOOL")
	if promtool == "" {
		promtool, _ = exec.LookPath("promtool")
	}
	if promtool == "" {
		t.Log("promtool not found: rendered rules checked with the PromQL parser only")
		return
	}
	data, err := yaml.Marshal(crd)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the rendered rules: %v\n%s", err, out)
	}
}

// TestRulesHaveRunbooks: every alert explains itself.
func TestRulesHaveRunbooks(t *testing.T) {
	f := sourceRules(t)
	n := 0
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			n++
			for _, a := range []string{"summary", "description", "runbook"} {
				if len(strings.TrimSpace(r.Annotations[a])) < 20 {
					t.Errorf("%s: annotation %s missing or too short", r.Alert, a)
				}
			}
			if r.Labels["severity"] == "" {
				t.Errorf("%s has no severity label", r.Alert)
			}
		}
	}
	for _, want := range []string{"LoadshedHighShedRatio", "LoadshedQueueWaitHigh", "LoadshedUpstreamErrors",
		"LoadshedMetricsAbsent", "LoadshedLimitAtFloor", "LoadshedConfigReloadFailing", "LoadshedQuotaStoreUnavailable"} {
		if !slices.ContainsFunc(f.Groups[0].Rules, func(r chartgen.Rule) bool { return r.Alert == want }) {
			t.Errorf("alert %s is missing", want)
		}
	}
	if n == 0 {
		t.Fatal("no rules")
	}
}

// exportedSeries is every series name an expression may select: the proxy's
// metric families (metrics.Names), their histogram series, and Prometheus' up.
func exportedSeries() map[string]bool {
	ok := map[string]bool{"up": true}
	for _, n := range metrics.Names() {
		ok[n] = true
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			ok[n+suffix] = true
		}
	}
	return ok
}

// The values of loadshed_requests_total's outcome label.
var outcomes = []string{metrics.OutcomeSuccess, metrics.OutcomeClientError, metrics.OutcomeUpstreamError,
	metrics.OutcomeUpstreamTimeout, metrics.OutcomeShed, metrics.OutcomeCanceled}

type exprInfo struct {
	metrics  map[string]bool
	grouping map[string][]string // metric name -> labels it is aggregated by
}

// checkExpr parses expr and checks every metric it selects is exported, and
// every outcome it matches exists.
func checkExpr(t *testing.T, where, expr string, info *exprInfo) {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: does not parse: %v\n%s", where, err, expr)
		return
	}
	ok := exportedSeries()
	parser.Inspect(e, func(n parser.Node, path []parser.Node) error {
		switch x := n.(type) {
		case *parser.VectorSelector:
			name := x.Name
			for _, m := range x.LabelMatchers {
				if m.Name == labels.MetricName {
					name = m.Value
				}
				if m.Name == "outcome" && (m.Type == labels.MatchEqual || m.Type == labels.MatchNotEqual ||
					m.Type == labels.MatchRegexp || m.Type == labels.MatchNotRegexp) {
					for _, v := range strings.Split(m.Value, "|") {
						if !slices.Contains(outcomes, v) {
							t.Errorf("%s: outcome %q is not one the proxy records (%v)", where, v, outcomes)
						}
					}
				}
			}
			if !ok[name] {
				t.Errorf("%s: metric %q is not exported by the proxy (internal/metrics.Names)", where, name)
			}
			if info != nil {
				info.metrics[name] = true
				for _, p := range path {
					if a, isAgg := p.(*parser.AggregateExpr); isAgg && !a.Without {
						info.grouping[name] = append(info.grouping[name], a.Grouping...)
					}
				}
			}
		}
		return nil
	})
}

func TestRuleExpressionsUseExportedMetrics(t *testing.T) {
	for _, g := range sourceRules(t).Groups {
		for _, r := range g.Rules {
			checkExpr(t, rulesFile+" "+r.Alert, r.Expr, nil)
		}
	}
}

// grafanaVars stands in for Grafana's interval variables, which are not PromQL.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

var labelValuesQuery = regexp.MustCompile(`^label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Title   string  `json:"title"`
	Type    string  `json:"type"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

func TestDashboardExpressions(t *testing.T) {
	var d dashboard
	if err := json.Unmarshal(readFile(t, dashboardFile), &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	info := &exprInfo{metrics: map[string]bool{}, grouping: map[string][]string{}}
	var walk func([]panel)
	titles := map[string]bool{}
	n := 0
	walk = func(ps []panel) {
		for _, p := range ps {
			titles[p.Title] = true
			for i, tg := range p.Targets {
				n++
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q target %d has no expression", p.Title, i)
					continue
				}
				checkExpr(t, "panel "+p.Title, grafanaVars.Replace(tg.Expr), info)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if n == 0 {
		t.Fatal("the dashboard has no queries")
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Errorf("variable %s: query: %v", v.Name, err)
			continue
		}
		m := labelValuesQuery.FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(selector, label)", v.Name, q.Query)
			continue
		}
		checkExpr(t, "variable "+v.Name, m[1], nil)
	}

	// What the dashboard must show.
	for _, want := range []string{
		"loadshed_requests_total",                  // offered, admitted, goodput
		"loadshed_shed_total",                      // sheds by reason and priority
		"loadshed_request_duration_seconds_bucket", // latency percentiles
		"loadshed_queue_depth", "loadshed_queue_wait_seconds_bucket",
		"loadshed_limit", "loadshed_limit_floor", "loadshed_limit_ceiling",
		"loadshed_quota_store_latency_seconds_bucket", "loadshed_quota_store_errors_total", // the quota store
		"loadshed_quota_fallback_active", "loadshed_quota_replicas",
	} {
		if !info.metrics[want] {
			t.Errorf("the dashboard never queries %s", want)
		}
	}
	for _, label := range []string{"reason", "priority"} {
		if !slices.Contains(info.grouping["loadshed_shed_total"], label) {
			t.Errorf("the dashboard never breaks loadshed_shed_total down by %s", label)
		}
	}
	if !titles["Offered, admitted, goodput and shed"] {
		t.Error("the dashboard has no goodput panel")
	}
}
