package chartgen

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"text/template"
)

// Paths of the sources and generated files, relative to the deploy directory.
const (
	RulesSource      = "prometheus/rules.yaml"
	DashboardSource  = "grafana/loadshed-dashboard.json"
	ChartDir         = "helm/loadshed"
	RulesTemplateOut = ChartDir + "/templates/_rules.tpl"
	DashboardCopy    = ChartDir + "/files/loadshed-dashboard.json"
	ValuesFile       = ChartDir + "/values.yaml"
	ReadmeTemplate   = ChartDir + "/README.md.tmpl"
	ReadmeOut        = ChartDir + "/README.md"
)

// Output is one generated file.
type Output struct {
	Path    string // relative to the deploy directory
	Content []byte
}

// Outputs computes every generated file from its source under the deploy
// directory root.
func Outputs(root string) ([]Output, error) {
	read := func(rel string) ([]byte, error) {
		return os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
	}
	rules, err := read(RulesSource)
	if err != nil {
		return nil, err
	}
	tpl, err := RulesTemplate(rules)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", RulesSource, err)
	}
	dashboard, err := read(DashboardSource)
	if err != nil {
		return nil, err
	}
	values, err := read(ValuesFile)
	if err != nil {
		return nil, err
	}
	documented, err := DocumentedValues(values)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ValuesFile, err)
	}
	readmeTpl, err := read(ReadmeTemplate)
	if err != nil {
		return nil, err
	}
	t, err := template.New("README").Option("missingkey=error").Parse(string(readmeTpl))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ReadmeTemplate, err)
	}
	var readme bytes.Buffer
	if err := t.Execute(&readme, map[string]any{"ValuesTable": ValuesTable(documented)}); err != nil {
		return nil, fmt.Errorf("%s: %w", ReadmeTemplate, err)
	}
	schema, err := read(SchemaFile)
	if err != nil {
		return nil, err
	}
	if schema, err = StrategySchema(schema); err != nil {
		return nil, fmt.Errorf("%s: %w", SchemaFile, err)
	}
	return []Output{
		{Path: RulesTemplateOut, Content: tpl},
		{Path: DashboardCopy, Content: dashboard},
		{Path: ReadmeOut, Content: readme.Bytes()},
		{Path: SchemaFile, Content: schema},
		{Path: StrategiesTemplate, Content: StrategiesTpl()},
	}, nil
}

// Stale returns the generated files under root whose content differs from what
// Outputs computes (missing files count as stale).
func Stale(root string) ([]string, error) {
	outs, err := Outputs(root)
	if err != nil {
		return nil, err
	}
	var stale []string
	for _, o := range outs {
		have, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(o.Path)))
		if err != nil || !bytes.Equal(have, o.Content) {
			stale = append(stale, o.Path)
		}
	}
	return stale, nil
}

// Write writes every generated file under root.
func Write(root string) ([]string, error) {
	outs, err := Outputs(root)
	if err != nil {
		return nil, err
	}
	var written []string
	for _, o := range outs {
		path := filepath.Join(root, filepath.FromSlash(o.Path))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return written, err
		}
		if err := os.WriteFile(path, o.Content, 0o644); err != nil {
			return written, err
		}
		written = append(written, o.Path)
	}
	return written, nil
}
