package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/loadshed/loadshed/internal/metrics"
)

const metricsDoc = "docs/metrics-and-alerts.md"

var (
	// metricDefRE matches a metric's name where the code defines it (a collector's options or a
	// descriptor).
	metricDefRE = regexp.MustCompile(`(?:Name:\s*|NewDesc\(\s*)"(loadshed_[a-z0-9_]+)"`)
	metricRE    = regexp.MustCompile(`\bloadshed_[a-z0-9_]+\b`)
	alertRE     = regexp.MustCompile(`^\x60?(Loadshed[A-Za-z]+)\x60?$`)
)

// exportedMetrics returns every metric family the proxy exports: the families gathered from a
// registry built as the proxy builds it (metrics.Names), and every name the module's code
// defines outside tests (the doors' own metrics, and vectors that a registry shows only once
// they have a child). Nested modules (cmd/inject, cmd/injector, deploy, e2e) are not the proxy.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	defined := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir
				}
				if n := d.Name(); strings.HasPrefix(n, ".") || n == "testdata" || n == "out" {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range metricDefRE.FindAllStringSubmatch(string(data), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range metrics.Names() {
		if !strings.HasPrefix(n, "loadshed_") {
			continue // Go and process collectors
		}
		if !defined[n] {
			t.Errorf("the registry exports %s but no code defines it by that name: the scan of the code is broken", n)
		}
	}
	if len(defined) < 30 {
		t.Fatalf("found only %d metric definitions in the code", len(defined))
	}
	return defined
}

// TestMetricsAreDocumented checks that the metric table of docs/metrics-and-alerts.md lists every
// metric the proxy exports, and nothing else; and that every loadshed_ name that README.md or
// any page of docs/ mentions is one the proxy exports (a histogram's series included).
func TestMetricsAreDocumented(t *testing.T) {
	exported := exportedMetrics(t)
	d := readDoc(t, metricsDoc)
	start, end, ok := d.section("every-metric")
	if !ok {
		t.Fatalf("%s has no \"Every metric\" section", metricsDoc)
	}
	rows, lines := d.tableRows(start, end)
	listed := map[string]bool{}
	for i, r := range rows[1:] { // rows[0] is the header
		name := strings.Trim(r[0], "`")
		if !metricRE.MatchString(name) || metricRE.FindString(name) != name {
			t.Errorf("%s:%d: first cell %q is not a metric name", metricsDoc, lines[i+1], r[0])
			continue
		}
		if listed[name] {
			t.Errorf("%s:%d: %s is listed twice", metricsDoc, lines[i+1], name)
		}
		listed[name] = true
		if !exported[name] {
			t.Errorf("%s:%d: %s is listed, but the proxy exports no such metric", metricsDoc, lines[i+1], name)
		}
	}
	var missing []string
	for n := range exported {
		if !listed[n] {
			missing = append(missing, n)
		}
	}
	sort.Strings(missing)
	for _, n := range missing {
		t.Errorf("%s: the proxy exports %s, but the \"Every metric\" table does not list it", metricsDoc, n)
	}

	for _, rel := range append(checkedFiles(t), "deploy/helm/loadshed/README.md") {
		d := readDoc(t, rel)
		for i, l := range d.lines {
			for _, n := range metricRE.FindAllString(l, -1) {
				base := n
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(n, s); ok && exported[b] {
						base = b
					}
				}
				if !exported[base] {
					t.Errorf("%s:%d: %s is not a metric the proxy exports", rel, i+1, n)
				}
			}
		}
	}
}

// alertRules returns every alert of deploy/prometheus/rules.yaml, the one source of the rules.
func alertRules(t *testing.T) map[string]struct{ For, Severity string } {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "deploy/prometheus/rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert  string            `yaml:"alert"`
				For    string            `yaml:"for"`
				Labels map[string]string `yaml:"labels"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	out := map[string]struct{ For, Severity string }{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out[r.Alert] = struct{ For, Severity string }{r.For, r.Labels["severity"]}
			}
		}
	}
	if len(out) < 8 {
		t.Fatalf("deploy/prometheus/rules.yaml: only %d alerts", len(out))
	}
	return out
}

// TestAlertsAreDocumented checks the alert tables of docs/metrics-and-alerts.md and
// deploy/README.md against deploy/prometheus/rules.yaml: one row per alert, no row for an alert
// that does not exist, and each row naming the alert's `for:` duration ("for 10m"); the docs'
// table also its severity.
func TestAlertsAreDocumented(t *testing.T) {
	rules := alertRules(t)
	for _, c := range []struct{ file, section string }{
		{metricsDoc, "every-alert"},
		{"deploy/README.md", "wire-alerts-and-the-dashboard"},
	} {
		d := readDoc(t, c.file)
		start, end, ok := d.section(c.section)
		if !ok {
			t.Errorf("%s has no section #%s", c.file, c.section)
			continue
		}
		rows, lines := d.tableRows(start, end)
		seen := map[string]bool{}
		for i, r := range rows {
			m := alertRE.FindStringSubmatch(r[0])
			if m == nil {
				continue // the header
			}
			name := m[1]
			rule, ok := rules[name]
			switch {
			case !ok:
				t.Errorf("%s:%d: alert %s is not in deploy/prometheus/rules.yaml", c.file, lines[i], name)
				continue
			case seen[name]:
				t.Errorf("%s:%d: alert %s is listed twice", c.file, lines[i], name)
			}
			seen[name] = true
			row := strings.Join(r, " | ")
			if !strings.Contains(row, "for "+rule.For) {
				t.Errorf("%s:%d: alert %s: the row does not say \"for %s\" (its for: in the rules)", c.file, lines[i], name, rule.For)
			}
			if c.file == metricsDoc && !strings.Contains(row, rule.Severity) {
				t.Errorf("%s:%d: alert %s: the row does not name its severity %s", c.file, lines[i], name, rule.Severity)
			}
		}
		for name := range rules {
			if !seen[name] {
				t.Errorf("%s: the alert table does not list %s (deploy/prometheus/rules.yaml)", c.file, name)
			}
		}
	}
}
