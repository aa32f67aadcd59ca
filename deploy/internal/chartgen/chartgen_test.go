package chartgen

import (
	"os"
	"strings"
	"testing"
)

func TestDocumentedValues(t *testing.T) {
	src := `# Section comment, not a description.
# -- Replicas.
replicaCount: 2
image:
  # -- Repository of the image,
  # continued on a second line.
  repository: loadshed
  # -- Tag.
  tag: ""
# -- Probe, a leaf although it is a mapping.
probe:
  httpGet:
    path: /healthz
# -- A list.
args: [--a, --b]
`
	got, err := DocumentedValues([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := []Value{
		{Key: "replicaCount", Type: "int", Default: "2", Description: "Replicas."},
		{Key: "image.repository", Type: "string", Default: `"loadshed"`, Description: "Repository of the image, continued on a second line."},
		{Key: "image.tag", Type: "string", Default: `""`, Description: "Tag."},
		{Key: "probe", Type: "object", Default: `{"httpGet":{"path":"/healthz"}}`, Description: "Probe, a leaf although it is a mapping."},
		{Key: "args", Type: "list", Default: `["--a","--b"]`, Description: "A list."},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d values %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("value %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
}

func TestUndocumentedValueIsAnError(t *testing.T) {
	_, err := DocumentedValues([]byte("image:\n  # -- Repo.\n  repository: x\n  tag: v1\nreplicas: 2\n"))
	if err == nil {
		t.Fatal("undocumented values accepted")
	}
	for _, want := range []string{"image.tag", "replicas"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

func TestValuesTableEscapes(t *testing.T) {
	table := ValuesTable([]Value{{Key: "a", Type: "string", Default: `"x|y"`, Description: "a|b <c>"}})
	if !strings.Contains(table, "| `a` | string | `\"x\\|y\"` | a\\|b &lt;c&gt; |") {
		t.Errorf("table row not escaped:\n%s", table)
	}
}

const rulesSrc = `groups:
  - name: g
    rules:
      - alert: LoadshedHighShedRatio
        expr: |
          (a) > 0.1
          and
          sum(rate(x[5m])) > 1
        for: 10m
        labels:
          severity: warning
        annotations:
          summary: "shedding {{ $value }}"
`

func withParams(t *testing.T, p []RuleParam) {
	t.Helper()
	old := RuleParams
	RuleParams = p
	t.Cleanup(func() { RuleParams = old })
}

func TestRulesTemplate(t *testing.T) {
	withParams(t, []RuleParam{{Alert: "LoadshedHighShedRatio", Key: "highShedRatio", Subs: []ExprSub{
		{Context: ") > 0.1\n", Default: "0.1", Value: "threshold"},
		{Context: "[5m])) > 1\n", Default: "1", Value: "minRate"},
		{Context: "[5m]", Default: "5m", Value: "window", All: true},
	}}})
	out, err := RulesTemplate([]byte(rulesSrc))
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	for _, want := range []string{
		`{{- define "loadshed.ruleGroups" -}}`,
		"{{- with $rules.highShedRatio }}{{ if .enabled }}",
		"(a) > {{ .threshold }}\n",
		"sum(rate(x[{{ .window }}])) > {{ .minRate }}\n",
		"for: {{ .for }}",
		"severity: {{ .severity | quote }}",
		`summary: "shedding {{ "{{" }} $value {{ "}}" }}"`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("template lacks %q:\n%s", want, s)
		}
	}
}

func TestRulesTemplateRefusesMismatches(t *testing.T) {
	cases := []struct {
		name   string
		params []RuleParam
		want   string
	}{
		{"alert without params", nil, "no entry in chartgen.RuleParams"},
		{"params without alert", []RuleParam{
			{Alert: "LoadshedHighShedRatio", Key: "h"}, {Alert: "Gone", Key: "g"},
		}, `"Gone"`},
		{"threshold not found", []RuleParam{{Alert: "LoadshedHighShedRatio", Key: "h", Subs: []ExprSub{
			{Context: ") > 0.2\n", Default: "0.2", Value: "threshold"},
		}}}, "occurs 0 times"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			withParams(t, c.params)
			_, err := RulesTemplate([]byte(rulesSrc))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

func TestEncodeKeepsTextExact(t *testing.T) {
	for _, s := range []string{"one line", "two\nlines\n", "no final newline\nhere", " leading space\nx\n", "trailing \nspace\n", "two finals\n\n"} {
		enc := encode(s, 2)
		if strings.HasPrefix(enc, "|") {
			// A block scalar: reading it back must give s.
			body := strings.TrimPrefix(strings.SplitN(enc, "\n", 2)[1], "")
			var lines []string
			for _, l := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
				lines = append(lines, strings.TrimPrefix(l, "  "))
			}
			back := strings.Join(lines, "\n")
			if strings.HasPrefix(enc, "|\n") {
				back += "\n"
			}
			if back != s {
				t.Errorf("encode(%q) = %q reads back as %q", s, enc, back)
			}
		} else if !strings.HasPrefix(enc, `"`) {
			t.Errorf("encode(%q) = %q: neither a block nor quoted", s, enc)
		}
	}
}

// The real sources generate without error.
func TestRealSources(t *testing.T) {
	if _, err := os.Stat("../../" + RulesSource); err != nil {
		t.Skip("not run from the repository")
	}
	if _, err := Outputs("../.."); err != nil {
		t.Fatal(err)
	}
}

// A comment line that starts with a flag continues the description: only "# --" followed by
// a space (or nothing) starts one.
func TestFlagAtTheStartOfALineContinuesTheDescription(t *testing.T) {
	got, err := DocumentedValues([]byte("# -- The mode. The app listens with\n# --listen=:8080 then.\nmode: proxy\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "The mode. The app listens with --listen=:8080 then."; len(got) != 1 || got[0].Description != want {
		t.Fatalf("got %+v, want one value described %q", got, want)
	}
}
