package chartgen

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/loadshed/loadshed/internal/config"
)

// Paths of the files generated from the strategy registry (internal/config), relative to the
// deploy directory.
const (
	SchemaFile          = ChartDir + "/values.schema.json"
	StrategiesTemplate  = ChartDir + "/templates/_strategies.tpl"
	strategiesTplHeader = "{{/*\nGenerated from the strategy registry (internal/config) by deploy/cmd/genchart: do not edit.\n*/}}\n"
)

// StrategiesTpl is the chart's template of the strategies: their names, in registry order, and
// the settings block key of each, so the templates never list them by hand.
func StrategiesTpl() []byte {
	var names, pairs []string
	for _, k := range config.Kinds() {
		names = append(names, k.Name)
		block := k.Block
		if k.New == nil && k.Name != config.StrategyChain {
			block = ""
		}
		pairs = append(pairs, fmt.Sprintf("%q %q", k.Name, block))
	}
	var b strings.Builder
	b.WriteString(strategiesTplHeader)
	b.WriteString("\n{{/*\nThe admission strategies, space-separated, in documentation order.\n*/}}\n")
	b.WriteString("{{- define \"loadshed.strategyNames\" -}}\n" + strings.Join(names, " ") + "\n{{- end }}\n")
	b.WriteString("\n{{/*\nThe config block key of each admission strategy (empty for none).\n*/}}\n")
	b.WriteString("{{- define \"loadshed.strategyBlock\" -}}\n{{- get (dict " + strings.Join(pairs, " ") + ") . }}\n{{- end }}\n")
	return []byte(b.String())
}

// StrategySchema rewrites the parts of values.schema.json that list the strategies: the enum of
// admission.strategy and the blocks a chain stage may hold. The rest of the file is kept byte
// for byte.
func StrategySchema(schema []byte) ([]byte, error) {
	var names, blocks []string
	for _, k := range config.Kinds() {
		names = append(names, k.Name)
		if k.New != nil {
			blocks = append(blocks, k.Block)
		}
	}
	enum, err := json.Marshal(names)
	if err != nil {
		return nil, err
	}
	var stage bytes.Buffer
	stage.WriteString("{")
	for i, b := range blocks {
		if i > 0 {
			stage.WriteString(",")
		}
		fmt.Fprintf(&stage, "%q:{\"$ref\":%q}", b, "#/definitions/"+b)
	}
	stage.WriteString("}")
	out, err := replaceJSON(schema, []string{"properties", "admission", "properties", "strategy", "enum"}, enum)
	if err != nil {
		return nil, err
	}
	return replaceJSON(out, []string{"definitions", "stage", "properties"}, stage.Bytes())
}

// replaceJSON replaces the value at path in the JSON document data with value (compact JSON),
// indented like the line that holds it.
func replaceJSON(data []byte, path []string, value []byte) ([]byte, error) {
	start, end, err := findJSON(data, path)
	if err != nil {
		return nil, err
	}
	lineStart := bytes.LastIndexByte(data[:start], '\n') + 1
	indent := data[lineStart:start]
	indent = indent[:len(indent)-len(bytes.TrimLeft(indent, " \t"))]
	var v bytes.Buffer
	if err := json.Indent(&v, value, string(indent), "  "); err != nil {
		return nil, err
	}
	out := append([]byte{}, data[:start]...)
	out = append(out, v.Bytes()...)
	return append(out, data[end:]...), nil
}

// findJSON returns the byte span of the value at path (object keys) in data.
func findJSON(data []byte, path []string) (start, end int, err error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	// Each frame is an open object or array; for an object, key is the key whose value comes next.
	type frame struct {
		object bool
		key    string
		atKey  bool
	}
	var stack []frame
	matches := func() bool {
		if len(stack) != len(path) {
			return false
		}
		for i, f := range stack {
			if !f.object || f.key != path[i] {
				return false
			}
		}
		return true
	}
	for {
		before := dec.InputOffset()
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return 0, 0, fmt.Errorf("no value at %s", strings.Join(path, "."))
		}
		if err != nil {
			return 0, 0, err
		}
		if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].atKey {
			if d, ok := tok.(json.Delim); !ok || (d != '}' && d != ']') {
				stack[n-1].key, stack[n-1].atKey = tok.(string), false
				continue
			}
		}
		valueStart := before + int64(len(data[before:])-len(bytes.TrimLeft(data[before:], " \t\r\n:,")))
		if matches() {
			start = int(valueStart)
			if d, ok := tok.(json.Delim); ok && (d == '{' || d == '[') {
				depth := 1
				for depth > 0 {
					t, err := dec.Token()
					if err != nil {
						return 0, 0, err
					}
					if d, ok := t.(json.Delim); ok {
						if d == '{' || d == '[' {
							depth++
						} else {
							depth--
						}
					}
				}
			}
			return start, int(dec.InputOffset()), nil
		}
		switch d, _ := tok.(json.Delim); d {
		case '{':
			stack = append(stack, frame{object: true, atKey: true})
			continue
		case '[':
			stack = append(stack, frame{})
			continue
		case '}', ']':
			stack = stack[:len(stack)-1]
		}
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].atKey = true
		}
	}
}
