package config

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written in YAML as a Go duration string ("80ms", "1.5s").
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalYAML writes the duration as a string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

func (d Duration) String() string { return time.Duration(d).String() }

var (
	durationType   = reflect.TypeOf(Duration(0))
	stdDurationTyp = reflect.TypeOf(time.Duration(0))
)

// defaulter is implemented by blocks that have defaults of their own: a block that appears in
// the file (a chain stage's adaptive block, say) starts from them rather than from zero.
type defaulter interface{ setDefaults() }

// strictDecode decodes a YAML node into v, which must point to a struct. Unlike a plain
// yaml.Unmarshal it reports every problem, each with its line and the dotted path of the field
// (admission.boundedQueue.maxWait), rejects unknown and duplicate keys, and never stops at the
// first error. Fields absent from the document keep the values v already holds (the defaults).
func strictDecode(doc *yaml.Node, v any, errs *Problems) {
	n := doc
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return
		}
		n = n.Content[0]
	}
	decodeValue(n, reflect.ValueOf(v).Elem(), "", errs)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	if n.Tag == "!!null" {
		return "null"
	}
	return strconv.Quote(n.Value)
}

func decodeValue(n *yaml.Node, v reflect.Value, path string, errs *Problems) {
	if n.Kind == yaml.AliasNode {
		errs.addLine(n.Line, path, "YAML aliases are not supported")
		return
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		// An explicit null leaves the default in place (and a pointer nil).
		return
	}
	switch {
	case v.Type() == durationType || v.Type() == stdDurationTyp:
		if n.Kind != yaml.ScalarNode {
			errs.addLine(n.Line, path, "want a duration such as \"80ms\", got %s", describe(n))
			return
		}
		d, err := time.ParseDuration(n.Value)
		if err != nil {
			errs.addLine(n.Line, path, "invalid duration %q (want a Go duration such as \"80ms\" or \"2s\")", n.Value)
			return
		}
		v.SetInt(int64(d))
		return
	case v.Kind() == reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
			if d, ok := v.Interface().(defaulter); ok {
				d.setDefaults()
			}
		}
		decodeValue(n, v.Elem(), path, errs)
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		decodeStruct(n, v, path, errs)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			errs.addLine(n.Line, path, "want a list, got %s", describe(n))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			decodeValue(item, s.Index(i), fmt.Sprintf("%s[%d]", path, i), errs)
		}
		v.Set(s)
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			errs.addLine(n.Line, path, "want a mapping, got %s", describe(n))
			return
		}
		m := reflect.MakeMap(v.Type())
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			if seen[k.Value] {
				errs.addLine(k.Line, join(path, k.Value), "duplicate key")
				continue
			}
			seen[k.Value] = true
			elem := reflect.New(v.Type().Elem()).Elem()
			decodeValue(val, elem, join(path, k.Value), errs)
			m.SetMapIndex(reflect.ValueOf(k.Value).Convert(v.Type().Key()), elem)
		}
		v.Set(m)
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			errs.addLine(n.Line, path, "want a string, got %s", describe(n))
			return
		}
		v.SetString(n.Value)
	case reflect.Bool:
		var b bool
		if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
			errs.addLine(n.Line, path, "want true or false, got %s", describe(n))
			return
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int64, reflect.Int32:
		var i int64
		if n.Kind != yaml.ScalarNode || n.Tag == "!!str" || n.Decode(&i) != nil {
			errs.addLine(n.Line, path, "want an integer, got %s", describe(n))
			return
		}
		if v.OverflowInt(i) {
			errs.addLine(n.Line, path, "%d is out of range", i)
			return
		}
		v.SetInt(i)
	case reflect.Float64:
		var f float64
		if n.Kind != yaml.ScalarNode || n.Tag == "!!str" || n.Decode(&f) != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			errs.addLine(n.Line, path, "want a number, got %s", describe(n))
			return
		}
		v.SetFloat(f)
	default:
		errs.addLine(n.Line, path, "unsupported field type %s", v.Type())
	}
}

// extraKeys is implemented by structs that accept keys beyond their fields: an admission block
// and a chain stage take the settings block of every strategy in the registry.
type extraKeys interface {
	// extraField returns where the value of key decodes to, or false for an unknown key.
	extraField(key string) (reflect.Value, bool)
}

func decodeStruct(n *yaml.Node, v reflect.Value, path string, errs *Problems) {
	if n.Kind != yaml.MappingNode {
		errs.addLine(n.Line, path, "want a mapping, got %s", describe(n))
		return
	}
	fields := map[string]int{}
	var names []string
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		fields[name] = i
		names = append(names, name)
	}
	extra, _ := v.Addr().Interface().(extraKeys)
	if extra != nil {
		names = append(names, blockKeys()...)
	}
	sort.Strings(names)
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		key := k.Value
		if seen[key] {
			errs.addLine(k.Line, join(path, key), "duplicate key")
			continue
		}
		seen[key] = true
		if idx, ok := fields[key]; ok {
			decodeValue(val, v.Field(idx), join(path, key), errs)
			continue
		}
		if extra != nil {
			if val.Kind == yaml.ScalarNode && val.Tag == "!!null" {
				if _, ok := kindOfBlock(key); ok {
					continue // an explicit null leaves the block out
				}
			} else if dst, ok := extra.extraField(key); ok {
				decodeValue(val, dst, join(path, key), errs)
				continue
			}
		}
		if errs.full() {
			errs.Omitted++ // no suggestion is worth computing for a problem nobody will read
			continue
		}
		msg := "unknown field"
		if s := suggest(key, names); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		} else {
			msg += " (known: " + strings.Join(names, ", ") + ")"
		}
		errs.addLine(k.Line, join(path, key), "%s", msg)
	}
}

// suggest returns the known name closest to key when it is a likely typo.
func suggest(key string, names []string) string {
	if len(key) > 64 {
		return ""
	}
	best, bestD := "", 3
	for _, n := range names {
		if d := editDistance(strings.ToLower(key), strings.ToLower(n)); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := 1
			if a[i-1] == b[j-1] {
				c = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+c)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
