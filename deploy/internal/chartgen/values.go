package chartgen

import (
	"encoding/json"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Value is one documented entry of values.yaml.
type Value struct {
	Key         string // dotted path, e.g. admission.inflight.limit
	Type        string // string, int, float, bool, list, object or null
	Default     string // JSON rendering of the default
	Description string
}

// DocumentedValues walks values.yaml and returns every documented value in file
// order. A value is documented by a comment block starting with "# --" right
// above its key; the comment may continue on following "#" lines. A mapping
// without such a comment is descended into; any other undocumented value is an
// error, so every value the chart reads is explained.
func DocumentedValues(data []byte) ([]Value, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("values: the document must be a mapping")
	}
	var out []Value
	var problems []string
	walkValues(doc.Content[0], "", &out, &problems)
	if len(problems) > 0 {
		return nil, fmt.Errorf("values: %s", strings.Join(problems, "; "))
	}
	return out, nil
}

func walkValues(m *yaml.Node, prefix string, out *[]Value, problems *[]string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		key := k.Value
		if prefix != "" {
			key = prefix + "." + k.Value
		}
		desc, ok := description(k.HeadComment)
		if !ok {
			if v.Kind == yaml.MappingNode && len(v.Content) > 0 {
				walkValues(v, key, out, problems)
				continue
			}
			*problems = append(*problems, fmt.Sprintf("%s (line %d) has no \"# --\" comment", key, k.Line))
			continue
		}
		typ, def, err := describeNode(v)
		if err != nil {
			*problems = append(*problems, fmt.Sprintf("%s: %v", key, err))
			continue
		}
		*out = append(*out, Value{Key: key, Type: typ, Default: def, Description: desc})
	}
}

// isMarker: "# --" alone or followed by a space starts a description; a comment line that
// begins with a flag ("# --listen=:8080") continues one.
func isMarker(l string) bool { return l == "# --" || strings.HasPrefix(l, "# -- ") }

// description returns the text of the last "# --" block in a head comment.
func description(head string) (string, bool) {
	lines := strings.Split(head, "\n")
	start := -1
	for i, l := range lines {
		if isMarker(strings.TrimSpace(l)) {
			start = i
		}
	}
	if start < 0 {
		return "", false
	}
	var parts []string
	for i, l := range lines[start:] {
		l = strings.TrimSpace(l)
		if i == 0 {
			l = strings.TrimPrefix(l, "# --")
		} else {
			if !strings.HasPrefix(l, "#") {
				break
			}
			l = strings.TrimPrefix(l, "#")
		}
		if l = strings.TrimSpace(l); l != "" {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, " "), true
}

func describeNode(v *yaml.Node) (typ, def string, err error) {
	var x any
	if err := v.Decode(&x); err != nil {
		return "", "", err
	}
	switch t := x.(type) {
	case nil:
		typ = "null"
	case bool:
		typ = "bool"
	case int:
		typ = "int"
	case float64:
		typ = "float"
	case string:
		typ = "string"
	case []any:
		typ = "list"
	case map[string]any:
		typ = "object"
	default:
		return "", "", fmt.Errorf("unexpected value of type %T", t)
	}
	var buf strings.Builder
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(x); err != nil {
		return "", "", err
	}
	return typ, strings.TrimSuffix(buf.String(), "\n"), nil
}

// ValuesTable renders the documented values as a Markdown table.
func ValuesTable(values []Value) string {
	var b strings.Builder
	b.WriteString("| Key | Type | Default | Description |\n|-----|------|---------|-------------|\n")
	for _, v := range values {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", v.Key, v.Type, code(v.Default), cell(v.Description))
	}
	return b.String()
}

func code(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	if strings.Contains(s, "`") {
		return "<code>" + strings.ReplaceAll(s, "<", "&lt;") + "</code>"
	}
	return "`" + s + "`"
}

func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;").Replace(s)
}
