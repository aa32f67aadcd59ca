package docs

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/loadshed/loadshed/internal/config"
)

var update = flag.Bool("update", false, "rewrite the generated parts of the docs instead of checking them")

const (
	configDoc  = "docs/configuration.md"
	module     = "github.com/loadshed/loadshed/"
	beginKeys  = "<!-- BEGIN GENERATED: every key (go test ./internal/docs -run TestConfigReference -update) -->"
	endMarker  = "<!-- END GENERATED -->"
	deprecated = "Deprecated and ignored"
)

// overrides replace the description of keys that the code still accepts but that no one should
// set. A key listed here that the configuration no longer has fails the test: remove it here.
var overrides = map[string]string{
	"server.fastPath": deprecated + ": it switched on the proxy's own HTTP/1.1 server and client, which are gone: net/http serves every exchange. Accepted with a warning for one release; leave it out.",
}

// TestConfigReference checks that docs/configuration.md lists every key of the configuration
// file with its type and default, as internal/config defines them (config.Keys), each described
// by its field's doc comment. With -update it rewrites the list.
func TestConfigReference(t *testing.T) {
	want := configReference(t)
	path := filepath.Join(root, configDoc)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	i, j := strings.Index(text, beginKeys), strings.Index(text, endMarker)
	if i < 0 || j < i {
		t.Fatalf("%s: no generated section (%s ... %s)", configDoc, beginKeys, endMarker)
	}
	got := text[i+len(beginKeys) : j]
	if got == want {
		return
	}
	if *update {
		if err := os.WriteFile(path, []byte(text[:i+len(beginKeys)]+want+text[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
	for k := 0; k < min(len(gl), len(wl)); k++ {
		if gl[k] != wl[k] {
			t.Errorf("%s: the key reference is out of date (run go test ./internal/docs -run TestConfigReference -update); first difference:\n  doc:  %s\n  code: %s", configDoc, gl[k], wl[k])
			return
		}
	}
	t.Errorf("%s: the key reference is out of date (run go test ./internal/docs -run TestConfigReference -update): %d lines, the code gives %d", configDoc, len(gl), len(wl))
}

// configReference renders the table of every key.
func configReference(t *testing.T) string {
	t.Helper()
	docs := fieldDocs(t)
	keys := config.Keys()
	seen := map[string]bool{}
	var b strings.Builder
	b.WriteString("\n| key | type | default | what it does |\n|---|---|---|---|\n")
	for _, k := range keys {
		if seen[k.Path] {
			t.Errorf("config.Keys lists %s twice", k.Path)
		}
		seen[k.Path] = true
		desc := k.Doc
		if k.Owner != nil {
			desc = docs[k.Owner.PkgPath()+"."+k.Owner.Name()+"."+k.Field]
		}
		if o, ok := overrides[k.Path]; ok {
			desc = o
		}
		def := k.Default
		switch {
		case k.Required != "" && def == "" && !strings.HasPrefix(k.Type, "mapping"):
			def = "required with " + k.Required
		case def != "":
			def = "`" + def + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", k.Path, cell(k.Type), cell(def), cell(desc))
	}
	for p := range overrides {
		if !seen[p] {
			t.Errorf("overrides in reference_test.go names %s, which the configuration no longer has: remove it", p)
		}
	}
	if len(keys) < 100 {
		t.Errorf("config.Keys lists only %d keys", len(keys))
	}
	return b.String()
}

// cell makes text fit in one table cell.
func cell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	return strings.ReplaceAll(s, "|", `\|`)
}

// fieldDocs returns the doc comment of every struct field declared in the packages that hold
// the configuration's types, by "pkgpath.Type.Field". A field without a doc comment of its own
// gets its line comment, if any.
func fieldDocs(t *testing.T) map[string]string {
	t.Helper()
	pkgs := map[string]bool{}
	var collect func(reflect.Type)
	visited := map[reflect.Type]bool{}
	collect = func(rt reflect.Type) {
		for rt.Kind() == reflect.Pointer || rt.Kind() == reflect.Slice {
			rt = rt.Elem()
		}
		if rt.Kind() != reflect.Struct || visited[rt] {
			return
		}
		visited[rt] = true
		pkgs[rt.PkgPath()] = true
		for i := 0; i < rt.NumField(); i++ {
			collect(rt.Field(i).Type)
		}
	}
	for _, k := range config.Keys() {
		if k.Owner != nil {
			collect(k.Owner)
		}
	}
	out := map[string]string{}
	for pkg := range pkgs {
		if !strings.HasPrefix(pkg, module) {
			continue
		}
		dir := filepath.Join(root, filepath.FromSlash(strings.TrimPrefix(pkg, module)))
		fset := token.NewFileSet()
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(fset, f, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(file, func(n ast.Node) bool {
				ts, ok := n.(*ast.TypeSpec)
				if !ok {
					return true
				}
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					return false
				}
				for _, f := range st.Fields.List {
					text := f.Doc.Text()
					if text == "" {
						text = f.Comment.Text()
					}
					for _, name := range f.Names {
						out[pkg+"."+ts.Name.Name+"."+name.Name] = text
					}
				}
				return false
			})
		}
	}
	return out
}
