package deploy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/loadshed/loadshed/internal/config"
)

// TestEveryStrategyIsCoveredEverywhere walks the strategy registry (internal/config): every
// strategy the proxy accepts must have its chart values block, its schema entries, its
// ci/<strategy>-values.yaml and its paragraph in docs/strategies.md, "Choosing a strategy" (lab support
// is checked over the same registry by internal/lab's TestEveryStrategyRunsInTheLab). A strategy
// added to the registry fails here until each is written (the schema enum and the chart's
// strategy helpers are generated from the registry: go generate in deploy/).
func TestEveryStrategyIsCoveredEverywhere(t *testing.T) {
	var values struct {
		Admission map[string]any `yaml:"admission"`
	}
	if err := yaml.Unmarshal(readFile(t, chartDir+"/values.yaml"), &values); err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Admission struct {
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"admission"`
		} `json:"properties"`
		Definitions map[string]json.RawMessage `json:"definitions"`
	}
	if err := json.Unmarshal(readFile(t, chartDir+"/values.schema.json"), &schema); err != nil {
		t.Fatal(err)
	}
	choosing := string(readFile(t, "../docs/strategies.md"))
	if !strings.HasPrefix(choosing, "# Choosing a strategy\n") {
		t.Fatal("docs/strategies.md does not start with \"# Choosing a strategy\"")
	}

	for _, k := range config.Kinds() {
		t.Run(k.Name, func(t *testing.T) {
			if k.Block != "" {
				if _, ok := values.Admission[k.Block]; !ok {
					t.Errorf("values.yaml has no admission.%s block", k.Block)
				}
				if _, ok := schema.Properties.Admission.Properties[k.Block]; !ok {
					t.Errorf("values.schema.json has no admission.%s property", k.Block)
				}
			}
			if k.New != nil {
				if _, ok := schema.Definitions[k.Block]; !ok {
					t.Errorf("values.schema.json has no definitions.%s", k.Block)
				}
			}
			ci := filepath.Join(chartDir, "ci", k.Name+"-values.yaml")
			data, err := os.ReadFile(ci)
			if err != nil {
				t.Errorf("no %s: %v", ci, err)
			} else if !regexp.MustCompile(`(?m)^\s+strategy:\s*"?` + regexp.QuoteMeta(k.Name) + `"?\s*$`).Match(data) {
				t.Errorf("%s does not select strategy %s", ci, k.Name)
			}
			if !strings.Contains(choosing, "**"+k.Name+"**") {
				t.Errorf("docs/strategies.md has no **%s** paragraph", k.Name)
			}
		})
	}
}
