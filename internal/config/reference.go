package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Key is one key of the configuration file, as the reference in docs/configuration.md lists it
// (generated from Keys by internal/docs, so the reference follows the code).
type Key struct {
	// Path is the key's dotted path; list items are written [] ("routes[].pathPrefix").
	Path string
	// Type is what the value is: a duration, string, integer, number, boolean, list of strings,
	// mapping, list of mappings, or an admission block.
	Type string
	// Default is the value a file that leaves the key out gets, as YAML would write it; empty for
	// a mapping. Keys under a block that is absent by default hold the block's own defaults, the
	// values a key gets when the block is written without it.
	Default string
	// Required names the strategy whose settings block must set this key (its defaults say
	// nothing about the backend); empty when the key is optional.
	Required string
	// Owner is the struct type that declares the key and Field its Go field name, so that a
	// generator can find the field's doc comment; Owner is nil for a strategy's settings block.
	Owner reflect.Type
	Field string
	// Doc is a line of documentation the code holds outside a doc comment (a strategy's registry
	// entry, for its settings block).
	Doc string
}

// Keys lists every key of the configuration file in the file's order: the fields of Config by
// their yaml tags, with the defaults of Default, every strategy's settings block under
// admission (from the registry) and the defaults of blocks that are absent unless written.
// A route's admission block has the keys of the top-level one and a chain stage those of one
// settings block: they are listed once, under admission.
func Keys() []Key {
	var out []Key
	d := Default()
	walkKeys(&out, "", reflect.ValueOf(&d).Elem(), "")
	return out
}

var (
	admissionType = reflect.TypeOf(Admission{})
	stageType     = reflect.TypeOf(Stage{})
)

func walkKeys(out *[]Key, path string, v reflect.Value, required string) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" || !f.IsExported() {
			continue
		}
		p := join(path, name)
		fv := v.Field(i)
		k := Key{Path: p, Owner: t, Field: f.Name, Required: required}
		switch {
		case fv.Kind() == reflect.Pointer && fv.Type().Elem() == admissionType:
			k.Type = "admission block: the keys of admission"
			*out = append(*out, k)
			continue
		case fv.Kind() == reflect.Slice && fv.Type().Elem() == stageType:
			k.Type = "list of settings blocks, each one strategy's (" + strings.Join(blockKeys(), ", ") + "), keys as under admission"
			*out = append(*out, k)
			continue
		case fv.Kind() == reflect.Pointer && fv.Type().Elem().Kind() == reflect.Struct:
			block := reflect.New(fv.Type().Elem())
			if d, ok := block.Interface().(defaulter); ok {
				d.setDefaults()
			}
			k.Type, k.Default = "mapping", "absent"
			*out = append(*out, k)
			walkKeys(out, p, block.Elem(), required)
			continue
		case fv.Kind() == reflect.Struct && fv.Type() != durationType:
			k.Type = "mapping"
			*out = append(*out, k)
			walkKeys(out, p, fv, required)
			if fv.Type() == admissionType {
				walkBlocks(out, p, fv.Addr().Interface().(*Admission))
			}
			continue
		case fv.Kind() == reflect.Slice && fv.Type().Elem().Kind() == reflect.Struct:
			k.Type = "list of mappings"
			*out = append(*out, k)
			walkKeys(out, p+"[]", reflect.New(fv.Type().Elem()).Elem(), required)
			continue
		}
		if fv.Kind() == reflect.Pointer && fv.IsNil() {
			// A scalar that is nil unless written (a deprecated key): its type is the element's.
			k.Type, _ = scalarKey(reflect.New(fv.Type().Elem()).Elem())
			k.Default = "absent"
			*out = append(*out, k)
			continue
		}
		k.Type, k.Default = scalarKey(fv)
		if required != "" {
			k.Default = ""
		}
		*out = append(*out, k)
	}
}

// walkBlocks lists the settings block of every strategy in the registry under an admission
// block, each with its defaults.
func walkBlocks(out *[]Key, path string, a *Admission) {
	for _, kd := range registry {
		if kd.New == nil {
			continue
		}
		p := join(path, kd.Block)
		req := ""
		if kd.Required {
			req = kd.Name
		}
		*out = append(*out, Key{Path: p, Type: "mapping: the settings of strategy " + kd.Name, Required: req, Doc: kd.Doc})
		walkKeys(out, p, reflect.ValueOf(a.block(&kd)).Elem(), req)
	}
}

// scalarKey returns the type and the default, as YAML writes it, of a value that is not a
// mapping.
func scalarKey(v reflect.Value) (typ, def string) {
	switch {
	case v.Type() == durationType:
		return "duration", time.Duration(v.Int()).String()
	case v.Type() == stdDurationTyp:
		return "duration", time.Duration(v.Int()).String()
	}
	switch v.Kind() {
	case reflect.String:
		return "string", strconv.Quote(v.String())
	case reflect.Bool:
		return "boolean", strconv.FormatBool(v.Bool())
	case reflect.Int, reflect.Int32, reflect.Int64:
		return "integer", strconv.FormatInt(v.Int(), 10)
	case reflect.Float64:
		return "number", strconv.FormatFloat(v.Float(), 'g', -1, 64)
	case reflect.Slice:
		items := make([]string, v.Len())
		for i := range items {
			_, items[i] = scalarKey(v.Index(i))
		}
		et, _ := scalarKey(reflect.New(v.Type().Elem()).Elem())
		return "list of " + et + "s", "[" + strings.Join(items, ", ") + "]"
	}
	return v.Type().String(), fmt.Sprint(v.Interface())
}
